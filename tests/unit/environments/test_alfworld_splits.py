"""The ALFWorld example's splits: held-out games in rooms and goals training never has."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from environments.alfworld.generate import candidates, generate
from environments.alfworld.household import ROOMS, make_layout
from environments.alfworld.splits import Seen, overlaps, receptacle_set, row_keys, split_summary

DATA = Path(__file__).resolve().parents[3] / "examples" / "alfworld" / "data"
EASY = {"task_types": ("pick_and_place_simple",), "sizes": ("small",)}


def _rows(name: str) -> list[dict]:
    return [json.loads(line) for line in (DATA / name).read_text().splitlines()]


def _shipped() -> dict[str, list[dict]]:
    return {split: _rows(f"{split}.jsonl") for split in ("train", "val", "test")}


def test_shipped_splits_share_no_room_and_no_goal() -> None:
    splits = _shipped()
    assert overlaps(splits) == []
    assert len(splits["test"]) >= 100 and len(splits["val"]) >= 40
    for rows in splits.values():
        for row in rows:  # the stored keys are what the game rebuilds to
            assert (row["receptacle_set"], row["goal_key"]) == row_keys(row)
    # Held-out games come from several rooms of every room type, not a handful of layouts.
    for split in ("val", "test"):
        summary = split_summary(splits[split])
        assert summary["rooms"] >= 10 and summary["goals"] >= 30
        assert {row["room"] for row in splits[split]} == {
            "kitchen",
            "livingroom",
            "bedroom",
            "bathroom",
        }
    ids = [row["id"] for rows in splits.values() for row in rows]
    assert len(ids) == len(set(ids))


def test_the_shipped_splits_are_what_the_documented_command_draws() -> None:
    manifest = json.loads((DATA / "manifest.json").read_text())
    counts = {split: manifest[split]["games"] for split in ("train", "val", "test")}
    layouts = {split: manifest[split]["layouts_per_room"] for split in ("train", "val", "test")}
    assert manifest["oracle_check"] and all(
        manifest[split]["oracle_failures_dropped"] == 0 for split in counts
    )  # so the oracle kept every candidate, and the candidates are the rows
    drawn, _ = generate(counts, layouts, manifest["seed"], oracle_check=False, **EASY)
    for split, rows in _shipped().items():
        plan_free = [{k: v for k, v in r.items() if not k.startswith("expert_")} for r in rows]
        assert drawn[split] == plan_free
        assert all(len(r["expert_plan"]) == r["expert_steps"] > 0 for r in rows)


def test_a_fresh_draw_with_another_seed_is_disjoint_and_repeatable() -> None:
    counts = {"train": 60, "val": 20, "test": 30}
    layouts = {"train": 8, "val": 12, "test": 80}
    first, manifest = generate(counts, layouts, seed=7, oracle_check=False, **EASY)
    again, _ = generate(counts, layouts, seed=7, oracle_check=False, **EASY)
    assert first == again
    assert [len(first[s]) for s in counts] == [60, 20, 30]
    assert overlaps(first) == [] and manifest["shared_rooms_or_goals"] == 0
    shipped = _shipped()
    assert [r["seed"] for r in first["test"]] != [r["seed"] for r in shipped["test"][:30]]
    # All six task types in rooms of every size draw apart too.
    mixed, _ = generate({"train": 24, "val": 6, "test": 6}, layouts, seed=3, oracle_check=False)
    assert overlaps(mixed) == []


@pytest.mark.parametrize(
    ("counts", "kinds"),
    [({"train": 1, "val": 1, "test": 1}, {}), ({"train": 3, "val": 0, "test": 2}, EASY)],
)
def test_every_seed_draws_the_asked_counts_disjoint_and_repeatably(
    counts: dict[str, int], kinds: dict
) -> None:
    layouts = {"train": 8, "val": 12, "test": 80}
    for seed in range(12):
        first, _ = generate(counts, layouts, seed=seed, oracle_check=False, **kinds)
        assert {s: len(rows) for s, rows in first.items()} == {s: n for s, n in counts.items() if n}
        assert overlaps(first) == [], seed
        assert generate(counts, layouts, seed=seed, oracle_check=False, **kinds)[0] == first


def test_overlaps_names_a_shared_room_and_a_shared_goal() -> None:
    train = _rows("train.jsonl")[:1]
    room, goal = row_keys(train[0])
    same_layout = {**train[0], "id": "x", "seed": train[0]["seed"] + 1}
    problems = overlaps({"train": train, "test": [same_layout]})
    assert f"train and test share the room {room!r}" in problems
    assert (f"train and test share the goal {goal!r}" in problems) == (
        row_keys(same_layout)[1] == goal
    )
    assert overlaps({"train": train, "val": [], "test": _rows("test.jsonl")[:5]}) == []


def test_a_split_that_avoids_every_room_says_what_to_raise() -> None:
    every_room = {receptacle_set(make_layout(f"{room}-test-{i}")) for room in ROOMS for i in (0, 3)}
    with pytest.raises(ValueError, match="raise the test layouts per room"):
        next(candidates("test", 2, 0, avoid=Seen(rooms=every_room), **EASY))
