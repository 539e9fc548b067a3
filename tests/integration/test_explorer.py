"""The explorer on real AgentScope agents: exact trajectories, in-place capture, failures."""

import asyncio

import pytest
from agentscope.agent import Agent, InjectionConfig
from agentscope.credential import OpenAICredential
from agentscope.message import UserMsg
from agentscope.model import OpenAIChatModel

import agentscope_rft
from agentscope_rft.explorer.explorer import EpisodeSettings, Explorer
from agentscope_rft.explorer.tasks import load_tasks
from agentscope_rft.types import RolloutStatus

from . import calc_app

# The shared engines' gateways serve on the session's event loop (tests/integration/conftest.py).
pytestmark = pytest.mark.asyncio(loop_scope="session")


@agentscope_rft.workflow
async def calc_workflow(task, model):
    agent = calc_app.build_agent(model)
    reply = await agent.reply(UserMsg(name="user", content=task["question"]))
    return float(task["answer"] in (reply.get_text_content() or ""))


async def test_multi_turn_tool_episode_merges_into_one_exact_sample(calc_gateway):
    explorer = Explorer(calc_workflow, calc_gateway, EpisodeSettings())
    tasks = load_tasks([{"id": "t1", "question": calc_app.QUESTION, "answer": "20"}])
    result = await explorer.explore(tasks, group_size=2, batch_id="b0")
    await explorer.close()

    assert [r.reward for r in result.rollouts] == [1.0, 1.0]
    assert result.metrics()["success_rate"] == 1.0
    assert len(result.samples) == 2  # one merged sample per episode
    tokenizer = calc_gateway.engine.tokenizer
    for sample, rollout in zip(result.samples, result.rollouts, strict=True):
        assert len(sample.token_ids) == len(sample.loss_mask) == len(sample.logprobs)
        assert sample.num_calls == 3 and sample.group_id == "b0:t1"
        trained = [t for t, m in zip(sample.token_ids, sample.loss_mask, strict=True) if m]
        generated = [t for call in rollout.calls for t in call.completion_ids]
        assert trained == generated  # mask-1 tokens are exactly what the model sampled
        assert tokenizer.decode(trained) == "<|im_end|>".join(calc_app.SCRIPT) + "<|im_end|>"
        # mask-0 tokens are everything else: the last call's prompt is the sequence's prefix
        last = rollout.calls[-1]
        assert list(sample.token_ids[: len(last.prompt_ids)]) == last.prompt_ids
        trained_logprobs = [
            lp for lp, m in zip(sample.logprobs, sample.loss_mask, strict=True) if m
        ]
        assert trained_logprobs == [lp for c in rollout.calls for lp in c.logprobs]
        assert all(
            lp == 0.0 for lp, m in zip(sample.logprobs, sample.loss_mask, strict=True) if not m
        )
    assert result.metrics()["trajectory/merge_rate"] == 1.0


# An existing app: it builds its own streaming OpenAIChatModel against some other server.
async def inplace_app(task, _model_unused):
    model = OpenAIChatModel(
        credential=OpenAICredential(api_key="sk-not-used", base_url="http://127.0.0.1:9/v1"),
        model="gpt-4o-mini",
        stream=True,
        parameters=OpenAIChatModel.Parameters(max_tokens=6),
    )
    agent = Agent(
        name="assistant",
        system_prompt="You are terse.",
        model=model,
        injection_config=InjectionConfig(inject_runtime_state=False),
    )
    await agent.reply(UserMsg(name="user", content=f"secret word {task['word']}"))
    await agent.reply(UserMsg(name="user", content=f"again {task['word']}"))
    return 0.5


async def explore_word_tasks(app, gateway, n: int):
    """Explore `n` tasks, each with its own secret word, once each, `n` at a time; every
    episode must succeed and make 2 calls, each of which names its task's word."""
    explorer = Explorer(agentscope_rft.workflow(app), gateway, EpisodeSettings(max_concurrency=n))
    tasks = load_tasks([{"id": f"t{i}", "word": f"w{i:02d}x"} for i in range(n)])
    result = await explorer.explore(tasks, group_size=1, batch_id="b")
    await explorer.close()
    assert all(r.ok for r in result.rollouts), [r.error for r in result.rollouts]
    for rollout in result.rollouts:
        assert len(rollout.calls) == 2
        assert all(rollout.task["word"] in str(call.messages) for call in rollout.calls)
    return result


