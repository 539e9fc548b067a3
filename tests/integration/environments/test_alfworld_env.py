"""ALFWorld through TextWorld's real PDDL engine: generated games, real-format game files."""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path
from typing import Any

import pytest

from environments.alfworld.env import AlfworldEnv
from environments.alfworld.games import game_data, goal_text, traj_data
from environments.alfworld.generate import candidates
from environments.alfworld.real import export_games, find_games
from environments.alfworld.solvers import oracle_episode
from environments.alfworld.tasks import TASK_TYPES, make_household

# A generated test set the committed data does not contain: one task of each type, in the
# small test layouts (`room-test-0`), which keeps the real engine quick.
FRESH_TEST_SET = [
    {"id": f"fresh-{i}", **row}
    for i, row in zip(range(6), candidates("test", 1, seed=123), strict=False)
]
_PLANS: dict[str, list[str]] = {}


async def _plan(task: dict[str, Any]) -> list[str]:
    if task["id"] not in _PLANS:
        _PLANS[task["id"]] = (await oracle_episode(task)).commands
    return _PLANS[task["id"]]


def test_fresh_test_set_has_every_task_type() -> None:
    assert sorted(task["task_type"] for task in FRESH_TEST_SET) == sorted(TASK_TYPES)


@pytest.mark.parametrize("task", FRESH_TEST_SET, ids=lambda task: task["task_type"])
async def test_oracle_solves_every_task_of_a_generated_test_set(task: dict[str, Any]) -> None:
    episode = await oracle_episode(task)
    assert episode.won, task
    assert 2 <= episode.steps <= 20
    _PLANS[task["id"]] = episode.commands


@pytest.mark.parametrize("seed", [7, 2024, 99991])
async def test_oracle_solves_games_of_other_seeds_and_rooms(seed: int) -> None:
    # Every generated game is solvable, whatever the seed: medium and large rooms included.
    rows = candidates("train", 3, seed=seed)
    for _, row in zip(range(2), rows, strict=False):
        episode = await oracle_episode({"id": f"seed-{seed}", **row})
        assert episode.won, row


async def test_observations_read_like_alfworld_and_wrong_commands_do_nothing() -> None:
    task = FRESH_TEST_SET[0]
    with AlfworldEnv(task, max_steps=3) as env:
        observation = await env.reset()
        assert observation.text.startswith("-= Welcome to TextWorld, ALFRED! =-\n\n")
        assert "You are in the middle of a room. Looking quickly around you, you see a " in (
            observation.text
        )
        assert observation.text.endswith(f"Your task is to: {task['goal']}.")
        assert observation.goal == task["goal"] and "UNKNOWN GOAL" not in observation.text
        assert {"look", "inventory", "help"} <= set(observation.admissible_commands)
        go_to = [c for c in observation.admissible_commands if c.startswith("go to ")]
        assert len(go_to) == task["num_receptacles"]
        wrong = await env.step("take apple 99 from the moon 1")
        assert (wrong.text, wrong.reward, wrong.done) == ("Nothing happens.", 0.0, False)
        arrived = await env.step(go_to[0].upper() + ".")  # case and a final period are ignored
        assert arrived.text.startswith(f"You arrive at {go_to[0].removeprefix('go to ')}.")
        last = await env.step("inventory")
        assert last.done and not last.won and last.steps == 3
        with pytest.raises(RuntimeError, match="episode is over"):
            await env.step("look")
    with pytest.raises(RuntimeError, match="closed"):
        await env.reset()


async def test_concurrent_episodes_match_sequential_ones() -> None:
    tasks = FRESH_TEST_SET[:2]

    async def play(task: dict[str, Any]) -> list[str]:
        with AlfworldEnv(task) as env:
            observation = await env.reset()
            texts = [observation.text]
            rng = random.Random(task["id"])
            admissible = observation.admissible_commands
            for _ in range(3):
                result = await env.step(rng.choice(admissible))
                texts.append(result.text)
                admissible = result.admissible_commands
            return texts

    sequential = [await play(task) for task in tasks]
    assert await asyncio.gather(*(play(task) for task in tasks)) == sequential


def _write_alfworld_game(folder: Path, task: dict[str, Any], solvable: bool = True) -> str:
    """A game folder the way `alfworld-generate` writes it, goal text by alfworld's own code."""
    from alfworld.agents.utils.misc import add_task_to_grammar

    household = make_household(task["task_type"], task["layout"], task["seed"])
    traj = traj_data(household, goal_text(household, task["seed"]), task["id"])
    data = game_data(household, "UNKNOWN GOAL")
    random.seed(0)  # alfworld picks the goal template with the global random module
    data["grammar"] = add_task_to_grammar(data["grammar"], traj)
    data |= {"solvable": solvable, "walkthrough": task["expert_plan"] if solvable else None}
    folder.mkdir(parents=True)
    (folder / "traj_data.json").write_text(json.dumps(traj))
    (folder / "initial_state.pddl").write_text(data["pddl_problem"])
    (folder / "game.tw-pddl").write_text(json.dumps(data))
    return data["grammar"].split("Your task is to: ", 1)[1].split(".", 1)[0]


