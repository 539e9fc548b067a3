"""Every committed sweep table re-makes from its committed artefacts with the current code, the
tables the pages paste are those files', and every committed resolved config loads on this clone
naming files that are here (no training: `sweep-summary` reads the metrics)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import yaml

from agentscope_rft.config import RunConfig
from agentscope_rft.config_paths import FILE_KEYS, resolve_file_keys
from agentscope_rft.runtime import sweep_summary
from agentscope_rft.runtime.sweep_summary import SEEDS_PLOT, SUMMARY_JSON, SUMMARY_MD, summarize

ROOT = Path(__file__).resolve().parents[2]
SWEEPS = sorted(
    path.parent
    for base in ("examples", "benchmarks/results")
    for path in (ROOT / base).glob("**/sweep.json")
    if (path.parent / SUMMARY_MD).is_file()
)
PAGES = sorted(
    [
        ROOT / "README.md",
        *(ROOT / "docs").glob("*.md"),
        *(ROOT / "examples").glob("*/README.md"),
        *(ROOT / "benchmarks").glob("**/ARTEFACTS.md"),
        *(ROOT / "examples").glob("**/ARTEFACTS.md"),
    ]
)
CONFIGS = sorted(
    path
    for base in ("examples", "benchmarks/results")
    for path in (ROOT / base).glob("**/config*.yaml")
    if {"results", "artefacts"} & set(path.relative_to(ROOT).parts)
)
SEED_TABLE = re.compile(r"^\| seed \| status \|.*?\n(?!\|)", re.M | re.S)


def relative(path: Path) -> str:
    return str(path.relative_to(ROOT))


def test_there_are_committed_sweeps_and_pasted_tables():
    assert len(SWEEPS) >= 10
    assert any(SEED_TABLE.search(page.read_text(encoding="utf-8")) for page in PAGES)


@pytest.mark.parametrize("folder", SWEEPS, ids=relative)
def test_a_committed_sweep_table_re_makes_from_its_artefacts(folder, tmp_path, monkeypatch):
    """`agentscope-rft sweep-summary` over the committed files (a copy named as the folder it
    is committed in, `results/`) gives the committed `summary.md`, cell for cell and named as
    the sweep (`run.name`), not as the folder it was re-made in."""
    committed = (folder / SUMMARY_MD).read_text(encoding="utf-8")
    copy = tmp_path / folder.name
    made = {SUMMARY_JSON, SUMMARY_MD, SEEDS_PLOT}  # the sweep's own; a seed's test summary stays
    shutil.copytree(
        folder, copy, ignore=lambda d, names: made & set(names) if d == str(folder) else []
    )
    monkeypatch.setattr(sweep_summary, "plot_seeds", lambda summary, path: None)  # not compared
    summarize(copy)
    assert (copy / SUMMARY_MD).read_text(encoding="utf-8") == committed, (
        f"{relative(folder)}: the committed table is not what the current code makes of the "
        f"committed artefacts; re-make it (`agentscope-rft sweep-summary` on a copy) and "
        "commit summary.md with the table in ARTEFACTS.md and the README"
    )


def pasted_tables() -> list[object]:
    return [
        pytest.param(
            page,
            m.group(0),
            id=f"{relative(page)}:{page.read_text()[: m.start()].count(chr(10)) + 1}",
        )
        for page in PAGES
        for m in SEED_TABLE.finditer(page.read_text(encoding="utf-8"))
    ]


@pytest.mark.parametrize(("page", "table"), pasted_tables())
def test_a_pasted_seed_table_is_a_committed_summary(page, table):
    """A seed table in a README or an artefacts index is, cell for cell, one committed
    `summary.md` (the one beside it for an index), so it names what re-makes it."""
    beside = page.parent / SUMMARY_MD
    sources = [beside] if page.name == "ARTEFACTS.md" else [f / SUMMARY_MD for f in SWEEPS]
    assert any(table in path.read_text(encoding="utf-8") for path in sources), (
        f"{relative(page)}: this seed table is in no committed summary.md "
        f"({', '.join(relative(p) for p in sources[:3])}...): paste the sweep's summary.md"
    )


def missing_files(config: Path) -> list[str]:
    """The file keys of `config` that name no file here, its schema validated as `load_config`
    does (read with libyaml where there is one: the pure-Python reader takes ~0.1 s a file; a
    model is a checkpoint or a name, not committed: not checked)."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    data = resolve_file_keys(yaml.load(config.read_text(encoding="utf-8"), loader), config.parent)
    RunConfig.model_validate(data)
    missing = []
    for key in FILE_KEYS:
        value: object = data
        for name in key:
            value = value.get(name) if isinstance(value, dict) else None
        if not isinstance(value, str) or key == ("model", "name_or_path") or "{" in value:
            continue
        path = value.rpartition(":")[0] if key in (("workflow",), ("judge",)) else value
        if path and "/" in path and not Path(path).exists():
            missing.append(f"{'.'.join(key)}: {value}")
    return missing


def test_every_committed_config_loads_naming_files_of_this_clone():
    """A resolved config committed beside a table (the `--config` of its re-make command) held
    the absolute paths of the clone it ran in, or paths relative to a folder it was moved from."""
    assert len(CONFIGS) > 50
    broken = {relative(c): m for c in CONFIGS if (m := missing_files(c))}
    assert not broken, (
        f"{len(broken)} committed configs name files that are not here (write paths relative "
        f"to the config's folder, as --artefacts does): {dict(list(broken.items())[:3])}"
    )


@pytest.mark.parametrize("folder", SWEEPS, ids=relative)
def test_an_artefacts_index_re_makes_the_sweep_from_its_committed_config(folder):
    """`ARTEFACTS.md`'s sweep command, run from the checkout's root: its `--config` is a file
    of the checkout (the committed config beside it), not `<the config>`, and a fork names no
    machine's folder."""
    index = (folder / "ARTEFACTS.md").read_text(encoding="utf-8")
    command = re.search(r"^- the sweep: `(agentscope-rft train [^`]+)`", index, re.M)
    assert command, f"{relative(folder)}/ARTEFACTS.md names no sweep command"
    words = command.group(1).split()
    config = words[words.index("--config") + 1]
    assert (ROOT / config).is_file(), f"{relative(folder)}/ARTEFACTS.md: --config {config}"
    if "--fork-from" in words:
        assert not Path(words[words.index("--fork-from") + 1]).is_absolute()
