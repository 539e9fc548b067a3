"""A synthetic metrics.jsonl: a learning curve with noise, eval points and a resume."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path


def write_synthetic_run(run_dir: Path, steps: int = 60, *, with_std: bool = True) -> Path:
    """Binary rewards whose success probability rises; 30-40 s per step; eval every 20 steps;
    a crash after step 45 resumed from the checkpoint of step 40."""
    rng = random.Random(0)
    run_dir.mkdir(parents=True, exist_ok=True)
    lines = []
    clock = 1_700_000_000.0

    def train_step(step: int) -> None:
        nonlocal clock
        clock += 30 + 10 * rng.random()
        chance = 0.2 + 0.6 * (1 - math.exp(-step / 25))
        rewards = [1.0 if rng.random() < chance else 0.0 for _ in range(32)]
        mean = sum(rewards) / len(rewards)
        record = {"step": step, "time": clock, "phase": "train", "reward/mean": mean}
        if with_std:
            record["reward/std"] = math.sqrt(mean * (1 - mean))
        else:
            record["reward/min"], record["reward/max"] = min(rewards), max(rewards)
        record["success_rate"] = mean
        lines.append(record)
        if step % 20 == 0:
            lines.append(
                {
                    "step": step,
                    "time": clock,
                    "phase": "eval",
                    "reward/mean": chance,
                    "success_rate": chance,
                }
            )

    for step in range(1, min(steps, 45) + 1):
        train_step(step)
    if steps > 45:
        lines.append({"step": 41, "time": clock + 60, "phase": "resume"})
        for step in range(41, steps + 1):
            train_step(step)
    path = run_dir / "metrics.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path
