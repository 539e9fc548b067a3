"""A multi-agent app trains: each agent's trajectory is grouped and scored apart."""

import json

from agentscope_rft.config import load_config
from agentscope_rft.runtime.local import train


async def test_two_agents_sharing_the_policy_train(tiny_model_path, toy_tasks, tmp_path):
    run_dir = tmp_path / "run"
    config = load_config(
        None,
        [
            f"model.name_or_path={tiny_model_path}",
            "workflow=tests/integration/toy_app.py:two_agents",
            f"tasks.train={toy_tasks}",
            "explorer.group_size=4",
            "explorer.tasks_per_step=2",
            "explorer.sampling.max_tokens=8",
            "engine.dtype=float32",
            "trainer.dtype=float32",
            f"run.dir={run_dir}",
            "run.name=two-agents",
            "run.steps=2",
            "monitor.tensorboard=false",
        ],
    )
    await train(config, run_dir)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r.get("phase") == "train" and "train/groups" in r]
    assert len(steps) == 2
    # two tasks, each a group per agent: the proposers compared together, the critics together
    assert all(r["train/groups"] == 4 for r in steps), steps
    assert any(r["train/zero_variance_groups"] < 4 for r in steps), steps
    rollouts = [json.loads(line) for line in (run_dir / "rollouts.jsonl").read_text().splitlines()]
    assert {c["agent"] for r in rollouts for c in r["calls"]} == {"proposer", "critic"}
