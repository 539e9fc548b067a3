"""A run whose engine can no longer serve (vLLM replicas crashed past `engine.max_restarts`) stops
after the step it happened in, naming the engine, with what it stored kept; it used to explore on,
every episode failing, until three empty steps in a row stopped it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentscope_rft.engines.vllm_server import VLLMServerError
from agentscope_rft.runtime import training
from agentscope_rft.runtime.local import train

from .test_train_loop import toy_config


async def test_an_engine_gone_for_good_stops_the_run_at_once(
    tiny_model_path: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(
        "".join(json.dumps({"id": f"t{i}", "prompt": f"Say {i}"}) + "\n" for i in range(8))
    )
    build = training.build_engine
    checks = []

    def gone_after_the_first_step(*args, **kwargs):
        engine = build(*args, **kwargs)

        def check() -> None:
            checks.append(len(checks))
            if len(checks) > 1:  # the second step's episodes met a dead server
                raise VLLMServerError("1 of 1 vLLM replica(s) gone for good: it crashed")

        engine.check = check
        return engine

    monkeypatch.setattr(training, "build_engine", gone_after_the_first_step)
    run_dir = tmp_path / "run"
    config = toy_config(tiny_model_path, tasks, tmp_path, "run.steps=5", "explorer.group_size=2")
    with pytest.raises(VLLMServerError, match="gone for good"):
        await train(config, run_dir)
    assert len(checks) == 2
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r.get("phase") == "train"] == [0]  # step 0 trained, once
    logged = [
        json.loads(line)["step"] for line in (run_dir / "rollouts.jsonl").read_text().splitlines()
    ]
    assert set(logged) == {0, 1}  # the failing step's episodes are kept for the post-mortem
