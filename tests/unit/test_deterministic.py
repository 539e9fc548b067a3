"""`run.deterministic`'s pieces: the settings it fixes, the sample order, the metrics it covers."""

import logging

import pytest
import torch

from agentscope_rft.config import RunConfig
from agentscope_rft.runtime.deterministic import deterministic_config, ordered, repeats
from agentscope_rft.types import Sample

BASE = {"workflow": "app.py:run", "tasks": {"train": "tasks.jsonl"}}


@pytest.fixture(autouse=True)
def _torch_settings_restored():
    """The flag switches torch to deterministic algorithms process-wide: switch back after."""
    yield
    torch.use_deterministic_algorithms(False)


def sample(rollout_id: str, k: int, version: int = 0) -> Sample:
    return Sample(
        token_ids=[1, 2],
        loss_mask=[0, 1],
        logprobs=[0.0, -1.0],
        reward=1.0,
        rollout_id=rollout_id,
        task_id="t",
        policy_version=version,
        sample_id=f"{rollout_id}:-:{k}",
    )


def test_samples_are_ordered_by_version_rollout_number_then_call():
    given = [sample("s1.10", 0), sample("s1.2", 1), sample("s1.2", 0), sample("s0.9", 0, 1)]
    got = [(s.rollout_id, s.sample_id) for s in ordered(given)]
    assert got == [
        ("s1.2", "s1.2:-:0"),
        ("s1.2", "s1.2:-:1"),
        ("s1.10", "s1.10:-:0"),  # 10 after 2: numbers compare as numbers
        ("s0.9", "s0.9:-:0"),  # a newer policy version last
    ]
    demo = Sample(
        token_ids=[1],
        loss_mask=[1],
        logprobs=[0.0],
        reward=0.0,
        rollout_id="",
        task_id="d",
        kind="sft",
    )
    assert ordered([demo, *given])[-1] is demo  # demonstrations keep their place after rollouts


def test_timed_settings_are_fixed_and_said(caplog):
    flagged = RunConfig.model_validate({**BASE, "run": {"deterministic": True}})
    with caplog.at_level(logging.INFO):
        fixed = deterministic_config(flagged)
    assert fixed.engine.num_threads == torch.get_num_threads()  # type: ignore[union-attr]
    assert fixed.engine.max_batch_size == 1  # type: ignore[union-attr]
    assert not fixed.engine.prefix_caching  # type: ignore[union-attr]
    assert "engine.num_threads fixed" in caplog.text and "computed alone" in caplog.text
    # episodes one at a time: concurrent ones would only queue into their timeout
    assert fixed.explorer.max_concurrency == 1 and "max_concurrency 1" in caplog.text
    if not torch.cuda.is_available():
        assert fixed.engine.dtype == "float32"
    # A user's own settings stay; without the flag nothing changes.
    own = RunConfig.model_validate(
        {**BASE, "run": {"deterministic": True}, "engine": {"num_threads": 1, "dtype": "float32"}}
    )
    assert deterministic_config(own).engine.num_threads == 1  # type: ignore[union-attr]
    vllm = RunConfig.model_validate(
        {**BASE, "run": {"deterministic": True}, "engine": {"type": "vllm"}}
    )
    assert deterministic_config(vllm).explorer.max_concurrency == 32  # not claimed there
    plain = RunConfig.model_validate(BASE)
    assert deterministic_config(plain) is plain
    # A memory budget plans from the estimate only: measured memory varies from run to run.
    budget = RunConfig.model_validate(
        {**BASE, "run": {"deterministic": True}, "trainer": {"memory_budget_gib": 3}}
    )
    with caplog.at_level(logging.INFO):
        assert not deterministic_config(budget).trainer.memory_budget_measured  # type: ignore[union-attr]
    assert "memory_budget_measured off" in caplog.text


def test_async_modes_warn_that_they_do_not_repeat(caplog):
    config = RunConfig.model_validate({**BASE, "run": {"deterministic": True, "mode": "async"}})
    with caplog.at_level(logging.WARNING):
        deterministic_config(config)
    assert "run.mode async" in caplog.text


def test_wall_times_and_engine_batching_are_the_only_metrics_left_out():
    for name in (
        "time",
        "time/step",
        "tokens_per_s",
        "engine/decode_steps",
        "engine/prefill_tokens",
        "memory/train_peak_gib",
    ):
        assert not repeats(name)
    for name in ("loss", "reward/mean", "grad_norm", "engine/policy_version", "timeouts"):
        assert repeats(name)
