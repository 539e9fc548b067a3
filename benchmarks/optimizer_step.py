"""The optimizer step alone on SmolLM2-135M's parameter shapes: torch's AdamW (fp32 moments)
against `BF16StateAdamW` (bf16 moments, `trainer.optimizer_state_dtype: bfloat16`), each under
glibc's default allocator and under `run.allocator: glibc-compact`'s settings (every tensor above
64 KiB mapped afresh), each setting in its own child process.

    python benchmarks/optimizer_step.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

SHAPES = [(49152, 576)] + [(576, 576)] * 60 + [(192, 576)] * 60 + [(1536, 576)] * 90
"""SmolLM2-135M: the tied embedding, q/o, k/v and the MLP's three projections of 30 layers."""
COMPACT = {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_ARENA_MAX": "2"}


def child(kind: str, steps: int) -> dict:
    import torch

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from agentscope_rft.trainers.optim import BF16StateAdamW

    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(s) * 0.02) for s in SHAPES]
    optimizer = (
        torch.optim.AdamW(params, lr=1e-5) if kind == "fp32" else BF16StateAdamW(params, lr=1e-5)
    )
    times = []
    for _ in range(steps):
        for p in params:
            p.grad = torch.randn_like(p) * 1e-3
        started = time.perf_counter()
        optimizer.step()
        times.append(time.perf_counter() - started)
        for p in params:
            p.grad = None
    return {"parameters": sum(p.numel() for p in params), "step_s": times}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--json", default=None)
    parser.add_argument("--child", choices=["fp32", "bf16"])
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.steps)))
        return
    results = {}
    for allocator, env in (("glibc_default", {}), ("compact", COMPACT)):
        for kind in ("fp32", "bf16"):
            argv = [sys.executable, __file__, "--child", kind, "--steps", str(args.steps)]
            done = subprocess.run(
                argv, env={**os.environ, **env}, capture_output=True, text=True, check=True
            )
            result = json.loads(done.stdout.strip().splitlines()[-1])
            results[f"{kind}_{allocator}"] = result
            later = result["step_s"][1:] or result["step_s"]
            print(f"{kind:5s} {allocator:14s} step {sum(later) / len(later):.2f} s", flush=True)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(results, handle, indent=1)


if __name__ == "__main__":
    main()
