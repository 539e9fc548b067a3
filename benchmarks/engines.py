"""Embedded engine vs vLLM on the same CPU, model and prompts: throughput, latency, weight sync.

    python benchmarks/engines.py [--engines embedded,vllm] [--concurrency 1,8,32] [--tokens 64]

For each engine: start-up seconds, then for each concurrency level N, N concurrent chat calls
(distinct prompts asking for long answers, greedy, at most `--tokens` new tokens), repeated for
`--rounds`; completion tokens per second over the wall time and the p50 latency of one call.
Last, the seconds of one weight sync (the same checkpoint folder reloaded as a new version).
Prints a Markdown table for docs/benchmarks.md. vLLM needs its environment
(scripts/install_vllm.sh).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from pathlib import Path

from agentscope_rft.engines.base import ChatRequest, ChoiceDone, Engine
from agentscope_rft.models import EMBEDDED_MODEL, resolve_model
from agentscope_rft.types import SamplingParams

TOPICS = ["the sea", "mountains", "a city", "rain", "coffee", "trains", "music", "a garden"]


def make_engine(name: str, model: Path, dtype: str) -> Engine:
    if name == "embedded":
        from agentscope_rft.engines.embedded import EmbeddedEngine

        return EmbeddedEngine(model, dtype=dtype)
    from agentscope_rft.engines.vllm import VLLMEngine

    return VLLMEngine(model, dtype=dtype, enforce_eager=True, max_model_len=2048)


async def one_call(engine: Engine, i: int, tokens: int) -> tuple[float, int]:
    topic = TOPICS[i % len(TOPICS)]
    request = ChatRequest(
        messages=[{"role": "user", "content": f"Write a long essay about {topic} (#{i})."}],
        sampling=SamplingParams(temperature=0.0, max_tokens=tokens),
    )
    started = time.perf_counter()
    count = 0
    async for event in engine.chat(request):
        if isinstance(event, ChoiceDone):
            count += len(event.choice.completion_ids)
    return time.perf_counter() - started, count


async def bench(name: str, args: argparse.Namespace, model: Path) -> list[dict]:
    engine = make_engine(name, model, args.dtype)
    started = time.perf_counter()
    await engine.start()
    startup = time.perf_counter() - started
    await one_call(engine, 0, 8)  # warm-up
    rows = []
    try:
        for n in args.concurrency:
            latencies: list[float] = []
            tokens = 0
            wall = 0.0
            for r in range(args.rounds):
                t0 = time.perf_counter()
                results = await asyncio.gather(
                    *(one_call(engine, r * n + i, args.tokens) for i in range(n))
                )
                wall += time.perf_counter() - t0
                latencies += [lat for lat, _ in results]
                tokens += sum(count for _, count in results)
            rows.append(
                {
                    "engine": name,
                    "concurrency": n,
                    "tokens_per_s": tokens / wall,
                    "p50_latency_s": statistics.median(latencies),
                }
            )
            print(rows[-1], flush=True)
        sync = await engine.load_weights(model, engine.policy_version + 1)
    finally:
        await engine.close()
    for row in rows:
        row.update(startup_s=startup, sync_s=sync)
    return rows


def table(rows: list[dict]) -> str:
    lines = [
        "| engine | concurrent calls | tokens/s | p50 latency (s) | start-up (s) | sync (s) |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['engine']} | {r['concurrency']} | {r['tokens_per_s']:.0f} | "
            f"{r['p50_latency_s']:.2f} | {r['startup_s']:.0f} | {r['sync_s']:.2f} |"
        )
    by = {(r["engine"], r["concurrency"]): r for r in rows}
    for n in sorted({r["concurrency"] for r in rows}):
        if ("embedded", n) in by and ("vllm", n) in by:
            ratio = by[("vllm", n)]["tokens_per_s"] / by[("embedded", n)]["tokens_per_s"]
            lines.append(f"\nvLLM / embedded throughput at {n} concurrent calls: {ratio:.2f}x")
    return "\n".join(lines)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", default="embedded,vllm")
    parser.add_argument("--concurrency", default="1,8,32")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--model", default=EMBEDDED_MODEL)
    args = parser.parse_args()
    args.concurrency = [int(n) for n in args.concurrency.split(",")]
    model = resolve_model(args.model)
    rows: list[dict] = []
    for name in args.engines.split(","):
        rows += await bench(name, args, model)
    print(table(rows))


if __name__ == "__main__":
    asyncio.run(main())
