"""Train / validation / test question sets that ask about disjoint parts of one world.

A test question must not be answerable by remembering training: its entities and the facts it
reads are never asked about in training. The world's entities are dealt into three shares (per
kind, in proportion to the split sizes); a split's questions name only entities of its share
(`question_entities`), and no two splits read the same `(page, attribute)` fact
(`question_facts`), whichever entities their chains pass through. Test questions are drawn first,
then validation, then training, each avoiding the facts the earlier ones read, so the held-out
splits keep the generator's natural distribution and training gives up what they use.

Reserved entities (the worked examples an agent keeps in its memory) are named by no question
and have none of their facts read.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import Any

from environments.search.questions import (
    DEFAULT_MIX,
    generate_questions,
    question_entities,
    question_facts,
)
from environments.search.world import World

SPLITS = ("test", "val", "train")
"""Split names in the order their questions are drawn."""
MIN_SHARE = 2
"""Entities of each kind dealt to every split, however few questions it asks (pool allowing)."""


def deal_entities(
    world: World, sizes: Mapping[str, int], seed: int, reserved: AbstractSet[str] = frozenset()
) -> dict[str, dict[str, list[str]]]:
    """Each split's share of the world's entities, per kind, in proportion to `sizes` and at
    least `MIN_SHARE` of each kind (as far as the kind has entities for every split).

    Args:
        world: The world.
        sizes: Split name -> number of questions.
        seed: The dealing seed.
        reserved: Page ids dealt to no split.

    Returns:
        Split -> kind -> page ids.

    Example:
        >>> from environments.search.world import build_world
        >>> shares = deal_entities(build_world(300), {"train": 3, "test": 1}, seed=0)
        >>> len(shares["train"]["person"]) > len(shares["test"]["person"])
        True
    """
    rng = random.Random(f"splits-{world.seed}-{seed}")
    total = sum(sizes.values())
    shares: dict[str, dict[str, list[str]]] = {name: {} for name in sizes}
    for kind, ids in sorted(world.by_kind.items()):
        pool = sorted(doc_id for doc_id in ids if doc_id not in reserved)
        rng.shuffle(pool)
        # A comparison needs two entities of a kind: a split far smaller than the others
        # (1 test question beside 1,000 training ones) still gets two of each.
        floor = min(MIN_SHARE, len(pool) // len(sizes))
        start = 0
        for i, (name, size) in enumerate(sizes.items()):
            later = len(sizes) - i - 1
            if later == 0:
                end = len(pool)
            else:
                wanted = max(floor, round(len(pool) * size / total))
                end = start + min(wanted, len(pool) - start - floor * later)
            shares[name][kind] = sorted(pool[start:end])
            start = end
    return shares


def generate_splits(
    world: World,
    sizes: Mapping[str, int],
    seed: int,
    reserved_titles: Sequence[str] = (),
    mix: Mapping[str, float] = DEFAULT_MIX,
) -> dict[str, list[dict[str, object]]]:
    """Question sets over disjoint entities and facts (see the module docstring).

    Args:
        world: The world.
        sizes: Split name (`test`, `val`, `train`) -> number of questions; 0 skips a split.
        seed: The question seed.
        reserved_titles: Titles of entities no question may name or read.
        mix: Question type -> weight, the same for every split.

    Returns:
        Split name -> question rows (without ids).

    Raises:
        ValueError: An unknown split or reserved title, a negative size, or more questions
            than the world has for a split.

    Example:
        >>> from environments.search.world import build_world
        >>> rows = generate_splits(build_world(400), {"train": 20, "test": 5}, seed=0)
        >>> check_disjoint(rows)
        []
    """
    unknown = sorted(set(sizes) - set(SPLITS))
    if unknown:
        raise ValueError(f"unknown split(s) {unknown}; use {', '.join(SPLITS)}")
    negative = {name: size for name, size in sizes.items() if size < 0}
    if negative:
        raise ValueError(f"question counts must be >= 0, got {negative} (--train/--val/--test)")
    by_title = {entity.name: doc_id for doc_id, entity in world.entities.items()}
    missing = [title for title in reserved_titles if title not in by_title]
    if missing:
        raise ValueError(f"reserved titles {missing} are not pages of this world")
    reserved = {by_title[title] for title in reserved_titles}
    blocked = {
        (doc_id, key)
        for doc_id in reserved
        for key in (*world.get(doc_id).scalars, *world.get(doc_id).links)
    }
    wanted = {name: sizes[name] for name in SPLITS if sizes.get(name)}
    shares = deal_entities(world, wanted, seed, reserved)
    splits: dict[str, list[dict[str, object]]] = {}
    for offset, name in enumerate(wanted):
        try:
            rows = generate_questions(
                world,
                wanted[name],
                seed=seed * len(SPLITS) + offset + 1,
                mix=mix,
                starts=shares[name],
                exclude_facts=blocked,
            )
        except RuntimeError as exc:
            raise ValueError(
                f"cannot draw {wanted[name]} {name} questions from a {len(world.entities)}-page "
                f"world: {exc}"
            ) from exc
        for row in rows:
            blocked |= question_facts(row)
        splits[name] = rows
    return splits


def check_disjoint(splits: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[str]:
    """What two splits share: named entities, read facts or question texts (empty: none).

    Args:
        splits: Split name -> generated question rows (with `program` and `supporting_ids`).

    Returns:
        One line per shared item kind and pair of splits, with an example.

    Example:
        >>> row = {"question": "Q?", "program": ["start:A", "get:born"], "supporting_ids": ["d1"]}
        >>> check_disjoint({"train": [row], "test": [row]})[0]
        "train and test share 1 question entities, e.g. 'd1'"
    """
    views: dict[str, Callable[[Mapping[str, Any]], set[Any]]] = {
        "question entities": question_entities,
        "facts": question_facts,
        "questions": lambda row: {row["question"]},
    }
    problems = []
    names = list(splits)
    for what, view in views.items():
        sets: dict[str, set[Any]] = {
            name: set().union(*(view(row) for row in splits[name])) for name in names
        }
        for i, first in enumerate(names):
            for second in names[i + 1 :]:
                shared = sets[first] & sets[second]
                if shared:
                    problems.append(
                        f"{first} and {second} share {len(shared)} {what}, e.g. "
                        f"{sorted(shared, key=str)[0]!r}"
                    )
    return problems
