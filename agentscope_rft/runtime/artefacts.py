"""A sweep's small artefacts, copied into a folder that is committed beside a README's table.

A number in a README is only as good as what re-makes it. `export_artefacts` copies what a
reader needs to check a seed table without the run folders (checkpoints, rollouts and buffers
stay behind): the resolved config, `sweep.json` (seeds, status, commit), the summary
(`summary.json`, `summary.md`, `seeds.png`), per seed its resolved config, `metrics.jsonl`,
`health.jsonl`, `best.json`, `state.json` and its test evaluation (`test-best/summary.json`,
`results.jsonl`), and the untrained model's test evaluation (`test-untrained/`). It writes
`ARTEFACTS.md`: where they came from, the commit, and the command that re-makes them.

An export into a checkout rewrites the resolved configs' file paths (workflow, tasks,
demonstrations, chat template) relative to each config's folder, so the exported `config.yaml`
re-makes the sweep on any clone: `train --config <out>/config.yaml`. The sweep may have run in
another clone (a fresh clone that re-made the table, exported into the working checkout): its
paths are taken at the same place in the checkout written into.

Example:
    >>> out = Path("examples/quickstart/results")
    >>> export_artefacts(Path("runs/quickstart"), out)  # doctest: +SKIP
    [PosixPath('examples/quickstart/results/config.yaml'), ...]
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

import yaml

from agentscope_rft.config import relative_file_keys
from agentscope_rft.config_effect import USER_KEYS_HEADER
from agentscope_rft.runtime.sweep import BASELINE_DIR, BEST_TEST_DIR, SweepError, read_sweep

logger = logging.getLogger(__name__)

SWEEP_FILES = ("config.yaml", "sweep.json", "summary.json", "summary.md", "seeds.png")
SEED_FILES = ("config.yaml", "metrics.jsonl", "health.jsonl", "best.json", "state.json")
EVAL_FILES = ("summary.json", "results.jsonl", "config.yaml")
EVAL_DIRS = (BEST_TEST_DIR, BASELINE_DIR)
MAX_FILE_BYTES = 5 * 2**20
"""A file above this is left out (and named): artefacts are for a git repository."""
INDEX = "ARTEFACTS.md"


def export_artefacts(sweep_dir: Path, out: Path, command: str | None = None) -> list[Path]:
    """Copy `sweep_dir`'s small artefacts into `out` (replacing what an earlier export left).

    `command` is the command line that exported them, written into `ARTEFACTS.md` beside the
    `--seeds` command that makes the sweep. Returns the files written.

    Raises:
        SweepError: `sweep_dir` is not a sweep folder, has no summary yet, or `out` is inside it.
    """
    data = read_sweep(sweep_dir)
    if not (sweep_dir / "summary.json").is_file():
        raise SweepError(
            f"{sweep_dir} has no summary.json yet: run `agentscope-rft sweep-summary {sweep_dir}`"
        )
    if out.resolve().is_relative_to(sweep_dir.resolve()):
        raise SweepError(f"--artefacts {out} is inside the sweep folder {sweep_dir}: pick another")
    if out.exists() and not (out / INDEX).is_file() and any(out.iterdir()):
        raise SweepError(
            f"{out} exists and holds files that are not an artefacts export (no {INDEX}): "
            "name an empty or new folder"
        )
    if out.exists():
        shutil.rmtree(out)  # an earlier export of this or another sweep: replaced whole
    out.mkdir(parents=True)
    root = _checkout(out)  # None: exported outside a checkout, the absolute paths are kept
    # the checkout whose absolute paths the configs recorded: the sweep's (maybe another clone)
    roots = None if root is None else (_checkout(sweep_dir) or root, root)
    written: list[Path] = []
    skipped: list[str] = []
    written += _copy(sweep_dir, out, SWEEP_FILES, skipped, roots)
    for seed in data["seeds"]:
        run_dir = sweep_dir / data["runs"][str(seed)]
        target = out / run_dir.name
        written += _copy(run_dir, target, SEED_FILES, skipped, roots)
        for name in EVAL_DIRS:
            written += _copy(run_dir / name, target / name, EVAL_FILES, skipped, roots)
    for name in EVAL_DIRS:
        written += _copy(sweep_dir / name, out / name, EVAL_FILES, skipped, roots)
    index = out / INDEX
    if not (out / "config.yaml").is_file():
        roots = None
    index.write_text(_index(sweep_dir, data, written, skipped, out, command, roots))
    written.append(index)
    return written


def _checkout(path: Path) -> Path | None:
    """The git checkout (a clone or a worktree) that holds `path`, or None."""
    for folder in (path.resolve(), *path.resolve().parents):
        if (folder / ".git").exists():
            return folder
    return None


def _copy(
    source: Path,
    target: Path,
    names: tuple[str, ...],
    skipped: list[str],
    roots: tuple[Path, Path] | None,
) -> list[Path]:
    """Copy `names` from `source`; a resolved config's paths inside the checkout it recorded
    (`roots`: that one, and the one written into) made relative."""
    copied = []
    for name in names:
        path = source / name
        if not path.is_file():
            continue
        if path.stat().st_size > MAX_FILE_BYTES:
            skipped.append(f"{path} ({path.stat().st_size / 2**20:.1f} MiB)")
            continue
        target.mkdir(parents=True, exist_ok=True)
        if name == "config.yaml" and roots is not None:
            _write_portable_config(path, target / name, roots[1], roots[0])
        else:
            shutil.copy2(path, target / name)
        copied.append(target / name)
    return copied


def _write_portable_config(
    source: Path, dest: Path, root: Path, recorded_root: Path | None = None
) -> None:
    """`source` (a resolved config) written to `dest` in the checkout `root` with its file paths
    relative to `dest`, and its first line naming the keys its user set (`config_effect`) kept.

    `recorded_root`: the checkout whose absolute paths `source` holds, when another clone (default
    `root`); a path inside it is taken at the same place in `root`."""
    text = source.read_text()
    header = text.partition("\n")[0] + "\n" if text.startswith(USER_KEYS_HEADER) else ""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError:
        data = None
    if not isinstance(data, dict):  # not a config this export understands: kept as it is
        shutil.copy2(source, dest)
        return
    recorded = recorded_root or root
    data = relative_file_keys(data, recorded / dest.parent.resolve().relative_to(root), recorded)
    dest.write_text(header + yaml.safe_dump(data, sort_keys=False))


def _commit_line(data: dict[str, Any]) -> str:
    """`- commit: ...`, or each seed's where a continued sweep ran seeds on different commits."""
    commits = {
        str(s): (data.get("commits") or {}).get(str(s), data.get("commit")) for s in data["seeds"]
    }
    if len(set(commits.values())) > 1:
        return "- commits (the sweep was continued on another): " + ", ".join(
            f"seed {seed} `{sha or 'unknown'}`" for seed, sha in commits.items()
        )
    return f"- commit: `{next(iter(commits.values()), None) or data.get('commit') or 'unknown'}`"