async def test_real_data_adapter_plays_games_in_alfworld_format(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    task = FRESH_TEST_SET[3]
    task = task | {"expert_plan": await _plan(task)}
    split = tmp_path / "json_2.1.1" / "valid_unseen"
    goal = _write_alfworld_game(split / f"{task['task_type']}-Pan-None-Fridge-1" / "trial_T1", task)
    _write_alfworld_game(split / "pick_and_place_simple-x" / "trial_T2", task, solvable=False)
    _write_alfworld_game(split / "pick_and_place_with_movable_recep-x" / "trial_T3", task)
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path))

    (row,) = find_games("valid_unseen")
    assert row["task_type"] == task["task_type"] and row["game_file"].endswith("T1/game.tw-pddl")
    with AlfworldEnv(row) as env:
        observation = await env.reset()
        assert observation.goal == goal
        for command in json.loads(Path(row["game_file"]).read_text())["walkthrough"]:
            result = await env.step(command)
        assert result.won and result.reward == 1.0

    # alfworld's own loader accepts the same folder.
    from alfworld.agents.environment.alfred_tw_env import AlfredTWEnv

    config = {
        "env": {"goal_desc_human_anns_prob": 0, "task_types": [1, 2, 3, 4, 5, 6]},
        "dataset": {"eval_ood_data_path": str(split), "num_eval_games": -1},
    }
    assert AlfredTWEnv(config, "eval_out_of_distribution").game_files == [row["game_file"]]


def test_export_and_find_games_round_trip(tmp_path: Path) -> None:
    tasks = [task | {"expert_plan": ["look"]} for task in FRESH_TEST_SET]
    paths = export_games(tasks, tmp_path, "valid_seen")
    rows = find_games("valid_seen", data_dir=tmp_path, task_types=["pick_two_obj_and_place"])
    assert [row["game_file"] for row in rows] == [
        str(path)
        for path, task in zip(paths, tasks, strict=True)
        if task["task_type"] == "pick_two_obj_and_place"
    ]


def test_rows_from_a_relative_data_folder_hold_from_anywhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    export_games(FRESH_TEST_SET[:1], tmp_path / "alfworld", "valid_seen")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ALFWORLD_DATA", "alfworld")  # as `export ALFWORLD_DATA=alfworld`
    [row] = find_games("valid_seen")
    assert Path(row["game_file"]).is_absolute() and Path(row["game_file"]).is_file()


def test_real_data_errors_name_the_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ALFWORLD_DATA", raising=False)
    with pytest.raises(FileNotFoundError, match="ALFWORLD_DATA is not set"):
        find_games()
    with pytest.raises(FileNotFoundError, match=r"no json_2\.1\.1/ folder"):
        find_games(data_dir=tmp_path)
    with pytest.raises(ValueError, match="unknown ALFWorld split 'valid'"):
        find_games("valid", data_dir=tmp_path)
    (tmp_path / "json_2.1.1" / "train").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match="no solvable games"):
        find_games("train", data_dir=tmp_path)
    # A split that was not downloaded (or extracted elsewhere) is named as missing.
    with pytest.raises(
        FileNotFoundError, match=r"json_2\.1\.1/valid_unseen: no such folder.*has: train"
    ):
        find_games("valid_unseen", data_dir=tmp_path)


def test_broken_game_folders_are_named(tmp_path: Path) -> None:
    [first, second] = export_games(FRESH_TEST_SET[:2], tmp_path, "train")
    traj_path = first.parent / "traj_data.json"
    traj_text = traj_path.read_text()
    traj_path.write_text("{broken")
    with pytest.raises(ValueError, match=rf"{traj_path}: not readable JSON"):
        find_games("train", data_dir=tmp_path)
    traj_path.write_text("{}")
    with pytest.raises(ValueError, match=rf"{traj_path}: no 'task_type' text"):
        find_games("train", data_dir=tmp_path)
    # Annotations of the wrong shape: a ValueError naming the file (was AttributeError/KeyError).
    for turk, message in (
        (None, "'turk_annotations' must be"),
        ([], "'turk_annotations' must be"),
        ({"anns": "x"}, "'turk_annotations' must be"),
        ({"anns": [{}]}, "the first of 'turk_annotations.anns' has no 'task_desc'"),
    ):
        traj = {**json.loads(traj_text), "turk_annotations": turk}
        traj_path.write_text(json.dumps(traj))
        with pytest.raises(ValueError, match=rf"{traj_path}: {message}"):
            find_games("train", data_dir=tmp_path)
    traj_path.write_text(traj_text)
    first.write_text("[1]")
    with pytest.raises(ValueError, match=rf"{first}: expected a JSON object, got list"):
        find_games("train", data_dir=tmp_path)
    # Game folders without their game files: the error says why none was found.
    first.unlink()
    second.unlink()
    with pytest.raises(FileNotFoundError, match=r"in 2 game folders \(2 without game\.tw-pddl\)"):
        find_games("train", data_dir=tmp_path)
