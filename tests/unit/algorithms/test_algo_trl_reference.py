"""TRL 1.16's GRPO loss as a second reference for GRPO (and its DAPO, Dr. GRPO, CISPO, GSPO modes).

We call TRL's real `GRPOTrainer._compute_loss` on a stand-in trainer object that carries only the
attributes the loss reads, with the model's log-probs replaced by ours, and compare loss and
gradient. TRL's advantages are computed inside its generation step (not a separate function), so
the GRPO advantage is checked against its formula with TRL's own `nanstd`.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch
from algo_helpers import random_loss_inputs, random_rl_batch

from agentscope_rft.algorithms import (
    AlgorithmConfig,
    LossInputs,
    compute_advantages,
    policy_objective,
)

grpo_trainer = pytest.importorskip(
    "trl.trainer.grpo_trainer", reason="trl is not installed (pip install trl==1.16.0)"
)
trl_utils = pytest.importorskip("trl.trainer.utils")

ATOL = 1e-5


class _Accelerator:
    num_processes = 1
    sync_gradients = True

    def gather(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    gather_for_metrics = gather

    def reduce(self, tensor: torch.Tensor, reduction: str = "sum") -> torch.Tensor:
        return tensor


def _trl_loss(
    inputs: LossInputs,
    logprobs: torch.Tensor,
    loss_type: str,
    *,
    epsilon_low: float = 0.2,
    epsilon_high: float = 0.2,
    beta: float = 0.0,
    level: str = "token",
    entropy_coef: float = 0.0,
    max_completion_length: int = 0,
) -> torch.Tensor:
    batch, length = inputs.loss_mask.shape
    entropy = inputs.entropy if inputs.entropy is not None else torch.zeros(batch, length)
    trainer = SimpleNamespace(
        _get_per_token_logps_and_entropies=lambda *args, **kwargs: (logprobs, entropy, None),
        top_entropy_quantile=1.0,
        off_policy_mask_threshold=None,
        importance_sampling_level=level,
        beta=beta,
        args=SimpleNamespace(use_bias_correction_kl=False, delta=None, steps_per_generation=1),
        loss_type=loss_type,
        epsilon_low=epsilon_low,
        epsilon_high=epsilon_high,
        use_vllm=False,
        vllm_importance_sampling_correction=False,
        model=SimpleNamespace(training=True),
        current_gradient_accumulation_steps=1,
        _entropy_bonus_enabled=entropy_coef > 0,
        use_adaptive_entropy=False,
        entropy_coef=entropy_coef,
        aux_loss_enabled=False,
        max_completion_length=max_completion_length,
        accelerator=_Accelerator(),
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
    )
    trl_inputs = {
        "prompt_ids": torch.zeros(batch, 1, dtype=torch.long),
        "prompt_mask": torch.ones(batch, 1, dtype=torch.long),
        "completion_ids": torch.zeros(batch, length, dtype=torch.long),
        "completion_mask": inputs.loss_mask,
        "advantages": inputs.advantages,
        "old_per_token_logps": inputs.old_logprobs,
        "ref_per_token_logps": inputs.ref_logprobs,
        "num_items_in_batch": torch.tensor(inputs.global_num_tokens),
    }
    return grpo_trainer.GRPOTrainer._compute_loss(trainer, None, trl_inputs)


def _grpo_inputs(seed: int, scale: float = 0.3) -> LossInputs:
    # GRPO advantages are constant along a sequence.
    inputs = random_loss_inputs(seed, num_rows=6, length=9, scale=scale)
    seq_adv = torch.randn(6, generator=torch.Generator().manual_seed(seed + 100))
    return dataclasses.replace(inputs, advantages=seq_adv.unsqueeze(-1) * inputs.loss_mask)


CASES = [
    # (TRL loss_type, TRL settings, our algorithm config)
    (
        "grpo",
        {},
        {"loss_agg": "seq-mean-token-mean", "policy_loss": {"type": "ppo", "dual_clip": None}},
    ),
    (
        "bnpo",
        {"epsilon_high": 0.28, "beta": 0.04},
        {
            "loss_agg": "token-mean",
            "policy_loss": {"type": "ppo", "clip_high": 0.28, "dual_clip": None},
            "kl": {"coef": 0.04, "estimator": "k3"},
        },
    ),
    (
        "dapo",
        {"epsilon_high": 0.28, "entropy_coef": 0.01},
        {
            "loss_agg": "token-mean",
            "policy_loss": {"type": "ppo", "clip_high": 0.28, "dual_clip": None},
            "entropy_coef": 0.01,
        },
    ),
    (
        "dr_grpo",
        {"max_completion_length": 9},
        {
            "loss_agg": "seq-mean-token-sum-norm",
            "loss_agg_horizon": 9,
            "policy_loss": {"type": "ppo", "dual_clip": None},
        },
    ),
    ("cispo", {"epsilon_high": 1.3}, {"policy_loss": {"type": "cispo", "clip_high": 0.3}}),
    (
        "grpo",
        {"level": "sequence", "epsilon_low": 0.05, "epsilon_high": 0.08},
        {
            "loss_agg": "seq-mean-token-mean",
            "policy_loss": {"type": "gspo", "clip_low": 0.05, "clip_high": 0.08},
        },
    ),
]


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize(("loss_type", "trl_settings", "algorithm"), CASES)
def test_grpo_loss_matches_trl(
    seed: int, loss_type: str, trl_settings: dict[str, object], algorithm: dict[str, object]
) -> None:
    cfg = AlgorithmConfig.model_validate(algorithm)
    inputs = _grpo_inputs(seed, scale=0.05 if cfg.policy_loss.type == "gspo" else 0.3)
    loss, _ = policy_objective(inputs, cfg, step=0)
    (grad,) = torch.autograd.grad(loss, inputs.logprobs)

    logprobs = inputs.logprobs.detach().clone().requires_grad_(True)
    trl_loss = _trl_loss(inputs, logprobs, loss_type, **trl_settings)  # type: ignore[arg-type]
    (trl_grad,) = torch.autograd.grad(trl_loss, logprobs)
    assert float(loss.detach()) == pytest.approx(float(trl_loss.detach()), abs=ATOL)
    torch.testing.assert_close(grad, trl_grad, atol=ATOL, rtol=ATOL)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_grpo_advantage_matches_trl_formula(seed: int) -> None:
    # TRL (scale_rewards="group"): (r - mean) / (nanstd + 1e-4), groups of num_generations.
    group_size = 4
    batch = random_rl_batch(seed, group_sizes=(group_size,) * 3)
    order = torch.argsort(batch.group_ids, stable=True)
    rewards = batch.rewards[order]
    grouped = rewards.view(-1, group_size)
    std = trl_utils.nanstd(grouped, dim=1).repeat_interleave(group_size)
    mean = grouped.mean(dim=1).repeat_interleave(group_size)
    trl_adv = (rewards - mean) / (std + 1e-4)

    cfg = AlgorithmConfig.model_validate({"advantage": {"type": "grpo", "epsilon": 1e-4}})
    ours = compute_advantages(batch.advantage_inputs(), cfg)
    per_sample = (ours.advantages * batch.loss_mask).sum(-1) / batch.loss_mask.sum(-1)
    torch.testing.assert_close(per_sample[order], trl_adv, atol=ATOL, rtol=ATOL)
