"""Documents and corpus files: JSONL with one `{"id", "title", "text"}` object per line (or
Search-R1's `{"id", "contents"}`)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from environments.jsonl import TaskFileError, iter_jsonl, write_jsonl


class CorpusError(TaskFileError):
    """A corpus that cannot be used; the message names the file, line and field."""


@dataclass(frozen=True)
class Document:
    """One page of a corpus.

    Attributes:
        id: Unique page id (any string).
        title: The page title, shown in search results.
        text: The full page text.
    """

    id: str
    title: str
    text: str


def load_corpus(path: str | Path) -> list[Document]:
    """Reads a corpus file: JSONL, one `{"id": str, "title": str, "text": str}` per line.

    Extra keys are ignored and integer ids are read as strings, so files from other tools (e.g. a
    Wikipedia dump converted to JSONL) load as they are. Search-R1's wiki-18 lines,
    `{"id", "contents": "\"Title\"\nText"}`, load too: the quoted first line of `contents` is
    the title (a line's own `title`, when it has one, wins).

    Args:
        path: The JSONL file.

    Returns:
        The documents, in file order.

    Raises:
        CorpusError: On a broken line, a missing or non-string field, a duplicate id, or an
            empty file.

    Example:
        >>> docs = load_corpus("environments/search/data/corpus.jsonl")  # doctest: +SKIP
        >>> docs[0].title  # doctest: +SKIP
        'Kindberford'
    """
    documents: list[Document] = []
    seen: set[str] = set()
    try:
        for line_number, row in iter_jsonl(path):
            if "contents" in row and "text" not in row:
                row = _from_contents(path, line_number, row)
            if isinstance(row.get("id"), int) and not isinstance(row["id"], bool):
                row = {**row, "id": str(row["id"])}  # wiki-18 and many dumps number their pages
            for key in ("id", "title", "text"):
                if not isinstance(row.get(key), str):
                    raise CorpusError(
                        f"{path}:{line_number}: field {key!r} must be a string, got "
                        f"{type(row.get(key)).__name__}; corpus lines are "
                        '{"id": str, "title": str, "text": str}'
                    )
            if row["id"] in seen:
                raise CorpusError(f"{path}:{line_number}: duplicate document id {row['id']!r}")
            seen.add(row["id"])
            documents.append(Document(id=row["id"], title=row["title"], text=row["text"]))
    except CorpusError:
        raise
    except TaskFileError as error:
        raise CorpusError(str(error)) from None
    if not documents:
        raise CorpusError(
            f"{path}: the corpus has no documents; add JSONL lines with id/title/text"
        )
    return documents


def _from_contents(path: str | Path, line_number: int, row: dict) -> dict:
    """A Search-R1 / wiki-18 line `{"id", "contents": "\"Title\"\nText"}` as id/title/text."""
    from environments.search.searchr1 import split_contents

    if not isinstance(row["contents"], str):
        raise CorpusError(
            f"{path}:{line_number}: field 'contents' must be a string, got "
            f"{type(row['contents']).__name__}"
        )
    title, text = split_contents(row["contents"])
    if isinstance(row.get("title"), str):  # the line's own title wins; its passage stays whole
        if title != row["title"].strip():  # unless the passage starts with that title
            text = row["contents"].strip()
        title = row["title"]
    return {**row, "title": title, "text": text}


def save_corpus(path: str | Path, documents: Iterable[Document]) -> int:
    """Writes documents as a JSONL corpus file.

    Args:
        path: The file to write.
        documents: The documents.

    Returns:
        The number of documents written.

    Example:
        >>> save_corpus("/tmp/corpus.jsonl", [Document("a", "A", "About A.")])  # doctest: +SKIP
        1
    """
    rows = ({"id": d.id, "title": d.title, "text": d.text} for d in documents)
    return write_jsonl(path, rows)


def corpus_fingerprint(documents: Sequence[Document]) -> str:
    """A short content hash of the documents (ids, titles and texts, in order)."""
    digest = hashlib.sha256()
    for document in documents:
        for part in (document.id, document.title, document.text):
            digest.update(part.encode("utf-8"))
            digest.update(b"\x00")
    return digest.hexdigest()[:16]
