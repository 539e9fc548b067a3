"""A real AgentScope agent with tools runs its tool loop against the gateway; calls are exact."""

import itertools

import pytest

from agentscope_rft.chat.template import ChatRenderer
from agentscope_rft.chat.tools import parse_tool_calls
from agentscope_rft.integration.agentscope import RolloutScope, rollout_scope

from . import calc_app

# The shared engines' gateways serve on the session's event loop (tests/integration/conftest.py).
pytestmark = pytest.mark.asyncio(loop_scope="session")


@pytest.mark.parametrize("stream", [False, True], ids=["non-streaming", "streaming"])
async def test_tool_loop_completes_and_calls_are_exact(calc_gateway, stream):
    answer = await calc_app.run_episode(calc_gateway.rollout_base_url("ep"), stream=stream)
    assert answer == "The answer is 20."

    engine = calc_gateway.engine
    tokenizer = engine.tokenizer
    renderer = ChatRenderer(tokenizer)
    calls = calc_gateway.recorder.calls("ep")
    assert len(calls) == 3
    for call, script in zip(calls, calc_app.SCRIPT, strict=True):
        assert call.completion_ids[-1] == tokenizer.eos_token_id
        generated = tokenizer.decode(call.completion_ids[:-1])
        assert generated == script
        parsed = parse_tool_calls(generated)
        assert [(tc.name, tc.arguments) for tc in call.tool_calls] == [
            (tc.name, tc.arguments) for tc in parsed.tool_calls
        ]
        # Ids are the gateway's own: the request id, the choice index and the call's position.
        assert [tc.id for tc in call.tool_calls] == [
            f"call_{call.request_id}_0_{i}" for i in range(len(parsed.tool_calls))
        ]
        assert (call.content or None) == (parsed.content or None)
        # The prompt is the chat-template rendering of the request (reused tokens included).
        assert call.prompt_ids == renderer.render_ids(call.messages, call.tools)
        assert len(call.logprobs) == len(call.completion_ids)
        # Called straight at the rollout URL (no rollout scope), the agent is not named.
        assert call.agent_name is None
    assert [c.finish_reason for c in calls] == ["tool_calls", "tool_calls", "stop"]
    # The agent sent back the ids it was given: the next request's assistant turn carries the
    # recorded tool calls and its tool results answer them, id for id.
    for earlier, later in itertools.pairwise(calls):
        assistant = next(
            m for m in reversed(later.messages) if m["role"] == "assistant" and m.get("tool_calls")
        )
        sent_back = [tc["id"] for tc in assistant["tool_calls"]]
        answered = [m["tool_call_id"] for m in later.messages if m["role"] == "tool"]
        assert sent_back == [tc.id for tc in earlier.tool_calls]
        assert sent_back == answered[-len(sent_back) :]
    assert len({tc.id for c in calls for tc in c.tool_calls}) == 2
    assert calls[0].prompt_reused_tokens == 0
    assert calls[1].prompt_reused_tokens == len(calls[0].prompt_ids) + len(calls[0].completion_ids)
    assert calls[2].prompt_reused_tokens > calls[1].prompt_reused_tokens


async def test_calls_in_a_rollout_scope_carry_the_agent_name(calc_gateway):
    """Inside a rollout scope the app's own model is redirected and every call names its agent."""
    scope = RolloutScope(
        rollout_id="scoped",
        base_url=calc_gateway.rollout_base_url("scoped"),
        api_key=calc_gateway.api_key or "no-key",
    )
    with rollout_scope(scope):
        # The app points its model somewhere else entirely; the scope redirects it.
        answer = await calc_app.run_episode("http://127.0.0.1:9/v1")
    assert answer == "The answer is 20."
    calls = calc_gateway.recorder.calls("scoped")
    assert [c.agent_name for c in calls] == ["calc", "calc", "calc"]
    assert scope.calls_made == {"calc": 3} and scope.last_agent == "calc"


async def test_rollout_models_share_the_episode_pool_and_answer(calc_gateway):
    """The model handed to a workflow builds no HTTP client of its own when the explorer gives
    the scope a pool (a client of its own costs an SSL context per episode)."""
    import httpx
    from agentscope.message import UserMsg

    from agentscope_rft.integration.agentscope import rollout_model

    async with httpx.AsyncClient() as pool:
        scope = RolloutScope(
            rollout_id="pooled",
            base_url=calc_gateway.rollout_base_url("pooled"),
            api_key=calc_gateway.api_key or "no-key",
            http_client=pool,
        )
        model = rollout_model(scope, calc_gateway.engine.model_name)
        own = model.__dict__["_agentscope_rft_own_client"]
        assert own._client is pool
        with rollout_scope(scope):
            agent = calc_app.build_agent(model)
            reply = await agent.reply(UserMsg(name="user", content=calc_app.QUESTION))
        assert reply.get_text_content() == "The answer is 20."
        assert len(calc_gateway.recorder.calls("pooled")) == 3
    unscoped = rollout_model(
        RolloutScope(rollout_id="x", base_url="http://127.0.0.1:9/v1", api_key="k"), "m"
    )
    assert unscoped.__dict__["_agentscope_rft_own_client"]._client is not pool


def _reply_in_a_thread(model, name: str, copy_context: bool) -> None:
    """What a sync app does: run an agent on an event loop of its own, in a thread."""
    import asyncio
    import threading

    from agentscope.agent import Agent, InjectionConfig
    from agentscope.message import UserMsg

    def reply() -> None:
        agent = Agent(
            name=name,
            system_prompt="Hi.",
            model=model,
            injection_config=InjectionConfig(inject_runtime_state=False),
        )
        asyncio.run(agent.reply(UserMsg(name="user", content="from a thread")))

    if copy_context:  # as `asyncio.to_thread` does
        import contextvars

        contextvars.copy_context().run(reply)
    else:
        thread = threading.Thread(target=reply)
        thread.start()
        thread.join()


