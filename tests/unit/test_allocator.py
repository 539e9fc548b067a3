"""`run.allocator`: the CLI restarts itself under jemalloc; glibc's settings; the config key.

The preload cases run in fresh interpreters: which allocator serves malloc is fixed when a
process starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from agentscope_rft.config import ConfigError, RunConfig, load_config
from agentscope_rft.runtime import memory
from agentscope_rft.runtime.memory import (
    AllocatorError,
    apply_allocator,
    jemalloc_library,
    loaded_allocator,
    tcmalloc_library,
)

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="LD_PRELOAD is Linux's")
JEMALLOC = jemalloc_library() if sys.platform.startswith("linux") else None
with_jemalloc = pytest.mark.skipif(
    JEMALLOC is None, reason="no jemalloc library here (Ray's wheel bundles one)"
)
TCMALLOC = tcmalloc_library() if sys.platform.startswith("linux") else None
with_tcmalloc = pytest.mark.skipif(
    TCMALLOC is None,
    reason="no tcmalloc library here (apt install libtcmalloc-minimal4; .ci/run does)",
)

RESTART = """
import json, os, subprocess, sys
from agentscope_rft.runtime import memory
print(json.dumps({"start": os.getpid()}), flush=True)
if sys.argv[1] == "cli":
    memory.allow_exec()
memory.preload_allocator(sys.argv[2])
child = subprocess.run(
    [sys.executable, "-c", "from agentscope_rft.runtime.memory import loaded_allocator as a; "
     "import os; print(a(), os.environ.get('LD_PRELOAD', ''))"],
    capture_output=True, text=True, check=True,
).stdout.split()
print(json.dumps({"end": os.getpid(), "loaded": memory.loaded_allocator(),
                  "ld_preload": os.environ.get("LD_PRELOAD", ""), "child": child}))
