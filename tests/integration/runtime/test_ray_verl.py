"""The verl trainer's ranks join the run's Ray cluster (the one `runtime: ray` connected to)."""

from __future__ import annotations

import logging

import pytest
import torch

from agentscope_rft.algorithms import AlgorithmConfig
from agentscope_rft.config import ConfigError, VerlTrainerConfig, load_config
from agentscope_rft.types import Sample

ray = pytest.importorskip("ray")
pytest.importorskip("verl", reason="verl is not installed (pip install 'agentscope-rft[verl]')")


def _samples(num: int = 4) -> list[Sample]:
    gen = torch.Generator().manual_seed(0)
    out = []
    for i in range(num):
        mask = [0, 0, 0] + [1] * 6
        out.append(
            Sample(
                token_ids=torch.randint(3, 4000, (len(mask),), generator=gen).tolist(),
                loss_mask=mask,
                logprobs=[-9.0 if m else 0.0 for m in mask],
                reward=float(i % 2),
                rollout_id=f"r{i}",
                task_id="t0",
            )
        )
    return out


def _node_of(actor) -> str:
    return ray.get(actor.__ray_call__.remote(lambda _self: ray.get_runtime_context().get_node_id()))


@pytest.mark.slow
def test_verl_ranks_join_the_runs_cluster(ray_driver, tiny_model_path, caplog):
    from agentscope_rft.trainers.verl.trainer import VerlTrainer

    torch.set_num_threads(1)  # see tests/integration/verl/conftest.py
    address = ray.get_runtime_context().gcs_address
    nodes = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    assert len(nodes) == 2
    # One CPU rank on each of the two one-CPU nodes: only this cluster can hold them.
    config = VerlTrainerConfig(
        device="cpu", n_gpus_per_node=1, nnodes=2, micro_batch_size=2, dtype="float32", lr=1e-3
    )
    with caplog.at_level(logging.INFO, logger="agentscope_rft.trainers.verl.trainer"):
        trainer = VerlTrainer(tiny_model_path, config, AlgorithmConfig(), total_steps=1)
    try:
        assert not trainer._owns_ray
        assert f"2 rank(s) in the Ray cluster this process is connected to ({address})" in (
            caplog.text
        )
        assert "started a local Ray" not in caplog.text
        workers = trainer.backend.group.workers
        assert {_node_of(w) for w in workers} == nodes  # the ranks are actors of this cluster
        metrics = trainer.step(_samples(), 0)
        assert metrics["grad_norm"] > 0 and metrics["train/samples"] == 4
    finally:
        trainer.close()
    assert ray.is_initialized()  # the run's connection (and cluster) is the run's to close
    assert ray.get_runtime_context().gcs_address == address


def test_a_verl_ray_of_its_own_is_refused_on_the_ray_runtime():
    base = ["workflow=app.py:run", "tasks.train=t.jsonl", "trainer.type=verl"]
    assert load_config(None, [*base, "trainer.ray.num_cpus=2"]).trainer.ray.num_cpus == 2
    with pytest.raises(ConfigError, match=r"with `runtime.type: ray` its ranks join the run's"):
        load_config(None, [*base, "runtime.type=ray", "trainer.ray.address=auto"])
