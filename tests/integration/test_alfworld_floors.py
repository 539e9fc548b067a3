"""The ALFWorld floors: the searcher reads what the app shows, the oracle wins, random repeats."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from types import ModuleType

import pytest

from agentscope_rft.api import import_file
from agentscope_rft.explorer.tasks import load_tasks
from workflows.alfworld_scripted import searcher_reply

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "alfworld"


def _module(name: str) -> ModuleType:
    module: ModuleType = import_file(EXAMPLE / f"{name}.py")
    return module


def test_floors_play_the_searcher_as_the_app_does_and_the_oracle_wins(tmp_path: Path) -> None:
    floors = _module("floors")
    rows = [json.loads(line) for line in (EXAMPLE / "data/test.jsonl").open()][:3]
    searcher = floors.outcomes(rows, "searcher", 1)
    # The same games, played through the real app (gateway, recorder, agent) by the same script.
    rollouts, _ = asyncio.run(
        _module("make_demos").play("run", load_tasks(rows), searcher_reply, 3)
    )
    assert {r.task_id: bool(r.success) for r in rollouts} == searcher
    assert all(floors.outcomes(rows, "oracle", 1).values())
    assert floors.outcomes(rows[:2], "random", 1) == floors.outcomes(rows[:2], "random", 1)
    out = tmp_path / "floors.json"
    floors.main(["--limit", "1", "--policies", "oracle", "--out", str(out)])
    written = json.loads(out.read_text())
    assert written["games"] == 1 and written["max_steps"] == 10
    assert written["policies"] == {"oracle": {rows[0]["id"]: True}}


def test_a_missing_or_broken_task_file_is_one_error_line(tmp_path: Path) -> None:
    floors = _module("floors")
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"id": "g1", "layout": "kitchen-test-0"}\n')
    for path, message in (
        (tmp_path / "none.jsonl", "none.jsonl: no such file"),
        (broken, "task 'g1' needs 'game_file', or 'task_type', 'layout' and 'seed'"),
    ):
        with pytest.raises(SystemExit, match=re.escape(message)):
            floors.main(["--tasks", str(path), "--out", str(tmp_path / "floors.json")])
