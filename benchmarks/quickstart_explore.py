"""The quickstart's explore step on each engine: embedded without / with prefix caching, vLLM.

    python benchmarks/quickstart_explore.py [--engines embedded-nocache,embedded,vllm] [--steps 2]

Engines: embedded-nocache (prefix caching off), embedded-unfused (transformers' decode forward
instead of `engines/fused.py`), embedded (the default), embedded-allcores (every core computes),
vllm.

Runs `agentscope-rft explore` on the quickstart's train split (its config: 4 tasks x 8 episodes
per step, temperature 1.0, the same seeds for every engine), `--steps` steps' worth of tasks,
each engine in its own process one after the other. Reported: explore seconds per step (engine
start-up excluded), episodes' mean reward (a sanity check: the same policy), and the prefix
cache's hit rate. Prints a Markdown table for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = {
    "embedded-nocache": ["engine.prefix_caching=false"],
    "embedded-unfused": ["engine.fused_decode=false"],
    "embedded": [],
    "embedded-allcores": [f"engine.num_threads={os.cpu_count() or 1}"],
    "vllm": ["engine.type=vllm", "engine.kv_cache_space_gib=1"],
}


def run(name: str, steps: int, out: Path, src: str | None = None) -> dict:
    command = [
        sys.executable,
        "-m",
        "agentscope_rft.cli",
        "explore",
        "--config",
        str(Path(src or ROOT).resolve() / "examples/quickstart/config.yaml"),
        "--split",
        "train",
        "--limit",
        str(4 * steps),
        "--out",
        str(out / name),
        "--log-level",
        "WARNING",
    ]
    for setting in SETTINGS.get(name, []):
        command += ["--set", setting]
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
            rows.append(run("embedded-baseline", args.steps, Path(tmp), args.baseline_src))
            print(json.dumps(rows[-1]), flush=True)
        for name in args.engines.split(","):
            rows.append(run(name, args.steps, Path(tmp)))
            print(json.dumps(rows[-1]), flush=True)
    print(f"\nquickstart explore, {args.steps} steps of 32 episodes; uptime at start: {load}\n")
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
