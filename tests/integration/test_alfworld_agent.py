"""The ALFWorld agent app on the real game engine: episodes, context modes, concurrency, errors.

A scripted engine plays a simple searching policy read off each prompt (`searcher_reply`, so
episodes can win);
a tiny random model runs the app end to end through `check_workflow`.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from agentscope_rft.api import import_file
from agentscope_rft.check import check_workflow
from agentscope_rft.engines.embedded import EmbeddedEngine
from agentscope_rft.explorer.explorer import EpisodeSettings, Explorer
from agentscope_rft.explorer.tasks import load_tasks as load_task_rows
from agentscope_rft.explorer.trajectory import build_samples
from agentscope_rft.gateway.server import Gateway
from agentscope_rft.testing import ScriptedEngine
from agentscope_rft.types import Rollout
from environments.alfworld import AlfworldEnv, export_games, find_games
from workflows.alfworld_agent import (
    AlfworldAgentSettings,
    SubgoalTracker,
    make_workflow,
    parse_command,
    window_prompt,
)
from workflows.alfworld_scripted import searcher_reply

TASKS = [
    {"id": f"t{i}", "task_type": "pick_and_place_simple", "layout": layout, "seed": seed}
    for i, (layout, seed) in enumerate(
        [
            ("bedroom-train-3", 11),
            ("kitchen-train-3", 5),
            ("livingroom-train-0", 7),
            ("bathroom-train-0", 3),
            ("bedroom-train-0", 21),
            ("kitchen-train-0", 2),
        ]
    )
]


def _text(message: dict[str, Any]) -> str:
    content = message.get("content") or ""
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content)
    return str(content)


async def _explore(
    run: Any, tasks: list[dict[str, Any]], concurrent: bool
) -> tuple[list[Rollout], ScriptedEngine]:
    engine = ScriptedEngine(searcher_reply)
    async with Gateway(engine) as gateway:
        explorer = Explorer(run, gateway, EpisodeSettings(max_retries=0))
        try:
            loaded = load_task_rows(tasks)
            if concurrent:
                rollouts = await asyncio.gather(*(explorer.run_episode(t) for t in loaded))
            else:
                rollouts = [await explorer.run_episode(t) for t in loaded]
        finally:
            await explorer.close()
    return list(rollouts), engine


def _commands(rollout: Rollout) -> list[str]:
    return [c.content or "" for c in sorted(rollout.calls, key=lambda c: c.started_at)]


async def test_full_history_trains_one_merged_sample_with_observations_masked() -> None:
    run = make_workflow(AlfworldAgentSettings(max_steps=12))
    [rollout], engine = await _explore(run, TASKS[:1], concurrent=False)
    assert rollout.ok and rollout.success and rollout.reward == 1.0, _commands(rollout)
    assert (rollout.status, rollout.truncated) == ("ok", None)
    commands = _commands(rollout)
    assert commands[-1].startswith("move baseballbat")
    [sample], stats = build_samples(rollout)
    assert sample.num_calls == len(commands) == int(rollout.metrics["steps"])
    assert stats.breaks == {}
    trained = engine.tokenizer.decode(
        [t for t, m in zip(sample.token_ids, sample.loss_mask, strict=True) if m]
    )
    masked = engine.tokenizer.decode(
        [t for t, m in zip(sample.token_ids, sample.loss_mask, strict=True) if not m]
    )
    for command in commands:
        assert command in trained
    assert "You arrive at" in masked and "You arrive at" not in trained
    assert "Admissible actions" in masked and "Admissible actions" not in trained
    assert sample.reward == 1.0 and sample.token_rewards is None
    assert sample.step_states is not None and len(sample.step_states) == sample.num_calls
    assert len(set(sample.step_states)) == sample.num_calls  # every turn a different state


async def test_window_mode_trains_one_sample_per_turn_with_step_rewards_on_its_command() -> None:
    settings = AlfworldAgentSettings(
        max_steps=4, context="window", window=2, invalid_command_reward=-0.05
    )
    run = make_workflow(settings)
    engine = ScriptedEngine(lambda messages, tools: "dance wildly")  # never admissible
    async with Gateway(engine) as gateway:
        explorer = Explorer(run, gateway, EpisodeSettings(max_retries=0))
        rollout = await explorer.run_episode(load_task_rows(TASKS[1:2])[0])
        await explorer.close()
    assert rollout.ok and not rollout.success and rollout.reward == -0.1
    assert (rollout.status, rollout.truncated) == ("truncated", "turn_limit")
    assert rollout.metrics["invalid_commands"] == 4.0
    samples, _ = build_samples(rollout)
    assert [s.num_calls for s in samples] == [1, 1, 1, 1]
    for sample in samples:
        assert sample.reward == -0.1
        last_trained = max(i for i, m in enumerate(sample.loss_mask) if m)
        assert sample.token_rewards is not None
        assert [i for i, r in enumerate(sample.token_rewards) if r] == [last_trained]
        assert sample.token_rewards[last_trained] == pytest.approx(-0.05)
    # The last prompt shows the last two turns and the current observation, not the first turn.
    prompt = _text(engine.requests[-1].messages[-1])
    assert "You have taken 3 step(s). Your last 2 step(s), oldest first:" in prompt
    assert "[3] Nothing happens. > dance wildly" in prompt
    assert "[2] Nothing happens. > dance wildly" in prompt and "[1]" not in prompt
    assert prompt.startswith("Your task is to: ")


async def test_subgoal_rewards_land_on_the_take_and_the_go_to_target_commands() -> None:
    settings = AlfworldAgentSettings(max_steps=10, subgoal_reward=0.2)
    rollouts, _ = await _explore(make_workflow(settings), TASKS[:1], concurrent=False)
    [rollout] = rollouts
    assert rollout.success and rollout.metrics["subgoals"] == 2.0
    commands = _commands(rollout)
    [sample], _ = build_samples(rollout)
    assert sample.token_rewards is not None
    rewarded = [i for i, r in enumerate(sample.token_rewards) if r]
    assert [sample.token_rewards[i] for i in rewarded] == [pytest.approx(0.2)] * 2
    # Each reward sits on the last token of a command: the take, then the go-to with it in hand.
    mask = [*sample.loss_mask, 0]
    ends = [i for i, m in enumerate(mask[:-1]) if m and not mask[i + 1]]
    rewarded_commands = [commands[ends.index(i)] for i in rewarded]
    assert rewarded_commands[0].startswith("take ")
    assert rewarded_commands[1].startswith("go to ")


def test_subgoal_tracker_needs_the_object_in_hand_and_a_real_arrival() -> None:
    tracker = SubgoalTracker("put a hot apple in fridge")
    assert (tracker.obj, tracker.target) == ("apple", "fridge")
    assert tracker.update("go to fridge 1", "You arrive at fridge 1.") == 0  # not holding it
    assert tracker.update("take apple 1 from countertop 1", "Nothing happens.") == 0
    assert (
        tracker.update(
            "take apple 1 from countertop 1", "You pick up the apple 1 from the countertop 1."
        )
        == 1
    )
    assert (
        tracker.update(
            "take apple 2 from countertop 1", "You pick up the apple 2 from the countertop 1."
        )
        == 0
    )
    assert tracker.update("go to fridge 1", "You arrive at fridge 1.") == 1
    assert tracker.update("go to fridge 1", "You arrive at fridge 1.") == 0
    assert (
        SubgoalTracker("look at bowl under the desklamp").update(
            "take bowl 1 from desk 1", "You pick up the bowl 1."
        )
        == 0
    )


async def test_concurrent_episodes_do_not_share_game_state() -> None:
    run = make_workflow(AlfworldAgentSettings(max_steps=12))
    sequential, _ = await _explore(run, TASKS, concurrent=False)
    concurrent, _ = await _explore(run, TASKS, concurrent=True)
    assert sum(r.success for r in sequential) >= 4
    for one, other in zip(sequential, concurrent, strict=True):
        assert other.ok and _commands(one) == _commands(other)
        assert (one.reward, one.metrics["steps"]) == (other.reward, other.metrics["steps"])


async def test_the_app_runs_end_to_end_on_a_tiny_model(tiny_model_path: str) -> None:
    run = make_workflow(AlfworldAgentSettings(max_steps=3, demo=False))
    # A short context bounds how much a random model can babble per call.
    engine = EmbeddedEngine(tiny_model_path, dtype="float32", device="cpu", max_model_len=640)
    report = await check_workflow(run, TASKS[2], engine=engine, show=False)
    await engine.close()
    assert report.rollout.ok, report.rollout.error
    assert len(report.rollout.calls) == 3 and report.rollout.metrics["steps"] == 3.0
    # A random model's babble may not survive the chat template's round trip, so its calls need
    # not merge; whatever the split, every call is trained once and its prompt is masked.
    assert sum(s.num_calls for s in report.samples) == 3
    for sample in report.samples:
        assert 0 < sample.num_trained_tokens < len(sample.token_ids)
        assert sample.reward == -0.1


def test_parse_command_and_window_prompt() -> None:
    assert parse_command("> Take Apple 1 from Fridge 1.") == "take apple 1 from fridge 1"
    assert parse_command("\n\n1. go to desk 1\nthen more") == "go to desk 1"
    assert parse_command("go to cabinet 1, go to cabinet 2, go to ") == "go to cabinet 1"
    history = [("You arrive at desk 1.\nOn it...", "go to desk 1"), ("Nothing happens.", "x")]
    prompt = window_prompt(
        "put a pen in drawer", history, "Now here.", AlfworldAgentSettings(window=1)
    )
    assert prompt.splitlines() == [
        "Your task is to: put a pen in drawer.",
        "You have taken 2 step(s). Your last 1 step(s), oldest first:",
        "[2] Nothing happens. > x",
        "Now: Now here.",
    ]


async def test_a_step_limit_of_zero_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match=r"max_steps = 0: the step limit must be a whole number"):
        AlfworldAgentSettings(max_steps=0)
    run = make_workflow(AlfworldAgentSettings(max_steps=3))
    [rollout], _ = await _explore(run, [{**TASKS[0], "max_steps": 0}], concurrent=False)
    assert not rollout.ok and "task 't0' max_steps = 0" in (rollout.error or "")


def test_a_missing_alfworld_data_folder_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path / "nowhere"))
    with pytest.raises(FileNotFoundError, match="ALFWORLD_DATA"):
        find_games("valid_seen")


async def test_real_data_layout_plays_and_a_broken_game_file_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    export_games(TASKS[:1], tmp_path, "valid_seen")
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path))
    [row] = find_games("valid_seen")
    run = make_workflow(AlfworldAgentSettings(max_steps=12))
    [rollout], _ = await _explore(run, [{**row, "id": "real"}], concurrent=False)
    assert rollout.ok and rollout.success
    broken = Path(row["game_file"])
    broken.write_text(json.dumps({"pddl_domain": "(define", "grammar": ""}))
    with pytest.raises(ValueError, match=f"{broken} lacks pddl_problem"):
        AlfworldEnv({"game_file": str(broken)})
    broken.write_text("{not json")
    with pytest.raises(ValueError, match=f"{broken} is not a game"):
        AlfworldEnv({"game_file": str(broken)})
    [rollout], _ = await _explore(run, [{"id": "gone", "game_file": str(tmp_path / "x")}], False)
    assert not rollout.ok and "does not exist" in (rollout.error or "")


def _make_demos_module() -> Any:
    return import_file(Path(__file__).resolve().parents[2] / "examples/alfworld/make_demos.py")


@pytest.mark.parametrize("context", ["full", "window"])
async def test_demonstrations_train_exactly_the_tokens_the_agent_produces(
    context: str, tmp_path: Path
) -> None:
    # The searcher's won game, written as chat JSONL by make_demos.py and read back as SFT
    # samples, must be token for token the sample the gateway recorded for that episode, with the
    # same tokens trained: the warm start teaches the commands in the app's own prompts.
    from agentscope_rft.buffer.offline import load_sft_samples
    from agentscope_rft.chat.template import ChatRenderer
    from agentscope_rft.demos import conversations as demo_conversations

    # (without the worked game: SFT trains every assistant turn, the worked game's included)
    settings = AlfworldAgentSettings(max_steps=12, context=context, window=12, demo=False)
    [rollout], engine = await _explore(make_workflow(settings), TASKS[:1], concurrent=False)
    assert rollout.success or context == "window"  # (the searcher plays full history only)
    requests = [r for r in engine.requests if r.rollout_id == rollout.rollout_id]
    conversations = demo_conversations(requests, searcher_reply)
    recorded, _ = build_samples(rollout)
    assert len(conversations) == len(recorded) == (1 if context == "full" else len(requests))
    assert all(tools is None for _, tools in conversations)  # the game offers no tools
    path = tmp_path / "demos.jsonl"
    path.write_text("".join(json.dumps({"messages": m}) + "\n" for m, _ in conversations))
    demos = load_sft_samples(path, ChatRenderer(engine.tokenizer))
    for demo, sample in zip(demos, recorded, strict=True):
        n = len(sample.token_ids)
        assert list(demo.token_ids[:n]) == list(sample.token_ids)
        assert list(demo.loss_mask[:n]) == list(sample.loss_mask)
        assert not any(demo.loss_mask[n:])  # only the template's trailing newline follows


async def test_make_demos_replays_the_searchers_won_games_in_the_window_app(tmp_path: Path) -> None:
    # The searcher cannot play from a window (it avoids receptacles it has visited), so its won
    # games are replayed in the window app: the same games are won with the same commands, and each
    # turn becomes one conversation with that app's own window prompt.
    import argparse

    module = _make_demos_module()
    example = Path(__file__).resolve().parents[2] / "examples" / "alfworld"
    tasks = tmp_path / "games.jsonl"
    tasks.write_text("".join((example / "data/train.jsonl").read_text().splitlines(True)[:3]))
    common = {"tasks": str(tasks), "workflow": "run", "limit": 0, "concurrency": 3}
    full = await module.make_demos(
        argparse.Namespace(**common, out=str(tmp_path / "full.jsonl"), replay_in=None)
    )
    window = await module.make_demos(
        argparse.Namespace(**common, out=str(tmp_path / "window.jsonl"), replay_in="run_window")
    )
    assert full["won"] == window["won"] >= 1
    by_game_full = {}
    for line in (tmp_path / "full.jsonl").read_text().splitlines():
        record = json.loads(line)
        by_game_full[record["id"]] = [
            m["content"] if isinstance(m["content"], str) else m["content"][0]["text"]
            for m in record["messages"]
            if m["role"] == "assistant"
        ]
    by_game_window: dict[str, list[str]] = {}
    for line in (tmp_path / "window.jsonl").read_text().splitlines():
        record = json.loads(line)
        user = record["messages"][1]["content"][0]["text"]
        assert user.startswith("Your task is to:") and "Admissible actions:" in user
        by_game_window.setdefault(record["id"], []).append(record["messages"][-1]["content"])
    assert by_game_window == by_game_full


@pytest.mark.parametrize(
    "task_type",
    [
        "pick_and_place_simple",
        "pick_clean_then_place_in_recep",
        "pick_heat_then_place_in_recep",
        "pick_cool_then_place_in_recep",
        "pick_two_obj_and_place",
    ],
)
def test_subgoal_tracker_reads_every_alfworld_goal_template_of_a_put_task(task_type: str) -> None:
    # Games (generated or downloaded) phrase a goal with either of alfworld's templates, e.g.
    # "put a hot egg in diningtable" or "heat some egg and put it in diningtable".
    from alfworld.gen import goal_library

    for template in goal_library.gdict[task_type]["templates"]:
        goal = template.format(obj="egg", recep="diningtable", toggle="", mrecep="")
        tracker = SubgoalTracker(goal)
        assert (tracker.obj, tracker.target) == ("egg", "diningtable"), goal
