"""Run folders written by hand, the way a run writes them, for the dashboard's tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml


def write_run(
    folder: Path,
    *,
    steps: int = 3,
    done: int = 3,
    status: dict[str, Any] | None = None,
    health: list[dict[str, Any]] | None = None,
    seed: int = 0,
) -> Path:
    """A run folder with `done` train steps (reward 0.1 * step), an eval at the end, two
    episodes and their samples per step (one group of two)."""
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(
        yaml.safe_dump(
            {"model": {"name_or_path": "no-such-model"}, "run": {"steps": steps, "seed": seed}}
        )
    )
    lines = [
        {"step": s, "time": 1000.0 + s, "phase": "train", "reward/mean": 0.1 * s}
        for s in range(done)
    ]
    lines.append({"step": done, "time": 1000.0 + done, "phase": "eval", "reward/mean": 0.5})
    (folder / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    rollouts, samples = [], []
    for s in range(done):
        for k, reward in enumerate((1.0, 0.0)):
            rid = f"s{s}.{k}"
            rollouts.append(
                {
                    "step": s,
                    "phase": "train",
                    "rollout_id": rid,
                    "task_id": f"t{s}",
                    "reward": reward,
                    "success": reward > 0,
                    "status": "ok",
                    "error": None,
                    "calls": [
                        {
                            "agent": "solver",
                            "prompt_tokens": 3,
                            "completion_tokens": 2,
                            "content": "hi",
                            "tool_calls": [],
                            "finish_reason": "stop",
                            "policy_version": s,
                        }
                    ],
                }
            )
            samples.append(
                {
                    "step": s,
                    "phase": "train",
                    "token_ids": [5, 6, 7, 8, 9, 2],
                    "loss_mask": [0, 0, 0, 1, 1, 0],
                    "logprobs": [0, 0, 0, -0.5, -0.25, 0],
                    "reward": reward,
                    "rollout_id": rid,
                    "task_id": f"t{s}",
                    "group_id": f"s{s}:t{s}",
                    "agent_name": "solver",
                    "sample_id": f"{rid}:solver:0",
                    "advantages": [0, 0, 0, 0.7, 0.7, 0],
                    "call_spans": [[3, 5]],
                    "break_reason": None,
                }
            )
    (folder / "rollouts.jsonl").write_text("".join(json.dumps(x) + "\n" for x in rollouts))
    (folder / "samples.jsonl").write_text("".join(json.dumps(x) + "\n" for x in samples))
    if status is not None:
        (folder / "status.json").write_text(json.dumps(status))
    if health:
        (folder / "health.jsonl").write_text("".join(json.dumps(x) + "\n" for x in health))
    return folder
