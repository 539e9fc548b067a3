"""`--set key.path=value` overrides: parsed as YAML and applied to a config's data before it is
validated."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from agentscope_rft.config_errors import ConfigError
from agentscope_rft.config_paths import FILE_KEYS, resolve_file_path


def parse_override(item: str) -> tuple[list[str], Any]:
    """`a.b.c=value` -> (["a", "b", "c"], value parsed as YAML)."""
    if "=" not in item:
        raise ConfigError(f"--set {item!r}: use key.path=value, e.g. --set trainer.lr=1e-5")
    key, _, raw = item.partition("=")
    path = [p for p in key.strip().split(".") if p]
    if not path:
        raise ConfigError(f"--set {item!r}: the key is empty")
    try:
        return path, yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError as exc:
        problem = getattr(exc, "problem", None) or type(exc).__name__
        raise ConfigError(
            f"--set {item!r}: the value is not valid YAML ({problem}); write it as YAML, e.g. "
            "--set 'explorer.sampling={max_tokens: 32}', with a string holding ': ' in quotes"
        ) from exc


def apply_overrides(data: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Apply `--set key.path=value` items; file paths are relative to the working directory.

    A number in the path is a list position: `--set data.operators.0.min=0.5` sets the first
    operator's `min`.
    """
    for item in overrides:
        path, value = parse_override(item)
        if tuple(path) in FILE_KEYS and isinstance(value, str):
            value = resolve_file_path(tuple(path), value, Path.cwd())
        node: Any = data
        for depth, part in enumerate(path):
            last = depth == len(path) - 1
            key: str | int = part
            if isinstance(node, list):
                key = _list_position(item, path[:depth], part, len(node))
            elif last:
                # An override of a split replaces the file's key for it under its other name.
                alias = SPLIT_ALIASES.get(tuple(path))
                if alias is not None:
                    node.pop(alias, None)
            else:
                child = node.get(part)
                if child is None or isinstance(child, str):
                    child = node[part] = {} if child is None else {"type": child}
                if not isinstance(child, dict | list):
                    raise ConfigError(
                        f"--set {item!r}: {'.'.join(path[: depth + 1])} is {child!r}, not a "
                        "section; set it whole, e.g. --set 'explorer.sampling={top_p: 1.0}'"
                    )
                node = child
                continue
            if last:
                node[key] = value
            else:
                node = node[key]
    return data


def _list_position(item: str, where: list[str], part: str, size: int) -> int:
    """The list position `part` names in `--set item`, or an error naming the valid ones."""
    if part.isdigit() and int(part) < size:
        return int(part)
    listed = ".".join(where)
    have = f"positions 0 to {size - 1}" if size else "no items"
    raise ConfigError(
        f"--set {item!r}: {listed} is a list with {have}, so {part!r} names none of its items; "
        f"set the whole list instead, e.g. --set '{listed}=[...]'"
    )


SPLIT_ALIASES: dict[tuple[str, ...], str] = {
    ("tasks", "eval"): "test",
    ("tasks", "test"): "eval",
    ("tasks", "val"): "validation",
    ("tasks", "validation"): "val",
}
"""Task split keys with two names (`--set tasks.eval=...` replaces a file's `test:`)."""
