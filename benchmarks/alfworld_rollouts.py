"""ALFWorld agent episodes per second: one episode at a time vs many at once, same games.

    python benchmarks/alfworld_rollouts.py [--engine scripted|embedded] [--episodes 16]
        [--concurrency 1,4,16] [--workflow run|run_window] [--model PATH]

Runs the example's agent (`examples/alfworld/app.py`, 10 commands) on the first `--episodes` test
games of `examples/alfworld/data/test.jsonl` through the real gateway, explorer and game engine,
at each concurrency, in one process, and checks that every concurrency produced the same episodes
(commands, rewards) as one at a time. `scripted` replies with `workflows.alfworld_scripted`
(no model compute: what is left is the game engine, serialized by its process-wide lock, and the
framework); `embedded` is SmolLM2-135M on the embedded engine, greedy (its batcher runs
concurrent calls together; `--model` serves a trained checkpoint). Each concurrency gets a fresh
engine, so no side finds the other's prompts in the prefix cache. Prints a Markdown table for
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agentscope_rft.explorer.explorer import EpisodeSettings, Explorer  # noqa: E402
from agentscope_rft.explorer.tasks import load_tasks  # noqa: E402
from agentscope_rft.gateway.server import Gateway  # noqa: E402
from agentscope_rft.types import Rollout  # noqa: E402


def make_engine(kind: str, model: str) -> Any:
    if kind == "scripted":
        from agentscope_rft.testing import ScriptedEngine
        from workflows.alfworld_scripted import searcher_reply

        return ScriptedEngine(searcher_reply)
    from agentscope_rft.engines.embedded import EmbeddedEngine

    return EmbeddedEngine(model)


def episode_key(rollout: Rollout) -> tuple[Any, ...]:
    calls = sorted(rollout.calls, key=lambda c: c.started_at)
    return (rollout.task_id, rollout.reward, tuple(c.content for c in calls))


async def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    from agentscope_rft.api import load_workflow

    workflow = load_workflow(f"{ROOT}/examples/alfworld/app.py:{args.workflow}")
    rows = [json.loads(line) for line in (ROOT / args.tasks).read_text().splitlines()]
    tasks = load_tasks(rows[: args.episodes])
    results: list[dict[str, Any]] = []
    reference: list[tuple[Any, ...]] | None = None
    greedy = {"": {"temperature": 0.0, "max_tokens": 16}}
    for concurrency in args.concurrency:
        engine = make_engine(args.engine, args.model)  # a cold prefix cache for every side
        await engine.start()
        try:
            async with Gateway(engine, sampling_overrides=greedy) as gateway:
                settings = EpisodeSettings(
                    max_concurrency=concurrency, max_retries=0, episode_timeout=3600
                )
                explorer = Explorer(workflow, gateway, settings)
                start = time.perf_counter()
                rollouts = await asyncio.gather(*(explorer.run_episode(t) for t in tasks))
                seconds = time.perf_counter() - start
                await explorer.close()
                keys = [episode_key(r) for r in rollouts]
                reference = reference or keys
                results.append(
                    {
                        "concurrency": concurrency,
                        "seconds": seconds,
                        "episodes_per_s": len(tasks) / seconds,
                        "calls": sum(len(r.calls) for r in rollouts),
                        "success": sum(r.success for r in rollouts) / len(rollouts),
                        "same_as_first": keys == reference,
                        "failed": sum(not r.ok for r in rollouts),
                    }
                )
                print(json.dumps(results[-1]), flush=True)
        finally:
            await engine.close()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=("scripted", "embedded"), default="scripted")
    parser.add_argument("--episodes", type=int, default=16)
    parser.add_argument("--concurrency", default="1,4,16")
    parser.add_argument("--workflow", default="run", help="run (full history) or run_window")
    parser.add_argument("--model", default="smollm2-135m-instruct", help="embedded: model or path")
    parser.add_argument("--tasks", default="examples/alfworld/data/test.jsonl")
    args = parser.parse_args()
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    results = asyncio.run(measure(args))
    base = results[0]["episodes_per_s"]
    print("\n| concurrency | episodes/s | speed-up | calls | success | same episodes |")
    print("|---|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r['concurrency']} | {r['episodes_per_s']:.3f} | "
            f"{r['episodes_per_s'] / base:.2f}x | {r['calls']} | {r['success']:.2f} | "
            f"{'yes' if r['same_as_first'] else 'NO'} |"
        )


if __name__ == "__main__":
    main()