async def test_in_place_app_is_captured_without_mixing(tiny_gateway):
    result = await explore_word_tasks(inplace_app, tiny_gateway, 16)
    for rollout in result.rollouts:
        word = rollout.task["word"]
        for call in rollout.calls:
            text = str(call.messages)
            assert all(f"w{i:02d}x" not in text for i in range(16) if f"w{i:02d}x" != word)
            assert call.agent_name == "assistant"
            assert call.model == "gpt-4o-mini"
    # Outside an episode the app's model is untouched (its own client and base URL).
    model = OpenAIChatModel(
        credential=OpenAICredential(api_key="k", base_url="http://x:1/v1"), model="m"
    )
    assert str(model.client.base_url) == "http://x:1/v1/"


async def raw_openai_app(task, _model_unused):
    from agentscope_rft.integration.agentscope import current_scope

    client = current_scope().client_for(None)  # openai by hand, on the run's shared pool
    assert client is current_scope().client_for(None)
    for turn in ("first", "second"):
        await client.chat.completions.create(
            model="policy",
            messages=[{"role": "user", "content": f"{turn} {task['word']}"}],
            max_tokens=4,
        )
    return 1.0


async def test_an_app_calling_openai_by_hand_is_captured(tiny_gateway):
    result = await explore_word_tasks(raw_openai_app, tiny_gateway, 8)
    assert len(result.samples) == 16  # the second prompt does not extend the first: 2 samples


async def two_agent_app(task, model):
    solver = Agent(
        name="solver",
        system_prompt="Solve it.",
        model=model,
        injection_config=InjectionConfig(inject_runtime_state=False),
    )
    critic = Agent(
        name="critic",
        system_prompt="Criticize the answer.",
        model=model,
        injection_config=InjectionConfig(inject_runtime_state=False),
    )
    answer = await solver.reply(UserMsg(name="user", content=task["q"]))
    await critic.reply(UserMsg(name="solver", content=answer.get_text_content() or "-"))
    await solver.reply(UserMsg(name="critic", content="Try again."))
    return 1.0


async def test_two_agent_app_yields_per_agent_trajectories(tiny_gateway):
    explorer = Explorer(
        agentscope_rft.workflow(two_agent_app), tiny_gateway, EpisodeSettings(max_tokens=5)
    )
    result = await explorer.explore(
        load_tasks([{"id": "x", "q": "1+1?"}]), group_size=1, batch_id="b"
    )
    await explorer.close()
    [rollout] = result.rollouts
    assert sorted(c.agent_name for c in rollout.calls) == ["critic", "solver", "solver"]
    by_agent = {s.agent_name: s for s in result.samples}
    assert set(by_agent) == {"solver", "critic"}
    assert by_agent["critic"].num_calls == 1
    assert sum(s.num_calls for s in result.samples if s.agent_name == "solver") == 2


async def raising_app(task, model):
    if task["kind"] == "raise":
        raise ValueError("the app broke on purpose")
    if task["kind"] == "hang":
        await asyncio.sleep(3600)
    agent = Agent(
        name="a",
        system_prompt="Hi.",
        model=model,
        injection_config=InjectionConfig(inject_runtime_state=False),
    )
    await agent.reply(UserMsg(name="user", content="hello"))
    return 1.0


