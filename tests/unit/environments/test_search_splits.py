"""Train / validation / test questions ask about disjoint entities and facts."""

from __future__ import annotations

import json

import pytest

from environments.search.env import DATA_DIR, SPLITS, load_tasks
from environments.search.index import SearchIndex
from environments.search.pages import render_pages
from environments.search.questions import (
    QUESTION_TYPES,
    generate_questions,
    question_entities,
    question_facts,
)
from environments.search.rewards import exact_match
from environments.search.solvers import scripted_solver
from environments.search.splits import check_disjoint, generate_splits
from environments.search.tools import SearchTools
from environments.search.world import build_world


def _without_id(row: dict) -> dict:
    return {key: value for key, value in row.items() if key != "id"}


def test_shipped_splits_share_no_entity_fact_or_question() -> None:
    splits = {name: load_tasks(name) for name in SPLITS}
    assert check_disjoint(splits) == []
    for rows in splits.values():
        assert {row["type"] for row in rows} == set(QUESTION_TYPES)


def test_shipped_splits_are_what_the_command_writes() -> None:
    manifest = json.loads((DATA_DIR / "manifest.json").read_text())
    sizes = {name: manifest[name] for name in SPLITS}
    world = build_world(manifest["pages"], manifest["seed"])
    fresh = generate_splits(world, sizes, manifest["seed"], manifest["reserved"])
    for name in SPLITS:
        assert [_without_id(row) for row in load_tasks(name)] == fresh[name], name
    # The reserved pages (the agent's worked examples) are named and read by no question.
    by_title = {entity.name: doc_id for doc_id, entity in world.entities.items()}
    reserved = {by_title[title] for title in manifest["reserved"]}
    assert len(reserved) == len(manifest["reserved"]) > 0
    for rows in fresh.values():
        for row in rows:
            assert not question_entities(row) & reserved
            assert not {page for page, _ in question_facts(row)} & reserved


def test_a_fresh_world_with_another_seed_gets_disjoint_splits() -> None:
    world = build_world(500, seed=7)
    splits = generate_splits(world, {"train": 150, "val": 40, "test": 40}, seed=3)
    assert [len(splits[name]) for name in ("train", "val", "test")] == [150, 40, 40]
    assert check_disjoint(splits) == []
    named = {name: set().union(*map(question_entities, rows)) for name, rows in splits.items()}
    assert not named["test"] & named["train"] and not named["val"] & named["train"]
    # Drawn the old way (distinct question texts only), the same world's sets overlap.
    train = generate_questions(world, 150, seed=1)
    test = generate_questions(world, 40, seed=2, exclude={str(row["question"]) for row in train})
    shared = check_disjoint({"train": train, "test": test})
    assert any("question entities" in line for line in shared)
    assert any("facts" in line for line in shared)


@pytest.mark.parametrize("pages", [100, 150, 2000])
async def test_every_seed_and_split_size_gets_disjoint_answerable_questions(pages: int) -> None:
    # A tiny split beside a large one (1 test question, 1,000 training ones) used to get no
    # entity of most kinds and fail with "could not sample a comparison question".
    sizes = [{"train": 1, "test": 1}, {"train": 60, "val": 1, "test": 2}, {"train": 1, "test": 40}]
    if pages == 2000:
        sizes = [{"train": 1000, "val": 1, "test": 1}]
    for seed in range(8 if pages < 2000 else 2):
        world = build_world(pages, seed)
        index = SearchIndex.build(render_pages(world))
        for wanted in sizes:
            splits = generate_splits(world, wanted, seed)
            assert {name: len(rows) for name, rows in splits.items()} == wanted
            assert check_disjoint(splits) == []
            assert generate_splits(world, wanted, seed) == splits  # deterministic per seed
            for rows in splits.values():
                for row in rows[:40]:
                    answer = await scripted_solver(row, SearchTools(index))
                    assert exact_match(answer, row["answer"]) == 1.0, (seed, row)


def test_check_disjoint_names_what_is_shared() -> None:
    asked = {"question": "Q1?", "program": ["start:A", "get:born"], "supporting_ids": ["d1"]}
    # Another entity's chain reads the same fact (d1, born): shared although d1 is not named.
    via = {
        "question": "Q2?",
        "program": ["start:B", "follow:mentor", "get:born"],
        "supporting_ids": ["d2", "d1"],
    }
    assert check_disjoint({"train": [asked], "test": [via]}) == [
        "train and test share 1 facts, e.g. ('d1', 'born')"
    ]


def test_bad_split_arguments_are_clear_errors() -> None:
    world = build_world(300)
    with pytest.raises(ValueError, match=r"unknown split\(s\) \['dev'\]"):
        generate_splits(world, {"dev": 5}, seed=0)
    with pytest.raises(ValueError, match=r"reserved titles \['Nobody'\] are not pages"):
        generate_splits(world, {"train": 5}, seed=0, reserved_titles=["Nobody"])
    with pytest.raises(ValueError, match=r"question counts must be >= 0, got \{'train': -1\}"):
        generate_splits(world, {"train": -1, "test": 5}, seed=0)
    with pytest.raises(ValueError, match=r"cannot draw 5000 train questions from a 300-page world"):
        generate_splits(world, {"train": 5000, "test": 5}, seed=0)
