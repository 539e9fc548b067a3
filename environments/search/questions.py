"""Questions with gold answers over a world's relation graph, at graded difficulty.

Types, from easy to hard:
- `single_hop`: one page answers it ("In what year was Ada Voss born?").
- `two_hop`: follow one relation, then read an attribute ("In which country is the city where
  Ada Voss was born?").
- `comparison`: read the same attribute on two pages and compare ("Who was born earlier, A or B?").
- `multi_hop`: follow two or three relations, then read an attribute.

Every question carries its supporting page ids (in reading order), the sub-queries that find
them (the page titles), and a `program` (`start:`, `follow:`, `get:`, `compare:`, `pick:` steps
over infobox labels) that the scripted solver executes with the search tools.
"""

from __future__ import annotations

import random
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from environments.search.pages import value_text
from environments.search.world import LINKS, World

QUESTION_TYPES = ("single_hop", "two_hop", "comparison", "multi_hop")
DEFAULT_MIX: dict[str, float] = {
    "single_hop": 0.3,
    "two_hop": 0.3,
    "comparison": 0.15,
    "multi_hop": 0.25,
}

# (kind, attribute) -> question about an entity phrase {x}.
ASK: dict[tuple[str, str], str] = {
    ("person", "born"): "In what year was {x} born?",
    ("person", "died"): "In what year did {x} die?",
    ("person", "occupation"): "What was the occupation of {x}?",
    ("person", "birthplace"): "In which city was {x} born?",
    ("person", "employer"): "Which organisation employed {x}?",
    ("person", "mentor"): "Who was the mentor of {x}?",
    ("city", "country"): "In which country is {x}?",
    ("city", "founded"): "In what year was {x} founded?",
    ("city", "population"): "What is the population of {x}?",
    ("country", "capital"): "What is the capital of {x}?",
    ("country", "founded"): "In what year was {x} established?",
    ("country", "currency"): "What is the currency of {x}?",
    ("organisation", "founded"): "In what year was {x} founded?",
    ("organisation", "founder"): "Who founded {x}?",
    ("organisation", "headquarters"): "In which city is {x} headquartered?",
    ("event", "year"): "In what year did {x} take place?",
    ("event", "location"): "In which city did {x} take place?",
    ("event", "organiser"): "Which organisation organised {x}?",
    ("event", "leader"): "Who led {x}?",
}
# (kind, relation) -> noun phrase for the entity the relation points to.
VIA: dict[tuple[str, str], str] = {
    ("person", "birthplace"): "the city where {x} was born",
    ("person", "employer"): "the organisation that employed {x}",
    ("person", "mentor"): "the mentor of {x}",
    ("city", "country"): "the country of {x}",
    ("country", "capital"): "the capital of {x}",
    ("organisation", "founder"): "the founder of {x}",
    ("organisation", "headquarters"): "the city where {x} is headquartered",
    ("event", "location"): "the city where {x} took place",
    ("event", "organiser"): "the organisation that organised {x}",
    ("event", "leader"): "the person who led {x}",
}
# (kind, numeric attribute) -> [(question about {a} and {b}, "min" or "max")].
COMPARE: dict[tuple[str, str], list[tuple[str, str]]] = {
    ("person", "born"): [
        ("Who was born earlier, {a} or {b}?", "min"),
        ("Who was born later, {a} or {b}?", "max"),
    ],
    ("person", "died"): [("Who died earlier, {a} or {b}?", "min")],
    ("city", "population"): [
        ("Which city has the larger population, {a} or {b}?", "max"),
        ("Which city has the smaller population, {a} or {b}?", "min"),
    ],
    ("city", "founded"): [("Which city was founded earlier, {a} or {b}?", "min")],
    ("country", "founded"): [("Which country was established earlier, {a} or {b}?", "min")],
    ("organisation", "founded"): [
        ("Which was founded earlier, {a} or {b}?", "min"),
        ("Which was founded more recently, {a} or {b}?", "max"),
    ],
    ("event", "year"): [("Which took place earlier, {a} or {b}?", "min")],
}


