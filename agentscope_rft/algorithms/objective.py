"""The entry points the trainer calls: advantages, the policy objective, the value loss.

A trainer step reads, top to bottom::

    if cfg.kl and cfg.kl.apply_to == "reward":
        token_rewards = apply_kl_penalty(token_rewards, kl_estimate(old, ref, cfg.kl.estimator),
                                         loss_mask, cfg.kl.coef)
    if cfg.drops_zero_variance_groups():
        keep = ~zero_variance_groups(rewards, group_ids)        # drop these samples, log the count
    adv = compute_advantages(AdvantageInputs(...), cfg)
    norms = loss_normalizers(loss_mask, cfg, seq_weights, sample_kinds)  # whole mini-batch
    for micro_batch in mini_batch:
        loss, metrics = policy_objective(LossInputs(..., global_num_tokens=norms.num_tokens, ...),
                                         cfg, step)
        loss.backward()                        # micro-batch shares add up to the mini-batch loss

Metrics returned by `policy_objective` and `value_loss` are shares too: sum them over
micro-batches (and ranks) to get mini-batch values.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from agentscope_rft.algorithms.aggregation import Normalizers, aggregate
from agentscope_rft.algorithms.base import (
    SAMPLE_KIND_CODES,
    AdvantageInputs,
    AdvantageOutputs,
    LossInputs,
    masked_mean,
    masked_sum,
)
from agentscope_rft.algorithms.config import AlgorithmConfig
from agentscope_rft.algorithms.kl import kl_estimate
from agentscope_rft.algorithms.losses import tis_weights
from agentscope_rft.algorithms.offline import dpo_loss, sft_mix_weight, sft_token_loss
from agentscope_rft.algorithms.registry import ADVANTAGE_ESTIMATORS, POLICY_LOSSES

_RL = SAMPLE_KIND_CODES["rl"]
_SFT = SAMPLE_KIND_CODES["sft"]


def _check_advantage_inputs(inputs: AdvantageInputs) -> None:
    mask = inputs.loss_mask
    if mask.dim() != 2 or mask.shape[0] == 0:
        raise ValueError(f"loss_mask must be [N, T] with N > 0, got {tuple(mask.shape)}")
    n = mask.shape[0]
    for name in ("rewards", "group_ids", "episode_ids"):
        value: Tensor = getattr(inputs, name)
        if value.shape != (n,):
            raise ValueError(f"{name} must be [N] = [{n}], got {tuple(value.shape)}")
    for name in ("token_rewards", "values", "step_state_ids"):
        value_or_none: Tensor | None = getattr(inputs, name)
        if value_or_none is not None and value_or_none.shape != mask.shape:
            raise ValueError(f"{name} must be [N, T] = {tuple(mask.shape)}")
    if inputs.token_rewards is not None and bool((inputs.token_rewards[mask == 0] != 0).any()):
        raise ValueError(
            "token_rewards are nonzero on untrained tokens (loss_mask 0); place per-step rewards "
            "on the last sampled token of their call"
        )


def compute_advantages(inputs: AdvantageInputs, cfg: AlgorithmConfig) -> AdvantageOutputs:
    """Advantages [N, T] of a training batch with the configured estimator.

    For `sft_rl_mix`, pass the RL samples only (SFT samples train without advantages).

    Example:
        >>> cfg = AlgorithmConfig.model_validate({"advantage": "grpo"})
        >>> out = compute_advantages(AdvantageInputs(
        ...     rewards=torch.tensor([1.0, 0.0]), group_ids=torch.tensor([0, 0]),
        ...     episode_ids=torch.tensor([0, 1]), loss_mask=torch.tensor([[0, 1], [1, 1]])), cfg)
        >>> out.advantages.round(decimals=4)
        tensor([[ 0.0000,  0.7071],
                [-0.7071, -0.7071]])
    """
    if not cfg.is_rl():
        raise ValueError(f"objective {cfg.objective!r} trains without advantages")
    _check_advantage_inputs(inputs)
    out = ADVANTAGE_ESTIMATORS[cfg.advantage.type].fn(inputs, cfg.advantage)
    mask = inputs.loss_mask.to(out.advantages.dtype)
    advantages = out.advantages * mask
    metrics = {
        "advantage/mean": float(masked_mean(advantages, mask)),
        "advantage/abs_mean": float(masked_mean(advantages.abs(), mask)),
        "advantage/max": float(advantages[mask.bool()].max()) if mask.any() else 0.0,
        "advantage/min": float(advantages[mask.bool()].min()) if mask.any() else 0.0,
        **out.metrics,
    }
    if out.returns is not None:
        metrics["advantage/returns_mean"] = float(masked_mean(out.returns, mask))
    return AdvantageOutputs(advantages=advantages, returns=out.returns, metrics=metrics)


@dataclass(frozen=True)
class LossNormalizers:
    """Global normalizers of one mini-batch (sum them across data-parallel ranks)."""

    num_tokens: float
    """-> LossInputs.global_num_tokens"""
    num_seqs: float
    """-> LossInputs.global_num_seqs"""
    num_sft_tokens: float
    """-> LossInputs.global_num_sft_tokens (sft_rl_mix)"""


def loss_normalizers(
    loss_mask: Tensor,
    cfg: AlgorithmConfig,
    seq_weights: Tensor | None = None,
    sample_kinds: Tensor | None = None,
) -> LossNormalizers:
    """Normalizers of a whole mini-batch `[N, T]`, before it is split into micro-batches.

    Counts trained tokens and sequences with trained tokens, weighted by `seq_weights` when
    `normalize_per_rollout` is on; for `sft_rl_mix` the RL rows, with SFT tokens counted apart.

    Example:
        >>> loss_normalizers(torch.tensor([[1, 1, 0], [0, 0, 0]]), AlgorithmConfig())
        LossNormalizers(num_tokens=2.0, num_seqs=1.0, num_sft_tokens=0.0)
    """
    counts = loss_mask.sum(dim=-1).to(torch.float64)  # [N]
    weights = counts.new_ones(counts.shape)
    if cfg.normalize_per_rollout and cfg.is_rl():
        if seq_weights is None:
            raise ValueError(
                "normalize_per_rollout is on: pass seq_weights=rollout_seq_weights(...)"
            )
        weights = seq_weights.to(torch.float64)
    rl_rows = torch.ones_like(counts, dtype=torch.bool)
    sft_rows = torch.zeros_like(rl_rows)
    if cfg.objective == "sft_rl_mix":
        if sample_kinds is None:
            raise ValueError("objective sft_rl_mix needs sample_kinds")
        rl_rows, sft_rows = sample_kinds == _RL, sample_kinds == _SFT
    return LossNormalizers(
        num_tokens=float((weights * counts)[rl_rows].sum()),
        num_seqs=float((weights * (counts > 0))[rl_rows].sum()),
        num_sft_tokens=float(counts[sft_rows].sum()),
    )


def _check_loss_inputs(inputs: LossInputs, cfg: AlgorithmConfig) -> None:
    shape = inputs.loss_mask.shape
    for name in ("logprobs", "old_logprobs", "rollout_logprobs", "advantages"):
        if getattr(inputs, name).shape != shape:
            raise ValueError(f"{name} must have loss_mask's shape {tuple(shape)}")
    for name in ("ref_logprobs", "entropy"):
        value = getattr(inputs, name)
        if value is not None and value.shape != shape:
            raise ValueError(f"{name} must have loss_mask's shape {tuple(shape)}")
    for name in ("seq_weights", "sample_kinds", "pair_index", "is_chosen"):
        value = getattr(inputs, name)
        if value is not None and value.shape != shape[:1]:
            raise ValueError(f"{name} must be [B] = [{shape[0]}], got {tuple(value.shape)}")
    if cfg.needs_reference() and inputs.ref_logprobs is None:
        raise ValueError(f"objective {cfg.objective!r} with this config needs ref_logprobs")
    if cfg.needs_entropy() and inputs.entropy is None:
        raise ValueError("entropy_coef > 0 needs entropy in LossInputs")
    if cfg.normalize_per_rollout and cfg.is_rl() and inputs.seq_weights is None:
        raise ValueError("normalize_per_rollout is on: pass rollout_seq_weights(episode_ids)")


def _share(values: Tensor, mask: Tensor, weights: Tensor | None, total: float) -> float:
    """Additive share of a weighted token mean: summed over micro-batches it is the mean."""
    if weights is not None:
        values = values * weights.unsqueeze(-1)
    return float(masked_sum(values.detach(), mask)) / total


def _rl_terms(inputs: LossInputs, cfg: AlgorithmConfig) -> tuple[Tensor, dict[str, float]]:
    """Policy loss (+ TIS) + KL loss term - entropy bonus, aggregated as configured."""
    if inputs.global_num_tokens <= 0 or inputs.global_num_seqs <= 0:
        raise ValueError("the mini-batch has no trained tokens (global_num_tokens is 0)")
    mask = inputs.loss_mask
    per_token, token_metrics = POLICY_LOSSES[cfg.policy_loss.type].fn(inputs, cfg.policy_loss)
    if cfg.tis is not None:
        weights = tis_weights(inputs.old_logprobs, inputs.rollout_logprobs, mask, cfg.tis)
        per_token = per_token * weights
        token_metrics["tis_weight"] = weights
        token_metrics["tis_capped"] = (weights >= cfg.tis.cap).float()
    seq_weights = inputs.seq_weights if cfg.normalize_per_rollout else None
    norm = Normalizers(inputs.global_num_tokens, inputs.global_num_seqs, cfg.loss_agg_horizon)
    loss = aggregate(per_token, mask, cfg.loss_agg, norm, seq_weights)
    metrics = {"actor/pg_loss": float(loss.detach())}
    if cfg.kl is not None and cfg.kl.apply_to == "loss":
        assert inputs.ref_logprobs is not None  # checked by _check_loss_inputs
        kl = kl_estimate(inputs.logprobs, inputs.ref_logprobs, cfg.kl.estimator)
        kl_loss = aggregate(kl, mask, cfg.loss_agg, norm, seq_weights)
        loss = loss + cfg.kl.coef * kl_loss
        metrics["actor/kl_loss"] = float(kl_loss.detach())
    if cfg.entropy_coef > 0.0:
        assert inputs.entropy is not None  # checked by _check_loss_inputs
        entropy = aggregate(inputs.entropy, mask, cfg.loss_agg, norm, seq_weights)
        loss = loss - cfg.entropy_coef * entropy
        metrics["actor/entropy"] = float(entropy.detach())
    for name, values in token_metrics.items():
        metrics[f"actor/{name}"] = _share(values, mask, seq_weights, inputs.global_num_tokens)
    return loss, metrics


def rl_objective(
    inputs: LossInputs, cfg: AlgorithmConfig, step: int
) -> tuple[Tensor, dict[str, float]]:
    """The configured policy loss with its regularizers, on RL samples."""
    if inputs.sample_kinds is not None and bool((inputs.sample_kinds != _RL).any()):
        raise ValueError("objective 'rl' got non-RL samples (sample_kinds); use sft_rl_mix")
    return _rl_terms(inputs, cfg)


def sft_objective(
    inputs: LossInputs, cfg: AlgorithmConfig, step: int
) -> tuple[Tensor, dict[str, float]]:
    """Token-mean negative log-likelihood of the trained (assistant) tokens."""
    if inputs.global_num_tokens <= 0:
        raise ValueError("the mini-batch has no trained tokens (global_num_tokens is 0)")
    loss = masked_sum(sft_token_loss(inputs.logprobs), inputs.loss_mask) / inputs.global_num_tokens
    return loss, {"sft/loss": float(loss.detach())}


def dpo_objective(
    inputs: LossInputs, cfg: AlgorithmConfig, step: int
) -> tuple[Tensor, dict[str, float]]:
    """Sigmoid DPO over the micro-batch's chosen/rejected pairs."""
    return dpo_loss(inputs, cfg.dpo)


