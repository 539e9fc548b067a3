import os
import sys

import pytest

from agentscope_rft.runtime.memory import release_freed_memory


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc only")
def test_freed_memory_is_returned_on_glibc():
    import ctypes
    from pathlib import Path

    def rss() -> int:
        return int(Path("/proc/self/statm").read_text().split()[1])

    release_freed_memory()
    before = rss()
    # Small blocks live on the heap (not mmap); with the last one still alive, free() alone
    # keeps every page below it (measured: ~385 MB stay resident without the trim).
    blocks = [ctypes.create_string_buffer(4000) for _ in range(100_000)]  # ~400 MB
    last = blocks[-1]
    del blocks
    assert release_freed_memory() is True
    assert last.raw[:1] == b"\0"
    assert rss() - before < 50 * 1024 * 1024 // 4096  # back within 50 MB


def test_kernel_cache_capped_unless_the_environment_says(monkeypatch) -> None:
    from agentscope_rft.runtime.memory import KERNEL_CACHE_ENTRIES, limit_kernel_cache

    for name in ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "DNNL_PRIMITIVE_CACHE_CAPACITY"):
        monkeypatch.delenv(name, raising=False)
    assert limit_kernel_cache() == KERNEL_CACHE_ENTRIES
    assert os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == str(KERNEL_CACHE_ENTRIES)
    monkeypatch.setenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "64")
    assert limit_kernel_cache() == 64
    monkeypatch.delenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY")
    monkeypatch.setenv("DNNL_PRIMITIVE_CACHE_CAPACITY", "2048")  # oneDNN's older name
    assert limit_kernel_cache() == 2048
    assert "ONEDNN_PRIMITIVE_CACHE_CAPACITY" not in os.environ
