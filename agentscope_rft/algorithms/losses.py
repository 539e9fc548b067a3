"""Policy losses: one pure function and one config class each, plus TIS weights.

A policy loss is `fn(inputs: LossInputs, cfg: ItsConfig) -> (loss [B, T], metrics)`: the
per-token loss before aggregation, and per-token statistics `{name: [B, T]}` that
`policy_objective` averages over trained tokens. Aggregation, TIS, KL and entropy terms are
applied around it by `policy_objective`, the same way for every loss.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field
from torch import Tensor

from agentscope_rft.algorithms.base import LossInputs, masked_sum
from agentscope_rft.algorithms.spec import PolicyLossConfigBase, StrictModel

# Bound on log-ratios before exp(); keeps ratios finite (verl uses the same bound).
_LOG_RATIO_BOUND = 20.0


class PPOClipConfig(PolicyLossConfigBase):
    """PPO's clipped surrogate with asymmetric clip and optional dual clip (GRPO, DAPO, PPO)."""

    type: Literal["ppo"] = "ppo"
    clip_low: float = Field(default=0.2, gt=0.0, lt=1.0)
    """Ratio lower bound is 1 - clip_low."""
    clip_high: float = Field(default=0.2, gt=0.0)
    """Ratio upper bound is 1 + clip_high (DAPO's clip-higher uses 0.28)."""
    dual_clip: float | None = Field(default=3.0, gt=1.0)
    """Dual-clip bound c: for negative advantages the loss is at most -c * A (None: off)."""


def ppo_clip_loss(inputs: LossInputs, cfg: PPOClipConfig) -> tuple[Tensor, dict[str, Tensor]]:
    """`max(-A r, -A clip(r, 1-eps_low, 1+eps_high))` with `r = pi / pi_old`, and for A < 0 at
    most `-A c` (dual clip).

    Papers: PPO, https://arxiv.org/abs/1707.06347; dual clip, https://arxiv.org/abs/1912.09729;
    asymmetric clip (clip-higher), DAPO, https://arxiv.org/abs/2503.14476.
    """
    adv = inputs.advantages  # [B, T]
    log_ratio = (inputs.logprobs - inputs.old_logprobs).clamp(-_LOG_RATIO_BOUND, _LOG_RATIO_BOUND)
    ratio = torch.exp(log_ratio)  # [B, T]
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - cfg.clip_low, 1.0 + cfg.clip_high)
    loss = torch.maximum(unclipped, clipped)
    metrics = {"clipfrac": (clipped > unclipped).float(), "ppo_kl": -log_ratio.detach()}
    if cfg.dual_clip is not None:
        bound = -adv * cfg.dual_clip
        metrics["clipfrac_dual"] = ((loss > bound) & (adv < 0)).float()
        loss = torch.where(adv < 0, torch.minimum(loss, bound), loss)
    return loss, metrics


class GSPOConfig(PolicyLossConfigBase):
    """GSPO: the clipped surrogate with a sequence-level (length-normalized) ratio."""

    type: Literal["gspo"] = "gspo"
    clip_low: float = Field(default=3e-4, gt=0.0, lt=1.0)
    """Ratio lower bound is 1 - clip_low (paper: 3e-4)."""
    clip_high: float = Field(default=4e-4, gt=0.0)
    """Ratio upper bound is 1 + clip_high (paper: 4e-4)."""