def sft_rl_mix_objective(
    inputs: LossInputs, cfg: AlgorithmConfig, step: int
) -> tuple[Tensor, dict[str, float]]:
    """CHORD: `(1 - mu) * L_rl + mu * L_sft` with mu from the `sft_mix` schedule at `step`.

    RL rows (kind `rl`) get the configured RL loss, SFT rows (kind `sft`) the token-mean NLL,
    optionally phi-weighted. Paper: CHORD, https://arxiv.org/abs/2508.11408.
    """
    kinds = inputs.sample_kinds
    if kinds is None:
        raise ValueError("objective sft_rl_mix needs sample_kinds in LossInputs")
    if bool(((kinds != _RL) & (kinds != _SFT)).any()):
        raise ValueError("objective sft_rl_mix takes only rl and sft samples")
    if inputs.global_num_sft_tokens is None:
        raise ValueError("objective sft_rl_mix needs global_num_sft_tokens in LossInputs")
    mu = sft_mix_weight(cfg.sft_mix, step)
    mask = inputs.loss_mask
    loss = inputs.logprobs.new_zeros(())
    metrics: dict[str, float] = {}
    if inputs.global_num_tokens > 0:
        rl_mask = mask * (kinds == _RL).unsqueeze(-1).to(mask.dtype)
        rl_loss, metrics = _rl_terms(dataclasses.replace(inputs, loss_mask=rl_mask), cfg)
        loss = loss + (1.0 - mu) * rl_loss
    if inputs.global_num_sft_tokens > 0:
        sft_mask = mask * (kinds == _SFT).unsqueeze(-1).to(mask.dtype)
        nll = sft_token_loss(inputs.logprobs, cfg.sft_mix.phi_weighting)
        sft_loss = masked_sum(nll, sft_mask) / inputs.global_num_sft_tokens
        loss = loss + mu * sft_loss
        metrics["sft/loss"] = float(sft_loss.detach())
    return loss, metrics


