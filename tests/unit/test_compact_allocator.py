"""`run.allocator: glibc-compact`: glibc returns freed tensors' memory at once (runtime/memory.py).

Each case runs in a fresh interpreter: the allocator settings are process-wide."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

PROBE = """
import json, sys, psutil, torch
from agentscope_rft.runtime.memory import compact_allocator
applied = compact_allocator() if sys.argv[1] == "compact" else {}
rss = lambda: psutil.Process().memory_info().rss / 2**20
x = torch.ones(2**18); del x  # a freed 1 MiB block: glibc raises its mmap threshold past it
before = rss()
blocks = [torch.ones(2**18) for _ in range(200)]  # 200 MiB in 1 MiB tensors
pin = torch.ones(2**18)  # allocated last: the heap cannot shrink below it
grown = rss() - before
del blocks
print(json.dumps({"applied": applied, "grown": grown, "kept": rss() - before}))
"""

glibc = pytest.mark.skipif(
    not sys.platform.startswith("linux") or os.confstr("CS_GNU_LIBC_VERSION") is None,
    reason="mallopt is glibc's",
)


def probe(mode: str, **env: str) -> dict:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    done = subprocess.run(
        [sys.executable, "-c", PROBE, mode],
        capture_output=True,
        text=True,
        check=True,
        env={**clean, **env},
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


@glibc
def test_freed_tensors_go_back_to_the_system_only_with_the_compact_allocator() -> None:
    system, compact = probe("system"), probe("compact")
    assert system["grown"] > 150 and compact["grown"] > 150
    # glibc's defaults keep the freed 200 MiB below the live block; compact returns them
    assert system["kept"] > 150
    assert compact["kept"] < 30
    assert compact["applied"] == {"MALLOC_MMAP_THRESHOLD_": 65536, "MALLOC_ARENA_MAX": 2}


@glibc
def test_settings_from_the_environment_win() -> None:
    result = probe("compact", MALLOC_ARENA_MAX="4")
    assert result["applied"] == {"MALLOC_MMAP_THRESHOLD_": 65536}
