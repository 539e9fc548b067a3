"""What one torch-trainer step holds at its peak, by kind of tensor, and what the process adds.

    python benchmarks/step_memory.py [--micro-batch-tokens 512] [--steps 4] [--dtype auto]
        [--json out.json]

SmolLM2-135M-Instruct on CPU, quickstart-shaped GRPO batches (32 samples: a 376-token shared
prefix, a 12-token question per group of 8, 20-90 trained tokens), bf16 AdamW moments, fixed
micro-batches (no budget: both sides of a comparison run the same passes). Every step reports
the resident memory it added above its start (sampled every 5 ms; after freed memory is returned
to the system) and its seconds; the last step runs under torch's profiler, whose memory timeline
gives the live tensors at the step's peak by category (parameters, optimizer state, gradients,
activations kept for backward, temporaries) and by the op that made them. Resident memory between
steps is printed too (growth there is memory a step left behind: caches, fragmentation).

To compare two commits, run it in each checkout one after the other on an idle machine, under the
allocator the runs use (`LD_PRELOAD=.../libtcmalloc_minimal.so.4` for `run.allocator: auto`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from collections import Counter

import psutil
import torch

sys.path.insert(0, os.path.dirname(__file__))
from shared_prefix import batch

from agentscope_rft.algorithms import AlgorithmConfig
from agentscope_rft.config import TorchTrainerConfig
from agentscope_rft.models import resolve_model
from agentscope_rft.runtime.memory import release_freed_memory
from agentscope_rft.trainers.torch_trainer import TorchTrainer

GIB = 2**30


class Peak:
    """The process's resident memory, sampled every 5 ms by a thread."""

    def __init__(self) -> None:
        self.process = psutil.Process()
        self.peak = 0.0
        self._stop = False
        threading.Thread(target=self._run, daemon=True).start()

    def now(self) -> float:
        return self.process.memory_info().rss / GIB

    def _run(self) -> None:
        while not self._stop:
            self.peak = max(self.peak, self.now())
            time.sleep(0.005)

    def close(self) -> None:
        self._stop = True


def live_at_peak(profile: torch.profiler.profile) -> tuple[float, Counter]:
    """Peak bytes of live tensors in a profiled step, and what was live then, by (category, op)."""
    from torch.profiler._memory_profiler import Action

    memory = profile._memory_profile()
    made_by = {}
    for node in memory._data_flow_graph.flow_nodes:
        for key, edge in node._edges.items():
            if edge.is_allocation:
                made_by.setdefault(key, node._event.name)
    live: dict = {}
    total, best, best_live = 0, 0, {}
    for _, action, (key, version), size in memory.timeline:
        if action in (Action.PREEXISTING, Action.CREATE):
            live[key] = (size, version)
            total += size
        elif action == Action.DESTROY and key in live:
            total -= live.pop(key)[0]
        elif action == Action.INCREMENT_VERSION and key in live:
            live[key] = (live[key][0], version)
        if total > best:
            best, best_live = total, dict(live)
    kinds: Counter = Counter()
    for key, (size, version) in best_live.items():
        category = memory._categories.get(key, version)
        name = str(category).removeprefix("Category.") if category else "other"
        kinds[(name, made_by.get(key, "(before the step)"))] += size
    return best / GIB, kinds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--micro-batch-tokens", type=int, default=512)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--json")
    args = parser.parse_args()
    config = TorchTrainerConfig.model_validate(
        {
            "lr": 2e-5,
            "micro_batch_tokens": args.micro_batch_tokens,
            "optimizer_state_dtype": "bfloat16",
            "dtype": args.dtype,
        }
    )
    trainer = TorchTrainer(
        resolve_model("smollm2-135m-instruct"), config, AlgorithmConfig(), total_steps=8
    )
    peak = Peak()
    rows = []
    for step in range(args.steps):
        release_freed_memory()
        base = peak.now()
        peak.peak = base
        started = time.perf_counter()
        samples = batch(376, 12, 4, 8, seed=step)
        if step == args.steps - 1:
            with torch.profiler.profile(
                activities=[torch.profiler.ProfilerActivity.CPU],
                profile_memory=True,
                record_shapes=True,
                with_stack=True,
            ) as profile:
                metrics = trainer.step(samples, step)
        else:
            metrics = trainer.step(samples, step)
        seconds = time.perf_counter() - started
        rows.append(
            {
                "step": step,
                "rss_before_gib": round(base, 3),
                "added_gib": round(peak.peak - base, 3),
                "seconds": round(seconds, 2),
                "loss": metrics["loss"],
            }
        )
        print(rows[-1], flush=True)
    peak.close()
    live, kinds = live_at_peak(profile)
    print(f"\nlive tensors at the profiled step's peak: {live:.3f} GiB")
    print("| GiB | category | made by |\n|---:|---|---|")
    for (category, op), size in kinds.most_common():
        if size >= 0.005 * GIB:
            print(f"| {size / GIB:.3f} | {category} | {op} |")
    if args.json:
        by_kind = [
            {"category": c, "op": o, "gib": round(s / GIB, 4)} for (c, o), s in kinds.items()
        ]
        with open(args.json, "w") as out:
            json.dump({"steps": rows, "live_peak_gib": live, "live": by_kind}, out, indent=1)


if __name__ == "__main__":
    main()