@dataclass
class _Draft:
    question: str
    answer: str
    supporting_ids: list[str]
    program: list[str]


def _capitalized(text: str) -> str:
    return text[0].upper() + text[1:]


Starts = Mapping[str, list[str]]
"""Page ids per kind that a question may name (`World.by_kind`, or one split's share of it)."""


def _chain(world: World, rng: random.Random, num_links: int, starts: Starts) -> _Draft | None:
    """A question that follows `num_links` relations from a random entity, or None."""
    kinds = [k for k in LINKS if starts.get(k)]
    if not kinds:
        return None
    kind = rng.choice(kinds)
    entity = world.get(rng.choice(starts[kind]))
    visited = [entity.doc_id]
    phrase, program = entity.phrase, [f"start:{entity.name}"]
    for _ in range(num_links):
        options = [key for key in sorted(entity.links) if entity.links[key] not in visited]
        if not options:
            return None
        key = rng.choice(options)
        phrase = VIA[(entity.kind, key)].format(x=phrase)
        program.append(f"follow:{key}")
        entity = world.get(entity.links[key])
        visited.append(entity.doc_id)
    asks = [
        key
        for (ask_kind, key) in ASK
        if ask_kind == entity.kind
        and (key in entity.scalars or entity.links.get(key, visited[0]) not in visited)
    ]
    if not asks:
        return None
    key = rng.choice(asks)
    program.append(f"get:{key}")
    question = _capitalized(ASK[(entity.kind, key)].format(x=phrase))
    return _Draft(question, value_text(world, entity, key), visited, program)


def _comparison(world: World, rng: random.Random, starts: Starts) -> _Draft | None:
    kind, key = rng.choice(sorted(COMPARE))
    if len(starts.get(kind, ())) < 2:
        return None
    first_id, second_id = rng.sample(starts[kind], 2)
    first, second = world.get(first_id), world.get(second_id)
    if first.scalars[key] == second.scalars[key]:
        return None
    template, pick = rng.choice(COMPARE[(kind, key)])
    chooser = min if pick == "min" else max
    winner = chooser((first, second), key=lambda e: int(e.scalars[key]))
    question = _capitalized(template.format(a=first.phrase, b=second.phrase))
    program = [f"compare:{first.name}", f"compare:{second.name}", f"get:{key}", f"pick:{pick}"]
    return _Draft(question, winner.name, [first.doc_id, second.doc_id], program)


def sample_question(
    world: World, rng: random.Random, question_type: str, starts: Starts | None = None
) -> dict[str, object]:
    """Samples one question of a type.

    Args:
        world: The world to ask about.
        rng: The random stream.
        question_type: One of `QUESTION_TYPES`.
        starts: The pages a question may name, per kind (`None`: every page). A chain starts
            at one of them; a comparison compares two of them.

    Returns:
        A dict with `question`, `answer`, `type`, `hops` (number of supporting pages),
        `supporting_ids`, `supporting_titles` and `program`.

    Raises:
        ValueError: If `question_type` is unknown.

    Example:
        >>> from environments.search.world import build_world
        >>> q = sample_question(build_world(300, seed=0), random.Random(0), "two_hop")
        >>> q["hops"]
        2
    """
    if question_type not in QUESTION_TYPES:
        raise ValueError(
            f"unknown question type {question_type!r}; choose from {', '.join(QUESTION_TYPES)}"
        )
    pool = world.by_kind if starts is None else starts
    for _ in range(1000):
        if question_type == "comparison":
            row = _comparison(world, rng, pool)
        else:
            links = {"single_hop": 0, "two_hop": 1}.get(question_type, rng.choice((2, 3)))
            row = _chain(world, rng, links, pool)
        if row is not None:
            return {
                "question": row.question,
                "answer": row.answer,
                "type": question_type,
                "hops": len(row.supporting_ids),
                "supporting_ids": row.supporting_ids,
                "supporting_titles": [world.get(doc_id).name for doc_id in row.supporting_ids],
                "program": row.program,
            }
    raise RuntimeError(f"could not sample a {question_type} question; the world is too small")


