"""The embedded engine's prefix cache, when not configured, takes 1/8 of the free memory, at most
1 GiB."""

from __future__ import annotations

import pytest
import torch

from agentscope_rft.engines import embedded


@pytest.mark.parametrize(
    ("free", "expected"),
    [(4 * 2**30, 2**29), (16 * 2**30, 2**30), (None, 2**30)],
)
def test_prefix_cache_is_sized_from_free_memory(monkeypatch, free, expected) -> None:
    monkeypatch.setattr(embedded, "available_memory", lambda device: free)
    assert embedded.prefix_cache_budget(torch.device("cpu")) == expected


def test_free_memory_is_read_on_this_machine() -> None:
    free = embedded.available_memory(torch.device("cpu"))
    assert free is not None and free > 0
