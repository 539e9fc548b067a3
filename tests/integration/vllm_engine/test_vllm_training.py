"""`engine: {type: vllm}` in the real training loop: episodes through vLLM, weights synced."""

from __future__ import annotations

import json

import pytest

from agentscope_rft.config import load_config
from agentscope_rft.runtime.local import train

from .conftest import VLLM_PYTHON

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


async def test_training_loop_runs_on_vllm(vllm_tiny_model_path, tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(
        "".join(
            json.dumps({"id": f"t{i}", "prompt": f"Say something {i}"}) + "\n" for i in range(4)
        )
    )
    run_dir = tmp_path / "run"
    config = load_config(
        None,
        [
            f"model.name_or_path={vllm_tiny_model_path}",
            "workflow=tests/integration/toy_app.py:run",
            f"tasks.train={tasks}",
            "engine.type=vllm",
            f"engine.python={VLLM_PYTHON}",
            "engine.enforce_eager=true",
            "engine.dtype=float32",
            "model.max_model_len=512",
            "explorer.group_size=4",
            "explorer.tasks_per_step=2",
            "explorer.sampling.max_tokens=8",
            "trainer.lr=5e-2",
            "trainer.dtype=float32",
            "run.steps=3",
            f"run.dir={run_dir}",
            "run.name=vllm",
            "monitor.tensorboard=false",
        ],
    )
    last = await train(config, run_dir)
    assert last["policy_version"] == 3.0 and last["time/sync"] > 0
    rollouts = [json.loads(x) for x in (run_dir / "rollouts.jsonl").read_text().splitlines()]
    versions = {(r["step"], c["policy_version"]) for r in rollouts for c in r["calls"]}
    assert versions == {(0, 0), (1, 1), (2, 2)}  # each step explored with the latest weights
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["train/samples"] for r in rows if "train/samples" in r] == [8.0, 8.0, 8.0]
