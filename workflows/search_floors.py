"""What a search question type is worth without learning: trivial floors and the oracle.

A learned score means something only next to what needs no search at all. Per task, as
`<answer>` replies scored by the agent's own reward (`answer_reward`, token F1):

- `copy entity 1`, `copy entity 2`: answer a name the question gives (its chain's start, or
  the first / second compared entity); `best copy` is the better of the two over the set, a
  fixed policy a model can learn from the question alone.
- `name both`: answer every named entity at once ("A or B"), a hedge.
- `random`: `environments.search.solvers.random_solver` (searches the question, answers a random
  fact of a random hit).
- `oracle (shipped tools)`: the task's `program` run through the agent's own tools under its
  settings (turn budget, top-k, lead length, `open_page`), one tool call per turn; a question
  type it cannot solve there cannot be learned there.
- `oracle (unbounded)`: the same program with the full tools (`scripted_solver`).

A type where a trivial floor reaches `TRIVIAL_AT` is flagged: answering it does not show search.
"""

from __future__ import annotations

import random
import statistics
from collections import defaultdict
from collections.abc import Generator, Mapping, Sequence
from typing import Any

from environments.search import SearchTools
from environments.search.pages import LABELS
from environments.search.questions import question_entities
from environments.search.solvers import parse_hits, random_solver, scripted_solver
from workflows.search_agent import Encyclopedia, SearchAgentSettings, _index, check_corpus
from workflows.search_reward import answer_reward, gold_answers

TRIVIAL = ("copy entity 1", "copy entity 2", "best copy", "name both", "random")
"""The floors that need no search (or none that follows the question)."""
TRIVIAL_AT = 0.2
"""Mean F1 of a trivial floor at which a question type is flagged as solvable without search."""
SOLVABLE_AT = 0.9
"""Mean F1 the shipped-tools oracle must reach for a question type to count as learnable."""


def entity_names(task: Mapping[str, Any]) -> list[str]:
    """The titles of the entities a generated question names, in question order.

    Example:
        >>> entity_names({"program": ["start:Ada Voss", "get:born"], "supporting_ids": ["d1"],
        ...     "supporting_titles": ["Ada Voss"]})
        ['Ada Voss']
    """
    named = len(question_entities(task))
    return [str(title) for title in task["supporting_titles"][:named]]


def lead_facts(search_output: str, title: str) -> dict[str, str] | None:
    """The fact box lines of `title`'s hit in search results (a cut last line dropped)."""
    blocks = search_output.split("\n[")
    for block in blocks:
        hits = parse_hits(block if block.startswith("[") else "[" + block)
        if hits and hits[0][0] == title:
            lines = block.split("\n")[1:]
            if lines and lines[-1].endswith(" ..."):
                lines = lines[:-1]
            return dict(line.split(": ", 1) for line in lines if ": " in line)
    return None


class _Budget:
    """The agent's tools with one call per turn, at most `max_turns` calls."""

    def __init__(self, settings: SearchAgentSettings) -> None:
        self.tools = Encyclopedia(
            _index(settings.corpus), settings.top_k, settings.lead_chars, settings.open_page
        )
        self.left = settings.max_turns
        self.open_page = settings.open_page

    async def read(self, title: str, label: str) -> str | None:
        """The value of `label` on `title`'s page, read as the agent could, or None."""
        if self.left < 1:
            return None
        self.left -= 1
        found = await self.tools.search(title)
        facts = lead_facts(found, title)
        if facts is not None and label in facts:
            return facts[label]
        hit = next((doc_id for name, doc_id in parse_hits(found) if name == title), None)
        if hit is None or not self.open_page or self.left < 1:
            return None
        self.left -= 1
        page = await self.tools.open_page(hit)
        head = page.split("\n\n", 2)[1] if page.count("\n\n") >= 2 else page
        values = dict(line.split(": ", 1) for line in head.split("\n") if ": " in line)
        return values.get(label)


def solve_program(task: Mapping[str, Any]) -> Generator[tuple[str, str], str | None, str | None]:
    """Walks the task's `program`: yields each `(page title, fact label)` it must read, is sent
    the value read (None: it could not be read), and returns the answer (None: no answer).

    Example:
        >>> walk = solve_program({"program": ["start:Ada Voss", "follow:birthplace",
        ...                                   "get:founded"]})
        >>> next(walk), walk.send("Mikist")
        (('Ada Voss', 'Birthplace'), ('Mikist', 'Founded'))
        >>> try:
        ...     walk.send("1458")
        ... except StopIteration as done:
        ...     print(done.value)
        1458
    """
    program = [str(step).split(":", 1) for step in task["program"]]
    if program[0][0] == "compare":
        key = next(value for op, value in program if op == "get")
        pick = next(value for op, value in program if op == "pick")
        values = []
        for name in (value for op, value in program if op == "compare"):
            value = yield name, LABELS[key]
            if value is None:
                return None
            values.append((int(value), name))
        return (min if pick == "min" else max)(values)[1]
    title = program[0][1]
    for op, key in program[1:]:
        value = yield title, LABELS[key]
        if value is None or op == "get":
            return value
        title = value
    return None


