"""GPU placement (`gpus:`): overlap without colocation is refused with the fix named; split and
colocated layouts are accepted and reach vLLM's command line, environment and sleep/wake."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from agentscope_rft.config import RunConfig
from agentscope_rft.engines.vllm import VLLMEngine
from agentscope_rft.runtime.gpus import (
    GpuPlacement,
    PlacementError,
    check_placement,
    room_for_training,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def config(gpus: dict[str, Any] | None, **sections: Any) -> RunConfig:
    data: dict[str, Any] = {
        "workflow": "app.py:run",
        "tasks": {"train": "t.jsonl"},
        "engine": {"type": "vllm", "replicas": 2},
        "trainer": {"type": "verl", "n_gpus_per_node": 6},
        **sections,
    }
    if gpus is not None:
        data["gpus"] = gpus
    return RunConfig.model_validate(data)


SPLIT = {"mode": "split", "engine": [0, 1], "trainer": [2, 3, 4, 5, 6, 7]}


def test_split_placement_is_accepted() -> None:
    check_placement(config(SPLIT), visible_gpus=8)


def test_overlap_without_colocation_is_refused_and_names_the_fix() -> None:
    overlapping = {**SPLIT, "trainer": [1, 2, 3, 4, 5, 6]}
    with pytest.raises(PlacementError, match=r"GPU\(s\) \[1\] are in both .*gpus.mode: colocated"):
        check_placement(config(overlapping), visible_gpus=8)


def test_no_placement_with_vllm_and_a_gpu_trainer_on_a_gpu_machine_is_refused() -> None:
    with pytest.raises(PlacementError, match="state the placement: `gpus:"):
        check_placement(config(None), visible_gpus=8)
    check_placement(config(None), visible_gpus=0)  # a CPU machine: nothing to place


def test_colocated_placement_is_accepted_with_verl_offloading() -> None:
    shared = {"mode": "colocated", "engine": [0, 1], "trainer": [0, 1, 2, 3, 4, 5]}
    trainer = {
        "type": "verl",
        "n_gpus_per_node": 6,
        "param_offload": True,
        "optimizer_offload": True,
    }
    placed = config(shared, trainer=trainer)
    check_placement(placed, visible_gpus=8)
    assert placed.gpus is not None and placed.gpus.memory_fraction() == 0.5
    with pytest.raises(
        PlacementError, match=r"trainer.param_offload and trainer.optimizer_offload"
    ):
        check_placement(config(shared), visible_gpus=8)


@pytest.mark.parametrize(
    ("gpus", "sections", "message"),
    [
        ({**SPLIT, "engine": [0]}, {}, r"gpus.engine lists 1 GPUs; engine.replicas=2 x 1"),
        ({**SPLIT, "trainer": [2, 3]}, {}, r"trainer.n_gpus_per_node uses 6"),
        ({**SPLIT, "trainer": [2, 3, 4, 5, 6, 9]}, {}, r"GPU\(s\) \[9\] do not exist here"),
        (SPLIT, {"engine": {"type": "embedded"}}, "engine.device"),
        (
            SPLIT,
            {
                "engine": {
                    "type": "vllm",
                    "replicas": 2,
                    "extra_args": ["--gpu-memory-utilization=0.3"],
                }
            },
            "gpus.engine_memory_fraction",
        ),
    ],
)
def test_placements_that_cannot_work_name_the_key(gpus, sections, message) -> None:
    with pytest.raises(PlacementError, match=message):
        check_placement(config(gpus, **sections), visible_gpus=8)


def test_tensor_parallel_replicas_take_consecutive_slices() -> None:
    engine = {"type": "vllm", "replicas": 2, "extra_args": ["--tensor-parallel-size", "2"]}
    gpus = {"mode": "split", "engine": [0, 1, 2, 3], "trainer": [4, 5, 6, 7]}
    placed = config(gpus, engine=engine, trainer={"type": "verl", "n_gpus_per_node": 4})
    check_placement(placed, visible_gpus=8)
    assert placed.gpus is not None
    assert placed.gpus.replica_devices(2) == [[0, 1], [2, 3]]


def test_duplicate_ids_are_a_config_error() -> None:
    with pytest.raises(ValueError, match="distinct"):
        GpuPlacement(mode="split", engine=[0, 0], trainer=[1])


def test_the_placement_reaches_vllms_command_and_environment(tmp_path: Path) -> None:
    engine = VLLMEngine(
        "tiny-random",
        replicas=2,
        replica_gpus=[[0], [1]],
        gpu_memory_fraction=0.5,
        sleep_mode=True,
    )
    command = engine.server_command(Path("/venv/bin/python"), 8000)
    assert command[command.index("--gpu-memory-utilization") + 1] == "0.5"
    assert "--enable-sleep-mode" in command
    assert engine.server_env(0)["CUDA_VISIBLE_DEVICES"] == "0"
    assert engine.server_env(1)["CUDA_VISIBLE_DEVICES"] == "1"


class FakeEngine:
    def __init__(self) -> None:
        self.calls: list[str] = []

    async def sleep(self) -> None:
        self.calls.append("sleep")

    async def wake_up(self) -> None:
        self.calls.append("wake")


def test_colocated_engine_sleeps_around_the_trainer_step_and_split_does_not() -> None:
    async def step(gpus: dict[str, Any]) -> list[str]:
        engine = FakeEngine()
        async with room_for_training(engine, config(gpus)):
            engine.calls.append("train")
        return engine.calls

    colocated = {"mode": "colocated", "engine": [0, 1], "trainer": [0, 1, 2, 3, 4, 5]}
    assert asyncio.run(step(colocated)) == ["sleep", "train", "wake"]
    assert asyncio.run(step(SPLIT)) == ["train"]


def test_a_sync_run_frees_the_embedded_engines_caches_before_the_step() -> None:
    class Embedded:
        def __init__(self) -> None:
            self.calls: list[str] = []

        @contextlib.asynccontextmanager
        async def idle_for_training(self, refill: object = None) -> AsyncIterator[None]:
            assert refill is weights  # what it retakes a freed copy of its weights from
            self.calls.append("release")  # caches freed (held too, when weights are shared)
            yield
            self.calls.append("resume")

    async def step(mode: str) -> list[str]:
        engine = Embedded()
        run = RunConfig.model_validate(
            {"workflow": "app.py:run", "tasks": {"train": "t.jsonl"}, "run": {"mode": mode}}
        )
        async with room_for_training(engine, run, weights):
            engine.calls.append("train")
        return engine.calls

    def weights() -> dict[str, Any]:
        return {}

    assert asyncio.run(step("sync")) == ["release", "train", "resume"]
    assert asyncio.run(step("one_step_off")) == ["train"]  # it explores during the step


@pytest.mark.parametrize("name", ["web_search", "alfworld"])
def test_the_gpu_recipes_state_a_placement_that_is_accepted(name: str) -> None:
    from agentscope_rft.config import load_config

    recipe = load_config(EXAMPLES / name / "config_gpu.yaml")
    assert recipe.gpus is not None
    check_placement(recipe, visible_gpus=8)


def test_colocated_placement_needs_synchronous_steps() -> None:
    shared = {"mode": "colocated", "engine": [0, 1], "trainer": [0, 1, 2, 3, 4, 5]}
    trainer = {"type": "verl", "n_gpus_per_node": 6, "param_offload": True}
    trainer["optimizer_offload"] = True
    with pytest.raises(PlacementError, match=r"use run.mode: sync, or gpus.mode: split"):
        check_placement(
            config(shared, trainer=trainer, run={"mode": "one_step_off"}), visible_gpus=8
        )
