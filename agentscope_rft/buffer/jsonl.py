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
        if handle.read(4) == _PARQUET_MAGIC:
            raise error(
                f"{path}: a Parquet file; this data is read from JSON Lines (one JSON object per "
                f"line): convert it with {_PARQUET_TO_JSONL.format(path=path)}"
            )
        handle.seek(0)
        for lineno, raw in enumerate(handle, start=1):
            try:
                # utf-8-sig: files saved by Windows editors start with a byte-order mark
                line = decode_line(raw, "utf-8-sig" if lineno == 1 else "utf-8")
            except ValueError as err:
                raise error(f"{path}:{lineno}: {err}: save the file as UTF-8") from None
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise error(
                    f"{path}:{lineno}: not valid JSON ({err.msg}){_one_per_line(line)}"
                ) from err
            if not isinstance(record, dict):
                raise error(
                    f"{path}:{lineno}: each line must be a JSON object{_one_per_line(line)}"
                )
            yield lineno, record


_PARQUET_MAGIC = b"PAR1"
_PARQUET_TO_JSONL = (
    'python -c "import json, sys, pyarrow.parquet as pq; '
    '[print(json.dumps(r, default=str)) for r in pq.read_table(sys.argv[1]).to_pylist()]" '
    "{path} > data.jsonl"
)


def _one_per_line(line: str) -> str:
    """A hint for a file written as one JSON document (an array, or an object spread over many
    lines) rather than JSON Lines."""
    text = line.strip()
    if text in ("[", "{") or text.startswith("["):
        return " (write one JSON object per line, JSON Lines, not one JSON array or document)"
    return ""
