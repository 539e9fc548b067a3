"""Task sets: rows from a file (JSONL, JSON; Parquet, CSV via HF `datasets`) or an iterable.

Every task is a dict (a JSON row exactly as written); its id comes from `id_field` (or its row
number when absent): one column, or several whose values are joined with `/`. A bad file or
row raises `TaskSetError` naming the file, the row and the field.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentscope_rft.buffer.jsonl import decode_line

_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}


class TaskSetError(ValueError):
    """A task file or row that cannot be used (the message names where and why)."""


@dataclass(frozen=True, slots=True)
class Task:
    id: str
    data: dict[str, Any]


def _read_jsonl(path: Path) -> list[Any]:
    rows = []
    with open(path, "rb") as handle:  # bytes: a line that is not UTF-8 is named by its number
        for number, raw in enumerate(handle, start=1):
            try:
                # utf-8-sig: files saved by Windows editors start with a byte-order mark
                line = decode_line(raw, "utf-8-sig" if number == 1 else "utf-8")
            except ValueError as exc:
                raise TaskSetError(f"{path} line {number}: {exc}: save the file as UTF-8") from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise TaskSetError(f"{path} line {number}: invalid JSON ({exc.msg})") from exc
            if not isinstance(row, dict):
                raise TaskSetError(f"{path} line {number}: a task must be a JSON object")
            rows.append(row)
    if not rows:
        raise TaskSetError(f"task file {path} has no tasks: write one JSON object per line")
    return rows


def _read_json(path: Path) -> list[Any]:
    try:
        rows = json.loads(path.read_text(encoding="utf-8-sig"))
    except UnicodeDecodeError as exc:
        raise TaskSetError(
            f"{path}: not UTF-8 text ({exc.reason}): save the file as UTF-8"
        ) from exc
    except json.JSONDecodeError as exc:
        if exc.msg == "Extra data":  # JSON lines in a file named .json
            return _read_jsonl(path)
        raise TaskSetError(f"{path}: invalid JSON ({exc.msg}, line {exc.lineno})") from exc
    if not isinstance(rows, list):
        raise TaskSetError(
            f"{path}: a .json task file must hold a list of task objects, not a "
            f"{type(rows).__name__} (or write one task per line as .jsonl)"
        )
    return rows


def _read_file(path: Path) -> list[Any]:
    if not path.is_file():
        raise TaskSetError(f"task file {path} does not exist")
    kind = _FORMATS.get(path.suffix.lower())
    if kind is None:
        raise TaskSetError(
            f"task file {path}: unsupported format {path.suffix!r} (use .jsonl, .json, "
            ".parquet or .csv)"
        )
    # JSON is read as written: `datasets` would give every row every column (None where a row has
    # none) and cast a column to one type (the string "0" in a column of ints becomes 0).
    if path.suffix.lower() == ".jsonl":
        return _read_jsonl(path)
    if path.stat().st_size == 0:  # `datasets` fails on it with a bare StopIteration
        raise TaskSetError(f"task file {path} is empty: it holds no tasks, add them (one per row)")
    if path.suffix.lower() == ".json":
        return _read_json(path)
    import datasets

    datasets.disable_progress_bars()
    try:
        dataset = datasets.load_dataset(kind, data_files=str(path), split="train")
    except Exception as exc:
        raise TaskSetError(f"task file {path} cannot be read: {type(exc).__name__}: {exc}") from exc
    return [dict(row) for row in dataset]


def load_tasks(
    source: str | Path | Iterable[Mapping[str, Any]],
    *,
    id_field: str | Sequence[str] = "id",
    required_fields: Sequence[str] = (),
) -> list[Task]:
    """Load and validate tasks.

    `id_field` names the id column, or several (`["data_source", "id"]` gives `nq/train_0`) for
    a file that concatenates datasets whose ids restart; columns a row lacks are left out.

    Raises:
        TaskSetError: missing file, unreadable row, missing required field, duplicate id, empty.

    Example:
        >>> [t.id for t in load_tasks([{"id": "a", "q": "1+1"}], required_fields=["q"])]
        ['a']
    """
    where = str(source) if isinstance(source, str | Path) else "the task list"
    rows = _read_file(Path(source)) if isinstance(source, str | Path) else list(source)
    if not rows:
        raise TaskSetError(f"{where} has no tasks")
    fields = [id_field] if isinstance(id_field, str) else list(id_field)
    tasks: list[Task] = []
    seen: dict[str, int] = {}
    for number, row in enumerate(rows):
        if not isinstance(row, Mapping):
            raise TaskSetError(f"{where} row {number}: a task must be a dict, got {type(row)}")
        missing = [f for f in required_fields if f not in row or row[f] is None]
        if missing:
            raise TaskSetError(
                f"{where} row {number}: missing field(s) {missing} that the workflow needs "
                f"(row has: {sorted(row)})"
            )
        parts = [str(row[f]) for f in fields if row.get(f) is not None]
        task_id = "/".join(parts) if parts else f"row-{number}"
        if task_id in seen:
            raise TaskSetError(
                f"{where} rows {seen[task_id]} and {number} share the id {task_id!r}; ids "
                f"(tasks.id_field {id_field!r}) must be unique. A file that concatenates "
                "datasets numbered from 0 each (Search-R1's NQ + HotpotQA) can qualify them "
                "with another column: tasks.id_field=[data_source, id]"
            )
        seen[task_id] = number
        tasks.append(Task(id=task_id, data=dict(row)))
    return tasks


def stratified_slice(tasks: Sequence[Task], limit: int | None, field: str | None) -> list[Task]:
    """`limit` tasks that keep the set's mix: by `field`'s values (each value its share, largest
    remainders first, at least one task per value while the limit allows), else spread evenly over
    the set (a file ordered by type still gives every type). File order is kept.

    Raises:
        TaskSetError: a task lacks `field`.

    Example:
        >>> tasks = load_tasks([{"id": i, "kind": "ab"[i >= 6]} for i in range(8)])
        >>> [t.data["kind"] for t in stratified_slice(tasks, 4, "kind")]
        ['a', 'a', 'a', 'b']
        >>> [t.id for t in stratified_slice(tasks, 4, None)]
        ['0', '2', '4', '6']
    """
    if limit is None or limit >= len(tasks):
        return list(tasks)
    if field is None:
        picked = {int(i * len(tasks) / limit) for i in range(limit)}
        return [t for i, t in enumerate(tasks) if i in picked]
    strata: dict[str, list[int]] = {}
    for index, task in enumerate(tasks):
        if field not in task.data:
            raise TaskSetError(
                f"tasks.stratify_field {field!r}: task {task.id!r} has no such field "
                f"(it has: {sorted(task.data)})"
            )
        strata.setdefault(str(task.data[field]), []).append(index)
    quotas = {key: limit * len(rows) / len(tasks) for key, rows in strata.items()}
    counts = {key: min(len(strata[key]), max(1, int(q))) for key, q in quotas.items()}
    while sum(counts.values()) > limit:  # more values than the limit: drop the smallest shares
        smallest = min((k for k in counts if counts[k]), key=lambda k: (quotas[k], k))
        counts[smallest] -= 1
    by_remainder = sorted(quotas, key=lambda k: (-(quotas[k] - int(quotas[k])), k))
    while sum(counts.values()) < limit:
        for key in by_remainder:
            if sum(counts.values()) < limit and counts[key] < len(strata[key]):
                counts[key] += 1
    picked = set()
    for key, rows in strata.items():
        step = len(rows) / counts[key] if counts[key] else 0
        picked.update(rows[int(i * step)] for i in range(counts[key]))
    return [t for i, t in enumerate(tasks) if i in picked]