@pytest.mark.parametrize("copy_context", [True, False], ids=["to_thread", "plain-thread"])
async def test_an_agent_on_an_event_loop_of_its_own_is_recorded(copy_context):
    """The episode's calls from a thread's own event loop reach the rollout and leave the shared
    pool usable (its connections opened on that loop broke the explorer's close before)."""
    import asyncio

    from agentscope_rft.check import check_workflow
    from agentscope_rft.testing import ScriptedEngine

    async def run(task, model):
        await asyncio.to_thread(_reply_in_a_thread, model, "threaded", copy_context)
        return 1.0

    report = await check_workflow(
        run, {"id": "t"}, engine=ScriptedEngine(lambda m, t: "done"), show=False
    )
    assert report.rollout.ok, report.rollout.error
    assert [c.agent_name for c in report.rollout.calls] == ["threaded"]
    assert [s.num_trained_tokens for s in report.samples] == [2]


async def test_a_model_that_is_not_redirected_is_named_once(monkeypatch, caplog):
    """An app on another AgentScope model class (here DeepSeek's) is told its episode's calls
    bypass the trainable endpoint, once, with the fix (before: only a connection error)."""
    import openai
    from agentscope.credential import DeepSeekCredential
    from agentscope.message import UserMsg
    from agentscope.model import DeepSeekChatModel

    from agentscope_rft.integration import agentscope as integration

    monkeypatch.setattr(integration, "_WARNED_MODELS", set())
    model = DeepSeekChatModel(
        credential=DeepSeekCredential(api_key="sk-x", base_url="http://127.0.0.1:9/v1"),
        model="deepseek-chat",
        stream=False,
        max_retries=0,
    )
    scope = RolloutScope(rollout_id="r", base_url="http://127.0.0.1:9/v1", api_key="k")
    with pytest.raises(openai.APIConnectionError):  # outside an episode: nothing to say
        await model([UserMsg(name="user", content="hi")])
    assert "not trained" not in caplog.text
    with rollout_scope(scope):
        for _ in range(2):
            with pytest.raises(openai.APIConnectionError):
                await model([UserMsg(name="user", content="hi")])
    warned = [r.getMessage() for r in caplog.records if "not trained" in r.getMessage()]
    assert len(warned) == 1
    assert "DeepSeekChatModel (model 'deepseek-chat')" in warned[0]
    assert "OpenAIChatModel" in warned[0]


async def test_agents_with_non_ascii_names_are_recorded_by_name():
    """A Chinese or accented agent name travels in the ASCII header percent-encoded and comes
    back as written (before: every call failed with UnicodeEncodeError)."""
    from agentscope.agent import Agent, InjectionConfig
    from agentscope.message import UserMsg

    from agentscope_rft.check import check_workflow
    from agentscope_rft.testing import ScriptedEngine

    names = ["助手", "Zoë the 50% critic", "plain"]

    async def run(task, model):
        message = UserMsg(name="用户", content="你好")
        for name in names:
            agent = Agent(
                name=name,
                system_prompt="Reply.",
                model=model,
                injection_config=InjectionConfig(inject_runtime_state=False),
            )
            message = await agent.reply(message)
        return 1.0

    report = await check_workflow(
        run, {"id": "t"}, engine=ScriptedEngine(lambda m, t: "done"), show=False
    )
    assert report.rollout.ok, report.rollout.error
    assert [c.agent_name for c in report.rollout.calls] == names
    assert sorted(s.sample_id for s in report.samples) == sorted(f"check:{n}:0" for n in names)


def _critic_class():
    from agentscope.agent import Agent
    from agentscope.message import Msg, UserMsg

    class Critic(Agent):
        """An app's own agent: its `reply` calls the model itself, not `Agent.reply`."""

        async def reply(self, msg=None, structured_schema=None):
            text = msg.get_text_content() if msg is not None else ""
            response = await self.model([UserMsg(name="user", content=f"critique: {text}")])
            return Msg(name=self.name, content=response.content, role="assistant")

    return Critic


CriticDefinedAtImport = _critic_class()


async def test_agent_subclasses_that_override_reply_tag_their_calls():
    """Two agents of an app's own `Agent` subclass (one defined before the patches, one after)
    train as two agents (before: their calls were untagged and merged into one trajectory)."""
    from agentscope.agent import InjectionConfig
    from agentscope.message import UserMsg

    from agentscope_rft.check import check_workflow
    from agentscope_rft.testing import ScriptedEngine

    async def run(task, model):
        defined_now = _critic_class()
        for name, cls in (("early", CriticDefinedAtImport), ("late", defined_now)):
            critic = cls(
                name=name,
                system_prompt="Critique.",
                model=model,
                injection_config=InjectionConfig(inject_runtime_state=False),
            )
            await critic.reply(UserMsg(name="user", content="a poem"))
        return 1.0

    report = await check_workflow(
        run, {"id": "t"}, engine=ScriptedEngine(lambda m, t: "fine"), show=False
    )
    assert report.rollout.ok, report.rollout.error
    assert [c.agent_name for c in report.rollout.calls] == ["early", "late"]
    assert sorted(s.sample_id for s in report.samples) == ["check:early:0", "check:late:0"]
