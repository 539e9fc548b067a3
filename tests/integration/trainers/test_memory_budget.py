"""`trainer.memory_budget_gib`: the torch trainer splits micro-batches (and checkpoints only when
one sample would not fit) so a step stays within the budget, with the same result."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from agentscope_rft.algorithms import AlgorithmConfig
from agentscope_rft.config import TorchTrainerConfig
from agentscope_rft.trainers.batch import build_batch, micro_batches, shared_prefix_length
from agentscope_rft.trainers.memory_budget import (
    GIB,
    MemoryBudgetError,
    ModelFootprint,
    plan_step,
)
from agentscope_rft.trainers.torch_trainer import TorchTrainer
from tests.integration.trainers.test_shared_prefix import prefixed_samples

SMOLLM2 = ModelFootprint(
    parameters=134_515_008,
    trainable=134_515_008,
    reference=False,
    layers=30,
    hidden=576,
    intermediate=1536,
    kv_width=192,
    vocab=49152,
    compute_bytes=2,
)


def _budget_for(footprint: ModelFootprint, tokens: int, checkpointing: bool = False) -> float:
    fixed = footprint.fixed_bytes() + footprint.workspace_bytes()
    return (fixed + footprint.pass_bytes(tokens, checkpointing)) / GIB


def test_plan_keeps_configured_size_when_it_fits_and_splits_when_not() -> None:
    roomy = plan_step(SMOLLM2, 64.0, configured_tokens=2048, longest_row=300)
    assert (roomy.micro_batch_tokens, roomy.checkpointing) == (2048, False)
    tight = plan_step(SMOLLM2, _budget_for(SMOLLM2, 700), configured_tokens=2048, longest_row=300)
    assert 300 <= tight.micro_batch_tokens <= 700
    assert not tight.checkpointing
    # A shared prefix's activations stay alive across passes (fewer tokens per pass), unless it
    # is recomputed after them; then its keys and values (and their gradients) stay.
    reserved = plan_step(SMOLLM2, _budget_for(SMOLLM2, 700), 2048, 100, reserved_tokens=300)
    assert reserved.recompute_prefix
    assert 400 < reserved.micro_batch_tokens <= 700
    kept = plan_step(SMOLLM2, _budget_for(SMOLLM2, 700), 400, 100, reserved_tokens=300)
    assert (kept.micro_batch_tokens, kept.recompute_prefix) == (384, False)
    # Each row also holds the prefix's keys and values: spread over its tokens, fewer fit.
    per_token = SMOLLM2.prefix_kv_bytes(2000) / 100
    assert per_token > 0.2 * SMOLLM2.activation_bytes_per_token(False)
    with_prefix = plan_step(SMOLLM2, _budget_for(SMOLLM2, 700), 2048, 100, 0, per_token)
    assert with_prefix.micro_batch_tokens < tight.micro_batch_tokens


def test_a_tight_budget_recomputes_the_shared_prefix_to_fit_more_rows_per_pass() -> None:
    act = SMOLLM2.activation_bytes_per_token(False)
    leaves = 2 * SMOLLM2.prefix_kv_bytes(376)
    # The quickstart's shape: a 376-token shared prompt, rows of ~140 tokens. Room for 600
    # tokens of activations: keeping the prompt's graph leaves 224 (one row per pass).
    budget = _budget_for(SMOLLM2, 600)
    kept = plan_step(SMOLLM2, budget, 2048, longest_row=140, reserved_tokens=376)
    assert kept.recompute_prefix
    assert kept.micro_batch_tokens >= 512  # (600 tokens less the prompt's keys/values, in 64s)
    room = budget * GIB - SMOLLM2.fixed_bytes() - SMOLLM2.workspace_bytes() - leaves
    assert kept.micro_batch_tokens * act + 4 * SMOLLM2.vocab * kept.micro_batch_tokens <= room
    # Where the graph kept across the passes leaves the configured size, it is kept.
    roomy = plan_step(SMOLLM2, 64.0, 2048, longest_row=140, reserved_tokens=376)
    assert (roomy.micro_batch_tokens, roomy.recompute_prefix) == (2048, False)
    # The recompute runs the prefix with a graph after the passes: it must fit on its own.
    small = _budget_for(SMOLLM2, 300)
    plan = plan_step(SMOLLM2, small, 2048, longest_row=100, reserved_tokens=376)
    assert not plan.recompute_prefix and plan.checkpointing
    # Without a shared prefix there is nothing to recompute.
    assert not plan_step(SMOLLM2, budget, 2048, longest_row=140).recompute_prefix


def test_plan_checkpoints_only_when_one_row_does_not_fit() -> None:
    budget = _budget_for(SMOLLM2, 500)
    assert not plan_step(SMOLLM2, budget, 8192, longest_row=400).checkpointing
    plan = plan_step(SMOLLM2, budget, 8192, longest_row=2000)
    assert plan.checkpointing
    assert plan.micro_batch_tokens >= 2000


def test_a_row_that_fits_is_never_refused_by_the_rounding_to_64_tokens() -> None:
    # 150 tokens fit, rounded down that is 128: a 139-token row still fits, as is, unsplit.
    budget = _budget_for(SMOLLM2, 150.5)
    plan = plan_step(SMOLLM2, budget, 2048, longest_row=139)
    assert (plan.micro_batch_tokens, plan.checkpointing) == (139, False)
    # Where the rounded size holds the longest row, the size is a multiple of 64.
    assert plan_step(SMOLLM2, budget, 2048, longest_row=100).micro_batch_tokens == 128


def test_small_passes_keep_their_logprobs_only_where_they_fit() -> None:
    kept = SMOLLM2.kept_logprob_tokens()  # 1,365 tokens of fp32 [tokens, 49152] in 256 MiB
    assert kept == 1365
    # Room for 600 tokens with their log-probs: passes of up to 600 tokens that keep them.
    plan = plan_step(SMOLLM2, _budget_for(SMOLLM2, 600), 2048, longest_row=300)
    assert plan.keep_logprobs and not plan.checkpointing
    assert 300 <= plan.micro_batch_tokens <= 600
    # A 500-token row fits only when its log-probs are recomputed: no checkpointing for that.
    fixed = SMOLLM2.fixed_bytes() + SMOLLM2.workspace_bytes()
    tight = (fixed + 520 * SMOLLM2.activation_bytes_per_token(False)) / GIB
    assert SMOLLM2.pass_bytes(500, False) > tight * GIB - fixed  # would not fit, kept
    plan = plan_step(SMOLLM2, tight, 2048, longest_row=500)
    assert (plan.checkpointing, plan.keep_logprobs) == (False, False)
    assert plan.micro_batch_tokens >= 500
    # Where passes of kept_logprob_tokens fit with their log-probs, larger ones (which
    # recompute them) may be planned too: every size up to the plan fits.
    roomy = _budget_for(SMOLLM2, 1800)
    plan = plan_step(SMOLLM2, roomy, 4096, longest_row=300)
    assert plan.keep_logprobs and plan.micro_batch_tokens > kept
    for tokens in range(64, plan.micro_batch_tokens + 1, 64):
        assert SMOLLM2.pass_bytes(tokens, False) <= roomy * GIB - fixed


def test_plan_refuses_a_budget_below_the_fixed_part_and_names_the_key() -> None:
    with pytest.raises(MemoryBudgetError, match=r"memory_budget_gib=1 .*AdamW"):
        plan_step(SMOLLM2, 1.0, 2048, 100)
    with pytest.raises(MemoryBudgetError, match="even with gradient checkpointing"):
        plan_step(SMOLLM2, _budget_for(SMOLLM2, 100), 2048, longest_row=10**6)


def test_a_budget_below_the_fixed_part_is_one_error_before_any_episode(
    tiny_model_path, toy_tasks, tmp_path
) -> None:
    """It was a MemoryBudgetError traceback from the first step, after its episodes ran."""
    app = Path(__file__).parent.parent / "toy_app.py"
    command = [sys.executable, "-m", "agentscope_rft.cli", "train"]
    for item in (
        f"model.name_or_path={tiny_model_path}",
        f"workflow={app}:run",
        f"tasks.train={toy_tasks}",
        "engine.device=cpu",
        "trainer.memory_budget_gib=0.001",
        f"run.dir={tmp_path / 'run'}",
        "monitor.tensorboard=false",
    ):
        command += ["--set", item]
    env = {**os.environ, "COLUMNS": "1000"}
    proc = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2, output
    assert "Traceback" not in output
    assert "step 0" not in output
    [line] = [x for x in output.splitlines() if x.startswith("error:")]
    assert "trainer.memory_budget_gib=0.001 is below the trainer's fixed footprint" in line


def test_an_overshoot_measured_is_held_back_from_later_plans() -> None:
    budget = _budget_for(SMOLLM2, 1024)
    plan = plan_step(SMOLLM2, budget, configured_tokens=1024, longest_row=300)
    assert plan.micro_batch_tokens == 1024
    # What it expects a step to add: gradients, the workspace and its largest pass; with the
    # weights and AdamW state resident before the step, that is the budget.
    resident = SMOLLM2.fixed_bytes() - 4 * SMOLLM2.trainable
    assert plan.planned_bytes == pytest.approx(
        SMOLLM2.step_bytes() + SMOLLM2.pass_bytes(1024, False)
    )
    assert resident + plan.planned_bytes <= budget * GIB
    over = 0.5 * SMOLLM2.pass_bytes(1024, False)
    held = plan_step(SMOLLM2, budget, 1024, 300, overshoot_bytes=over)
    assert 300 <= held.micro_batch_tokens <= 576
    assert resident + held.planned_bytes + over <= budget * GIB
    with pytest.raises(MemoryBudgetError, match="measured above their plans"):
        plan_step(SMOLLM2, budget, 1024, 300, overshoot_bytes=budget * GIB)


class _Meter:
    """A step meter that reports what it is told (a machine whose steps take more)."""

    def __init__(self) -> None:
        self.extra = 0.0
        self.before: float | None = None  # what the passes take above plan (default: extra)
        self.trainer: TorchTrainer | None = None

    def start(self) -> None:
        return None

    def so_far(self) -> float:  # (before the optimizer's step)
        assert self.trainer is not None
        trainer = self.trainer
        extra = self.extra if self.before is None else self.before
        return trainer.plan.expected_bytes(trainer._largest_pass) + extra

    def stop(self) -> float:
        assert self.trainer is not None
        trainer = self.trainer
        return trainer.plan.expected_bytes(trainer._largest_pass) + self.extra

    def close(self) -> None:
        return None


def test_a_step_measured_above_its_plan_shrinks_the_later_ones(tiny_model_path, caplog) -> None:
    probe = _run(tiny_model_path, memory_budget_gib=64.0)[0]
    footprint = probe.footprint
    assert footprint is not None
    samples = prefixed_samples(int(probe._base().config.vocab_size))
    batch = build_batch(samples, 0)
    padded = len(batch.samples) * int(batch.lengths.max())
    budget = _budget_for(footprint, padded + 64)  # one pass over the whole batch fits
    config = TorchTrainerConfig.model_validate(
        {
            "lr": 1e-3,
            "dtype": "float32",
            "share_prefix": False,
            "micro_batch_tokens": 4096,
            "memory_budget_gib": budget,
        }
    )
    trainer = TorchTrainer(tiny_model_path, config, AlgorithmConfig(), total_steps=5, seed=0)
    meter = _Meter()
    meter.trainer = trainer
    trainer._meter = meter  # type: ignore[assignment]
    # The first step allocates AdamW's state after its passes: measured before that, it is not
    # held against the passes (here they take what was planned).
    meter.extra, meter.before = 10 * GIB, 0.0
    first = trainer.step(samples, 0)
    assert trainer.plan.micro_batch_tokens >= padded
    assert first["train/memory_overshoot_gib"] == 0
    meter.before = None
    meter.extra = footprint.pass_bytes(padded // 2, False)  # then a step takes more than planned
    with caplog.at_level("INFO", logger="agentscope_rft.trainers.torch_trainer"):
        second = trainer.step(samples, 1)
    assert second["train/memory_overshoot_gib"] == pytest.approx(meter.extra / GIB)
    assert "more than planned" in caplog.text
    meter.extra = 0.0
    third = trainer.step(samples, 2)
    plan = trainer.plan
    assert plan.micro_batch_tokens <= padded // 2 + 64  # the difference held back
    assert len(micro_batches(batch, plan.micro_batch_tokens)) >= 2
    assert third["train/memory_overshoot_gib"] == second["train/memory_overshoot_gib"]
    expected = plan.expected_bytes(trainer._largest_pass)  # of the passes it ran, not the cap
    assert expected <= plan.planned_bytes
    assert third["train/memory_step_gib"] == pytest.approx(expected / GIB)
    # A step whose passes are the same size as before and which takes the same memory again
    # does not hold more back: the plan is compared with the passes it ran.
    meter.extra = footprint.pass_bytes(padded // 2, False)
    trainer.step(samples, 3)
    assert trainer.budget_watch.overshoot_bytes == pytest.approx(meter.extra)
    # More than the budget could hold back without gradient checkpointing: the smallest passes
    # without it (checkpointing only where the estimate itself needs it), said once.
    trainer.budget_watch.overshoot_bytes = budget * GIB
    with caplog.at_level("WARNING", logger="agentscope_rft.trainers.torch_trainer"):
        trainer.step(samples, 4)
    assert not trainer.plan.checkpointing
    assert trainer.plan.micro_batch_tokens < padded // 2 + 64
    assert "more would need gradient checkpointing" in caplog.text


def test_the_first_steps_passes_are_measured_before_adamw_state(tiny_model_path) -> None:
    probe = _run(tiny_model_path, memory_budget_gib=64.0)[0]
    footprint = probe.footprint
    assert footprint is not None
    samples = prefixed_samples(int(probe._base().config.vocab_size))
    config = TorchTrainerConfig.model_validate(
        {"lr": 1e-3, "dtype": "float32", "share_prefix": False, "memory_budget_gib": 64.0}
    )
    trainer = TorchTrainer(tiny_model_path, config, AlgorithmConfig(), total_steps=2, seed=0)
    meter = _Meter()
    meter.trainer = trainer
    trainer._meter = meter  # type: ignore[assignment]
    meter.extra, meter.before = 10 * GIB, 0.25 * GIB  # passes 0.25 GiB over their plan
    first = trainer.step(samples, 0)
    assert first["train/memory_overshoot_gib"] == pytest.approx(0.25)  # held from step 1 on
    assert first["train/memory_step_gib"] > 10  # (the metric: all the step added)
    meter.extra, meter.before = 0.0, None  # state exists now: a later step is measured whole
    trainer.step(samples, 1)
    assert trainer.budget_watch.overshoot_bytes == pytest.approx(0.25 * GIB)


def test_a_cpu_step_is_measured_from_resident_memory(tiny_model_path) -> None:
    trainer, metrics = _run(tiny_model_path, memory_budget_gib=64.0)
    assert metrics["train/memory_step_gib"] >= 0  # the process's resident memory, sampled
    trainer.close()
    off = _run(tiny_model_path, memory_budget_gib=64.0, memory_budget_measured=False)[1]
    assert "train/memory_step_gib" not in off


def _run(tiny_model_path: str, **trainer_args: object) -> tuple[TorchTrainer, dict[str, float]]:
    config = TorchTrainerConfig.model_validate(
        {"lr": 1e-3, "dtype": "float32", "share_prefix": False, **trainer_args}
    )
    trainer = TorchTrainer(tiny_model_path, config, AlgorithmConfig(), total_steps=1, seed=0)
    vocab = int(trainer._base().config.vocab_size)
    return trainer, trainer.step(prefixed_samples(vocab), 0)


def test_the_trainer_splits_a_batch_that_would_exceed_the_budget(tiny_model_path: str) -> None:
    whole, expected = _run(tiny_model_path, micro_batch_tokens=4096)
    assert whole.footprint is None
    footprint = _run(tiny_model_path, memory_budget_gib=64.0)[0].footprint
    assert footprint is not None
    batch = build_batch(prefixed_samples(int(whole._base().config.vocab_size)), 0)
    padded = len(batch.samples) * int(batch.lengths.max())
    budget = _budget_for(footprint, padded // 3)
    # Without splitting, the one pass over the whole batch would not fit the budget.
    assert _budget_for(footprint, padded) > budget

    trainer, metrics = _run(tiny_model_path, micro_batch_tokens=4096, memory_budget_gib=budget)
    plan = trainer.plan
    assert not plan.checkpointing
    parts = micro_batches(batch, plan.micro_batch_tokens)
    assert len(parts) >= 3
    for rows in parts:
        width = int(batch.lengths[rows].max())
        assert _budget_for(footprint, width * len(rows)) <= budget
    for key in ("loss", "grad_norm", "entropy/mean"):
        assert metrics[key] == pytest.approx(expected[key], rel=1e-4, abs=1e-6), key


def test_the_trainer_recomputes_the_shared_prefix_rather_than_checkpoint(tiny_model_path) -> None:
    _, expected = _run(tiny_model_path, micro_batch_tokens=4096, share_prefix=True)
    probe = _run(tiny_model_path, memory_budget_gib=64.0, share_prefix=True)[0]
    footprint = probe.footprint
    assert footprint is not None
    batch = build_batch(prefixed_samples(int(probe._base().config.vocab_size)), 0)
    shared = shared_prefix_length(batch)
    longest = int(batch.lengths.max()) - shared
    suffix = float((batch.lengths - shared).float().mean())
    per_token = footprint.activation_bytes_per_token(False) + (
        footprint.prefix_kv_bytes(shared) / suffix
    )
    # Room for the prefix's keys/values (and their gradients) and two rows' activations: with
    # the prefix's graph kept across the passes not even one row fits beside it.
    room = 2 * footprint.prefix_kv_bytes(shared) + 2 * longest * per_token
    assert shared * footprint.activation_bytes_per_token(False) + longest * per_token > room
    fixed = footprint.fixed_bytes() + footprint.workspace_bytes()
    budget = (fixed + room + 1024) / GIB
    trainer, metrics = _run(
        tiny_model_path, micro_batch_tokens=4096, share_prefix=True, memory_budget_gib=budget
    )
    assert trainer.plan.recompute_prefix and not trainer.plan.checkpointing
    assert trainer.plan.micro_batch_tokens >= longest
    assert metrics["train/shared_prefix_tokens"] == shared
    for key in ("loss", "grad_norm", "entropy/mean"):
        assert metrics[key] == pytest.approx(expected[key], rel=1e-5, abs=1e-7), key


def test_the_trainer_checkpoints_when_one_sample_does_not_fit(tiny_model_path: str) -> None:
    _, expected = _run(tiny_model_path, micro_batch_tokens=4096)
    footprint = _run(tiny_model_path, memory_budget_gib=64.0)[0].footprint
    assert footprint is not None
    # Activations of 40 tokens: one ~60-token sample fits only with checkpointing (the tiny
    # model's log-probs, 4 x vocab bytes a token, would not fit beside it: recomputed)
    fixed = footprint.fixed_bytes() + footprint.workspace_bytes()
    budget = (fixed + 40 * footprint.activation_bytes_per_token(False)) / GIB
    trainer, metrics = _run(tiny_model_path, memory_budget_gib=budget)
    assert trainer.plan.checkpointing and not trainer.plan.keep_logprobs
    assert trainer._base().is_gradient_checkpointing
    for key in ("loss", "grad_norm"):
        assert metrics[key] == pytest.approx(expected[key], rel=1e-4, abs=1e-6), key


def test_bf16_optimizer_state_trains_counts_half_and_resumes(tiny_model_path, tmp_path) -> None:
    trainer, metrics = _run(
        tiny_model_path, optimizer_state_dtype="bfloat16", memory_budget_gib=64.0
    )
    assert metrics["loss"] == metrics["loss"] and metrics["grad_norm"] > 0  # finite, trained
    states = list(trainer.optimizer.state.values())
    assert states and all(
        s["exp_avg"].dtype == s["exp_avg_sq"].dtype == torch.bfloat16 for s in states
    )
    footprint = trainer.footprint
    assert footprint is not None and footprint.optimizer_bytes == 4
    fp32 = _run(tiny_model_path, memory_budget_gib=64.0)[0].footprint
    assert fp32 is not None
    assert fp32.fixed_bytes() - footprint.fixed_bytes() == 4 * footprint.trainable
    # A checkpoint keeps the bf16 moments as they were.
    trainer.export_hf(tmp_path / "ckpt" / "model")  # (a run's checkpoint: weights, then state)
    trainer.save(tmp_path / "ckpt")
    again, _ = _run(tiny_model_path, optimizer_state_dtype="bfloat16")
    again.load(tmp_path / "ckpt")
    for before, after in zip(states, again.optimizer.state.values(), strict=True):
        assert after["exp_avg_sq"].dtype == torch.bfloat16
        assert torch.equal(before["exp_avg_sq"], after["exp_avg_sq"])
