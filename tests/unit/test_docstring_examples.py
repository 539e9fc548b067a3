"""Every `>>>` example in the package's docstrings (and the example workflows' and environments')
runs and prints what it says; examples that need a server, a model or a file are marked
`# doctest: +SKIP` where they stand."""

from __future__ import annotations

import doctest
import importlib
import pkgutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("agentscope_rft", "workflows", "environments")
OPTIONAL = {"verl", "ray", "playwright", "vllm"}
"""Extras a module may import at its top: without them its examples are skipped, not failed."""


def modules() -> list[str]:
    names = []
    for package in PACKAGES:
        names.append(package)
        path = [str(ROOT / package)]
        names += [m.name for m in pkgutil.walk_packages(path, prefix=f"{package}.")]
    return sorted(names)


def test_the_walk_finds_the_modules():
    found = modules()
    assert "agentscope_rft.data.selection" in found and "workflows.search_reward" in found
    assert len(found) > 100


@pytest.mark.parametrize("name", modules())
def test_docstring_examples_run(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(
        tmp_path
    )  # examples that write (runs/demo/...) write here, not in the checkout
    try:
        module = importlib.import_module(name)
    except ImportError as error:
        if error.name and error.name.split(".")[0] in OPTIONAL:
            pytest.skip(f"{name} needs the optional {error.name}")
        raise
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    tests = [t for t in finder.find(module, name) if t.examples]
    if not tests:
        pytest.skip(f"{name} has no docstring examples")
    report: list[str] = []
    for test in tests:
        runner.run(test, out=report.append)
    assert runner.summarize(verbose=False).failed == 0, "".join(report)