async def test_failing_and_hanging_episodes_do_not_kill_the_batch(tiny_gateway):
    explorer = Explorer(
        agentscope_rft.workflow(raising_app),
        tiny_gateway,
        EpisodeSettings(episode_timeout=2.0, max_retries=1, max_tokens=4),
    )
    tasks = load_tasks(
        [
            {"id": "ok", "kind": "ok"},
            {"id": "boom", "kind": "raise"},
            {"id": "stuck", "kind": "hang"},
        ]
    )
    result = await explorer.explore(tasks, group_size=1, batch_id="b")
    await explorer.close()
    status = {r.task_id: r for r in result.rollouts}
    assert status["ok"].ok and status["ok"].reward == 1.0
    assert status["boom"].status is RolloutStatus.FAILED
    assert "the app broke on purpose" in status["boom"].error
    assert status["boom"].attempts == 2  # retried once
    assert status["stuck"].status is RolloutStatus.TIMEOUT
    assert "episode_timeout" in status["stuck"].error
    metrics = result.metrics()
    assert metrics["explore/failed"] == 1 and metrics["explore/timeout"] == 1
    assert len(result.samples) == 1


async def test_an_app_that_edits_its_task_edits_its_own_copy(tiny_gateway):
    async def app(task, model):
        task["notes"].append("seen")  # e.g. a chat history in the task, extended by the app
        agent = Agent(
            name="a",
            system_prompt="Hi.",
            model=model,
            injection_config=InjectionConfig(inject_runtime_state=False),
        )
        await agent.reply(UserMsg(name="user", content=" ".join(task["notes"])))
        return float(len(task["notes"]))

    async def judge(task, reward):
        return reward + len(task["notes"])  # the judge sees the task as written

    explorer = Explorer(
        agentscope_rft.workflow(app, judge=judge), tiny_gateway, EpisodeSettings(max_tokens=4)
    )
    tasks = load_tasks([{"id": "t", "notes": ["start"]}])
    result = await explorer.explore(tasks, group_size=3, batch_id="b")
    await explorer.close()
    # every episode of the group saw the same task, and the task set is unchanged
    assert [r.reward for r in result.rollouts] == [3.0, 3.0, 3.0]
    assert tasks[0].data == {"id": "t", "notes": ["start"]}
    prompts = [str(c.messages[-1]["content"]) for r in result.rollouts for c in r.calls]
    assert len(prompts) == 3 and all("start seen" in p and "seen seen" not in p for p in prompts)


async def test_emitted_step_rewards_land_on_their_calls(tiny_gateway):
    async def app(task, model):
        agent = Agent(
            name="a",
            system_prompt="Hi.",
            model=model,
            injection_config=InjectionConfig(inject_runtime_state=False),
        )
        await agent.reply(UserMsg(name="user", content="one"))
        agentscope_rft.emit_reward(0.25)  # the latest call: 0
        await agent.reply(UserMsg(name="user", content="two"))
        agentscope_rft.emit_reward(0.5, step=0)
        return 1.0

    explorer = Explorer(agentscope_rft.workflow(app), tiny_gateway, EpisodeSettings(max_tokens=4))
    result = await explorer.explore(load_tasks([{"id": "s"}]), group_size=1, batch_id="b")
    await explorer.close()
    [rollout] = result.rollouts
    assert [(s.value, s.call_index) for s in rollout.step_rewards] == [(0.25, 0), (0.5, 0)]
    rewards = [r for s in result.samples for r in (s.token_rewards or [])]
    assert sorted(r for r in rewards if r) == [0.75]


async def test_a_nan_step_reward_fails_its_episode_by_name(tiny_gateway):
    async def app(task, model):
        agent = Agent(
            name="a",
            system_prompt="Hi.",
            model=model,
            injection_config=InjectionConfig(inject_runtime_state=False),
        )
        await agent.reply(UserMsg(name="user", content="one"))
        agentscope_rft.emit_reward(float(task["step_reward"]))
        return 1.0

    explorer = Explorer(
        agentscope_rft.workflow(app), tiny_gateway, EpisodeSettings(max_tokens=4, max_retries=0)
    )
    tasks = load_tasks([{"id": "nan", "step_reward": "nan"}, {"id": "ok", "step_reward": 0.5}])
    result = await explorer.explore(tasks, group_size=1, batch_id="b")
    await explorer.close()
    by_task = {r.task_id: r for r in result.rollouts}
    assert by_task["nan"].status is RolloutStatus.FAILED
    assert "emit_reward(nan): a step reward must be a finite number" in (by_task["nan"].error or "")
    assert by_task["ok"].ok and [s.value for s in by_task["ok"].step_rewards] == [0.5]
    assert [s.rollout_id for s in result.samples] == [by_task["ok"].rollout_id]


