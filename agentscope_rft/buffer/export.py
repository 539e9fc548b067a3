"""Samples between a SQL buffer and JSONL files: `export_samples`, `import_samples` and
`import_to_buffer` (which skips what the buffer already holds).

One JSON object per line with the chosen `Sample` fields; arrays are JSON lists (log-probs at
float32 precision, as stored). Export writes a temporary file and renames it, so an interrupted
export never leaves a partial file under the target name.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Literal

import sqlalchemy as sa

from agentscope_rft.buffer.base import BufferInputError
from agentscope_rft.buffer.codec import decode_sample, encode_sample, sample_to_json
from agentscope_rft.buffer.importing import ImportReport
from agentscope_rft.buffer.jsonl import read_json_objects
from agentscope_rft.buffer.schema import (
    SAMPLE_COLUMNS,
    create_buffer_engine,
    groups_table,
    samples_table,
    to_url,
)
from agentscope_rft.buffer.sql import SQLBuffer
from agentscope_rft.config_base import did_you_mean
from agentscope_rft.types import JSON, Sample

ExportState = Literal["all", "pending", "consumed", "dropped"]

SAMPLE_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Sample))
"""Every field a line may carry."""

DEFAULT_EXPORT_FIELDS: tuple[str, ...] = (
    "sample_id",
    "kind",
    "rollout_id",
    "task_id",
    "group_id",
    "agent_name",
    "policy_version",
    "reward",
    "stop_reason",
    "token_ids",
    "loss_mask",
    "logprobs",
)
"""What `export_samples` writes by default: enough to train on and to trace a sample back."""

REQUIRED_FIELDS: tuple[str, ...] = tuple(
    f.name
    for f in dataclasses.fields(Sample)
    if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
)


def _check_fields(fields: Sequence[str]) -> tuple[str, ...]:
    unknown = [name for name in fields if name not in SAMPLE_FIELDS]
    if unknown:
        hint = did_you_mean(unknown[0], SAMPLE_FIELDS)
        raise ValueError(
            f"unknown sample field {unknown[0]!r}{hint} (fields: {', '.join(SAMPLE_FIELDS)})"
        )
    if not fields:
        raise ValueError("no fields to export")
    return tuple(dict.fromkeys(fields))


def iter_stored_samples(
    url: str | Path, *, state: ExportState = "all", page_size: int = 256
) -> Iterator[Sample]:
    """The samples of a SQL buffer in insertion order, read in pages (any size of buffer).

    Raises:
        BufferFormatError: no such buffer, not a buffer, or another schema version.

    Example:
        >>> for sample in iter_stored_samples("runs/demo/buffer.db", state="consumed"):
        ...     print(sample.rollout_id)  # doctest: +SKIP
    """
    engine = create_buffer_engine(to_url(url), create=False)
    s, g = samples_table.c, groups_table.c
    try:
        last_id = -1
        while True:
            query = sa.select(s.id, *SAMPLE_COLUMNS).where(s.id > last_id)
            if state != "all":
                query = query.join(groups_table, g.id == s.group_ref).where(g.state == state)
            with engine.connect().execution_options(read_only=True) as conn, conn.begin():
                rows = conn.execute(query.order_by(s.id).limit(page_size)).mappings().all()
            if not rows:
                return
            for row in rows:
                yield decode_sample(row)
            last_id = rows[-1]["id"]
    finally:
        engine.dispose()


def export_samples(
    url: str | Path,
    out_path: str | Path,
    fields: Sequence[str] = DEFAULT_EXPORT_FIELDS,
    *,
    state: ExportState = "all",
) -> int:
    """Write the samples of a SQL buffer to a JSONL file; returns how many.

    Args:
        url: the buffer's SQLAlchemy URL or SQLite file path.
        out_path: the JSONL file to write (replaced when it exists).
        fields: `Sample` fields per line, in this order.
        state: which samples: all, or those of `pending` / `consumed` / `dropped` groups.

    Raises:
        ValueError: an unknown field name, or an `out_path` that cannot be written.
        BufferFormatError: no such buffer, not a buffer, or another schema version.

    Example:
        >>> export_samples("runs/demo/buffer.db", "samples.jsonl")  # doctest: +SKIP
        1024
    """
    names = _check_fields(fields)
    out = Path(out_path)
    if out.is_dir():
        raise ValueError(
            f"{out} is a folder: give the file to write (e.g. {out / 'samples.jsonl'})"
        )
    partial = out.with_name(out.name + ".partial")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        handle = partial.open("w", encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"cannot write {out}: {exc.strerror or exc}") from exc
    count = 0
    try:
        with handle:
            for sample in iter_stored_samples(url, state=state):
                handle.write(json.dumps(sample_to_json(sample, names), ensure_ascii=False))
                handle.write("\n")
                count += 1
        os.replace(partial, out)
    except OSError as exc:  # a full disk: named, and no half file left (below)
        raise ValueError(
            f"cannot write {out}: {exc.strerror or exc} after {count} samples; nothing was "
            "left there: make room, or give --out a file on a disk with room"
        ) from exc
    finally:
        partial.unlink(missing_ok=True)
    return count


def _sample_from_line(record: JSON, where: str) -> Sample:
    for key in record:
        if key not in SAMPLE_FIELDS:
            hint = did_you_mean(key, SAMPLE_FIELDS)
            raise BufferInputError(f"{where}: unknown field {key!r}{hint}")
    missing = [name for name in REQUIRED_FIELDS if name not in record]
    if missing:
        raise BufferInputError(
            f"{where}: missing field {missing[0]!r} (required: {', '.join(REQUIRED_FIELDS)})"
        )
    if record.get("metrics") is None:
        record.pop("metrics", None)
    try:
        sample = Sample(**record)
    except (TypeError, ValueError) as err:
        raise BufferInputError(f"{where}: {err}") from err
    encode_sample(sample, where)
    return sample


def import_samples(path: str | Path) -> list[Sample]:
    """Samples from a JSONL file such as `export_samples` writes (blank lines are skipped).

    Raises:
        BufferInputError: a bad line; the message names the file, the line and the field.

    Example:
        >>> samples = import_samples("samples.jsonl")  # doctest: +SKIP
        >>> report = await buffer.put_new(samples)  # doctest: +SKIP
    """
    path = Path(path)
    return [
        _sample_from_line(record, f"{path}:{lineno}")
        for lineno, record in read_json_objects(path, BufferInputError)
    ]


async def import_to_buffer(path: str | Path, url: str | Path) -> ImportReport:
    """Add the samples of a JSONL file to a SQL buffer (created when absent), in one transaction,
    skipping every sample the buffer already holds, pending or trained, and repeats within the
    file (`SQLBuffer.put_new`); samples sharing a group (`group_id`, else `task_id`) form one
    group.

    Raises:
        BufferInputError: a bad line (file, line and field named); nothing is stored.
        BufferFormatError: the url is not a buffer this version can read.

    Example:
        >>> report = await import_to_buffer("samples.jsonl", "runs/b/buffer.db")  # doctest: +SKIP
        >>> print(report.summary())  # doctest: +SKIP
        imported 2 groups (8 samples); skipped 4 samples of 1 group that the buffer already ...
    """
    samples = import_samples(path)
    buffer = SQLBuffer(url)
    try:
        return await buffer.put_new(samples)
    finally:
        await buffer.close()
