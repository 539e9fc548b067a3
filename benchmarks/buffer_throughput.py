"""Put and get throughput of the buffers, in samples/s, for samples of `--tokens` tokens.

    python benchmarks/buffer_throughput.py [--tokens 1024] [--groups 200] [--group-size 8]
        [--groups-per-get 4] [--postgres-url postgresql+psycopg://...]

Each storage gets `--groups` puts of one group each (the explorer's pattern), then gets of
`--groups-per-get` groups until empty (the trainer's pattern). Samples are built before timing;
put time includes validation and encoding, get time includes decoding into `Sample`s. SQLite runs
on a temporary file with `synchronous=full` (the default) and `normal`.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import tempfile
import time
from pathlib import Path

from agentscope_rft.buffer import Buffer, MemoryBuffer, SQLBuffer
from agentscope_rft.types import Sample


def make_groups(num_groups: int, group_size: int, num_tokens: int) -> list[list[Sample]]:
    rng = random.Random(0)
    prompt = num_tokens // 4
    groups = []
    for g in range(num_groups):
        groups.append(
            [
                Sample(
                    token_ids=[rng.randrange(150_000) for _ in range(num_tokens)],
                    loss_mask=[0] * prompt + [1] * (num_tokens - prompt),
                    logprobs=[0.0] * prompt + [-rng.random() for _ in range(num_tokens - prompt)],
                    reward=rng.random(),
                    rollout_id=f"g{g}-r{i}",
                    task_id=f"t{g}",
                    group_id=f"g{g}",
                    metrics={"turns": 3.0},
                )
                for i in range(group_size)
            ]
        )
    return groups


async def measure(buffer: Buffer, groups: list[list[Sample]], per_get: int) -> tuple[float, float]:
    num_samples = sum(len(group) for group in groups)
    start = time.perf_counter()
    for group in groups:
        await buffer.put(group)
    put_seconds = time.perf_counter() - start
    start = time.perf_counter()
    received = 0
    step = 0
    while received < num_samples:
        step += 1
        received += len(await buffer.get(per_get, step=step, timeout=10))
    get_seconds = time.perf_counter() - start
    await buffer.close()
    return num_samples / put_seconds, num_samples / get_seconds


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--groups", type=int, default=200)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--groups-per-get", type=int, default=4)
    parser.add_argument("--postgres-url", default=None)
    args = parser.parse_args()
    groups = make_groups(args.groups, args.group_size, args.tokens)
    with tempfile.TemporaryDirectory() as folder:
        storages: list[tuple[str, Buffer]] = [
            ("memory", MemoryBuffer()),
            ("sqlite synchronous=full", SQLBuffer(Path(folder) / "full.db")),
            ("sqlite synchronous=normal", SQLBuffer(Path(folder) / "n.db", synchronous="normal")),
        ]
        if args.postgres_url:
            storages.append(("postgres", SQLBuffer(args.postgres_url)))
        print(
            f"{args.groups} groups x {args.group_size} samples x {args.tokens} tokens; "
            f"gets of {args.groups_per_get} groups"
        )
        print(f"{'storage':28s} {'put samples/s':>14s} {'get samples/s':>14s}")
        for name, buffer in storages:
            put_rate, get_rate = await measure(buffer, groups, args.groups_per_get)
            print(f"{name:28s} {put_rate:14,.0f} {get_rate:14,.0f}")


if __name__ == "__main__":
    asyncio.run(main())
