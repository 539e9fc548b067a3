"""Inputs and outputs of the algorithm functions, and the masked tensor helpers they share.

Shapes: `N` samples in a training batch, `B` samples in one micro-batch, `T` tokens per (padded)
sample. Every per-token tensor is aligned with `Sample.token_ids`: position `t` holds the value
for token `t` (the trainer shifts model outputs before it builds these inputs).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from agentscope_rft.types import SAMPLE_KINDS

SAMPLE_KIND_CODES: dict[str, int] = {kind: code for code, kind in enumerate(SAMPLE_KINDS)}
"""Integer code of each `Sample.kind`, as carried in `LossInputs.sample_kinds`."""


@dataclass(frozen=True)
class AdvantageInputs:
    """What an advantage estimator sees: one training batch of `N` samples.

    Baselines and statistics are over *episodes*, not samples: an episode split into 3 samples
    (calls that did not merge into one sequence, or several agents) counts once, and each of its
    samples gets its episode's advantage. Samples of one episode appear in the batch in call order;
    token-level estimators treat an episode as the concatenation of its samples' trained tokens.
    """

    rewards: Tensor
    """[N] outcome reward of each sample's episode (equal for all samples of an episode)."""
    group_ids: Tensor
    """[N] long: samples of one task group (the GRPO/RLOO baseline group)."""
    episode_ids: Tensor
    """[N] long: samples of the same rollout/episode."""
    loss_mask: Tensor
    """[N, T] 1 on trained (sampled) tokens."""
    token_rewards: Tensor | None = None
    """[N, T] per-step rewards on the last sampled token of their call (and KL penalties from
    `apply_kl_penalty`), 0 elsewhere; nonzero values on untrained tokens are an error."""
    values: Tensor | None = None
    """[N, T] critic values for GAE."""
    step_state_ids: Tensor | None = None
    """[N, T] long: the anchor state (from `emit_state`) of each trained token's call, equal
    within a call, -1 where none was recorded (for GiGPO's step groups)."""


@dataclass(frozen=True)
class AdvantageOutputs:
    """What an advantage estimator returns."""

    advantages: Tensor
    """[N, T] advantage of each token, 0 where `loss_mask` is 0."""
    returns: Tensor | None
    """[N, T] targets for the critic (GAE), else None."""
    metrics: dict[str, float]
    """Batch statistics to log."""


@dataclass(frozen=True)
class LossInputs:
    """One micro-batch of `B` samples; the trainer accumulates gradients across micro-batches.

    The `global_*` normalizers count the whole mini-batch (all micro-batches, all ranks), so each
    micro-batch's loss is its exact share of the mini-batch loss: summing the micro-batch losses (or
    calling backward on each) is exact gradient accumulation. `loss_normalizers` computes them.
    """

    logprobs: Tensor
    """[B, T] current policy log-probs (requires grad), temperature-scaled by the trainer."""
    old_logprobs: Tensor
    """[B, T] proximal/behaviour policy log-probs for the PPO ratio."""
    rollout_logprobs: Tensor
    """[B, T] log-probs the inference engine recorded (for TIS)."""
    advantages: Tensor
    """[B, T] from `compute_advantages` (zeros for SFT/DPO rows)."""
    loss_mask: Tensor
    """[B, T] 1 on trained tokens."""
    global_num_tokens: float
    """Trained tokens in the whole mini-batch (token-mean normalizer); weighted by `seq_weights`
    when per-rollout normalization is on; RL rows only for `sft_rl_mix`."""
    global_num_seqs: float
    """Sequences with trained tokens in the whole mini-batch (seq-mean normalizer; DPO divides it
    by 2 to count pairs); weighted like `global_num_tokens`."""
    seq_weights: Tensor | None = None
    """[B] per-rollout normalization weights, `rollout_seq_weights(episode_ids)`."""
    ref_logprobs: Tensor | None = None
    """[B, T] reference policy log-probs, when KL is on or for DPO."""
    entropy: Tensor | None = None
    """[B, T] per-token entropy of the current policy, when the entropy bonus is on."""
    sample_kinds: Tensor | None = None
    """[B] long codes of `Sample.kind` (`SAMPLE_KIND_CODES`), for `sft_rl_mix` and DPO."""
    pair_index: Tensor | None = None
    """[B] long DPO pair id; both members of a pair are in the same micro-batch."""
    is_chosen: Tensor | None = None
    """[B] bool for DPO (derived from `sample_kinds` when absent)."""
    global_num_sft_tokens: float | None = None
    """Trained tokens of SFT rows in the whole mini-batch (`sft_rl_mix` only)."""


def encode_sample_kinds(kinds: Sequence[str]) -> Tensor:
    """[N] long codes for a list of `Sample.kind` values.

    Example:
        >>> encode_sample_kinds(["rl", "sft"]).tolist()
        [0, 1]
    """
    return torch.tensor([SAMPLE_KIND_CODES[kind] for kind in kinds], dtype=torch.long)


def masked_sum(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Sum of `values` where `mask` is nonzero; NaN/inf outside the mask cannot leak in."""
    valid = torch.where(mask.bool(), values, torch.zeros_like(values))
    if dim is None:
        return (valid * mask).sum()
    return (valid * mask).sum(dim=dim)


def masked_mean(values: Tensor, mask: Tensor) -> Tensor:
    """Mean of `values` over the mask (0 for an empty mask)."""
    return masked_sum(values, mask) / mask.sum().clamp(min=1)


def masked_whiten(values: Tensor, mask: Tensor) -> Tensor:
    """`(values - mean) / sqrt(var + 1e-8)` with mean and unbiased variance over the mask.

    Matches `verl.utils.torch_functional.masked_whiten` (a mask with one element has variance 0
    here instead of an error).
    """
    count = mask.sum()
    mean = masked_sum(values, mask) / count.clamp(min=1)
    var = masked_sum((values - mean) ** 2, mask) / (count - 1).clamp(min=1)
    return (values - mean) * torch.rsqrt(var + 1e-8)


def rollout_seq_weights(episode_ids: Tensor) -> Tensor:
    """[N] weight 1/k of each sample of an episode split into k samples (per-rollout weights).

    Compute it over the whole training batch, then slice it per micro-batch.

    Example:
        >>> rollout_seq_weights(torch.tensor([7, 7, 9])).tolist()
        [0.5, 0.5, 1.0]
    """
    _, inverse, counts = torch.unique(episode_ids, return_inverse=True, return_counts=True)
    return 1.0 / counts[inverse].to(torch.float32)
