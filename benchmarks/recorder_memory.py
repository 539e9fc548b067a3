"""Resident memory of a long-lived gateway whose recorded rollouts nobody reads (a `serve`).

    python benchmarks/recorder_memory.py [--rollouts 6000] [--prompt-chars 6000] [--max-mib 64]

Sends `--rollouts` attributed calls over loopback HTTP (8 at a time), each in its own rollout with
a distinct prompt of `--prompt-chars` characters, and reads the process's RSS every 500 rollouts.
Two recorders, each in a fresh process: the old bound (10,000 rollouts, by count only) and the
memory bound (`max_bytes = --max-mib`, the default age limit). The engine is the scripted test
engine (real tokenizer and chat template, instant replies) with its prompt-reuse cache off, so
the numbers are the recorder's. Also reports the recorder's own byte estimate against the RSS.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import subprocess
import sys

import httpx
import psutil

from agentscope_rft.gateway.recorder import CallRecorder
from agentscope_rft.gateway.server import Gateway
from agentscope_rft.testing import ScriptedEngine

CONFIGS = {
    "count only (before)": {"max_rollouts": 10_000, "max_age": 1e9, "max_bytes": 1 << 50},
    "memory bound (now)": {},
}


def rss_mib() -> float:
    gc.collect()
    return psutil.Process().memory_info().rss / 2**20


async def run(config: str, rollouts: int, prompt_chars: int, max_mib: int) -> None:
    bounds = dict(CONFIGS[config]) or {"max_bytes": max_mib << 20}
    engine = ScriptedEngine(lambda messages, tools: "ok")
    engine.prompts.reuse = False
    recorder = CallRecorder(**bounds)  # type: ignore[arg-type]
    async with Gateway(engine, recorder=recorder) as gateway:
        base = gateway.base_url.removesuffix("/v1")
        filler = ("lorem ipsum dolor sit amet " * (prompt_chars // 27 + 1))[:prompt_chars]
        async with httpx.AsyncClient(base_url=base, timeout=60) as http:

            async def call(i: int) -> None:
                body = {"model": "m", "messages": [{"role": "user", "content": f"{i} {filler}"}]}
                response = await http.post(f"/rollouts/r{i}/v1/chat/completions", json=body)
                response.raise_for_status()

            start = rss_mib()
            for first in range(0, rollouts, 8):
                await asyncio.gather(*(call(i) for i in range(first, min(first + 8, rollouts))))
                engine.requests.clear()
                done = min(first + 8, rollouts)
                if done % 500 == 0 or done == rollouts:
                    stats = recorder.stats()
                    print(
                        json.dumps(
                            {
                                "rollouts": done,
                                "rss_mib": rss_mib(),
                                "start_mib": start,
                                "held_mib": stats["recorder_bytes"] / 2**20,
                                "held_rollouts": stats["recorder_rollouts"],
                                "evicted": stats["recorder_evictions_bytes"]
                                + stats["recorder_evictions_count"],
                            }
                        ),
                        flush=True,
                    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=6000)
    parser.add_argument("--prompt-chars", type=int, default=6000)
    parser.add_argument("--max-mib", type=int, default=64)
    parser.add_argument("--config", choices=list(CONFIGS), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.config:
        asyncio.run(run(args.config, args.rollouts, args.prompt_chars, args.max_mib))
        return
    rows: dict[str, list[dict[str, float]]] = {}
    for config in CONFIGS:
        done = subprocess.run(
            [sys.executable, __file__, "--config", config, "--rollouts", str(args.rollouts),
             "--prompt-chars", str(args.prompt_chars), "--max-mib", str(args.max_mib)],
            capture_output=True, text=True,
        )  # fmt: skip
        if done.returncode != 0:
            sys.exit(f"{config} failed:\n{done.stderr[-3000:]}")
        rows[config] = [json.loads(x) for x in done.stdout.splitlines() if x.startswith("{")]
    names = list(CONFIGS)
    print(f"| rollouts | RSS growth: {names[0]} | RSS growth: {names[1]} (held estimate) |")
    print("|---|---|---|")
    for a, b in zip(rows[names[0]], rows[names[1]], strict=True):
        print(
            f"| {a['rollouts']:,} | {a['rss_mib'] - a['start_mib']:+.0f} MiB "
            f"(estimate {a['held_mib']:.0f}) | {b['rss_mib'] - b['start_mib']:+.0f} MiB "
            f"(estimate {b['held_mib']:.0f}, {b['held_rollouts']:.0f} rollouts, "
            f"{b['evicted']:.0f} evicted) |"
        )


if __name__ == "__main__":
    main()
