"""The ALFWorld example's configs validate; the GPU recipe mirrors Trinity's ALFWorld benchmark."""

from __future__ import annotations

from pathlib import Path

from agentscope_rft.api import load_callable, load_workflow
from agentscope_rft.config import load_config

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "alfworld"


def test_cpu_config_validates_and_its_files_exist() -> None:
    cfg = load_config(EXAMPLE / "config.yaml")
    assert cfg.engine.type == "embedded" and cfg.trainer.type == "torch"
    assert cfg.tasks.train is not None and Path(cfg.tasks.train).is_file()
    assert cfg.tasks.eval is not None and Path(cfg.tasks.eval).is_file()
    assert cfg.workflow is not None and load_workflow(cfg.workflow).name == "alfworld_full"


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
