"""Processes for the multi-process buffer tests: `python buffer_procs.py <command> ...`.

Samples are a pure function of (group, index, num_tokens), so a reader can check every stored
array without knowing what the writer did.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

import numpy as np

from agentscope_rft.buffer import BufferTimeout, SQLBuffer
from agentscope_rft.types import Sample


def expected_sample(group: int, index: int, num_tokens: int) -> Sample:
    start = (group * 1000 + index) * 7
    token_ids = np.arange(start, start + num_tokens, dtype=np.int64) % (2**31 - 1)
    logprobs = -((token_ids % 997) / 997.0).astype(np.float32)
    return Sample(
        token_ids=token_ids.tolist(),
        loss_mask=(token_ids % 3 != 0).astype(int).tolist(),
        logprobs=logprobs.astype(float).tolist(),
        reward=float(group % 5),
        rollout_id=f"g{group}-r{index}",
        task_id=f"task{group}",
        group_id=f"g{group}",
        policy_version=group,
        metrics={"num_tokens": float(num_tokens)},
    )


def make_group(group: int, size: int, num_tokens: int) -> list[Sample]:
    return [expected_sample(group, i, num_tokens) for i in range(size)]


def say(*parts: object) -> None:
    print(*parts, flush=True)


async def write(url: str, first: int, count: int, size: int, num_tokens: int, gap: float) -> None:
    """Put groups `first .. first+count-1`, one per call, announcing each before and after."""
    buffer = SQLBuffer(url, synchronous="normal")
    for group in range(first, first + count):
        say("begin", group)
        await buffer.put(make_group(group, size, num_tokens))
        say("stored", group)
        await asyncio.sleep(gap)
    await buffer.close()


async def write_then_hang(url: str, size: int, num_tokens: int) -> None:
    """Store group 0, then stop inside the transaction of group 1 after its sample rows are
    written but before the commit, and wait there to be killed."""
    import sqlalchemy as sa

    buffer = SQLBuffer(url, synchronous="normal")
    await buffer.put(make_group(0, size, num_tokens))

    def hang_after_samples(conn, cursor, statement, *args) -> None:  # type: ignore[no-untyped-def]
        if statement.startswith("INSERT INTO buffer_samples"):
            say("inside-transaction")
            time.sleep(60)

    sa.event.listen(buffer._engine, "after_cursor_execute", hang_after_samples)
    await buffer.put(make_group(1, size, num_tokens))
    say("committed")  # never reached: the test kills us first


async def read(url: str, num_groups: int, timeout: float, step: int, train_time: float) -> None:
    """Claim groups (spending `train_time` on each batch, like a trainer) until none arrives within
    `timeout`; print the claimed rollout ids as JSON."""
    buffer = SQLBuffer(url, poll_interval=0.01)
    say("ready")
    claimed: list[str] = []
    while True:
        try:
            batch = await buffer.get(num_groups, step=step, timeout=timeout)
        except BufferTimeout:
            break
        claimed.extend(s.rollout_id for s in batch)
        await asyncio.sleep(train_time)
    await buffer.close()
    say(json.dumps(claimed))


def main(argv: list[str]) -> None:
    command, *args = argv
    if command == "write":
        url, first, count, size, num_tokens, gap = args
        asyncio.run(write(url, int(first), int(count), int(size), int(num_tokens), float(gap)))
    elif command == "write-then-hang":
        url, size, num_tokens = args
        asyncio.run(write_then_hang(url, int(size), int(num_tokens)))
    elif command == "read":
        url, num_groups, timeout, step, train_time = args
        asyncio.run(read(url, int(num_groups), float(timeout), int(step), float(train_time)))
    else:
        raise SystemExit(f"unknown command {command!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
