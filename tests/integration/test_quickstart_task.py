"""The quickstart task generator, reward and agent app (scripted engine, no model compute)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from agentscope_rft.gateway.server import Gateway
from agentscope_rft.testing import ScriptedEngine

QUICKSTART = Path(__file__).resolve().parents[2] / "examples" / "quickstart"
sys.path.insert(0, str(QUICKSTART))

import app  # noqa: E402
import task  # noqa: E402
from evaluate import make_model  # noqa: E402


def tool_call(expression: str) -> str:
    arguments = json.dumps({"expression": expression})
    return f'<tool_call>\n{{"name": "calculate", "arguments": {arguments}}}\n</tool_call>'


def test_generator_is_deterministic_and_seeded():
    assert task.generate(20, 10, seed=3) == task.generate(20, 10, seed=3)
    assert task.generate(20, 10, seed=3) != task.generate(20, 10, seed=4)


def test_splits_are_disjoint_and_answers_match_questions():
    train, test = task.generate(512, 128, seed=0)
    assert len(train) == 512 and len(test) == 128
    assert not {t["question"] for t in train} & {t["question"] for t in test}
    for t in train + test:
        expression = t["question"].removeprefix("What is ").removesuffix("?")
        assert app.calculate(expression) == str(t["answer"])


def test_committed_task_files_are_the_generator_output():
    train, test, val = task.generate(n_val=64)
    assert task.load_tasks(QUICKSTART / "tasks_train.jsonl") == train
    assert task.load_tasks(QUICKSTART / "tasks_test.jsonl") == test
    assert task.load_tasks(QUICKSTART / "tasks_val.jsonl") == val
    questions = [{t["question"] for t in split} for split in (train, test, val)]
    assert not (questions[0] & questions[2]) and not (questions[1] & questions[2])


@pytest.mark.parametrize(
    ("expression", "result"),
    [("12 * 34", "408"), ("950 - 120", "830"), ("7 / 2", "3.5"), ("-3 + 5", "2"), ("3 x 4", "12")],
)
def test_calculate(expression, result):
    assert app.calculate(expression) == result


@pytest.mark.parametrize("expression", ["__import__('os')", "2 ** 3", "1 / 0", "abc", ""])
def test_calculate_rejects_everything_but_arithmetic(expression):
    assert app.calculate(expression).startswith("error")


@pytest.mark.parametrize(
    ("text", "ran_tool", "reward"),
    [
        ("408", False, 1.0),
        ("The answer is 408.", True, 1.0),
        ("12 * 34 = 408", False, 1.0),
        ("4,08", False, 1.0),  # thousands separators are dropped
        ("408.0", False, 1.0),
        ("407", True, app.TOOL_CREDIT),
        ("408 apples, so 12", True, app.TOOL_CREDIT),  # the last number counts
        ("", False, 0.0),
        ("I don't know", False, 0.0),
    ],
)
def test_score(text, ran_tool, reward):
    assert app.score(text, 408, ran_tool) == reward


def scripted_engine(first_call: str, answer: str | None = None) -> ScriptedEngine:
    """Replies `first_call` to the question, then `answer` (default: the tool's result)."""

    def reply(messages: list[dict], tools: list[dict] | None) -> str:
        last = messages[-1]
        if last["role"] == "tool":
            return answer if answer is not None else last["content"]
        return first_call

    return ScriptedEngine(reply)


async def run_scripted(engine: ScriptedEngine, question: str, answer: int) -> tuple[float, list]:
    async with Gateway(engine) as gateway:
        model = make_model(gateway.rollout_base_url("ep"), 1.0, 48, None)
        try:
            reward = await app.run({"question": question, "answer": answer}, model)
        finally:
            await model.client.close()
        return reward, gateway.recorder.calls("ep")


async def test_episode_with_the_tool_gets_full_reward_and_merges_into_one_sequence():
    engine = scripted_engine(tool_call("94 * 99"))
    reward, calls = await run_scripted(engine, "What is 94 * 99?", 9306)
    assert reward == 1.0
    assert [c.finish_reason for c in calls] == ["tool_calls", "stop"]
    assert calls[0].tool_calls[0].name == "calculate"
    # The second prompt continues the first call's exact tokens: one training sequence.
    first = calls[0].prompt_ids + calls[0].completion_ids
    assert calls[1].prompt_ids[: len(first)] == first
    tool_turn = engine.tokenizer.decode(calls[1].prompt_ids[len(first) :])
    assert "<tool_response>\n9306\n</tool_response>" in tool_turn
    # The demonstrations are in the prompt, before the question.
    prompt = engine.tokenizer.decode(calls[0].prompt_ids)
    for question, expression in app.DEMOS:
        assert prompt.index(question) < prompt.index("What is 94 * 99?")
        assert f'{{"expression": "{expression}"}}' in prompt
    assert calls[0].tools is not None and calls[0].tools[0]["function"]["name"] == "calculate"


async def test_episode_with_the_tool_and_a_wrong_answer_gets_tool_credit():
    engine = scripted_engine(tool_call("94 * 98"), answer="9212")
    reward, calls = await run_scripted(engine, "What is 94 * 99?", 9306)
    assert reward == app.TOOL_CREDIT
    assert len(calls) == 2


@pytest.mark.parametrize(
    "first_call",
    [
        "9306",  # right, without the tool
        "<tool_response>\n9000\n</tool_response>",  # the model's favourite mistake
        '<tool_call>\n{"name": "calculate", "arguments": {"score": "94 * 99"}}\n</tool_call>',
        tool_call("94 ** 99"),
    ],
    ids=["no-tool", "fake-response", "bad-argument", "bad-expression"],
)
async def test_failed_tool_use_gets_no_credit(first_call):
    # After a failed tool call the scripted model answers with the (error) tool result.
    engine = scripted_engine(first_call)
    reward, calls = await run_scripted(engine, "What is 94 * 99?", 9306)
    if first_call == "9306":
        assert reward == 1.0 and len(calls) == 1
    else:
        assert reward == 0.0
    if "<tool_call>" in first_call:
        assert calls[0].tool_calls, "a well-formed call block is parsed even with bad arguments"


def test_the_quickstart_config_is_valid_and_its_workflow_loads(monkeypatch):
    from agentscope_rft.api import load_workflow
    from agentscope_rft.config import load_config
    from agentscope_rft.explorer.tasks import load_tasks

    monkeypatch.chdir(QUICKSTART.parents[1])  # the README runs it from the repository root
    config = load_config("examples/quickstart/config.yaml")
    assert config.model.name_or_path == "smollm2-135m-instruct"
    assert load_workflow(config.workflow).name == "run"
    tasks = load_tasks(config.tasks.train, id_field=config.tasks.id_field)
    assert len(tasks) == 512
    assert len(load_tasks(config.tasks.val, id_field=config.tasks.id_field)) == 64
    assert len(load_tasks(config.tasks.eval, id_field=config.tasks.id_field)) == 128
