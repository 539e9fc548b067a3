"""FrozenLake as text: maps are solvable, the protocol parses replies, the oracle always wins."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from environments.frozenlake.env import FrozenLakeEnv, parse_action, render
from environments.frozenlake.generate import main, make_tasks
from environments.frozenlake.maps import DOWN, LEFT, RIGHT, UP, make_map, shortest_path
from environments.frozenlake.solvers import oracle_episode, random_episode
from environments.frozenlake.tasks import load_tasks, reward
from environments.jsonl import TaskFileError


def test_generated_maps_are_always_solvable_and_deterministic() -> None:
    for size in (2, 3, 4, 6, 8, 10):
        for seed in range(40):
            desc = make_map(size, 0.7, seed)
            assert len(desc) == size and all(len(line) == size for line in desc)
            assert desc[0][0] == "S" and desc[-1][-1] == "G"
            assert shortest_path(desc) is not None
    assert make_map(6, 0.8, 3) == make_map(6, 0.8, 3)
    assert make_map(6, 0.8, 3) != make_map(6, 0.8, 4)
    with pytest.raises(ValueError, match="p_frozen"):
        make_map(4, 0.3, 0)


def test_shortest_path_by_hand() -> None:
    assert shortest_path(["SFF", "HHF", "GFF"]) == [RIGHT, RIGHT, DOWN, DOWN, LEFT, LEFT]
    assert shortest_path(["SH", "HG"]) is None
    assert shortest_path(["SF", "FG"], start=(0, 1)) == [DOWN]


def test_parse_action_protocol() -> None:
    assert parse_action("<action>up</action>") == UP
    assert parse_action("Left is a hole, so <action> DOWN </action>.") == DOWN
    assert parse_action("I go left... no, right") == RIGHT
    assert parse_action("<action>jump</action> left") is None  # a tag wins, and it is invalid
    assert parse_action("") is None


def test_episode_text_rewards_and_budget() -> None:
    env = FrozenLakeEnv({"map": ["SFF", "FHF", "FFG"], "max_steps": 3})
    opening = env.reset()
    assert opening.text == "A new game starts.\nP F F\nF H F\nF F G\nYou are at row 1, column 1."
    result = env.step("<action>up</action>")
    assert result.text.startswith("You tried to move up but stayed in place.")
    result = env.step("dance")
    assert result.text.startswith("Invalid move") and result.steps == 2 and not result.done
    result = env.step("right")
    assert result.done and not result.won and result.text.startswith("You move right. You are out")
    with pytest.raises(RuntimeError, match="episode is over"):
        env.step("down")
    env.reset()
    env.step("down")
    hole = env.step("right")
    assert hole.done and hole.reward == 0.0 and "hole" in hole.text
    env = FrozenLakeEnv({"map": ["SF", "FG"]})
    env.reset()
    env.step("right")
    won = env.step("down")
    assert won.won and won.done and won.reward == reward(won) == 1.0
    assert render(["SF", "FG"], 1, 1) == "S F\nF P"


def test_slippery_episodes_are_reproducible_from_the_seed() -> None:
    task = {"map": make_map(5, 0.9, 1), "is_slippery": True, "seed": 7, "max_steps": 40}

    def play() -> list[str]:
        env = FrozenLakeEnv(task)
        env.reset()
        texts = []
        for _ in range(10):
            result = env.step("right")
            texts.append(result.text)
            if result.done:
                break
        return texts

    first = play()
    assert first == play()
    assert any("slipped" in text for text in first)


def test_oracle_wins_every_committed_and_fresh_task_random_rarely() -> None:
    rows = load_tasks("test") + make_tasks("fresh", 50, seed=5)
    rng = random.Random(0)
    assert all(oracle_episode(row) == (True, row["shortest_path"]) for row in rows)
    assert sum(random_episode(row, rng)[0] for row in rows) < 0.1 * len(rows)


def test_committed_sets_match_the_generator_and_do_not_overlap() -> None:
    train, test = load_tasks("train"), load_tasks("test")
    assert train == make_tasks("train", 1000, seed=0)
    assert not {tuple(row["map"]) for row in train} & {tuple(row["map"]) for row in test}
    assert {row["size"] for row in test} == {4, 5, 6, 7, 8}


def test_bad_task_files_are_clear_errors(tmp_path: Path) -> None:
    path = tmp_path / "lake.jsonl"
    path.write_text(json.dumps({"id": "a", "map": ["SF", "F"]}) + "\n")
    with pytest.raises(TaskFileError, match="'map' must be equal-length rows"):
        load_tasks(path)
    for unwinnable in (["SF", "FF"], ["SH", "HG"]):  # no goal; a goal behind holes
        path.write_text(json.dumps({"id": "a", "map": unwinnable}) + "\n")
        with pytest.raises(TaskFileError, match="task 'a': no path from S to a G"):
            load_tasks(path)
    path.write_text('{"id": "a", "map": ["SF", "FG"]}\n{"id": "b", "map": \n')
    with pytest.raises(TaskFileError, match=r"lake\.jsonl:2: not valid JSON"):
        load_tasks(path)


def test_generate_skips_an_empty_split_and_stops_when_maps_run_out(tmp_path: Path) -> None:
    main(["--train", "5", "--test", "0", "--sizes", "4", "--out", str(tmp_path)])
    assert len(load_tasks(tmp_path / "train.jsonl")) == 5
    assert not (tmp_path / "test.jsonl").exists()
    assert "test" not in json.loads((tmp_path / "manifest.json").read_text())
    # A 2 x 2 lake has 3 solvable maps: asking for more is an error, not an endless loop.
    with pytest.raises(ValueError, match=r"only 3 of 20 distinct maps of sizes \[2\]"):
        make_tasks("train", 20, seed=0, sizes=(2,))
    with pytest.raises(ValueError, match=r"train: the number of tasks must be >= 0, got -1"):
        make_tasks("train", -1, seed=0)
