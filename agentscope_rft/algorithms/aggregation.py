"""Loss aggregation: per-token losses [B, T] -> the micro-batch's share of the mini-batch loss.

Normalizers are global (whole mini-batch), so the shares of all micro-batches add up to the
mini-batch loss. With per-rollout normalization every row carries a weight `w_i = 1/k` (k samples
in its episode), and the normalizers count weighted tokens/sequences, so an episode that was split
into k samples weighs as much as one sample rather than k.

Modes (verl's names and semantics):
- token-mean: sum_i w_i sum_t l_it / num_tokens. Every token weighs the same (DAPO).
- seq-mean-token-sum: sum_i w_i sum_t l_it / num_seqs.
- seq-mean-token-mean: sum_i w_i mean_t l_it / num_seqs. Every sequence weighs the same
  (original GRPO; GSPO).
- seq-mean-token-sum-norm: seq-mean-token-sum / horizon, a constant (Dr. GRPO).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import Tensor

from agentscope_rft.algorithms.base import masked_sum


@dataclass(frozen=True)
class Normalizers:
    """Global normalizers of one mini-batch and the aggregation's constant horizon."""

    num_tokens: float
    num_seqs: float
    horizon: float | None = None


def _row_weights(loss: Tensor, seq_weights: Tensor | None) -> Tensor:
    """[B] weight of each row (1 without per-rollout normalization)."""
    if seq_weights is None:
        return loss.new_ones(loss.shape[0])
    return seq_weights.to(loss.dtype)


def token_mean(
    loss: Tensor, loss_mask: Tensor, seq_weights: Tensor | None, norm: Normalizers
) -> Tensor:
    weights = _row_weights(loss, seq_weights).unsqueeze(-1)  # [B, 1]
    return masked_sum(loss * weights, loss_mask) / norm.num_tokens


def seq_mean_token_sum(
    loss: Tensor, loss_mask: Tensor, seq_weights: Tensor | None, norm: Normalizers
) -> Tensor:
    seq_loss = masked_sum(loss, loss_mask, dim=-1)  # [B]
    return (seq_loss * _row_weights(loss, seq_weights)).sum() / norm.num_seqs


def seq_mean_token_mean(
    loss: Tensor, loss_mask: Tensor, seq_weights: Tensor | None, norm: Normalizers
) -> Tensor:
    seq_len = loss_mask.sum(dim=-1).clamp(min=1)  # [B]
    seq_loss = masked_sum(loss, loss_mask, dim=-1) / seq_len  # [B]
    return (seq_loss * _row_weights(loss, seq_weights)).sum() / norm.num_seqs


def seq_mean_token_sum_norm(
    loss: Tensor, loss_mask: Tensor, seq_weights: Tensor | None, norm: Normalizers
) -> Tensor:
    if norm.horizon is None:
        raise ValueError("loss_agg 'seq-mean-token-sum-norm' needs loss_agg_horizon")
    return seq_mean_token_sum(loss, loss_mask, seq_weights, norm) / norm.horizon


AggregationFn = Callable[[Tensor, Tensor, Tensor | None, Normalizers], Tensor]

AGGREGATIONS: dict[str, AggregationFn] = {
    "token-mean": token_mean,
    "seq-mean-token-sum": seq_mean_token_sum,
    "seq-mean-token-mean": seq_mean_token_mean,
    "seq-mean-token-sum-norm": seq_mean_token_sum_norm,
}


def aggregate(
    loss: Tensor, loss_mask: Tensor, mode: str, norm: Normalizers, seq_weights: Tensor | None = None
) -> Tensor:
    """Scalar share of the mini-batch loss for per-token `loss` [B, T] under `mode`.

    Example:
        >>> import torch
        >>> loss, mask = torch.tensor([[1.0, 3.0], [2.0, 0.0]]), torch.tensor([[1, 1], [1, 0]])
        >>> float(aggregate(loss, mask, "token-mean", Normalizers(num_tokens=3, num_seqs=2)))
        2.0
        >>> float(aggregate(loss, mask, "seq-mean-token-mean", Normalizers(3, 2)))
        2.0
    """
    return AGGREGATIONS[mode](loss, loss_mask, seq_weights, norm)
