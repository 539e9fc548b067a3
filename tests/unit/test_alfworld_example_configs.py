"""The ALFWorld example's configs validate; the GPU recipe mirrors Trinity's ALFWorld benchmark."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentscope_rft.api import load_callable, load_workflow
from agentscope_rft.config import load_config

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "alfworld"


def test_cpu_config_validates_and_its_files_exist() -> None:
    cfg = load_config(EXAMPLE / "config.yaml")
    assert cfg.engine.type == "embedded" and cfg.trainer.type == "torch"
    assert cfg.tasks.train is not None and Path(cfg.tasks.train).is_file()
    assert cfg.tasks.eval is not None and Path(cfg.tasks.eval).is_file()
    assert cfg.workflow is not None and load_workflow(cfg.workflow).name == "alfworld_full"
    assert 0 < cfg.offline.warmup_steps < cfg.run.steps
    assert cfg.offline.path is not None and Path(cfg.offline.path).is_file()
    # Every choice uses the validation split: the best checkpoint by validation success, a
    # validation at the end of the warm-up and at the last step.
    assert cfg.tasks.val is not None and Path(cfg.tasks.val).name == "val.jsonl"
    assert Path(cfg.tasks.eval).name == "test.jsonl" and cfg.tasks.eval_limit is None
    assert cfg.run.best_metric == "val/success_rate"
    assert cfg.offline.warmup_steps % cfg.run.eval_every == 0
    assert cfg.run.steps % cfg.run.eval_every == 0
    rows = [json.loads(line) for line in Path(cfg.tasks.val).read_text().splitlines()]
    assert cfg.tasks.stratify_field is not None and all(cfg.tasks.stratify_field in r for r in rows)
    assert cfg.tasks.val_limit is not None and cfg.tasks.val_limit < len(rows)


def test_the_sft_control_differs_from_the_rl_arm_only_in_the_rl_weight() -> None:
    rl = load_config(EXAMPLE / "config.yaml").model_dump(mode="json")
    control = load_config(EXAMPLE / "config_sft_control.yaml").model_dump(mode="json")
    assert rl["algorithm"]["objective"] == control["algorithm"]["objective"] == "sft_rl_mix"
    mix = control["algorithm"].pop("sft_mix")
    assert (mix["mu_peak"], mix["mu_valley"]) == (1.0, 1.0)  # loss = 0 x RL + 1 x SFT
    assert rl["algorithm"].pop("sft_mix") == {**mix, "mu_peak": 0.5, "mu_valley": 0.5}
    assert (rl["run"].pop("name"), control["run"].pop("name")) == (
        "alfworld",
        "alfworld_sft_control",
    )
    assert rl == control  # the same games, steps, schedule, validation and best checkpoint


def test_the_demonstrations_are_won_training_games_that_load_as_sft_samples() -> None:
    from agentscope_rft.buffer.offline import load_sft_samples
    from agentscope_rft.chat.template import ChatRenderer
    from agentscope_rft.models import load_tokenizer, resolve_model

    def ids(name: str) -> set[str]:
        lines = (EXAMPLE / "data" / name).read_text().splitlines()
        return {json.loads(line)["id"] for line in lines}

    demos = ids("demos.jsonl")
    assert len(demos) >= 150 and demos <= ids("train.jsonl")
    assert not demos & (ids("test.jsonl") | ids("val.jsonl"))  # held-out games never do
    renderer = ChatRenderer(load_tokenizer(resolve_model("tiny-random")))
    samples = load_sft_samples(EXAMPLE / "data" / "demos.jsonl", renderer)
    assert len(samples) == len(demos)
    text = renderer.tokenizer.decode(
        [t for t, m in zip(samples[0].token_ids, samples[0].loss_mask, strict=True) if m]
    )
    assert text.startswith("go to ") and "move " in text and "Admissible" not in text


def test_gpu_config_mirrors_trinitys_alfworld_benchmark() -> None:
    cfg = load_config(EXAMPLE / "config_gpu.yaml")
    assert cfg.engine.type == "vllm" and cfg.trainer.type == "verl"
    assert (cfg.explorer.tasks_per_step, cfg.explorer.group_size) == (32, 8)
    assert cfg.trainer.lr == 1e-6
    assert cfg.workflow is not None
    assert load_workflow(cfg.workflow).name == "alfworld_gpu"
    settings = load_callable(f"{EXAMPLE / 'app.py'}:GPU_SETTINGS")
    assert (settings.max_steps, settings.failure_reward) == (30, -0.1)


def test_curriculum_stage_2_config_validates() -> None:
    cfg = load_config(EXAMPLE / "config_stage2.yaml")
    assert cfg.tasks.train is not None and Path(cfg.tasks.train).is_file()
    assert cfg.workflow is not None and load_workflow(cfg.workflow).name == "alfworld_stage2"


def test_window_config_is_the_full_configs_twin_with_window_demonstrations() -> None:
    full = load_config(EXAMPLE / "config.yaml")
    window = load_config(EXAMPLE / "config_window.yaml")
    assert window.workflow is not None and load_workflow(window.workflow).name == "alfworld_window"
    assert window.algorithm.advantage.type == "gigpo"
    for part in ("explorer", "trainer", "tasks"):
        assert getattr(window, part) == getattr(full, part)
    assert (window.run.eval_every, window.run.best_metric) == (
        full.run.eval_every,
        full.run.best_metric,
    )
    assert (window.run.steps, window.offline.warmup_steps) == (full.run.steps, 16)
    assert window.algorithm.objective == full.algorithm.objective
    lines = [json.loads(line) for line in Path(window.offline.path or "").read_text().splitlines()]
    full_ids = {json.loads(line)["id"] for line in (EXAMPLE / "data/demos.jsonl").open()}
    assert {line["id"] for line in lines} == full_ids  # the same won games, one line per turn
    assert all(len(line["messages"]) == 3 for line in lines)  # system, window prompt, command
    assert all(
        line["messages"][1]["content"][0]["text"].startswith("Your task is to:") for line in lines
    )


def test_curriculum_stage_2_starts_from_stage_1s_last_checkpoint() -> None:
    stage1 = load_config(EXAMPLE / "config.yaml")
    text = (EXAMPLE / "config_stage2.yaml").read_text()
    last = f"runs/{stage1.run.name}/checkpoints/step-{stage1.run.steps:06d}/model"
    assert f"name_or_path: {last}" in text and "step-0000" in text
    assert stage1.run.steps % stage1.run.checkpoint_every == 0  # that checkpoint is written


def test_gpu_config_requires_the_real_alfworld_task_rows() -> None:
    from agentscope_rft.explorer.tasks import TaskSetError
    from agentscope_rft.runtime.preflight import preflight

    with pytest.raises(
        TaskSetError, match=r"alfworld_train.jsonl does not exist \(tasks.train\): .*--set tasks"
    ):
        preflight(load_config(EXAMPLE / "config_gpu.yaml"))