def _index(
    sweep_dir: Path,
    data: dict[str, Any],
    written: list[Path],
    skipped: list[str],
    out: Path,
    command: str | None,
    roots: tuple[Path, Path] | None,
) -> str:
    summary = json.loads((sweep_dir / "summary.json").read_text())
    seeds = ",".join(str(s) for s in data["seeds"])
    config = data.get("config", {})
    test = " --test" if any("test" in r for r in summary.get("seeds", {}).values()) else ""
    # run from the checkout's root: the exported config, the fork's source in the sweep's clone
    the_config = "<the config>"
    if roots is not None:
        the_config = str((out / "config.yaml").resolve().relative_to(roots[1]))
    remake = (
        f"agentscope-rft train --config {the_config} --seeds {seeds}{test} "
        f"--set run.name={config.get('run', {}).get('name', sweep_dir.name)}"
    )
    fork = data.get("fork")
    if fork:  # each seed forked from the same seed of another sweep
        source = os.path.relpath(fork["from"], roots[0] if roots else None)
        source = fork["from"] if source.startswith("..") else source
        remake += f" --fork-from {source} --fork-step {fork['step']}"
    default_export = f"agentscope-rft sweep-summary runs/<name> --artefacts {out}"
    lines = [
        f"# Artefacts of the sweep `{sweep_dir.name}`",
        "",
        _commit_line(data),
        f"- seeds: {seeds} (status: "
        + ", ".join(f"{k} {v}" for k, v in data.get("status", {}).items())
        + ")",
        f"- metric: `{summary.get('metric')}` ({summary.get('mode')})",
        f"- the sweep: `{remake}`",
        f"- exported by: `{command or default_export}`",
        "",
        "The table (summary.md):",
        "",
        (sweep_dir / "summary.md").read_text().rstrip(),
        "",
        "Files: " + ", ".join(f"`{p.relative_to(out)}`" for p in sorted(written)),
    ]
    if skipped:
        lines += ["", "Left out (over 5 MiB): " + ", ".join(skipped)]
    return "\n".join(lines) + "\n"