"""


def restart(mode: str, choice: str, **env: str) -> tuple[list[int], dict]:
    clean = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "MALLOC_CONF")}
    done = subprocess.run(
        [sys.executable, "-c", RESTART, mode, choice],
        capture_output=True,
        text=True,
        check=True,
        env={**clean, **env},
    )
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    starts = [line["start"] for line in lines if "start" in line]
    return starts, lines[-1]


@linux
@with_jemalloc
def test_the_cli_restarts_under_jemalloc_and_its_children_keep_their_environment() -> None:
    starts, end = restart("cli", "jemalloc")
    assert len(starts) == 2 and starts[0] == starts[1] == end["end"]  # one process, run twice
    assert end["loaded"] == "jemalloc"
    assert end["ld_preload"] == ""  # restored: the command's children start as they would have
    assert end["child"] == ["glibc"]


@linux
@with_jemalloc
def test_a_preload_given_by_the_user_is_kept_and_not_restarted() -> None:
    assert JEMALLOC is not None
    starts, end = restart("cli", "auto", LD_PRELOAD=JEMALLOC)  # auto would pick tcmalloc
    assert len(starts) == 1 and end["loaded"] == "jemalloc"
    assert end["ld_preload"] == JEMALLOC  # the user's own setting, untouched


@linux
@with_jemalloc
def test_a_cli_invoked_inside_another_program_never_replaces_it() -> None:
    starts, end = restart("library", "jemalloc")
    assert len(starts) == 1 and end["loaded"] == "glibc"


@linux
def test_glibc_is_never_restarted() -> None:
    starts, end = restart("cli", "glibc")
    assert len(starts) == 1 and end["loaded"] == "glibc"


@linux
@with_jemalloc
def test_a_library_path_is_preloaded() -> None:
    assert JEMALLOC is not None
    starts, end = restart("cli", JEMALLOC)
    assert len(starts) == 2 and end["loaded"] == "jemalloc"


def test_jemalloc_asked_for_and_missing_names_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memory, "jemalloc_library", lambda: None)
    with pytest.raises(AllocatorError, match=r"pip install 'ray\[default\]'.*libjemalloc2"):
        memory._wanted_library("jemalloc")
    monkeypatch.setattr(memory, "tcmalloc_library", lambda: None)
    assert memory._wanted_library("auto") is None  # auto falls back to glibc
    with pytest.raises(AllocatorError, match="is not a file"):
        memory._wanted_library("/nowhere/libjemalloc.so.2")


def test_auto_picks_tcmalloc_then_jemalloc_then_glibc(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memory, "tcmalloc_library", lambda: "/lib/libtcmalloc_minimal.so.4")
    monkeypatch.setattr(memory, "jemalloc_library", lambda: "/lib/libjemalloc.so.2")
    assert memory._wanted_library("auto") == "/lib/libtcmalloc_minimal.so.4"
    assert memory._wanted_library("jemalloc") == "/lib/libjemalloc.so.2"
    monkeypatch.setattr(memory, "tcmalloc_library", lambda: None)
    assert memory._wanted_library("auto") == "/lib/libjemalloc.so.2"


@linux
def test_jemalloc_required_in_a_process_started_on_glibc_says_how_to_start_it() -> None:
    if loaded_allocator() != "glibc" or JEMALLOC is None:
        pytest.skip("this test process must run on glibc with a jemalloc library found")
    with pytest.raises(AllocatorError, match="LD_PRELOAD="):
        apply_allocator("jemalloc")
    assert apply_allocator("auto") == "glibc"  # auto only says how, in a log line


PURGE = """
import json, sys, psutil, torch
from agentscope_rft.runtime.memory import apply_allocator, release_freed_memory
rss = lambda: psutil.Process().memory_info().rss / 2**20
result = {"loaded": apply_allocator(sys.argv[1])}
before = rss()
blocks = [torch.ones(2**18) for _ in range(200)]  # 200 MiB in 1 MiB tensors
pin = torch.ones(2**18)
result["grown"] = rss() - before
del blocks
result["freed"] = rss() - before
result["released"] = release_freed_memory()
result["kept"] = rss() - before
print(json.dumps(result))
"""


@linux
@with_jemalloc
def test_release_freed_memory_purges_jemalloc_arenas() -> None:
    assert JEMALLOC is not None
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_CONF"}
    done = subprocess.run(
        [sys.executable, "-c", PURGE, "jemalloc"],
        capture_output=True,
        text=True,
        check=True,
        # no decay: jemalloc keeps every freed page until purged
        env={**env, "LD_PRELOAD": JEMALLOC, "MALLOC_CONF": "dirty_decay_ms:-1,muzzy_decay_ms:-1"},
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["loaded"] == "jemalloc" and result["released"] is True
    assert result["grown"] > 150 and result["freed"] > 150
    assert result["kept"] < 30


@linux
@with_tcmalloc
def test_the_cli_restarts_under_tcmalloc_and_releases_its_free_pages() -> None:
    starts, end = restart("cli", "tcmalloc")
    assert len(starts) == 2 and starts[0] == starts[1] == end["end"]
    assert end["loaded"] == "tcmalloc" and end["ld_preload"] == "" and end["child"] == ["glibc"]
    assert TCMALLOC is not None
    done = subprocess.run(
        [sys.executable, "-c", PURGE, "tcmalloc"],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "LD_PRELOAD": TCMALLOC},
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["loaded"] == "tcmalloc" and result["released"] is True
    assert result["grown"] > 150 and result["freed"] > 150  # tcmalloc keeps freed spans...
    assert result["kept"] < 30  # ...until released


def test_tcmalloc_asked_for_and_missing_names_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memory, "tcmalloc_library", lambda: None)
    with pytest.raises(AllocatorError, match="apt install libtcmalloc-minimal4"):
        memory._wanted_library("tcmalloc")


@linux
@with_jemalloc
def test_glibc_settings_under_another_allocator_are_refused() -> None:
    assert JEMALLOC is not None
    done = subprocess.run(
        [sys.executable, "-c", PURGE, "glibc-compact"],
        capture_output=True,
        text=True,
        env={**os.environ, "LD_PRELOAD": JEMALLOC},
    )
    assert done.returncode != 0
    assert "glibc-compact asked for, but jemalloc serves this process" in done.stderr


BASE = {"workflow": "app.py:run", "tasks": {"train": "tasks.jsonl"}}


def test_the_old_compact_allocator_key_becomes_glibc_compact(tmp_path) -> None:  # type: ignore[no-untyped-def]
    assert RunConfig.model_validate(BASE).run.allocator == "glibc"
    old = RunConfig.model_validate({**BASE, "engine": {"compact_allocator": True}})
    assert old.run.allocator == "glibc-compact"
    off = RunConfig.model_validate({**BASE, "engine": {"compact_allocator": False}})
    assert off.run.allocator == "glibc"
    config = tmp_path / "x.yaml"
    config.write_text("workflow: app.py:run\ntasks: {train: tasks.jsonl}\n")
    by_set = load_config(config, ["engine.compact_allocator=true"])
    assert by_set.run.allocator == "glibc-compact"
    with pytest.raises(ConfigError, match=r"contradicts run\.allocator"):
        load_config(config, ["engine.compact_allocator=true", "run.allocator=jemalloc"])


def test_an_unknown_allocator_is_refused_with_the_choices(tmp_path) -> None:  # type: ignore[no-untyped-def]
    config = tmp_path / "x.yaml"
    config.write_text("workflow: app.py:run\ntasks: {train: tasks.jsonl}\n")
    with pytest.raises(ConfigError, match="auto, jemalloc, tcmalloc, glibc, glibc-compact"):
        load_config(config, ["run.allocator=mimalloc"])
