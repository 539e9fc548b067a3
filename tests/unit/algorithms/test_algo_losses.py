"""Policy losses, TIS, KL, entropy, aggregation and the value loss against hand-derived values."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from algo_helpers import random_loss_inputs

from agentscope_rft.algorithms import (
    AlgorithmConfig,
    LossInputs,
    Normalizers,
    TISConfig,
    aggregate,
    apply_kl_penalty,
    kl_estimate,
    loss_normalizers,
    policy_objective,
    rollout_seq_weights,
    tis_weights,
    value_loss,
)


def _cfg(**algorithm: object) -> AlgorithmConfig:
    return AlgorithmConfig.model_validate(algorithm)


def _inputs(
    logprobs: list[list[float]],
    old: list[list[float]],
    advantages: list[list[float]],
    mask: list[list[int]] | None = None,
    **extra: object,
) -> LossInputs:
    lp = torch.tensor(logprobs, requires_grad=True)
    loss_mask = torch.tensor(mask) if mask is not None else torch.ones_like(lp, dtype=torch.long)
    fields: dict[str, object] = {
        "logprobs": lp,
        "old_logprobs": torch.tensor(old),
        "rollout_logprobs": torch.tensor(old),
        "advantages": torch.tensor(advantages),
        "loss_mask": loss_mask,
        "global_num_tokens": float(loss_mask.sum()),
        "global_num_seqs": float((loss_mask.sum(-1) > 0).sum()),
    }
    fields.update(extra)
    return LossInputs(**fields)  # type: ignore[arg-type]


# Ratios 1.5, 0.5, 0.5, 4.0, 1.1 with advantages 1, 1, -1, -1, 2; clip 0.2 / 0.28, dual clip 3:
#   1.5, A=1:  max(-1.5, -1.28) = -1.28 (clipped high)
#   0.5, A=1:  max(-0.5, -0.8) = -0.5
#   0.5, A=-1: max(0.5, 0.8) = 0.8 (clipped low)
#   4.0, A=-1: max(4.0, 1.28) = 4.0 -> dual clip min(4.0, 3.0) = 3.0
#   1.1, A=2:  max(-2.2, -2.2) = -2.2
# token-mean = (-1.28 - 0.5 + 0.8 + 3.0 - 2.2) / 5 = -0.036
RATIOS = [1.5, 0.5, 0.5, 4.0, 1.1]
PPO_ADV = [[1.0, 1.0, -1.0, -1.0, 2.0]]


def test_ppo_clip_asymmetric_and_dual_clip() -> None:
    inputs = _inputs([[math.log(r) for r in RATIOS]], [[0.0] * 5], PPO_ADV)
    cfg = _cfg(policy_loss={"type": "ppo", "clip_low": 0.2, "clip_high": 0.28, "dual_clip": 3.0})
    loss, metrics = policy_objective(inputs, cfg, step=0)
    assert float(loss.detach()) == pytest.approx(-0.036, abs=1e-6)
    assert metrics["actor/clipfrac"] == pytest.approx(2 / 5)
    assert metrics["actor/clipfrac_dual"] == pytest.approx(1 / 5)
    loss.backward()
    # d/dlogp of -A * r is -A * r where unclipped (tokens 2 and 5), else 0; / 5 tokens.
    expected_grad = torch.tensor([[0.0, -0.5, 0.0, 0.0, -2.2]]) / 5
    torch.testing.assert_close(inputs.logprobs.grad, expected_grad, atol=1e-6, rtol=0)


def test_ppo_without_dual_clip() -> None:
    inputs = _inputs([[math.log(r) for r in RATIOS]], [[0.0] * 5], PPO_ADV)
    cfg = _cfg(policy_loss={"type": "ppo", "clip_low": 0.2, "clip_high": 0.28, "dual_clip": None})
    loss, metrics = policy_objective(inputs, cfg, step=0)
    assert float(loss.detach()) == pytest.approx((-1.28 - 0.5 + 0.8 + 4.0 - 2.2) / 5, abs=1e-6)
    assert "actor/clipfrac_dual" not in metrics


def test_gspo_uses_the_sequence_ratio() -> None:
    # Log-ratios 0.1, 0.3 -> s = exp(0.2) = 1.22140, on both tokens; clip 0.2 / 0.2.
    # A = +1: max(-1.2214, -1.2) = -1.2 (clipped, no gradient). A = -1: max(1.2214, 1.2) = 1.2214.
    cfg = _cfg(policy_loss={"type": "gspo", "clip_low": 0.2, "clip_high": 0.2})
    pos = _inputs([[0.1, 0.3]], [[0.0, 0.0]], [[1.0, 1.0]])
    loss, _ = policy_objective(pos, cfg, step=0)
    assert float(loss.detach()) == pytest.approx(-1.2, abs=1e-6)
    neg = _inputs([[0.1, 0.3]], [[0.0, 0.0]], [[-1.0, -1.0]])
    loss, metrics = policy_objective(neg, cfg, step=0)
    assert float(loss.detach()) == pytest.approx(math.exp(0.2), abs=1e-6)
    assert metrics["actor/seq_ratio"] == pytest.approx(math.exp(0.2), abs=1e-6)


def test_gspo_gradient_is_the_papers_sequence_gradient() -> None:
    # GSPO's objective per sequence: min(s A, clip(s) A) with s = exp(mean_t log ratio), averaged
    # over sequences; seq-mean-token-mean aggregation of GSPO-token must give the same gradient.
    inputs = random_loss_inputs(seed=1, scale=0.002)
    seq_adv = torch.randn(inputs.advantages.shape[0], generator=torch.Generator().manual_seed(2))
    inputs = dataclasses.replace(inputs, advantages=seq_adv.unsqueeze(-1) * inputs.loss_mask)
    cfg = _cfg(policy_loss="gspo", loss_agg="seq-mean-token-mean")
    loss, _ = policy_objective(inputs, cfg, step=0)
    (grad,) = torch.autograd.grad(loss, inputs.logprobs)

    lp = inputs.logprobs.detach().clone().requires_grad_(True)
    mask = inputs.loss_mask.float()
    s = torch.exp(((lp - inputs.old_logprobs) * mask).sum(-1) / mask.sum(-1))
    surrogate = torch.minimum(s * seq_adv, s.clamp(1 - 3e-4, 1 + 4e-4) * seq_adv)
    reference = -surrogate.mean()
    (ref_grad,) = torch.autograd.grad(reference, lp)
    assert float(loss.detach()) == pytest.approx(float(reference.detach()), abs=1e-6)
    torch.testing.assert_close(grad, ref_grad, atol=1e-6, rtol=1e-5)


def test_cispo_clips_the_stop_gradient_weight() -> None:
    # Token 1: ratio 2 -> weight min(2, 1 + 0.5) = 1.5, A = 1, log pi = log 2 + (-1.0)
    #   loss = -1.5 * 1 * logp, d/dlogp = -1.5.
    # Token 2: ratio 0.5 (no lower clip) -> weight 0.5, A = -2: loss = 1.0 * logp, d/dlogp = 1.0.
    logp = [[math.log(2.0) - 1.0, math.log(0.5) - 1.0]]
    inputs = _inputs(logp, [[-1.0, -1.0]], [[1.0, -2.0]])
    cfg = _cfg(policy_loss={"type": "cispo", "clip_high": 0.5}, loss_agg="seq-mean-token-sum")
    loss, metrics = policy_objective(inputs, cfg, step=0)
    assert float(loss.detach()) == pytest.approx(-1.5 * logp[0][0] + 1.0 * logp[0][1], abs=1e-6)
    assert metrics["actor/clipfrac"] == pytest.approx(0.5)
    loss.backward()
    torch.testing.assert_close(inputs.logprobs.grad, torch.tensor([[-1.5, 1.0]]), atol=1e-6, rtol=0)


def test_tis_weights_by_hand() -> None:
    old = torch.log(torch.tensor([[1.5, 3.0, 0.5, 7.0]]))
    rollout = torch.zeros(1, 4)
    mask = torch.tensor([[1, 1, 1, 0]])
    token = tis_weights(old, rollout, mask, TISConfig(cap=2.0))
    torch.testing.assert_close(token, torch.tensor([[1.5, 2.0, 0.5, 0.0]]))
    # Sequence: 1.5 * 3 * 0.5 = 2.25 -> capped at 2 on every trained token.
    seq = tis_weights(old, rollout, mask, TISConfig(cap=2.0, level="sequence"))
    torch.testing.assert_close(seq, torch.tensor([[2.0, 2.0, 2.0, 0.0]]))


def test_tis_scales_the_policy_loss() -> None:
    # ratio 1 everywhere, A = 1 -> loss -1 per token; TIS weights 1.5 and 2 (capped from 3).
    inputs = _inputs([[0.0, 0.0]], [[0.0, 0.0]], [[1.0, 1.0]])
    inputs = dataclasses.replace(inputs, rollout_logprobs=-torch.log(torch.tensor([[1.5, 3.0]])))
    loss, metrics = policy_objective(inputs, _cfg(tis={"cap": 2.0}), step=0)
    assert float(loss.detach()) == pytest.approx(-(1.5 + 2.0) / 2, abs=1e-6)
    assert metrics["actor/tis_capped"] == pytest.approx(0.5)


def test_kl_estimators_by_hand() -> None:
    logp, ref = torch.tensor([[-1.0]]), torch.tensor([[-2.0]])
    assert float(kl_estimate(logp, ref, "k1")) == pytest.approx(1.0)
    assert float(kl_estimate(logp, ref, "k2")) == pytest.approx(0.5)
    # k3 = exp(-1) - (-1) - 1 = 0.367879
    assert float(kl_estimate(logp, ref, "k3")) == pytest.approx(math.exp(-1.0), abs=1e-6)
    with pytest.raises(ValueError, match="did you mean 'k3'"):
        kl_estimate(logp, ref, "k4")


def test_kl_loss_term_and_entropy_bonus() -> None:
    # ratio 1, A = 0 -> policy loss 0; k1 KL = 1 on both tokens -> + 0.1 * 1; entropy 1 and 2
    # -> - 0.01 * 1.5.  Total 0.1 - 0.015 = 0.085.
    inputs = _inputs(
        [[-1.0, -1.0]],
        [[-1.0, -1.0]],
        [[0.0, 0.0]],
        ref_logprobs=torch.tensor([[-2.0, -2.0]]),
        entropy=torch.tensor([[1.0, 2.0]]),
    )
    cfg = _cfg(kl={"coef": 0.1, "estimator": "k1"}, entropy_coef=0.01)
    assert cfg.needs_reference() and cfg.needs_entropy()
    loss, metrics = policy_objective(inputs, cfg, step=0)
    assert float(loss.detach()) == pytest.approx(0.085, abs=1e-6)
    assert metrics["actor/kl_loss"] == pytest.approx(1.0)
    assert metrics["actor/entropy"] == pytest.approx(1.5)
    with pytest.raises(ValueError, match="needs ref_logprobs"):
        policy_objective(dataclasses.replace(inputs, ref_logprobs=None), cfg, step=0)


def test_kl_as_reward_penalty() -> None:
    kl = torch.tensor([[0.5, 2.0, 1.0]])
    mask = torch.tensor([[1, 0, 1]])
    rewards = torch.tensor([[0.0, 0.0, 1.0]])
    penalized = apply_kl_penalty(rewards, kl, mask, coef=0.1)
    torch.testing.assert_close(penalized, torch.tensor([[-0.05, 0.0, 0.9]]))
    assert not _cfg(kl={"apply_to": "reward"}).needs_entropy()


def test_aggregation_modes_by_hand() -> None:
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 99.0, 99.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    norm = Normalizers(num_tokens=4, num_seqs=2, horizon=4)
    assert float(aggregate(loss, mask, "token-mean", norm)) == pytest.approx(10 / 4)
    assert float(aggregate(loss, mask, "seq-mean-token-sum", norm)) == pytest.approx((6 + 4) / 2)
    assert float(aggregate(loss, mask, "seq-mean-token-mean", norm)) == pytest.approx((2 + 4) / 2)
    assert float(aggregate(loss, mask, "seq-mean-token-sum-norm", norm)) == pytest.approx(5 / 4)
    # Row 0 is one of two samples of its episode (weight 1/2): tokens weigh 1/2 * 3 + 1 = 2.5.
    weights = torch.tensor([0.5, 1.0])
    weighted = Normalizers(num_tokens=2.5, num_seqs=1.5)
    assert float(aggregate(loss, mask, "token-mean", weighted, weights)) == pytest.approx(7 / 2.5)
    assert float(aggregate(loss, mask, "seq-mean-token-mean", weighted, weights)) == pytest.approx(
        (0.5 * 2 + 4) / 1.5
    )


def test_loss_normalizers_count_weighted_tokens_and_sequences() -> None:
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0], [1, 1, 0]])
    episodes = torch.tensor([5, 5, 6, 7])
    weights = rollout_seq_weights(episodes)
    assert weights.tolist() == [0.5, 0.5, 1.0, 1.0]
    plain = loss_normalizers(mask, _cfg())
    assert (plain.num_tokens, plain.num_seqs) == (6.0, 3.0)  # the empty row is not a sequence
    per_rollout = loss_normalizers(mask, _cfg(normalize_per_rollout=True), weights)
    assert (per_rollout.num_tokens, per_rollout.num_seqs) == (0.5 * 3 + 0.5 * 1 + 2, 2.0)
    kinds = torch.tensor([0, 1, 0, 1])
    mix = loss_normalizers(mask, _cfg(objective="sft_rl_mix"), sample_kinds=kinds)
    assert (mix.num_tokens, mix.num_seqs, mix.num_sft_tokens) == (3.0, 1.0, 3.0)


@pytest.mark.parametrize(
    "algorithm",
    [
        {"loss_agg": "token-mean"},
        {"loss_agg": "seq-mean-token-sum"},
        {"loss_agg": "seq-mean-token-mean", "policy_loss": "gspo"},
        {"loss_agg": "seq-mean-token-sum-norm", "loss_agg_horizon": 10, "policy_loss": "cispo"},
        {
            "normalize_per_rollout": True,
            "kl": {"coef": 0.05},
            "entropy_coef": 0.01,
            "tis": {"cap": 1.5},
            "loss_agg": "seq-mean-token-mean",
        },
    ],
)
def test_micro_batch_shares_add_up_to_the_mini_batch_loss(algorithm: dict[str, object]) -> None:
    cfg = _cfg(**algorithm)
    full = random_loss_inputs(seed=4, num_rows=6)
    episodes = torch.tensor([0, 0, 1, 2, 2, 2])
    weights = rollout_seq_weights(episodes)
    norms = loss_normalizers(full.loss_mask, cfg, weights)
    full = dataclasses.replace(
        full,
        seq_weights=weights,
        global_num_tokens=norms.num_tokens,
        global_num_seqs=norms.num_seqs,
    )
    loss, metrics = policy_objective(full, cfg, step=0)
    (grad,) = torch.autograd.grad(loss, full.logprobs)

    total = torch.zeros(())
    summed: dict[str, float] = {}
    for rows in (slice(0, 2), slice(2, 3), slice(3, 6)):
        lp = full.logprobs.detach()[rows].clone().requires_grad_(True)
        micro = dataclasses.replace(
            full,
            **{
                f.name: getattr(full, f.name)[rows]
                for f in dataclasses.fields(full)
                if isinstance(getattr(full, f.name), torch.Tensor)
            },
        )
        micro = dataclasses.replace(micro, logprobs=lp)
        part, part_metrics = policy_objective(micro, cfg, step=0)
        part.backward()
        torch.testing.assert_close(lp.grad, grad[rows], atol=1e-6, rtol=1e-5)
        total = total + part.detach()
        for key, value in part_metrics.items():
            summed[key] = summed.get(key, 0.0) + value
    assert float(total.detach()) == pytest.approx(float(loss.detach()), abs=1e-6)
    assert summed == pytest.approx(metrics, abs=1e-6)


def test_value_loss_clips_by_hand() -> None:
    # Token 1: V 1.0, old 0, R 0: max((1)^2, (0.5)^2) = 1.  Token 2: V 0.2 (inside the clip), R 1:
    # 0.64.  Token 3: V 1.0, old 0, R 2: max(1, (0.5 - 2)^2 = 2.25) = 2.25 (clipped).
    # 0.5 * (1 + 0.64 + 2.25) / 3 = 0.648333, times vf_coef 2.
    values = torch.tensor([[1.0, 0.2, 1.0, 7.0]], requires_grad=True)
    old = torch.zeros(1, 4)
    returns = torch.tensor([[0.0, 1.0, 2.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    cfg = _cfg(advantage="gae", critic={"vf_coef": 2.0, "value_clip": 0.5})
    assert cfg.needs_critic()
    loss, metrics = value_loss(values, old, returns, mask, cfg, global_num_tokens=3)
    assert float(loss.detach()) == pytest.approx(2 * 0.5 * 3.89 / 3, abs=1e-6)
    assert metrics["critic/vf_loss"] == pytest.approx(0.5 * 3.89 / 3, abs=1e-6)
    assert metrics["critic/vf_clipfrac"] == pytest.approx(1 / 3)
    unclipped, _ = value_loss(values, old, returns, mask, _cfg(critic={"value_clip": None}), 3)
    assert float(unclipped.detach()) == pytest.approx(0.5 * (1 + 0.64 + 1) / 3, abs=1e-6)


def test_bad_loss_inputs_fail_clearly() -> None:
    inputs = _inputs([[0.0, 0.0]], [[0.0, 0.0]], [[1.0, 1.0]])
    with pytest.raises(ValueError, match="advantages must have loss_mask's shape"):
        policy_objective(dataclasses.replace(inputs, advantages=torch.zeros(1, 3)), _cfg(), 0)
    with pytest.raises(ValueError, match="no trained tokens"):
        policy_objective(dataclasses.replace(inputs, global_num_tokens=0.0), _cfg(), 0)
    with pytest.raises(ValueError, match="rollout_seq_weights"):
        policy_objective(inputs, _cfg(normalize_per_rollout=True), 0)
    with pytest.raises(ValueError, match="non-RL samples"):
        policy_objective(dataclasses.replace(inputs, sample_kinds=torch.tensor([1])), _cfg(), 0)