async def test_no_model_call_is_reported(tiny_gateway, caplog):
    explorer = Explorer(agentscope_rft.workflow(lambda_app), tiny_gateway, EpisodeSettings())
    result = await explorer.explore(load_tasks([{"id": "n"}]), group_size=2, batch_id="b")
    await explorer.close()
    assert result.no_model_calls == ["n", "n"]
    assert result.metrics()["explore/no_model_calls"] == 2
    assert "made no model call" in caplog.text


async def lambda_app(task, model):
    return 0.0


async def test_check_workflow_reports_what_was_captured(calc_gateway):
    report = await agentscope_rft.check_workflow(
        calc_workflow,
        {"id": "t", "question": calc_app.QUESTION, "answer": "20"},
        engine=calc_gateway.engine,
        show=False,
    )
    assert report.rollout.reward == 1.0
    assert len(report.samples) == 1 and report.warnings == []
    assert "3 model call(s)" in report.render()


async def judged_app(task, model):
    agent = Agent(
        name="a",
        system_prompt="Hi.",
        model=model,
        injection_config=InjectionConfig(inject_runtime_state=False),
    )
    reply = await agent.reply(UserMsg(name="user", content=task["q"]))
    return {"text": reply.get_text_content() or "", "task": task["id"]}


async def test_a_judge_scores_the_response_outside_the_episode(tiny_gateway):
    seen = []

    async def judge(task, response):
        # The judge's own model calls are not the policy's: no rollout scope is set here.
        from agentscope_rft.integration.agentscope import current_scope

        seen.append((task["id"], response["task"], current_scope()))
        if task["id"] == "bad":
            return "not a reward"
        return agentscope_rft.Reward(0.25 if task["id"] == "x" else 0.75, metrics={"judged": 1.0})

    workflow = agentscope_rft.workflow(judged_app, judge=judge)
    explorer = Explorer(workflow, tiny_gateway, EpisodeSettings(max_tokens=4, max_retries=0))
    tasks = load_tasks(
        [{"id": "x", "q": "1+1?"}, {"id": "y", "q": "2+2?"}, {"id": "bad", "q": "?"}]
    )
    result = await explorer.explore(tasks, group_size=1, batch_id="b")
    await explorer.close()
    by_task = {r.task_id: r for r in result.rollouts}
    assert by_task["x"].reward == 0.25 and by_task["y"].reward == 0.75
    assert by_task["x"].metrics == {"judged": 1.0}
    assert [len(by_task[t].calls) for t in ("x", "y")] == [1, 1]  # the policy's call only
    assert sorted((t, r) for t, r, _ in seen) == [("bad", "bad"), ("x", "x"), ("y", "y")]
    assert all(scope is None for _, _, scope in seen)
    assert by_task["bad"].status is RolloutStatus.FAILED
    assert "the judge returned str" in (by_task["bad"].error or "")
    assert {s.reward for s in result.samples} == {0.25, 0.75}


@pytest.mark.timeout(120)  # without the shared deadline the judge would hang the batch
async def test_a_hanging_judge_times_out_with_its_episode(tiny_gateway):
    async def slow_judge(task, response):
        await asyncio.sleep(3600)
        return 1.0

    workflow = agentscope_rft.workflow(judged_app, judge=slow_judge)
    explorer = Explorer(
        workflow, tiny_gateway, EpisodeSettings(episode_timeout=2.0, max_retries=0, max_tokens=4)
    )
    started = asyncio.get_running_loop().time()
    result = await explorer.explore(
        load_tasks([{"id": "x", "q": "hi"}]), group_size=1, batch_id="b"
    )
    elapsed = asyncio.get_running_loop().time() - started
    await explorer.close()
    [rollout] = result.rollouts
    assert rollout.status is RolloutStatus.TIMEOUT
    assert "judge" in (rollout.error or "") and "episode_timeout=2.0s" in (rollout.error or "")
    assert elapsed < 60  # bounded by the deadline, not by the judge's hour
    assert result.samples == []
