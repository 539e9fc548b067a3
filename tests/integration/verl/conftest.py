"""verl CPU tests run torch single-threaded.

verl's CPU log-prob path (`logprobs_from_logits_v2`, used without flash-attn) runs one
`logsumexp` per token row. Each such small op wakes torch's intra-op thread pool; on a busy shared
machine a woken thread waits for a core, and a step of the tiny test model took 6-10 s with 2
threads against 0.2 s with 1 (measured on the 2-core CI box at load ~3-5).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def _single_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
