"""Links between the project's Markdown pages lead somewhere: the file, and the heading's anchor."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted(
    [
        ROOT / "README.md",
        ROOT / "environments" / "README.md",
        *(ROOT / "docs").glob("*.md"),
        *(ROOT / "examples").glob("*/README.md"),
        *(ROOT / "benchmarks").glob("*.md"),
    ]
)
FENCE = re.compile(r"```.*?```", re.S)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    for match in re.finditer(r"^#+ (.*)$", FENCE.sub("", page.read_text()), re.M):
        name = slug(match.group(1))
        count = seen.get(name, 0)
        seen[name] = count + 1
        found.add(name if count == 0 else f"{name}-{count}")
    return found


def test_the_slug_is_githubs() -> None:
    heading = "Recording live traffic (`serve --record`)"
    assert slug(heading) == "recording-live-traffic-serve---record"
    assert slug("Reasoning models (`<think>`)") == "reasoning-models-think"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_finds_its_page_and_heading(page: Path) -> None:
    broken = []
    for match in re.finditer(r"\]\(([^)\s]+)\)", FENCE.sub("", page.read_text())):
        link = match.group(1)
        if link.startswith(("http://", "https://", "mailto:")):
            continue
        path, _, anchor = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        if not target.exists():
            broken.append(f"{link} (no such file)")
        elif anchor and target.suffix == ".md" and anchor not in anchors(target):
            broken.append(f"{link} (no heading with that anchor in {target.name})")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)
