"""File paths in a run config: which keys name files, and how a relative path resolves.

In a config file a path is relative to the file's folder; with `--set`, to the working directory.
`~` and environment variables (`$DATA/train.jsonl`) are expanded; the resolved config keeps paths
absolute, and `relative_file_keys` makes them relative again for a config exported into a repo.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentscope_rft.config_errors import ConfigError

logger = logging.getLogger(__name__)


# Keys that name files: in a config file they are relative to the file's folder.
FILE_KEYS = (
    ("workflow",),
    ("judge",),
    ("tasks", "train"),
    ("tasks", "eval"),
    ("tasks", "test"),
    ("tasks", "val"),
    ("tasks", "validation"),
    ("offline", "path"),
    ("model", "chat_template"),
    ("model", "name_or_path"),
    ("algorithm", "advantage", "path"),
    ("algorithm", "policy_loss", "path"),
)

_CALLABLE_KEYS = (
    ("workflow",),
    ("judge",),
    ("algorithm", "advantage", "path"),
    ("algorithm", "policy_loss", "path"),
)
"""File keys whose value is `path/to/file.py:fn` (a path) or `package.module:fn` (none)."""


def _file_part(key: tuple[str, ...], value: str) -> tuple[str, str] | None:
    """The file path inside a value and the rest (`app.py` + `:run`), or None if it is no path."""
    if key in _CALLABLE_KEYS:
        target, colon, attr = value.rpartition(":")
        if not colon or not (target.endswith(".py") or "/" in target):
            return None  # `package.module:fn`
        return target, colon + attr
    if key == ("model", "chat_template") and "{" in value:
        return None  # an inline template
    if key == ("model", "name_or_path") and not ("/" in value or value.startswith(".")):
        return None  # a model name
    return value, ""


def _expand_variables(key: tuple[str, ...], path: str) -> str:
    """`path` with `$NAME` / `${NAME}` replaced by the environment's values (all must be set)."""
    if "$" not in path:
        return path
    expanded = os.path.expandvars(path)
    unset = re.findall(r"\$\{?([A-Za-z_]\w*)", expanded)
    if unset:
        raise ConfigError(
            f"{'.'.join(key)}: {path!r} names the environment variable ${unset[0]}, which is not "
            f"set: export {unset[0]}=... before the command, or write the path itself"
        )
    return expanded


def resolve_file_path(key: tuple[str, ...], value: str, base: Path) -> str:
    """`value` of the file key `key` with a relative path made absolute against `base`.

    A path that does not exist under `base` but does exist relative to the working directory
    (configs written to be run from one place) is taken from there, with a warning. `~` and
    environment variables (`$DATA/train.jsonl`, `${DATA}/train.jsonl`) are expanded; an unset
    variable is an error. Absolute paths, `package.module:fn` specs, model names and inline
    templates are returned unchanged.

    Raises:
        ConfigError: the path names an environment variable that is not set.

    Example:
        >>> resolve_file_path(("workflow",), "app.py:run", Path("/proj/exp"))
        '/proj/exp/app.py:run'
    """
    parts = _file_part(key, value)
    if parts is None:
        return value
    path, rest = Path(_expand_variables(key, parts[0])).expanduser(), parts[1]
    if path.is_absolute():
        return f"{path}{rest}" if str(path) != parts[0] else value
    resolved = (base / path).resolve()
    if not resolved.exists() and path.exists():
        logger.warning(
            "%s: %s is not in %s (the config file's folder) but is in the working directory; "
            "using %s (paths in a config file are relative to its folder)",
            ".".join(key), path, base, path.resolve(),
        )  # fmt: skip
        resolved = path.resolve()
    return f"{resolved}{rest}"


def _map_file_keys(
    data: dict[str, Any], convert: Callable[[tuple[str, ...], str], str]
) -> dict[str, Any]:
    """A copy of config data with `convert(key, value)` applied to every file key's value."""
    out = dict(data)
    for key in FILE_KEYS:
        section: Any = out
        for name in key[:-1]:  # copy the sections on the way down, not the caller's data
            child = section.get(name)
            if not isinstance(child, dict):
                break
            section[name] = section = dict(child)
        else:
            if isinstance(section.get(key[-1]), str):
                section[key[-1]] = convert(key, section[key[-1]])
    return out


def resolve_file_keys(data: dict[str, Any], base: Path) -> dict[str, Any]:
    """A copy of config data with every file key's relative path made absolute against `base`."""
    return _map_file_keys(data, lambda key, value: resolve_file_path(key, value, base))


def relative_file_keys(data: dict[str, Any], base: Path, root: Path) -> dict[str, Any]:
    """A copy of resolved config data: absolute file paths inside `root` made relative to `base`.

    The inverse of `resolve_file_keys` for a config written into the folder `base`: a resolved
    config exported into a repository (a README's artefacts) then loads on any clone of it, not
    only on the machine whose absolute paths it recorded. Paths outside `root`, model names and
    `package.module:fn` specs are returned unchanged.

    Example:
        >>> relative_file_keys({"workflow": "/repo/ex/app.py:run"}, Path("/repo/ex/results"),
        ...                    Path("/repo"))
        {'workflow': '../app.py:run'}
    """

    def relative(key: tuple[str, ...], value: str) -> str:
        parts = _file_part(key, value)  # a relative path is never inside the absolute `root`
        if parts is None or not Path(parts[0]).is_relative_to(root):
            return value
        return os.path.relpath(parts[0], base) + parts[1]

    return _map_file_keys(data, relative)


def missing_run_folder(run_dir: Path) -> str | None:
    """What is wrong with `--resume run_dir` when the folder is not there (None: it is).

    Cheap on purpose: the CLI asks before it imports the config and training modules (torch).

    Example:
        >>> missing_run_folder(Path("runs/nope")).startswith("--resume runs/nope: no such folder")
        True
    """
    if run_dir.is_dir():
        return None
    return (
        f"--resume {run_dir}: no such folder; give a run's folder (runs/<name>), or start a "
        "new run with --config"
    )
