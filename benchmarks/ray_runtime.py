"""Rollouts/s of an environment-bound workflow: local runtime vs `runtime: ray`.

    PYTHONPATH=. python benchmarks/ray_runtime.py --episodes 16 --steps 8 --step-s 0.05

Side by side in one run, on the same tasks and the same gateway (a scripted engine that answers
at once, so the environment is the bottleneck, as in ALFWorld): the local runtime (episodes are
asyncio tasks of one process), the Ray runtime with 2 runners on one node, the same 2 runners
spread over two Ray nodes started on loopback (head + worker), and 8 runners on one node. Each
row runs a warm-up batch first (runner start-up and imports), then measures one batch.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

from agentscope_rft.api import load_workflow
from agentscope_rft.config import load_config
from agentscope_rft.explorer.explorer import EpisodeSettings, Explorer
from agentscope_rft.explorer.runner import ModelSettings
from agentscope_rft.explorer.tasks import load_tasks
from agentscope_rft.gateway.server import Gateway
from agentscope_rft.testing import ScriptedEngine

APP = "benchmarks/env_bound_app.py:run"


def run_config(tmp: Path, **runtime: Any):
    tasks = tmp / "tasks.jsonl"
    tasks.write_text('{"id": "x"}\n')
    sets = [f"workflow={APP}", f"tasks.train={tasks}", "runtime.type=ray"]
    sets += [f"runtime.{k}={v}" for k, v in runtime.items()]
    return load_config(None, sets)


async def measure(explorer: Explorer, tasks: list[Any]) -> tuple[float, int]:
    await explorer.explore(tasks[:4], group_size=1, batch_id="warm")
    result = await explorer.explore(tasks, group_size=1, batch_id="run")
    failed = sum(not r.ok for r in result.rollouts)
    return len(tasks) / result.seconds, failed


async def row(name: str, gateway: Gateway, tasks: list[Any], tmp: Path, **runtime: Any) -> dict:
    from agentscope_rft.runtime.ray import RayRuntime

    settings = EpisodeSettings(max_concurrency=64, episode_timeout=600)
    workflow = load_workflow(APP)
    if not runtime:
        explorer = Explorer(workflow, gateway, settings)
        rate, failed = await measure(explorer, tasks)
        await explorer.close()
        return {"row": name, "rollouts_per_s": rate, "failed": failed, "start_s": 0.0}
    config = run_config(tmp, **runtime)
    started = time.perf_counter()
    ray_runtime = RayRuntime(config)
    try:
        model = ModelSettings(gateway.engine.model_name)
        pool = await ray_runtime.episode_runner(config, model, gateway.port)
        start_s = time.perf_counter() - started
        explorer = Explorer(workflow, gateway, settings, runner=pool)
        rate, failed = await measure(explorer, tasks)
        await explorer.close()
    finally:
        ray_runtime.close()
    return {"row": name, "rollouts_per_s": rate, "failed": failed, "start_s": start_s}


async def main(args: argparse.Namespace) -> list[dict]:
    from ray.cluster_utils import Cluster

    engine = ScriptedEngine(lambda messages, tools: "go to countertop 1")
    tmp = Path(args.tmp)
    tmp.mkdir(parents=True, exist_ok=True)
    results = []
    async with Gateway(engine, generate_api_key=True) as gateway:
        for kind in args.kinds.split(","):
            tasks = load_tasks(
                [
                    {"id": f"t{i}", "kind": kind, "steps": args.steps, "step_s": args.step_s}
                    for i in range(args.episodes)
                ]
            )
            rows = [
                await row(f"{kind}: local runtime", gateway, tasks, tmp),
                await row(
                    f"{kind}: ray, 2 runners, 1 node",
                    gateway,
                    tasks,
                    tmp,
                    num_cpus=2,
                    runners=2,
                    runner_cpus=0.5,
                    episodes_per_runner=8,
                ),
            ]
            cluster = Cluster(
                initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False}
            )
            cluster.add_node(num_cpus=1)
            try:
                rows.append(
                    await row(
                        f"{kind}: ray, 2 runners, 2 nodes (loopback)",
                        gateway,
                        tasks,
                        tmp,
                        address=cluster.address,
                        runners=2,
                        runner_cpus=0.5,
                        episodes_per_runner=8,
                    )
                )
            finally:
                cluster.shutdown()
            rows.append(
                await row(
                    f"{kind}: ray, 8 runners, 1 node",
                    gateway,
                    tasks,
                    tmp,
                    num_cpus=2,
                    runners=8,
                    runner_cpus=0.25,
                    episodes_per_runner=2,
                )
            )
            base = rows[0]["rollouts_per_s"]
            for r in rows:
                r["vs_local"] = r["rollouts_per_s"] / base
            results.extend(rows)
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--episodes", type=int, default=16)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--step-s", type=float, default=0.05)
    parser.add_argument("--kinds", default="sleep,cpu")
    parser.add_argument("--tmp", default="/tmp/agentscope_rft_ray_bench")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    args = parser.parse_args()
    load = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    results = asyncio.run(main(args))
    print(f"load before: {load}")
    print(
        f"{args.episodes} episodes x {args.steps} env steps of {args.step_s}s (+1 model call each)"
    )
    print("| setting | rollouts/s | vs local | failed | runner start (s) |")
    print("|---|---:|---:|---:|---:|")
    for r in results:
        print(
            f"| {r['row']} | {r['rollouts_per_s']:.2f} | {r['vs_local']:.2f}x | {r['failed']} "
            f"| {r['start_s']:.1f} |"
        )
    Path(args.tmp, "results.json").write_text(json.dumps(results, indent=1))
