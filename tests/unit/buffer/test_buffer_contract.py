"""The `Buffer` contract, run against every storage (memory, SQLite, Postgres when configured)."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from buffer_helpers import Storage, make_group, make_sample

from agentscope_rft.buffer import Buffer, BufferInputError, BufferTimeout


def rollout_ids(samples) -> list[str]:
    return [s.rollout_id for s in samples]


async def test_implements_protocol(storage: Storage) -> None:
    assert isinstance(storage.buffer, Buffer)


async def test_groups_come_back_whole_fifo_and_exact(storage: Storage) -> None:
    a, b, c = make_group("a", 3), make_group("b", 2), make_group("c", 1)
    for group in (a, b, c):
        await storage.buffer.put(group)

    first = await storage.buffer.get(2, step=1, timeout=5)
    second = await storage.buffer.get(1, step=2, timeout=5)

    assert first == [storage.expect(s) for s in a + b]
    assert second == [storage.expect(s) for s in c]
    assert await storage.buffer.stats() == {
        "pending_groups": 0.0,
        "pending_samples": 0.0,
        "consumed_groups": 3.0,
        "consumed_samples": 6.0,
        "dropped_groups": 0.0,
        "dropped_samples": 0.0,
    }


async def test_one_put_of_interleaved_groups_keeps_each_group_together(storage: Storage) -> None:
    a0, a1 = make_sample("a", 0), make_sample("a", 1)
    b0, b1 = make_sample("b", 0), make_sample("b", 1)
    await storage.buffer.put([a0, b0, a1, b1])

    assert rollout_ids(await storage.buffer.get(1, step=1, timeout=5)) == ["a-r0", "a-r1"]
    assert rollout_ids(await storage.buffer.get(1, step=1, timeout=5)) == ["b-r0", "b-r1"]


async def test_group_falls_back_to_task_id(storage: Storage) -> None:
    import dataclasses

    samples = [dataclasses.replace(make_sample("x", i), group_id="") for i in range(2)]
    await storage.buffer.put(samples)
    assert len(await storage.buffer.get(1, step=1, timeout=5)) == 2


async def test_get_waits_until_enough_groups_arrive(storage: Storage) -> None:
    await storage.buffer.put(make_group("a"))
    waiting = asyncio.create_task(storage.buffer.get(2, step=1, timeout=10))
    await asyncio.sleep(0.1)
    assert not waiting.done()

    await storage.buffer.put(make_group("b"))
    batch = await asyncio.wait_for(waiting, 5)
    assert [s.group_id for s in batch] == ["a"] * 3 + ["b"] * 3


async def test_timeout_says_what_it_waits_for(storage: Storage) -> None:
    await storage.buffer.put(make_group("old1", policy_version=3))
    await storage.buffer.put(make_group("fresh", policy_version=5))
    await storage.buffer.put(make_group("old2", policy_version=4))

    with pytest.raises(BufferTimeout) as caught:
        await storage.buffer.get(3, step=7, min_policy_version=5, timeout=0.2)

    message = str(caught.value)
    assert "for 3 groups with policy_version >= 5" in message
    assert "have 1 ready, 2 dropped as stale" in message
    assert "is the explorer running?" in message
    stats = await storage.buffer.stats()
    assert (stats["pending_groups"], stats["dropped_groups"], stats["dropped_samples"]) == (1, 2, 6)


async def test_a_group_with_one_stale_sample_is_dropped(storage: Storage) -> None:
    mixed = [make_sample("mixed", 0, policy_version=5), make_sample("mixed", 1, policy_version=4)]
    await storage.buffer.put(mixed)
    await storage.buffer.put(make_group("fresh", policy_version=6))

    batch = await storage.buffer.get(1, step=1, min_policy_version=5, timeout=5)

    assert {s.group_id for s in batch} == {"fresh"}
    assert (await storage.buffer.stats())["dropped_groups"] == 1


async def test_invalid_put_raises_and_stores_nothing(storage: Storage) -> None:
    import dataclasses

    bad = dataclasses.replace(make_sample("a", 1), token_ids=[2**31] + [1] * 11)
    with pytest.raises(BufferInputError, match=r"samples\[1\] \(a-s1\): field 'token_ids'"):
        await storage.buffer.put([make_sample("a", 0), bad, make_sample("b", 0)])

    assert sum((await storage.buffer.stats()).values()) == 0
    with pytest.raises(BufferTimeout):
        await storage.buffer.get(1, step=1, timeout=0)


async def test_requeue_after_gives_back_later_steps_in_original_order(storage: Storage) -> None:
    for name, version in (("g1", 0), ("g2", 0), ("stale", 0), ("g3", 1)):
        await storage.buffer.put(make_group(name, 2, policy_version=version))
    await storage.buffer.get(1, step=1, timeout=5)  # g1
    await storage.buffer.get(1, step=2, timeout=5)  # g2
    await storage.buffer.get(1, step=3, min_policy_version=1, timeout=5)  # drops stale, takes g3

    assert await storage.buffer.requeue_after(1) == 6  # g2, stale, g3
    assert await storage.buffer.requeue_after(1) == 0
    stats = await storage.buffer.stats()
    assert (stats["pending_groups"], stats["consumed_groups"], stats["dropped_groups"]) == (3, 1, 0)
    batch = await storage.buffer.get(3, step=2, timeout=5)
    assert [s.group_id for s in batch[::2]] == ["g2", "stale", "g3"]


async def test_concurrent_gets_never_hand_out_a_group_twice(storage: Storage) -> None:
    for g in range(12):
        await storage.buffer.put(make_group(f"g{g}", 2))
    readers = [storage.buffer]
    if storage.open_again is not None:
        readers.append(storage.open_again())

    batches = await asyncio.gather(
        *(readers[i % len(readers)].get(2, step=i, timeout=10) for i in range(6))
    )

    ids = [rid for batch in batches for rid in rollout_ids(batch)]
    assert len(ids) == len(set(ids)) == 24
    for extra in readers[1:]:
        await extra.close()


async def test_a_cancelled_get_loses_no_group(storage: Storage) -> None:
    await storage.buffer.put(make_group("a"))
    task = asyncio.create_task(storage.buffer.get(1, step=1, timeout=10))
    await asyncio.sleep(0)
    task.cancel()
    try:
        batch = await task
    except asyncio.CancelledError:
        batch = []
    stats = await storage.buffer.stats()
    assert stats["pending_samples"] + len(batch) == 3
    assert stats["consumed_samples"] == len(batch)


async def test_a_get_waiting_on_a_closed_buffer_fails(storage: Storage) -> None:
    waiting = asyncio.create_task(storage.buffer.get(1, step=1, timeout=10))
    await asyncio.sleep(0.05)
    await storage.buffer.close()
    with pytest.raises(RuntimeError, match="closed"):
        await asyncio.wait_for(waiting, 5)
    with pytest.raises(RuntimeError, match="closed"):
        await storage.buffer.put(make_group("late"))


@pytest.mark.parametrize("num_groups", [0, -1, 1.5, True])
async def test_get_rejects_impossible_requests(storage: Storage, num_groups) -> None:
    with pytest.raises(ValueError, match="num_groups"):
        await storage.buffer.get(num_groups, step=1, timeout=0)


async def test_empty_put_is_a_no_op(storage: Storage) -> None:
    await storage.buffer.put([])
    assert sum((await storage.buffer.stats()).values()) == 0


async def test_a_cancelled_put_stores_whole_groups_or_nothing(storage: Storage) -> None:
    task = asyncio.create_task(storage.buffer.put(make_group("a", 4) + make_group("b", 4)))
    await asyncio.sleep(0)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    stats = await storage.buffer.stats()
    assert (stats["pending_groups"], stats["pending_samples"]) in ((0, 0), (2, 8))
