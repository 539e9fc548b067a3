"""Every committed sweep table re-makes from its committed artefacts with the current code, and
the tables the pages paste are those files' (no training: `sweep-summary` reads the metrics)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

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
SEED_TABLE = re.compile(r"^\| seed \| status \|.*?\n(?!\|)", re.M | re.S)


def relative(path: Path) -> str:
    return str(path.relative_to(ROOT))


def test_there_are_committed_sweeps_and_pasted_tables():
    assert len(SWEEPS) >= 10
    assert any(SEED_TABLE.search(page.read_text(encoding="utf-8")) for page in PAGES)


@pytest.mark.parametrize("folder", SWEEPS, ids=relative)
def test_a_committed_sweep_table_re_makes_from_its_artefacts(folder, tmp_path, monkeypatch):
    """`agentscope-rft sweep-summary runs/<name>` over the committed files gives the committed
    `summary.md`, cell for cell (its first line names the sweep, the folder it was made in)."""
    committed = (folder / SUMMARY_MD).read_text(encoding="utf-8")
    name = re.match(r"Seeds of `([^`]+)`", committed)
    assert name, f"{relative(folder / SUMMARY_MD)} is not a sweep-summary table"
    copy = tmp_path / name.group(1)
    made = {SUMMARY_JSON, SUMMARY_MD, SEEDS_PLOT}  # the sweep's own; a seed's test summary stays
    shutil.copytree(
        folder, copy, ignore=lambda d, names: made & set(names) if d == str(folder) else []
    )
    monkeypatch.setattr(sweep_summary, "plot_seeds", lambda summary, path: None)  # not compared
    summarize(copy)
    assert (copy / SUMMARY_MD).read_text(encoding="utf-8") == committed, (
        f"{relative(folder)}: the committed table is not what the current code makes of the "
        f"committed artefacts; re-make it (sweep-summary on a copy named {name.group(1)}) "
        "and commit summary.md with the table in ARTEFACTS.md and the README"
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
