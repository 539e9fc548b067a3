"""The examples' make_demos scripts: bad input is one error line, and nothing is overwritten."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

import pytest

from agentscope_rft.api import import_file

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_web_search_demos_refuse_a_missing_config_and_unknown_types(tmp_path: Path) -> None:
    script = import_file(EXAMPLES / "web_search" / "make_demos.py")
    out = tmp_path / "demos.jsonl"
    out.write_text('{"kept": true}\n')

    def run(config: Path, types: str) -> None:
        args = argparse.Namespace(
            config=str(config), out=str(out), types=types, limit=0, seed=0, concurrency=1
        )
        asyncio.run(script.main(args))

    with pytest.raises(SystemExit, match=r"error: config file .*none\.yaml does not exist"):
        run(tmp_path / "none.yaml", "single_hop")
    # A mistyped type used to play no question and overwrite --out with nothing.
    with pytest.raises(SystemExit, match=r"has no questions of types \['single-hop'\]"):
        run(EXAMPLES / "web_search" / "config.yaml", "single-hop")
    assert out.read_text() == '{"kept": true}\n'


def test_alfworld_demos_refuse_a_missing_task_file(tmp_path: Path) -> None:
    script = import_file(EXAMPLES / "alfworld" / "make_demos.py")
    args = argparse.Namespace(
        tasks=str(tmp_path / "none.jsonl"),
        out=str(tmp_path / "demos.jsonl"),
        workflow="run",
        limit=0,
        concurrency=1,
        replay_in=None,
    )
    with pytest.raises(SystemExit, match=r"error: task file .*none\.jsonl does not exist"):
        asyncio.run(script.make_demos(args))
