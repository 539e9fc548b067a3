"""`rollouts.jsonl`: each call logs the request messages that were new to it."""

from agentscope_rft.runtime.components import MESSAGE_CHARS, new_messages
from agentscope_rft.types import Call, ToolCall

SYSTEM = {"role": "system", "content": [{"type": "text", "text": "You add numbers."}]}
USER = {"role": "user", "name": "user", "content": "What is 2+3?"}


def call(agent: str, messages: list[dict], content: str = "") -> Call:
    return Call(
        call_id=f"c{len(messages)}",
        request_id="r",
        rollout_id="e",
        agent_name=agent,
        messages=messages,
        tools=None,
        prompt_ids=[1, 2],
        completion_ids=[3],
        logprobs=[-0.1],
        finish_reason="stop",
        policy_version=0,
        content=content,
        tool_calls=[ToolCall("t1", "add", '{"a": 2, "b": 3}')] if not content else [],
    )


def test_a_tool_loop_logs_each_tool_result_once_where_it_entered():
    first = [SYSTEM, USER]
    reply = {"role": "assistant", "content": None, "tool_calls": [{"id": "t1"}]}
    result = {"role": "tool", "tool_call_id": "t1", "content": "5"}
    second = [*first, reply, result]
    other = [{"role": "user", "content": "Judge this."}]
    calls = [call("solver", first), call("judge", other, "ok"), call("solver", second, "5")]
    assert new_messages(calls) == [
        [["system", "", "You add numbers."], ["user", "user", "What is 2+3?"]],
        [["user", "", "Judge this."]],
        [["tool", "", "5"]],  # not the system prompt again, nor the solver's own reply
    ]


def test_a_rewritten_history_logs_every_message_and_long_text_is_cut():
    first = [SYSTEM, USER]
    compacted = [SYSTEM, {"role": "user", "content": "x" * (3 * MESSAGE_CHARS)}]
    rows = new_messages([call("a", first), call("a", compacted, "done")])
    assert [r[0] for r in rows[1]] == ["system", "user"]  # not a continuation: all of it
    text = rows[1][1][2]
    assert len(text) < MESSAGE_CHARS + 100 and "characters ...]" in text


def test_a_reasoning_models_thinking_is_logged_beside_its_answer_and_cut_like_a_message():
    from agentscope_rft.runtime.components import rollout_line
    from agentscope_rft.types import Rollout

    thinking = call("solver", [SYSTEM, USER], "4")
    thinking.reasoning = "2+2 is " + "very " * MESSAGE_CHARS + "4."
    plain = call("solver", [SYSTEM, USER, {"role": "user", "content": "and?"}], "done")
    rollout = Rollout(rollout_id="e", task_id="t", task={}, calls=[thinking, plain], reward=1.0)
    logged, after = rollout_line(0, "train", rollout)["calls"]
    assert logged["content"] == "4" and logged["reasoning"].startswith("2+2 is very")
    assert len(logged["reasoning"]) < MESSAGE_CHARS + 100 and logged["reasoning"].endswith("4.")
    assert after["reasoning"] is None
