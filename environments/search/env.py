"""Entry points for a search workflow: the shipped (or a user's) corpus, task files, reward."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from environments.jsonl import TaskFileError, read_jsonl
from environments.search.index import SearchIndex

DATA_DIR = Path(__file__).parent / "data"
"""The committed default data: 2,000 generated pages; 1,000 train, 200 validation and 200 test
questions about disjoint entities and facts (`environments.search.splits`)."""

SPLITS = ("train", "val", "test")
"""The shipped question sets, by the name `load_tasks` takes."""


@functools.cache
def load_index(corpus: str | Path = DATA_DIR / "corpus.jsonl") -> SearchIndex:
    """The search index of a corpus file, built once per process (and cached on disk).

    Args:
        corpus: A JSONL corpus (`{"id", "title", "text"}` per line); the default is the shipped
            synthetic encyclopedia. Point it at your own file to search real data.

    Returns:
        The shared, read-only index.

    Example:
        >>> index = load_index()
        >>> index.search("capital", k=1)[0].doc_id.startswith("d")
        True
    """
    return SearchIndex.from_jsonl(corpus)


def load_tasks(split_or_path: str | Path = "test") -> list[dict[str, Any]]:
    """Question rows: `"train"`/`"val"`/`"test"` for the shipped sets, or a path to your own JSONL.

    A row needs `id`, `question` and `answer` (a string or a list of accepted strings); the
    generated sets also carry `type`, `hops`, `supporting_ids`, `supporting_titles`, `program`.

    Example:
        >>> len(load_tasks("test"))
        200
    """
    path = DATA_DIR / f"{split_or_path}.jsonl" if split_or_path in SPLITS else split_or_path
    rows = read_jsonl(path, required=("id", "question", "answer"))
    for row in rows:
        if not isinstance(row["question"], str) or not row["question"].strip():
            raise TaskFileError(f"{path}: task {row['id']!r}: 'question' must be non-empty text")
        answer = row["answer"]
        golds = [answer] if isinstance(answer, str) else answer
        # A blank gold answer would match an empty reply: every episode would score 1 for it.
        if not (
            isinstance(golds, list)
            and golds
            and all(isinstance(gold, str) and gold.strip() for gold in golds)
        ):
            raise TaskFileError(
                f"{path}: task {row['id']!r}: 'answer' must be a non-blank string or a non-empty "
                f"list of them, got {answer!r}"
            )
    if not rows:
        raise TaskFileError(f"{path}: no questions; add JSONL lines with id/question/answer")
    return rows


def foreign_page(task: dict[str, Any], index: SearchIndex) -> tuple[str, str] | None:
    """The first supporting page `(id, title)` of a generated task that `index` does not hold.

    Generated rows name their supporting pages (`supporting_ids`, `supporting_titles`); a task
    of another world (a fresh `environments.search.generate --out DIR`) searched in this corpus
    can never be answered. Rows without them (Search-R1's, a user's own) are not checked.

    Example:
        >>> foreign_page({"id": "q1", "question": "?", "answer": "x"}, load_index()) is None
        True
    """
    ids, titles = task.get("supporting_ids"), task.get("supporting_titles")
    if not isinstance(ids, list) or not isinstance(titles, list):
        return None
    for doc_id, title in zip(ids, titles, strict=False):
        document = index.open(str(doc_id))
        if document is None or document.title != title:
            return str(doc_id), str(title)
    return None
