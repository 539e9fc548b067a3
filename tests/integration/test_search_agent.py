"""The search agent app (workflows/search_agent.py) through the real gateway and explorer.

A scripted engine (real chat template and tokenizer) plays exact episodes; a tiny model that
memorized one episode runs it through `check_workflow` and the embedded engine, also with a
context window too small for the second call.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from agentscope_rft.api import import_file
from agentscope_rft.check import check_workflow
from agentscope_rft.engines.embedded import EmbeddedEngine
from agentscope_rft.explorer.explorer import EpisodeSettings, Explorer
from agentscope_rft.explorer.tasks import load_tasks
from agentscope_rft.explorer.trajectory import build_samples
from agentscope_rft.gateway.server import Gateway
from agentscope_rft.testing import ScriptedEngine, scripted_model
from agentscope_rft.types import Rollout, RolloutStatus
from environments.search import load_tasks as load_search_tasks
from environments.search.generate import generate
from workflows.search_agent import JudgeSettings, SearchAgentSettings, search_workflow
from workflows.search_scripted import oracle_reply

TASK = next(
    t
    for t in load_search_tasks("test")
    if t["type"] == "single_hop" and t["question"].startswith("In what year was")
)
NAME = TASK["supporting_titles"][0]
SEARCH = f'<tool_call>\n{{"name": "search", "arguments": {{"query": "{NAME}"}}}}\n</tool_call>'
ANSWER = f"<answer>{TASK['answer']}</answer>"
# Short episodes for a tiny model to memorize: no demos, one result, no open_page.
SMALL = SearchAgentSettings(max_turns=2, top_k=1, open_page=False, demos=0)


def _script(*replies: str) -> Callable[[list, list | None], str]:
    queue = list(replies)
    return lambda messages, tools: queue.pop(0) if len(queue) > 1 else queue[0]


def _greedy(settings: SearchAgentSettings):
    """The app with greedy model calls (a memorized episode replays exactly)."""
    app = search_workflow(settings)

    async def run(task: dict, model):
        model.parameters.temperature = 0.0
        return await app.fn(task, model)

    return run


async def _episode(engine, settings: SearchAgentSettings, task: dict = TASK, **kw) -> Rollout:
    greedy = {"": {"temperature": 0.0}}
    async with Gateway(engine, sampling_overrides=greedy) as gateway:
        explorer = Explorer(
            search_workflow(settings), gateway, EpisodeSettings(max_retries=0, **kw)
        )
        [loaded] = load_tasks([task])
        rollout = await explorer.run_episode(loaded, "r")
        await explorer.close()
    return rollout


@pytest.fixture(scope="module")
def search_conversation() -> tuple[list[dict], list[dict], list[int]]:
    """The messages and tools of the scripted two-call episode, and its prompt lengths."""
    engine = ScriptedEngine(_script(SEARCH, ANSWER))
    rollout = asyncio.run(_episode(engine, SMALL))
    assert rollout.reward == 1.0, rollout.error
    last = engine.requests[-1]
    assert last.tools is not None
    messages = [*last.messages, {"role": "assistant", "content": ANSWER}]
    return messages, last.tools, [len(call.prompt_ids) for call in rollout.calls]


@pytest.fixture(scope="module")
def search_model(search_conversation) -> str:
    messages, tools, _ = search_conversation
    return str(scripted_model([(messages, tools)], max_steps=2000))


async def test_scripted_episode_runs_the_tool_and_scores(search_conversation) -> None:
    engine = ScriptedEngine(_script(SEARCH, ANSWER))
    rollout = await _episode(engine, SearchAgentSettings(max_turns=3, top_k=2))
    assert rollout.status is RolloutStatus.OK and rollout.reward == 1.0
    assert rollout.metrics["searches"] == 1.0 and rollout.metrics["em"] == 1.0
    # The tool ran: its result (the page's fact box) is in the second prompt.
    tool_turn = engine.requests[1].messages[-1]
    assert tool_turn["role"] == "tool" and f"{NAME} (id: " in str(tool_turn["content"])
    assert f": {TASK['answer']}" in str(tool_turn["content"])
    # Two demonstrations precede the question; open_page is offered.
    first = engine.requests[0]
    assert [m["role"] for m in first.messages].count("user") == 3
    assert {t["function"]["name"] for t in first.tools or []} == {"search", "open_page"}


async def test_check_workflow_on_a_tiny_model(search_model: str) -> None:
    engine = EmbeddedEngine(search_model, dtype="float32", device="cpu")
    report = await check_workflow(_greedy(SMALL), TASK, engine=engine, show=False)
    rollout = report.rollout
    assert rollout.status is RolloutStatus.OK, rollout.error
    assert rollout.reward == 1.0 and rollout.metrics["f1"] == 1.0
    assert [len(c.tool_calls) for c in rollout.calls] == [1, 0]
    assert rollout.calls[0].tool_calls[0].name == "search"
    # One merged sample: both completions trained, the tool result between them masked.
    [sample] = report.samples
    assert sample.num_calls == 2 and report.stats.merges == 1
    first, second = rollout.calls
    gap = len(second.prompt_ids) - len(first.prompt_ids) - len(first.completion_ids)
    assert gap > 20  # the tool turn
    assert sample.num_trained_tokens == len(first.completion_ids) + len(second.completion_ids)
    assert report.warnings == []


async def test_context_overflow_ends_as_truncated_data(search_model, search_conversation) -> None:
    _, _, prompt_lengths = search_conversation
    # Room for the first call, not for the second prompt (the search result made it longer).
    window = prompt_lengths[1] - 1
    engine = EmbeddedEngine(search_model, dtype="float32", device="cpu", max_model_len=window)
    await engine.start()
    try:
        rollout = await _episode(engine, SMALL, context_overflow_reward=-0.5)
    finally:
        await engine.close()
    assert rollout.status is RolloutStatus.TRUNCATED and rollout.ok
    assert rollout.truncated == "context_window" and rollout.attempts == 1
    assert rollout.reward == -0.5
    assert "longer than the context window" in (rollout.error or "")
    assert len(rollout.calls) == 1 and rollout.calls[0].tool_calls[0].name == "search"
    samples, _ = build_samples(rollout)
    assert [s.reward for s in samples] == [-0.5] and samples[0].num_trained_tokens > 0


async def test_turn_limit_ends_as_truncated_data() -> None:
    engine = ScriptedEngine(_script(SEARCH))  # never answers
    rollout = await _episode(engine, SMALL)
    assert rollout.status is RolloutStatus.TRUNCATED and rollout.truncated == "turn_limit"
    # Two tool turns, then AgentScope's forced final call (tools off).
    assert len(rollout.calls) == 3 and engine.requests[-1].tool_choice == "none"
    assert rollout.metrics["turn_limit"] == 1.0 and rollout.metrics["searches"] == 2.0
    samples, stats = build_samples(rollout)
    assert len(samples) == 1 and stats.merges == 2


async def test_judge_scores_outside_the_episode() -> None:
    judge_engine = ScriptedEngine(lambda messages, tools: "CORRECT", served_model_name="judge")
    async with Gateway(judge_engine) as judge:
        settings = SearchAgentSettings(
            max_turns=2, demos=0, judge=JudgeSettings(judge.base_url, "judge", api_key_env=None)
        )
        wrong_words = f"<answer>the year {TASK['answer']}</answer>"
        rollout = await _episode(ScriptedEngine(_script(SEARCH, wrong_words)), settings)
    assert rollout.status is RolloutStatus.OK and rollout.reward == 1.0
    assert rollout.metrics["judge_called"] == 1.0 and rollout.metrics["judge_error"] == 0.0
    assert rollout.metrics["em"] == 0.0
    # The judge saw the question and both answers; its call is not among the episode's.
    [judge_request] = judge_engine.requests
    assert TASK["question"] in judge_request.messages[0]["content"]
    assert len(rollout.calls) == 2 and all(c.model != "judge" for c in rollout.calls)


async def test_judge_endpoint_down_is_a_counted_fallback() -> None:
    down = JudgeSettings("http://127.0.0.1:9/v1", "judge", api_key_env=None, timeout=2.0)
    settings = SearchAgentSettings(max_turns=2, demos=0, judge=down)
    reply = f"<answer>{TASK['answer']} AD</answer>"
    rollout = await _episode(ScriptedEngine(_script(SEARCH, reply)), settings)
    assert rollout.status is RolloutStatus.OK  # nothing lost: the episode is still data
    assert rollout.metrics["judge_error"] == 1.0
    assert rollout.reward == pytest.approx(2 / 3)  # token F1 of "<year> AD" against "<year>"


async def test_task_without_question_or_answer_is_a_counted_failure() -> None:
    engine = ScriptedEngine(_script(SEARCH, ANSWER))
    no_question = await _episode(engine, SMALL, task={"id": "q1", "query": "?", "answer": "x"})
    assert no_question.status is RolloutStatus.FAILED
    assert "has no 'question' text" in (no_question.error or "")
    # NQ-style `answers` is not a gold field: the episode fails before any model call.
    fresh = ScriptedEngine(_script(SEARCH, ANSWER))
    task = {"question": TASK["question"], "answers": ["x"]}
    no_answer = await _episode(fresh, SMALL, task=task)
    assert no_answer.status is RolloutStatus.FAILED
    assert "this task has no gold answer: give 'answer'" in (no_answer.error or "")
    assert "fields present: ['answers', 'question']" in (no_answer.error or "")
    assert fresh.requests == []


def test_missing_corpus_is_a_clear_error(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match=r"search corpus .*missing.jsonl does not exist"):
        search_workflow(SearchAgentSettings(corpus=str(tmp_path / "missing.jsonl")))


def test_example_config_explores_with_a_tiny_model(tmp_path) -> None:
    # The example's own config and engine (the embedded one), with the tiny model.
    out = tmp_path / "explore"
    command = [
        sys.executable, "-m", "agentscope_rft.cli", "explore",
        "--config", "examples/web_search/config.yaml",
        "--set", "model.name_or_path=tiny-random",
        "--limit", "4", "--out", str(out),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    rollouts = [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]
    # 4 tasks x group 8; a random model writes no tool call, but every episode is data.
    assert len(rollouts) == 4 * 8
    errors = [r["error"] for r in rollouts if r["status"] not in ("ok", "truncated")]
    assert not errors, errors[0]
    assert all({"f1", "em", "searches"} <= set(r["metrics"]) for r in rollouts)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["explore/failed"] == 0 and summary["explore/rollouts"] == 32


async def test_tasks_of_another_world_need_its_corpus(tmp_path, monkeypatch) -> None:
    # A fresh world, as a user makes one: its questions are about pages the shipped corpus lacks.
    generate(300, train=0, test=8, seed=7, out=tmp_path)
    [task] = [t for t in load_search_tasks(tmp_path / "test.jsonl") if t["type"] == "single_hop"][
        :1
    ]
    oracle = oracle_reply([task])
    shipped = await _episode(ScriptedEngine(oracle), SMALL, task=task)
    assert shipped.status is RolloutStatus.FAILED  # not a silent reward of 0
    assert f"task {task['id']!r} reads page" in (shipped.error or "")
    assert "SearchAgentSettings(corpus=...)" in (shipped.error or "")
    fresh = SearchAgentSettings(corpus=str(tmp_path / "corpus.jsonl"), max_turns=2, demos=0)
    rollout = await _episode(ScriptedEngine(oracle), fresh, task=task)
    assert rollout.status is RolloutStatus.OK and rollout.reward == 1.0, rollout.error
    # The example's app searches $SEARCH_CORPUS when it is set.
    monkeypatch.setenv("SEARCH_CORPUS", str(tmp_path / "corpus.jsonl"))
    app = import_file(Path(__file__).resolve().parents[2] / "examples" / "web_search" / "app.py")
    assert app.SETTINGS.corpus == str(tmp_path / "corpus.jsonl")
