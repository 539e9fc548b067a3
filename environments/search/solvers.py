"""Reference solvers for search tasks, both acting only through the agent's tools.

- `scripted_solver`: executes the task's `program` (search a title, open the page, read an
  infobox line, follow it). Its success rate shows that every question is answerable from the
  corpus with the tools.
- `random_solver`: searches the question, opens a random hit and answers with a random infobox
  value of it: the floor a policy must beat.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping
from typing import Any

from environments.search.pages import LABELS
from environments.search.tools import SearchTools

_HIT = re.compile(r"^\[\d+\] (?P<title>.+) \(id: (?P<doc_id>[^)]+)\)$", re.MULTILINE)
_INFOBOX_LINE = re.compile(r"^(?P<label>[A-Z][A-Za-z ]*): (?P<value>.+)$", re.MULTILINE)


def parse_hits(search_output: str) -> list[tuple[str, str]]:
    """`(title, doc_id)` pairs from the text that `SearchTools.search` returns."""
    return [(match["title"], match["doc_id"]) for match in _HIT.finditer(search_output)]


def parse_infobox(page_output: str) -> dict[str, str]:
    """The `Label: value` lines at the top of a page opened with `SearchTools.open_page`."""
    head = page_output.split("\n\n", 2)[1] if page_output.count("\n\n") >= 2 else page_output
    return {match["label"]: match["value"].strip() for match in _INFOBOX_LINE.finditer(head)}


async def _read_page(tools: SearchTools, title: str) -> dict[str, str] | None:
    for hit_title, doc_id in parse_hits(await tools.search(title, k=5)):
        if hit_title == title:
            return parse_infobox(await tools.open_page(doc_id))
    return None


async def scripted_solver(task: Mapping[str, Any], tools: SearchTools) -> str:
    """Answers a generated task by running its `program` with the tools.

    Args:
        task: A task row with a `program` list (`start:`/`follow:`/`get:` or
            `compare:`/`get:`/`pick:` steps).
        tools: The episode's tools.

    Returns:
        The answer, or `""` when a page could not be found or read.

    Example:
        >>> import asyncio  # doctest: +SKIP
        >>> asyncio.run(scripted_solver(task, SearchTools(index)))  # doctest: +SKIP
        'Kestrow'
    """
    program = [step.split(":", 1) for step in task["program"]]
    if program[0][0] == "compare":
        names = [value for op, value in program if op == "compare"]
        key = next(value for op, value in program if op == "get")
        pick = next(value for op, value in program if op == "pick")
        values = []
        for name in names:
            page = await _read_page(tools, name)
            if page is None or LABELS[key] not in page:
                return ""
            values.append((int(page[LABELS[key]]), name))
        return (min if pick == "min" else max)(values)[1]
    title = program[0][1]
    for op, key in program[1:]:
        page = await _read_page(tools, title)
        if page is None or LABELS[key] not in page:
            return ""
        if op == "get":
            return page[LABELS[key]]
        title = page[LABELS[key]]
    return ""


async def random_solver(task: Mapping[str, Any], tools: SearchTools, rng: random.Random) -> str:
    """Searches the question, opens a random hit and answers a random infobox value of it.

    Example:
        >>> asyncio.run(random_solver(task, tools, random.Random(0)))  # doctest: +SKIP
        '1842'
    """
    hits = parse_hits(await tools.search(str(task["question"]), k=5))
    if not hits:
        return ""
    page = parse_infobox(await tools.open_page(rng.choice(hits)[1]))
    values = [value for label, value in page.items() if label != "Type"]
    return rng.choice(values) if values else ""
