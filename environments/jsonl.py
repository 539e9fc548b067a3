"""Task files: JSONL read and write with errors that name the file and line."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any


class TaskFileError(ValueError):
    """A JSONL file that cannot be read: the message names the file, the line and the fix."""


def iter_jsonl(path: str | Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yields `(line_number, row)` for every non-blank line of a JSONL file.

    Args:
        path: The file to read.

    Raises:
        TaskFileError: If the file is missing or not UTF-8 text, or a line is not a JSON object.

    Example:
        >>> for line_number, row in iter_jsonl("tasks.jsonl"):  # doctest: +SKIP
        ...     print(line_number, row["id"])
    """
    path = Path(path)
    if not path.is_file():
        raise TaskFileError(f"{path}: no such file; generate it or pass the right path")
    try:
        with path.open(encoding="utf-8") as handle:
            for line_number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as error:
                    raise TaskFileError(
                        f"{path}:{line_number}: not valid JSON ({error.msg} at column "
                        f"{error.colno}); each line must be one JSON object"
                    ) from None
                if not isinstance(row, dict):
                    raise TaskFileError(
                        f"{path}:{line_number}: expected a JSON object, got {type(row).__name__}"
                    )
                yield line_number, row
    except UnicodeDecodeError:
        hint = (
            " (Search-R1 parquet converts with `python -m environments.search.searchr1 questions`)"
            if path.suffix.lower() == ".parquet"
            else ""
        )
        raise TaskFileError(
            f"{path}: not UTF-8 text (a binary file?); expected JSONL, one JSON object per "
            f"line{hint}"
        ) from None


def read_jsonl(path: str | Path, required: Iterable[str] = ("id",)) -> list[dict[str, Any]]:
    """Reads a JSONL file of flat task rows, checking required keys and unique ids.

    Args:
        path: The file to read.
        required: Keys every row must have.

    Returns:
        The rows, in file order.

    Raises:
        TaskFileError: On a broken line, a missing key or a duplicate `id`.

    Example:
        >>> rows = read_jsonl("environments/frozenlake/data/test.jsonl")  # doctest: +SKIP
    """
    required = tuple(required)
    rows: list[dict[str, Any]] = []
    seen: set[str] = set()
    for line_number, row in iter_jsonl(path):
        missing = [key for key in required if key not in row]
        if missing:
            raise TaskFileError(f"{path}:{line_number}: missing key(s) {missing}")
        if "id" in row:
            row_id = str(row["id"])
            if row_id in seen:
                raise TaskFileError(f"{path}:{line_number}: duplicate id {row_id!r}")
            seen.add(row_id)
        rows.append(row)
    return rows


def write_jsonl(path: str | Path, rows: Iterable[dict[str, Any]]) -> int:
    """Writes rows as JSONL (one compact object per line), creating parent folders.

    Args:
        path: The file to write (replaced if it exists).
        rows: The rows.

    Returns:
        The number of rows written.

    Example:
        >>> write_jsonl("/tmp/tasks.jsonl", [{"id": "a"}])  # doctest: +SKIP
        1
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    with path.open("w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row, ensure_ascii=False, separators=(",", ":")) + "\n")
            count += 1
    return count


def remove_stale_splits(out: str | Path, drawn: Iterable[str], names: Iterable[str]) -> list[Path]:
    """Removes `<out>/<split>.jsonl` for each of `names` not in `drawn`, saying so on stderr.

    A generator writes only the splits it draws; a split file left in `out` by an earlier draw
    (another seed, another world) would be read beside the new ones and share their rooms, maps
    or entities, which the splits promise not to do.

    Args:
        out: The generator's output folder.
        drawn: The splits this draw writes.
        names: Every split the generator can write.

    Returns:
        The removed files.

    Example:
        >>> remove_stale_splits("/tmp/sets", ["train"], ["train", "test"])  # doctest: +SKIP
        [PosixPath('/tmp/sets/test.jsonl')]
    """
    drawn = set(drawn)
    removed = []
    for name in names:
        path = Path(out) / f"{name}.jsonl"
        if name not in drawn and path.is_file():
            path.unlink()
            print(
                f"removed {path}: left by an earlier draw, and this one has no {name} split",
                file=sys.stderr,
            )
            removed.append(path)
    return removed
