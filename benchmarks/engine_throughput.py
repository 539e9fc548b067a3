"""Embedded engine throughput vs sequential `model.generate`, same model, prompts and lengths.

    python benchmarks/engine_throughput.py [--prompts 32] [--tokens 64] [--concurrency 8,32]

Baseline: the same HF model (same dtype) generating the prompts one at a time with
`model.generate` (sampling, exactly `--tokens` new tokens). Ours: the embedded engine serving the
same chat prompts with N requests in flight (exactly `--tokens` new tokens each, `ignore_eos`).
Both in one run; reports tokens/s, p50 latency per request and the speed-up ratio as a Markdown
table for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

import torch

from agentscope_rft.engines.base import ChatRequest, ChoiceDone
from agentscope_rft.engines.embedded import EmbeddedEngine
from agentscope_rft.models import EMBEDDED_MODEL, load_causal_lm, resolve_model
from agentscope_rft.types import SamplingParams

TOPICS = [
    "the sea",
    "mountains",
    "a city at night",
    "rain",
    "coffee",
    "old trains",
    "jazz",
    "a garden",
    "winter",
    "robots",
    "bread",
    "the moon",
    "libraries",
    "bicycles",
    "volcanoes",
    "chess",
]


def prompts(count: int) -> list[list[dict]]:
    return [
        [
            {
                "role": "user",
                "content": f"Write a short story about {TOPICS[i % len(TOPICS)]}. "
                f"Story number {i}.",
            }
        ]
        for i in range(count)
    ]


def baseline(engine: EmbeddedEngine, convs: list[list[dict]], tokens: int) -> dict:
    assert engine.dtype is not None
    model = load_causal_lm(engine.model_path, dtype=engine.dtype)
    latencies = []
    started = time.perf_counter()
    with torch.no_grad():
        for conv in convs:
            ids = torch.tensor([engine.renderer.render_ids(conv)])
            t0 = time.perf_counter()
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=True,
                temperature=1.0,
                top_k=0,
                max_new_tokens=tokens,
                min_new_tokens=tokens,
            )
            latencies.append(time.perf_counter() - t0)
            assert out.shape[1] - ids.shape[1] == tokens
    elapsed = time.perf_counter() - started
    return {
        "setting": "HF model.generate, one at a time",
        "tokens_per_s": len(convs) * tokens / elapsed,
        "p50_latency_s": statistics.median(latencies),
    }


async def ours(engine: EmbeddedEngine, convs: list[list[dict]], tokens: int, n: int) -> dict:
    limit = asyncio.Semaphore(n)
    latencies: list[float] = []

    async def one(i: int, conv: list[dict]) -> int:
        async with limit:
            t0 = time.perf_counter()
            request = ChatRequest(
                messages=conv,
                sampling=SamplingParams(
                    temperature=1.0, max_tokens=tokens, seed=i, ignore_eos=True
                ),
            )
            count = 0
            async for event in engine.chat(request):
                if isinstance(event, ChoiceDone):
                    count = len(event.choice.completion_ids)
            latencies.append(time.perf_counter() - t0)
            return count

    started = time.perf_counter()
    counts = await asyncio.gather(*[one(i, c) for i, c in enumerate(convs)])
    elapsed = time.perf_counter() - started
    assert all(c == tokens for c in counts)
    return {
        "setting": f"embedded engine, {n} concurrent",
        "tokens_per_s": sum(counts) / elapsed,
        "p50_latency_s": statistics.median(latencies),
    }


async def main(args: argparse.Namespace) -> None:
    engine = EmbeddedEngine(resolve_model(EMBEDDED_MODEL), dtype=args.dtype)
    await engine.start()
    convs = prompts(args.prompts)
    await ours(engine, convs[:2], 4, 2)  # warm-up
    rows = [await asyncio.to_thread(baseline, engine, convs, args.tokens)]
    for n in args.concurrency:
        rows.append(await ours(engine, convs, args.tokens, n))
    await engine.close()
    base = rows[0]["tokens_per_s"]
    print(
        f"\nSmolLM2-135M-Instruct, {str(engine.dtype).removeprefix('torch.')}, "
        f"{torch.get_num_threads()} threads, {args.prompts} prompts x {args.tokens} new tokens\n"
    )
    print("| setting | tokens/s | p50 latency (s) | vs baseline |")
    print("|---|---:|---:|---:|")
    for row in rows:
        print(
            f"| {row['setting']} | {row['tokens_per_s']:.1f} | {row['p50_latency_s']:.2f} | "
            f"{row['tokens_per_s'] / base:.2f}x |"
        )
    if args.json:
        print(json.dumps(rows))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument(
        "--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[8, 32]
    )
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--json", action="store_true")
    asyncio.run(main(parser.parse_args()))