def gspo_loss(inputs: LossInputs, cfg: GSPOConfig) -> tuple[Tensor, dict[str, Tensor]]:
    """GSPO-token: `s_it = sg[s_i] * pi_t / sg[pi_t]` with `s_i = exp(mean_t log(pi_t/pi_old_t))`
    over the sequence's trained tokens; clipped surrogate on `s_it`. Its value is `s_i` on every
    token and its gradient is GSPO's. Use with `loss_agg: seq-mean-token-mean` as in the paper.

    Paper: Group Sequence Policy Optimization, https://arxiv.org/abs/2507.18071.
    """
    adv = inputs.advantages  # [B, T]
    mask = inputs.loss_mask
    log_ratio = inputs.logprobs - inputs.old_logprobs  # [B, T]
    seq_log_ratio = masked_sum(log_ratio, mask, dim=-1) / mask.sum(dim=-1).clamp(min=1)  # [B]
    log_seq_ratio = (
        inputs.logprobs - inputs.logprobs.detach() + seq_log_ratio.detach().unsqueeze(-1)
    ).clamp(max=10.0)
    seq_ratio = torch.exp(log_seq_ratio)  # [B, T], equal along a row
    unclipped = -adv * seq_ratio
    clipped = -adv * seq_ratio.clamp(1.0 - cfg.clip_low, 1.0 + cfg.clip_high)
    metrics = {
        "clipfrac": (clipped > unclipped).float(),
        "ppo_kl": -log_ratio.detach(),
        "seq_ratio": seq_ratio.detach(),
    }
    return torch.maximum(unclipped, clipped), metrics


class CISPOConfig(PolicyLossConfigBase):
    """CISPO: REINFORCE with a clipped, stop-gradient importance weight (no token is dropped)."""

    type: Literal["cispo"] = "cispo"
    clip_low: float | None = Field(default=None, gt=0.0, le=1.0)
    """Weight lower bound is 1 - clip_low (None: no lower bound, as in the paper)."""
    clip_high: float = Field(default=4.0, gt=0.0)
    """Weight upper bound is 1 + clip_high (ScaleRL's eps_max = 5 is clip_high = 4)."""


def cispo_loss(inputs: LossInputs, cfg: CISPOConfig) -> tuple[Tensor, dict[str, Tensor]]:
    """`-sg(clip(r, 1-eps_low, 1+eps_high)) * A * log pi` with `r = pi / pi_old`.

    Paper: MiniMax-M1, https://arxiv.org/abs/2506.13585; ScaleRL, https://arxiv.org/abs/2510.13786.
    """
    log_ratio = (inputs.logprobs - inputs.old_logprobs).clamp(-_LOG_RATIO_BOUND, _LOG_RATIO_BOUND)
    ratio = torch.exp(log_ratio)  # [B, T]
    low = 1.0 - cfg.clip_low if cfg.clip_low is not None else None
    weight = ratio.clamp(min=low, max=1.0 + cfg.clip_high).detach()
    loss = -weight * inputs.advantages * inputs.logprobs
    metrics = {"clipfrac": (weight != ratio.detach()).float(), "ppo_kl": -log_ratio.detach()}
    return loss, metrics


class TISConfig(StrictModel):
    """Truncated importance sampling: corrects for rollout-vs-trainer log-prob mismatch and
    staleness with weights `min(pi_old / pi_rollout, cap)`."""

    cap: float = Field(default=2.0, gt=0.0)
    """Upper bound of the importance weight."""
    level: Literal["token", "sequence"] = "token"
    """Per-token ratios, or one ratio per sequence (product over its trained tokens)."""


def tis_weights(
    old_logprobs: Tensor, rollout_logprobs: Tensor, loss_mask: Tensor, cfg: TISConfig
) -> Tensor:
    """[B, T] detached weights `min(exp(old - rollout), cap)`, 0 on untrained tokens.

    `old_logprobs` are the trainer's (proximal policy) log-probs of the sampled tokens and
    `rollout_logprobs` the engine's; the weight multiplies the per-token policy loss.
    Paper: "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training",
    https://fengyao.notion.site/off-policy-rl (TIS); verl's `rollout_is` with a single threshold.
    """
    mask = loss_mask.to(old_logprobs.dtype)
    log_ratio = (old_logprobs - rollout_logprobs).detach()  # [B, T]
    if cfg.level == "sequence":
        log_ratio = masked_sum(log_ratio, mask, dim=-1).unsqueeze(-1).expand_as(mask)
    weights = torch.exp(log_ratio.clamp(-_LOG_RATIO_BOUND, _LOG_RATIO_BOUND)) * mask
    return weights.clamp(max=cfg.cap)