ObjectiveFn = Callable[[LossInputs, AlgorithmConfig, int], tuple[Tensor, dict[str, float]]]

OBJECTIVES: dict[str, ObjectiveFn] = {
    "rl": rl_objective,
    "sft": sft_objective,
    "dpo": dpo_objective,
    "sft_rl_mix": sft_rl_mix_objective,
}


def policy_objective(
    inputs: LossInputs, cfg: AlgorithmConfig, step: int
) -> tuple[Tensor, dict[str, float]]:
    """The micro-batch's share of the mini-batch loss under `cfg.objective`, and metric shares.

    `step` is the optimizer step (the SFT+RL mix schedule reads it).

    Example:
        >>> lp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
        >>> loss, _ = policy_objective(LossInputs(
        ...     logprobs=lp, old_logprobs=lp.detach(), rollout_logprobs=lp.detach(),
        ...     advantages=torch.tensor([[1.0, 1.0]]), loss_mask=torch.tensor([[1, 1]]),
        ...     global_num_tokens=2, global_num_seqs=1), AlgorithmConfig(), step=0)
        >>> float(loss)
        -1.0
    """
    _check_loss_inputs(inputs, cfg)
    return OBJECTIVES[cfg.objective](inputs, cfg, step)


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    loss_mask: Tensor,
    cfg: AlgorithmConfig,
    global_num_tokens: float,
) -> tuple[Tensor, dict[str, float]]:
    """Clipped value loss `vf_coef * 0.5 * max((V - R)^2, (clip(V, V_old +- c) - R)^2)`, token-mean
    with the global normalizer (a micro-batch share, like `policy_objective`).

    Shapes: values, old_values, returns, loss_mask are [B, T]. Paper: PPO,
    https://arxiv.org/abs/1707.06347 (value clipping as in OpenAI baselines, verl, TRL).

    Example:
        >>> one, zero = torch.tensor([[1.0]]), torch.tensor([[0.0]])
        >>> loss, _ = value_loss(one, zero, zero, torch.tensor([[1]]), AlgorithmConfig(), 1)
        >>> float(loss)  # 0.5 * max(1, 0.25)
        0.5
    """
    if global_num_tokens <= 0:
        raise ValueError("the mini-batch has no trained tokens (global_num_tokens is 0)")
    losses = (values - returns) ** 2  # [B, T]
    clipped_frac = torch.zeros_like(losses)
    clip = cfg.critic.value_clip
    if clip is not None:
        clipped_values = torch.clamp(values, old_values - clip, old_values + clip)
        clipped_losses = (clipped_values - returns) ** 2
        clipped_frac = (clipped_losses > losses).float()
        losses = torch.maximum(losses, clipped_losses)
    vf_loss = 0.5 * masked_sum(losses, loss_mask) / global_num_tokens
    metrics = {
        "critic/vf_loss": float(vf_loss.detach()),
        "critic/vf_clipfrac": _share(clipped_frac, loss_mask, None, global_num_tokens),
        "critic/values_mean": _share(values, loss_mask, None, global_num_tokens),
    }
    return cfg.critic.vf_coef * vf_loss, metrics
