"""Objectives on demonstrations and preferences: SFT, DPO, and the SFT weight of an SFT+RL mix."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from pydantic import Field, model_validator
from torch import Tensor

from agentscope_rft.algorithms.base import SAMPLE_KIND_CODES, LossInputs, masked_sum
from agentscope_rft.algorithms.spec import StrictModel


class DPOConfig(StrictModel):
    """Direct preference optimization on chosen/rejected pairs."""

    beta: float = Field(default=0.1, gt=0.0)
    """Inverse temperature of the implicit reward `beta * log(pi / pi_ref)`."""
    label_smoothing: float = Field(default=0.0, ge=0.0, lt=0.5)
    """Assumed probability that a pair's label is flipped (conservative DPO); 0 is plain DPO."""


class SFTMixConfig(StrictModel):
    """CHORD's SFT+RL mix: `(1 - mu) * L_rl + mu * L_sft`, with mu warmed up linearly from 0 to
    `mu_peak`, then cosine-decayed to `mu_valley`."""

    mu_peak: float = Field(default=0.1, ge=0.0, le=1.0)
    """Largest SFT weight, reached after the warmup."""
    mu_valley: float = Field(default=0.1, ge=0.0, le=1.0)
    """SFT weight after the decay."""
    warmup_steps: int = Field(default=0, ge=0)
    """Steps of linear warmup from 0 to mu_peak."""
    decay_steps: int = Field(default=0, ge=0)
    """Steps of cosine decay from mu_peak to mu_valley after the warmup."""
    phi_weighting: bool = True
    """Weight each SFT token by `p (1 - p)` (CHORD-phi), so tokens the policy already predicts
    with certainty, or finds very unlikely, move it less."""

    @model_validator(mode="after")
    def _check_valley(self) -> SFTMixConfig:
        if self.mu_valley > self.mu_peak:
            raise ValueError(f"mu_valley ({self.mu_valley}) must be <= mu_peak ({self.mu_peak})")
        return self


def sft_mix_weight(cfg: SFTMixConfig, step: int) -> float:
    """mu at `step`: CHORD's warmup-then-cosine schedule of the SFT weight.

    Paper: CHORD, https://arxiv.org/abs/2508.11408.

    Example:
        >>> cfg = SFTMixConfig(mu_peak=0.5, mu_valley=0.0, warmup_steps=10, decay_steps=20)
        >>> sft_mix_weight(cfg, 5), sft_mix_weight(cfg, 20), sft_mix_weight(cfg, 30)
        (0.25, 0.25, 0.0)
    """
    if step < cfg.warmup_steps:
        return step / cfg.warmup_steps * cfg.mu_peak
    if step >= cfg.warmup_steps + cfg.decay_steps:
        return cfg.mu_valley
    progress = (step - cfg.warmup_steps) / cfg.decay_steps
    return cfg.mu_valley + (cfg.mu_peak - cfg.mu_valley) * 0.5 * (
        1.0 + math.cos(math.pi * progress)
    )


def sft_token_loss(logprobs: Tensor, phi_weighting: bool = False) -> Tensor:
    """[B, T] negative log-likelihood, optionally weighted by detached `p (1 - p)` (CHORD-phi)."""
    if not phi_weighting:
        return -logprobs
    prob = torch.exp(logprobs.detach())
    return -logprobs * prob * (1.0 - prob)


def dpo_loss(inputs: LossInputs, cfg: DPOConfig) -> tuple[Tensor, dict[str, float]]:
    """Sigmoid DPO loss of the micro-batch's pairs, as its share of the mini-batch's mean over
    `global_num_seqs / 2` pairs.

    With sequence log-ratios `h = log pi(y) - log pi_ref(y)` summed over trained tokens and
    `x = beta * (h_chosen - h_rejected)`: loss = -(1 - eps) log sigmoid(x) - eps log sigmoid(-x).
    Papers: DPO, https://arxiv.org/abs/2305.18290; label smoothing (cDPO),
    https://ericmitchell.ai/cdpo.pdf.
    """
    if inputs.ref_logprobs is None or inputs.pair_index is None:
        raise ValueError("DPO needs ref_logprobs and pair_index in LossInputs")
    is_chosen = inputs.is_chosen
    if is_chosen is None:
        if inputs.sample_kinds is None:
            raise ValueError("DPO needs is_chosen or sample_kinds in LossInputs")
        is_chosen = inputs.sample_kinds == SAMPLE_KIND_CODES["dpo_chosen"]
    mask = inputs.loss_mask
    seq_logratio = masked_sum(inputs.logprobs - inputs.ref_logprobs, mask, dim=-1)  # [B]

    _, pair = torch.unique(inputs.pair_index, return_inverse=True)  # [B] pair index in [0, P)
    num_pairs = int(pair.max()) + 1 if pair.numel() else 0
    chosen_count = torch.bincount(pair[is_chosen], minlength=num_pairs)
    rejected_count = torch.bincount(pair[~is_chosen], minlength=num_pairs)
    if not (bool((chosen_count == 1).all()) and bool((rejected_count == 1).all())):
        raise ValueError(
            "every DPO pair (pair_index) needs exactly one chosen and one rejected sample in the "
            "same micro-batch"
        )
    zeros = seq_logratio.new_zeros(num_pairs)
    chosen = zeros.index_add(0, pair[is_chosen], seq_logratio[is_chosen])  # [P]
    rejected = zeros.index_add(0, pair[~is_chosen], seq_logratio[~is_chosen])  # [P]
    logits = cfg.beta * (chosen - rejected)  # [P]
    per_pair = -(1.0 - cfg.label_smoothing) * F.logsigmoid(logits) - (
        cfg.label_smoothing * F.logsigmoid(-logits)
    )
    global_pairs = inputs.global_num_seqs / 2.0
    loss = per_pair.sum() / global_pairs
    metrics = {
        "dpo/loss": float(loss.detach()),
        "dpo/accuracy": float((logits > 0).float().sum()) / global_pairs,
        "dpo/margin": float(logits.detach().sum()) / global_pairs,
        "dpo/chosen_reward": float(cfg.beta * chosen.detach().sum()) / global_pairs,
        "dpo/rejected_reward": float(cfg.beta * rejected.detach().sum()) / global_pairs,
    }
    return loss, metrics
