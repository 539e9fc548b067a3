"""The synthetic encyclopedia and its questions: deterministic, consistent, answerable."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest

from environments.search.corpus import Document, corpus_fingerprint, load_corpus
from environments.search.env import DATA_DIR, load_tasks
from environments.search.index import SearchIndex
from environments.search.pages import LABELS, render_pages
from environments.search.questions import QUESTION_TYPES, generate_questions, sample_question
from environments.search.rewards import exact_match
from environments.search.solvers import parse_infobox, random_solver, scripted_solver
from environments.search.tools import SearchTools
from environments.search.world import LINKS, World, build_world


@dataclass
class Fixture:
    world: World
    pages: dict[str, Document]
    index: SearchIndex


@pytest.fixture(scope="module")
def small() -> Fixture:
    world = build_world(600, seed=3)
    pages = render_pages(world)
    return Fixture(world, {page.id: page for page in pages}, SearchIndex.build(pages))


def test_world_is_deterministic_and_seed_dependent() -> None:
    first, again = render_pages(build_world(300, seed=1)), render_pages(build_world(300, seed=1))
    assert corpus_fingerprint(first) == corpus_fingerprint(again)
    assert corpus_fingerprint(first) != corpus_fingerprint(render_pages(build_world(300, seed=2)))


def test_world_entities_are_unique_linked_and_consistent() -> None:
    world = build_world(1000, seed=0)
    assert len(world.entities) == 1000
    names = [entity.name for entity in world.entities.values()]
    assert len(set(names)) == len(names)
    for entity in world.entities.values():
        for key, target in entity.links.items():
            assert world.get(target).kind == LINKS[entity.kind][key]
        if entity.kind == "person" and "mentor" in entity.links:
            assert world.get(entity.links["mentor"]).scalars["born"] < entity.scalars["born"]
    for country_id in world.by_kind["country"]:
        capital = world.get(world.get(country_id).links["capital"])
        assert capital.links["country"] == country_id


def test_too_small_a_world_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="too small"):
        build_world(20)


def test_questions_cover_all_types_with_consistent_support(small: Fixture) -> None:
    rows = generate_questions(small.world, 200, seed=5)
    assert {row["type"] for row in rows} == set(QUESTION_TYPES)
    assert len({row["question"] for row in rows}) == len(rows)
    for row in rows:
        assert row["hops"] == len(row["supporting_ids"]) == len(row["supporting_titles"])
        assert row["hops"] == {"single_hop": 1, "two_hop": 2, "comparison": 2}.get(
            row["type"], row["hops"] if row["hops"] in (3, 4) else -1
        )
        if row["type"] != "comparison":
            # The answer is written on the last supporting page, under the asked label.
            page = small.pages[row["supporting_ids"][-1]]
            key = row["program"][-1].split(":", 1)[1]
            assert parse_infobox(f"# title\n\n{page.text}")[LABELS[key]] == row["answer"]


def test_unknown_question_type_is_a_clear_error(small: Fixture) -> None:
    with pytest.raises(ValueError, match="unknown question type 'three_hop'"):
        sample_question(small.world, random.Random(0), "three_hop")
    with pytest.raises(ValueError, match="unknown question type"):
        generate_questions(small.world, 3, seed=0, mix={"three_hop": 1.0})


def test_gold_pages_are_in_the_top_k_for_their_sub_queries(small: Fixture) -> None:
    for row in generate_questions(small.world, 150, seed=7):
        for title, doc_id in zip(row["supporting_titles"], row["supporting_ids"], strict=True):
            assert doc_id in [hit.doc_id for hit in small.index.search(title, k=5)], (row, title)


async def test_scripted_solver_answers_every_question_random_rarely(small: Fixture) -> None:
    rows = generate_questions(small.world, 150, seed=9)
    rng = random.Random(0)
    solved = lucky = 0.0
    for row in rows:
        solved += exact_match(await scripted_solver(row, SearchTools(small.index)), row["answer"])
        guess = await random_solver(row, SearchTools(small.index), rng)
        lucky += exact_match(guess, row["answer"])
    assert solved == len(rows)
    assert lucky < 0.2 * len(rows)


def test_committed_data_is_what_the_generator_writes() -> None:
    committed = load_corpus(DATA_DIR / "corpus.jsonl")
    assert corpus_fingerprint(committed) == corpus_fingerprint(render_pages(build_world(2000, 0)))
    ids = {document.id for document in committed}
    for split, size in (("train", 1000), ("val", 200), ("test", 200)):
        rows = load_tasks(split)
        assert len(rows) == size
        assert all(set(row["supporting_ids"]) <= ids for row in rows)