async def shipped_oracle(task: Mapping[str, Any], settings: SearchAgentSettings) -> str:
    """Runs the task's `program` through the agent's tools under `settings` (`""`: it could not).

    Example:
        >>> asyncio.run(shipped_oracle(task, SearchAgentSettings(max_turns=2)))  # doctest: +SKIP
        '1749'
    """
    budget = _Budget(settings)
    walk = solve_program(task)
    try:
        title, label = next(walk)
        while True:
            title, label = walk.send(await budget.read(title, label))
    except StopIteration as done:
        return done.value or ""


def _f1(answer: str, golds: Sequence[str]) -> float:
    return answer_reward(f"<answer>{answer}</answer>", golds).metrics["f1"]


async def floor_scores(
    tasks: Sequence[Mapping[str, Any]], settings: SearchAgentSettings, seed: int = 0
) -> dict[str, dict[str, float]]:
    """Mean F1 of every floor per question type (and `all`).

    Args:
        tasks: Generated task rows (with `program`, `supporting_titles`, `type`).
        settings: The agent's settings (the shipped-tools oracle uses them).
        seed: The random solver's seed.

    Returns:
        Floor name -> question type (or `all`) -> mean F1.

    Raises:
        ValueError: No task, or a task from another world than `settings.corpus` (whose
            oracles would score 0 and flag every type as unanswerable).

    Example:
        >>> scores = asyncio.run(floor_scores(load_tasks("test"), SETTINGS))  # doctest: +SKIP
        >>> scores["copy entity 1"]["comparison"]  # doctest: +SKIP
        0.52
    """
    if not tasks:
        raise ValueError("no tasks to score the floors on")
    rng = random.Random(seed)
    index = _index(settings.corpus)
    for task in tasks:
        check_corpus(dict(task), index, settings.corpus)
    per: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for task in tasks:
        golds, names = gold_answers(task), entity_names(task)
        answers = {
            "copy entity 1": names[0],
            "copy entity 2": names[-1],
            "name both": " or ".join(names),
            "random": await random_solver(task, SearchTools(index), rng),
            "oracle (shipped tools)": await shipped_oracle(task, settings),
            "oracle (unbounded)": await scripted_solver(task, SearchTools(index)),
        }
        for group in ("all", str(task.get("type", "unknown"))):
            for name, answer in answers.items():
                per[name][group].append(_f1(answer, golds))
    scores = {
        name: {group: statistics.mean(values) for group, values in groups.items()}
        for name, groups in per.items()
    }
    groups = scores["copy entity 1"]
    scores["best copy"] = {
        group: max(scores["copy entity 1"][group], scores["copy entity 2"][group])
        for group in groups
    }
    return {name: scores[name] for name in (*TRIVIAL, *(n for n in scores if n not in TRIVIAL))}


def flag_types(scores: Mapping[str, Mapping[str, float]]) -> dict[str, str]:
    """Question types that do not count for a learning claim, with the reason.

    A type is flagged when a trivial floor reaches `TRIVIAL_AT` (it is answered without search)
    or the shipped-tools oracle stays under `SOLVABLE_AT` (the agent's tools cannot answer it).

    Example:
        >>> flag_types({"copy entity 1": {"comparison": 0.5, "single_hop": 0.0},
        ...             "oracle (shipped tools)": {"comparison": 1.0, "single_hop": 1.0}})
        {'comparison': 'trivial: copy entity 1 scores 0.500'}
    """
    flags: dict[str, str] = {}
    oracle = scores.get("oracle (shipped tools)", {})
    for group in oracle:
        if group == "all":
            continue
        floors = [(scores[name][group], name) for name in TRIVIAL if group in scores.get(name, {})]
        best, name = max(floors, default=(0.0, ""))
        if best >= TRIVIAL_AT:
            flags[group] = f"trivial: {name} scores {best:.3f}"
        elif oracle[group] < SOLVABLE_AT:
            flags[group] = (
                f"apart: the oracle with the shipped tools scores {oracle[group]:.3f} "
                "(more dependent searches than the turn budget, or facts the tools do not show)"
            )
    return flags
