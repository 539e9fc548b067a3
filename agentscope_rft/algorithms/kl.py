"""KL estimators between the policy and the reference policy, per token.

With `d = log pi(x) - log pi_ref(x)` for a token `x` sampled from `pi` (J. Schulman, "Approximating
KL Divergence", http://joschu.net/blog/kl-approx.html):

- k1 = d: unbiased, high variance, can be negative.
- k2 = d^2 / 2: biased, low variance; its gradient is the gradient of KL(pi||pi_ref).
- k3 = exp(-d) + d - 1: unbiased, low variance, never negative (verl's `low_var_kl`, TRL's KL).

Used as a loss term (`kl.apply_to: loss`, with the current log-probs, gradient flows) or as a
reward penalty (`kl.apply_to: reward`, with the behaviour log-probs, before advantages).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from agentscope_rft.algorithms.spec import unknown_name_message


def kl_k1(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """[B, T] k1 = log pi - log pi_ref."""
    return logprobs - ref_logprobs


def kl_k2(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """[B, T] k2 = (log pi - log pi_ref)^2 / 2."""
    return 0.5 * (logprobs - ref_logprobs).square()


def kl_k3(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """[B, T] k3 = r - log r - 1 with r = pi_ref / pi; clamped like verl for stability."""
    log_r = (ref_logprobs - logprobs).clamp(-20.0, 20.0)
    return (torch.exp(log_r) - log_r - 1.0).clamp(-10.0, 10.0)


KL_ESTIMATORS: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    "k1": kl_k1,
    "k2": kl_k2,
    "k3": kl_k3,
}


def kl_estimate(logprobs: Tensor, ref_logprobs: Tensor, estimator: str) -> Tensor:
    """[B, T] per-token KL estimate `estimator` (k1, k2 or k3) of pi against pi_ref.

    Example:
        >>> kl_estimate(torch.tensor([[-1.0]]), torch.tensor([[-2.0]]), "k1")
        tensor([[1.]])
    """
    fn = KL_ESTIMATORS.get(estimator)
    if fn is None:
        raise ValueError(unknown_name_message("KL estimator", estimator, KL_ESTIMATORS))
    return fn(logprobs, ref_logprobs)


def apply_kl_penalty(
    token_rewards: Tensor | None, kl: Tensor, loss_mask: Tensor, coef: float
) -> Tensor:
    """[N, T] token rewards minus `coef * kl` on trained tokens (KL as a reward penalty).

    The trainer calls it before `compute_advantages`, with `kl = kl_estimate(old_logprobs,
    ref_logprobs, cfg.kl.estimator)` (no gradient). Outcome estimators then score an episode by
    outcome reward + sum of its token rewards; token-level estimators discount them per token.

    Example:
        >>> apply_kl_penalty(None, torch.tensor([[0.5, 2.0]]), torch.tensor([[1, 0]]), 0.1) + 0.0
        tensor([[-0.0500,  0.0000]])
    """
    penalty = coef * kl.detach() * loss_mask.to(kl.dtype)
    if token_rewards is None:
        return -penalty
    return token_rewards - penalty