def question_entities(row: Mapping[str, Any]) -> set[str]:
    """The page ids of the entities a generated question names (its chain's start, or both
    compared entities).

    Example:
        >>> sorted(question_entities({"program": ["compare:A", "compare:B", "get:born",
        ...     "pick:min"], "supporting_ids": ["d1", "d2"]}))
        ['d1', 'd2']
    """
    program = [str(step) for step in row["program"]]
    pages = [str(doc_id) for doc_id in row["supporting_ids"]]
    named = sum(step.startswith(("start:", "compare:")) for step in program)
    return set(pages[:named])


def question_facts(row: Mapping[str, Any]) -> set[tuple[str, str]]:
    """The `(page id, attribute)` facts a generated question reads: every relation it follows
    and the attribute it asks (on both pages, for a comparison).

    Example:
        >>> sorted(question_facts({"program": ["start:A", "follow:birthplace", "get:country"],
        ...     "supporting_ids": ["d1", "d2"]}))
        [('d1', 'birthplace'), ('d2', 'country')]
    """
    program = [str(step).split(":", 1) for step in row["program"]]
    pages = [str(doc_id) for doc_id in row["supporting_ids"]]
    if program[0][0] == "compare":
        key = next(value for op, value in program if op == "get")
        return {(page, key) for page in pages}
    reads = [value for op, value in program[1:] if op in ("follow", "get")]
    return set(zip(pages, reads, strict=True))


def generate_questions(
    world: World,
    count: int,
    seed: int,
    mix: Mapping[str, float] = DEFAULT_MIX,
    exclude: set[str] | None = None,
    starts: Starts | None = None,
    exclude_facts: Collection[tuple[str, str]] = (),
) -> list[dict[str, object]]:
    """Generates `count` distinct questions with the type mix `mix`.

    Each question's type is drawn first, then questions of that type are sampled until one is
    new and reads none of `exclude_facts`, so exclusions do not skew the mix.

    Args:
        world: The world to ask about.
        count: Number of questions.
        seed: Random seed (use different seeds for train and test).
        mix: Question type -> weight.
        exclude: Question texts to skip (e.g. the train set, when making the test set).
        starts: The pages a question may name, per kind (`None`: every page).
        exclude_facts: `(page id, attribute)` facts no question may read (`question_facts`).

    Returns:
        Rows without ids; `generate.py` adds ids.

    Raises:
        RuntimeError: The world has too few new questions of a type left.

    Example:
        >>> from environments.search.world import build_world
        >>> rows = generate_questions(build_world(300, seed=0), count=5, seed=1)
        >>> len(rows)
        5
    """
    unknown = sorted(set(mix) - set(QUESTION_TYPES))
    if unknown:
        raise ValueError(f"unknown question type(s) {unknown}; choose from {QUESTION_TYPES}")
    rng = random.Random(f"questions-{world.seed}-{seed}")
    types, weights = list(mix), [mix[t] for t in mix]
    seen = set(exclude or ())
    blocked = set(exclude_facts)
    rows: list[dict[str, object]] = []
    while len(rows) < count:
        question_type = rng.choices(types, weights)[0]
        for _ in range(500):
            row = sample_question(world, rng, question_type, starts)
            if row["question"] not in seen and not question_facts(row) & blocked:
                break
        else:
            raise RuntimeError(
                f"only {len(rows)} of {count} distinct {question_type} questions found; grow the "
                "corpus or ask for fewer questions"
            )
        seen.add(str(row["question"]))
        rows.append(row)
    return rows
