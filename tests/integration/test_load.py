"""Load: 1,000 concurrent episodes through the gateway on loopback (tiny model, the real explorer,
each episode one call of AgentScope's OpenAIChatModel), then 3,000 in sequence: no failed call,
resident memory after them within 10% of what it was after the first 1,000, and Python's memory
blocks flat per finished episode after the first 1,000 sequential ones (a leak of anything an
episode allocates shows there at once; RSS alone needed 10,000 episodes to see a few KiB each).
A reliability figure of docs/benchmarks.md (the test prints its numbers;
`AGENTSCOPE_RFT_LOAD_SEQUENTIAL=10000` runs the 10,000 of its table)."""

from __future__ import annotations

import gc
import os
import sys
import time

import psutil
import pytest
from agentscope.message import UserMsg

import agentscope_rft
from agentscope_rft.engines.embedded import EmbeddedEngine
from agentscope_rft.explorer.explorer import EpisodeSettings, Explorer
from agentscope_rft.explorer.tasks import load_tasks
from agentscope_rft.gateway.server import Gateway

CONCURRENT = 1000
SEQUENTIAL = int(os.environ.get("AGENTSCOPE_RFT_LOAD_SEQUENTIAL", "3000"))
CHUNK = 1000
# Python memory blocks the sequential episodes after the first chunk may add, per episode.
# Measured 5.3: bounded by design and not full here (the recorder's call numbers per rollout id,
# the gateway's closed rollout ids). The engine keeping every finished conversation added 38.
BLOCKS_PER_EPISODE = 12.0


async def one_call(task: dict, model) -> float:
    """The lightest real episode: one call of the injected AgentScope model (no agent loop)."""
    response = await model([UserMsg(name="user", content=task["prompt"])])
    return float(len(response.content) > 0)


def rss_mib() -> float:
    gc.collect()
    return psutil.Process().memory_info().rss / 2**20


def heap_blocks() -> int:
    """Python's allocated memory blocks (every object an episode leaves behind counts)."""
    gc.collect()
    return sys.getallocatedblocks()


def assert_all_ok(result, episodes: int) -> None:
    failed = [r for r in result.rollouts if not r.ok or len(r.calls) != 1]
    assert not failed, (len(failed), failed[0].error if failed else None)
    assert len(result.rollouts) == episodes
    assert result.metrics()["explore/failed"] == 0 and result.metrics()["explore/timeout"] == 0


@pytest.mark.slow
@pytest.mark.timeout(3600)
async def test_1000_concurrent_then_3000_sequential_episodes(tiny_model_path):
    engine = EmbeddedEngine(
        tiny_model_path, dtype="float32", device="cpu", max_model_len=64, max_batch_size=256
    )
    await engine.start()
    gateway = Gateway(engine, generate_api_key=True)
    await gateway.start()
    workflow = agentscope_rft.workflow(one_call)
    try:
        wide = Explorer(
            workflow,
            gateway,
            EpisodeSettings(
                max_concurrency=CONCURRENT, max_tokens=2, max_retries=0, episode_timeout=3600
            ),
        )
        tasks = load_tasks([{"id": f"c{i}", "prompt": f"hi {i}"} for i in range(CONCURRENT)])
        started = time.perf_counter()
        result = await wide.explore(tasks, group_size=1, batch_id="wide")
        wide_seconds = time.perf_counter() - started
        await wide.close()
        assert_all_ok(result, CONCURRENT)
        assert gateway.state.counters["requests_failed"] == 0
        del result
        after_wide = rss_mib()
        print(f"\nload: {CONCURRENT} concurrent in {wide_seconds:.1f} s, RSS {after_wide:.0f} MiB")

        one_by_one = Explorer(
            workflow, gateway, EpisodeSettings(max_concurrency=1, max_tokens=2, max_retries=0)
        )
        assert SEQUENTIAL >= 2 * CHUNK and SEQUENTIAL % CHUNK == 0, SEQUENTIAL
        started = time.perf_counter()
        for chunk in range(SEQUENTIAL // CHUNK):
            tasks = load_tasks([{"id": f"s{chunk}.{i}", "prompt": f"yo {i}"} for i in range(CHUNK)])
            result = await one_by_one.explore(tasks, group_size=1, batch_id=f"seq{chunk}")
            assert_all_ok(result, CHUNK)
            del result
            if chunk == 0:  # warmed up: pools, caches and the allocator's arenas are filled
                blocks_warm = heap_blocks()
        blocks_kept = (heap_blocks() - blocks_warm) / (SEQUENTIAL - CHUNK)
        seq_seconds = time.perf_counter() - started
        await one_by_one.close()
        after_seq = rss_mib()
    finally:
        await gateway.stop()
        await engine.close()
    counters = gateway.state.counters
    assert counters["requests_ok"] == CONCURRENT + SEQUENTIAL and counters["requests_failed"] == 0
    assert gateway.recorder.rollout_ids == []  # every episode's calls were taken
    growth = (after_seq - after_wide) / after_wide
    print(
        f"\nload: {CONCURRENT} concurrent episodes in {wide_seconds:.1f} s "
        f"({CONCURRENT / wide_seconds:.0f}/s); {SEQUENTIAL} sequential in {seq_seconds:.1f} s "
        f"({SEQUENTIAL / seq_seconds:.0f}/s); RSS {after_wide:.0f} MiB after the concurrent "
        f"ones, {after_seq:.0f} MiB after the sequential ones ({growth:+.1%}); "
        f"{blocks_kept:.2f} Python memory blocks kept per episode; failed calls 0"
    )
    assert abs(growth) <= 0.10
    assert blocks_kept < BLOCKS_PER_EPISODE, (
        f"{blocks_kept:.1f} Python memory blocks stay per finished episode: something keeps "
        "each episode's objects (a per-rollout cache nobody clears?)"
    )
