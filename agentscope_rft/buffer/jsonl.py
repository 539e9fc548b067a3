"""Reading JSONL data files (offline SFT/DPO data, imported samples) with errors that name the
file and the line."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from agentscope_rft.types import JSON


def decode_line(raw: bytes, encoding: str = "utf-8") -> str:
    """One line of a data file as text.

    Raises:
        ValueError: the line is not UTF-8, naming the first bad byte and its column.

    Example:
        >>> decode_line(b"caf\\xe9")
        Traceback (most recent call last):
        ValueError: not UTF-8 text (byte 0xe9 at column 4)
    """
    try:
        return raw.decode(encoding)
    except UnicodeDecodeError as exc:
        raise ValueError(
            f"not UTF-8 text (byte {raw[exc.start]:#04x} at column {exc.start + 1})"
        ) from None


def read_json_objects(path: Path, error: type[Exception]) -> Iterator[tuple[int, JSON]]:
    """(line number, object) for every non-blank line of `path`.

    Raises:
        error: the file is missing, a line is not UTF-8 or not JSON, or a line is not a JSON
            object; the message starts with `path:line`.

    Example:
        >>> rows = list(read_json_objects(Path("sft.jsonl"), ValueError))  # doctest: +SKIP
    """
    if not path.is_file():
        raise error(f"{path}: no such file")
    with path.open("rb") as handle:  # bytes: a line that is not UTF-8 is named by its number
        for lineno, raw in enumerate(handle, start=1):
            try:
                line = decode_line(raw)
            except ValueError as err:
                raise error(f"{path}:{lineno}: {err}: save the file as UTF-8") from None
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise error(f"{path}:{lineno}: not valid JSON ({err.msg})") from err
            if not isinstance(record, dict):
                raise error(f"{path}:{lineno}: each line must be a JSON object")
            yield lineno, record
