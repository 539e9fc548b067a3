"""Cross-check against verl 0.9.1's `verl.trainer.ppo.core_algos` on random inputs.

Masks are padded on both sides with tool-result gaps inside; groups have unequal sizes. verl groups
samples, we group episodes: with one sample per episode (as here) the two must agree to 1e-5.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from algo_helpers import RLBatch, random_loss_inputs, random_rl_batch

from agentscope_rft.algorithms import (
    AlgorithmConfig,
    LossInputs,
    Normalizers,
    TISConfig,
    aggregate,
    compute_advantages,
    kl_estimate,
    policy_objective,
    tis_weights,
    value_loss,
)

core_algos = pytest.importorskip(
    "verl.trainer.ppo.core_algos", reason="verl is not installed (pip install verl==0.9.1)"
)
rollout_corr = pytest.importorskip("verl.trainer.ppo.rollout_corr_helper")
verl_config = pytest.importorskip("verl.workers.config")
verl_trainer_config = pytest.importorskip("verl.trainer.config")

ATOL = 1e-5
SEEDS = [0, 1, 2]


def _close(ours: torch.Tensor, verl: torch.Tensor, mask: torch.Tensor | None = None) -> None:
    if mask is not None:
        ours, verl = ours * mask, verl * mask
    torch.testing.assert_close(ours.float(), verl.float(), atol=ATOL, rtol=ATOL)


def _cfg(**algorithm: object) -> AlgorithmConfig:
    return AlgorithmConfig.model_validate(algorithm)


def _index(batch: RLBatch) -> np.ndarray:
    return np.array([f"task-{int(g)}" for g in batch.group_ids], dtype=object)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("normalize_std", [True, False])
def test_grpo(seed: int, normalize_std: bool) -> None:
    batch = random_rl_batch(seed, group_sizes=(2, 3, 4, 5, 3))
    mask = batch.loss_mask.float()
    ours = compute_advantages(
        batch.advantage_inputs(), _cfg(advantage={"type": "grpo", "normalize_std": normalize_std})
    )
    verl, _ = core_algos.compute_grpo_outcome_advantage(
        batch.verl_token_level_rewards(), mask, _index(batch), norm_adv_by_std_in_grpo=normalize_std
    )
    _close(ours.advantages, verl)


@pytest.mark.parametrize("seed", SEEDS)
def test_grpo_with_zero_variance_groups(seed: int) -> None:
    # Binary rewards give constant groups; verl's (s - mean) / (0 + eps) is then exactly 0 too.
    batch = random_rl_batch(seed, group_sizes=(2, 4, 4, 3), binary=True)
    mask = batch.loss_mask.float()
    ours = compute_advantages(batch.advantage_inputs(), _cfg(advantage="grpo"))
    verl, _ = core_algos.compute_grpo_outcome_advantage(
        batch.verl_token_level_rewards(), mask, _index(batch)
    )
    _close(ours.advantages, verl)


@pytest.mark.parametrize("seed", SEEDS)
def test_rloo(seed: int) -> None:
    batch = random_rl_batch(seed)
    mask = batch.loss_mask.float()
    ours = compute_advantages(batch.advantage_inputs(), _cfg(advantage="rloo"))
    verl, _ = core_algos.compute_rloo_outcome_advantage(
        batch.verl_token_level_rewards(), mask, _index(batch)
    )
    _close(ours.advantages, verl)


@pytest.mark.parametrize("seed", SEEDS)
def test_reinforce_plus_plus_baseline(seed: int) -> None:
    batch = random_rl_batch(seed)
    mask = batch.loss_mask.float()
    ours = compute_advantages(
        batch.advantage_inputs(), _cfg(advantage="reinforce_plus_plus_baseline")
    )
    verl, _ = core_algos.compute_reinforce_plus_plus_baseline_outcome_advantage(
        batch.verl_token_level_rewards(), mask, _index(batch)
    )
    _close(ours.advantages, verl)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_reinforce_plus_plus_with_step_rewards(seed: int, gamma: float) -> None:
    batch = random_rl_batch(seed)
    mask = batch.loss_mask.float()
    ours = compute_advantages(
        batch.advantage_inputs(token_rewards=True),
        _cfg(advantage={"type": "reinforce_plus_plus", "gamma": gamma}),
    )
    verl, _ = core_algos.compute_reinforce_plus_plus_outcome_advantage(
        batch.verl_token_level_rewards(token_rewards=True),
        mask,
        config=verl_trainer_config.AlgoConfig(gamma=gamma),
    )
    _close(ours.advantages, verl)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(("gamma", "lam"), [(1.0, 1.0), (0.99, 0.95), (0.8, 0.5)])
def test_gae(seed: int, gamma: float, lam: float) -> None:
    batch = random_rl_batch(seed)
    mask = batch.loss_mask.float()
    ours = compute_advantages(
        batch.advantage_inputs(token_rewards=True, values=True),
        _cfg(advantage={"type": "gae", "gamma": gamma, "lam": lam}),
    )
    verl_adv, verl_returns = core_algos.compute_gae_advantage_return(
        batch.verl_token_level_rewards(token_rewards=True), batch.values, mask, gamma, lam
    )
    _close(ours.advantages, verl_adv, mask)
    assert ours.returns is not None
    _close(ours.returns, verl_returns, mask)


def _actor_config(cfg: AlgorithmConfig, inputs: LossInputs) -> object:
    loss = cfg.policy_loss
    clip_low = getattr(loss, "clip_low", 0.2)
    clip_low = 1.0 if clip_low is None else clip_low  # no lower bound: 1 - 1 = 0
    dual = getattr(loss, "dual_clip", None)
    actor = verl_config.ActorConfig(
        strategy="fsdp",
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=1,
        clip_ratio=clip_low,
        clip_ratio_low=clip_low,
        clip_ratio_high=loss.clip_high,  # type: ignore[attr-defined]
        clip_ratio_c=dual if dual is not None else 1e9,
        loss_agg_mode=cfg.loss_agg,
    )
    actor.global_batch_info.update(
        dp_size=1,
        batch_num_tokens=inputs.global_num_tokens,
        global_batch_size=inputs.global_num_seqs,
        loss_scale_factor=cfg.loss_agg_horizon,
    )
    return actor


POLICY_CASES = [
    ("vanilla", {"policy_loss": {"type": "ppo", "clip_low": 0.2, "clip_high": 0.28}}),
    ("vanilla", {"policy_loss": {"type": "ppo", "dual_clip": None}}),
    ("gspo", {"policy_loss": {"type": "gspo", "clip_low": 0.05, "clip_high": 0.08}}),
    ("cispo", {"policy_loss": {"type": "cispo", "clip_high": 0.3}}),
    ("cispo", {"policy_loss": {"type": "cispo", "clip_low": 0.2, "clip_high": 0.28}}),
]
AGG_MODES = ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]


@pytest.mark.parametrize("seed", SEEDS[:2])
@pytest.mark.parametrize("agg", AGG_MODES)
@pytest.mark.parametrize(("verl_name", "algorithm"), POLICY_CASES)
def test_policy_losses(seed: int, agg: str, verl_name: str, algorithm: dict[str, object]) -> None:
    horizon = 10 if agg == "seq-mean-token-sum-norm" else None
    cfg = _cfg(**algorithm, loss_agg=agg, loss_agg_horizon=horizon)
    inputs = random_loss_inputs(
        seed, num_rows=7, length=10, scale=0.4 if verl_name != "gspo" else 0.05
    )
    loss, metrics = policy_objective(inputs, cfg, step=0)
    (grad,) = torch.autograd.grad(loss, inputs.logprobs)

    logprobs = inputs.logprobs.detach().clone().requires_grad_(True)
    verl_loss, verl_metrics = core_algos.get_policy_loss_fn(verl_name)(
        old_log_prob=inputs.old_logprobs,
        log_prob=logprobs,
        advantages=inputs.advantages,
        response_mask=inputs.loss_mask.bool(),
        loss_agg_mode=agg,
        config=_actor_config(cfg, inputs),
    )
    (verl_grad,) = torch.autograd.grad(verl_loss, logprobs)
    assert float(loss.detach()) == pytest.approx(float(verl_loss.detach()), abs=ATOL)
    _close(grad, verl_grad)
    assert metrics["actor/clipfrac"] == pytest.approx(verl_metrics["actor/pg_clipfrac"], abs=ATOL)
    assert metrics["actor/ppo_kl"] == pytest.approx(verl_metrics["actor/ppo_kl"], abs=ATOL)
    if verl_name != "gspo":
        assert metrics["actor/clipfrac"] > 0  # the comparison covers clipped tokens
    if verl_name == "vanilla" and "actor/clipfrac_dual" in metrics:
        assert metrics["actor/clipfrac_dual"] == pytest.approx(
            verl_metrics["actor/pg_clipfrac_lower"], abs=ATOL
        )


@pytest.mark.parametrize("seed", SEEDS[:2])
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_tis_weights_match_rollout_correction(seed: int, level: str) -> None:
    inputs = random_loss_inputs(seed, scale=0.2)
    ours = tis_weights(
        inputs.old_logprobs,
        inputs.rollout_logprobs,
        inputs.loss_mask,
        TISConfig(cap=1.3, level=level),
    )
    verl, _ = rollout_corr.compute_rollout_correction_weights(
        log_ratio=inputs.old_logprobs - inputs.rollout_logprobs,
        response_mask=inputs.loss_mask.float(),
        rollout_is=level,
        rollout_is_threshold=1.3,
    )
    _close(ours, verl)


@pytest.mark.parametrize("seed", SEEDS[:2])
def test_full_rl_objective_matches_verl_ppo_loss_composition(seed: int) -> None:
    # verl.workers.utils.losses.ppo_loss: pg_loss(..., rollout_is_weights) - entropy_coeff *
    # agg(entropy) + kl_loss_coef * agg(kl_penalty(log_prob, ref, kl_loss_type)); rebuilt from
    # core_algos because ppo_loss itself takes verl's nested-tensor batches.
    cfg = _cfg(
        policy_loss={"type": "ppo", "clip_high": 0.28},
        loss_agg="seq-mean-token-mean",
        kl={"coef": 0.05, "estimator": "k3"},
        entropy_coef=0.01,
        tis={"cap": 1.5},
    )
    inputs = random_loss_inputs(seed, num_rows=7, length=10, scale=0.3)
    loss, _ = policy_objective(inputs, cfg, step=0)
    (grad,) = torch.autograd.grad(loss, inputs.logprobs)

    logprobs = inputs.logprobs.detach().clone().requires_grad_(True)
    actor = _actor_config(cfg, inputs)
    mask = inputs.loss_mask.bool()
    is_weights, _ = rollout_corr.compute_rollout_correction_weights(
        inputs.old_logprobs - inputs.rollout_logprobs, mask.float(), "token", 1.5
    )
    pg, _ = core_algos.get_policy_loss_fn("vanilla")(
        inputs.old_logprobs,
        logprobs,
        inputs.advantages,
        mask,
        "seq-mean-token-mean",
        actor,
        is_weights,
    )
    info = actor.global_batch_info  # type: ignore[attr-defined]
    entropy = core_algos.agg_loss(inputs.entropy, mask, "seq-mean-token-mean", **info)
    kl = core_algos.kl_penalty(logprobs, inputs.ref_logprobs, "low_var_kl")
    kl_loss = core_algos.agg_loss(kl, mask, "seq-mean-token-mean", **info)
    verl_loss = pg - 0.01 * entropy + 0.05 * kl_loss
    (verl_grad,) = torch.autograd.grad(verl_loss, logprobs)
    assert float(loss.detach()) == pytest.approx(float(verl_loss.detach()), abs=ATOL)
    _close(grad, verl_grad)


@pytest.mark.parametrize("seed", SEEDS[:2])
@pytest.mark.parametrize("agg", AGG_MODES)
def test_agg_loss(seed: int, agg: str) -> None:
    inputs = random_loss_inputs(seed, num_rows=8)
    values = torch.randn(inputs.loss_mask.shape, generator=torch.Generator().manual_seed(seed))
    norm = Normalizers(inputs.global_num_tokens, inputs.global_num_seqs, horizon=7)
    ours = aggregate(values, inputs.loss_mask, agg, norm)
    verl = core_algos.agg_loss(
        values,
        inputs.loss_mask.bool(),
        agg,
        dp_size=1,
        batch_num_tokens=inputs.global_num_tokens,
        global_batch_size=inputs.global_num_seqs,
        loss_scale_factor=7,
    )
    assert float(ours) == pytest.approx(float(verl), abs=ATOL)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(("ours", "verl"), [("k1", "kl"), ("k2", "mse"), ("k3", "low_var_kl")])
def test_kl_estimators(seed: int, ours: str, verl: str) -> None:
    gen = torch.Generator().manual_seed(seed)
    logprobs = -torch.rand(5, 9, generator=gen) * 4
    ref = -torch.rand(5, 9, generator=gen) * 4
    _close(kl_estimate(logprobs, ref, ours), core_algos.kl_penalty(logprobs, ref, verl))


@pytest.mark.parametrize("seed", SEEDS)
def test_value_loss(seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    inputs = random_loss_inputs(seed)
    values = torch.randn(inputs.loss_mask.shape, generator=gen)
    old_values = values + torch.randn(values.shape, generator=gen) * 0.5
    returns = torch.randn(values.shape, generator=gen)
    cfg = _cfg(advantage="gae", critic={"vf_coef": 1.0, "value_clip": 0.3})
    ours, metrics = value_loss(
        values, old_values, returns, inputs.loss_mask, cfg, inputs.global_num_tokens
    )
    verl, verl_clipfrac = core_algos.compute_value_loss(
        values,
        returns,
        old_values,
        inputs.loss_mask.bool(),
        cliprange_value=0.3,
        batch_num_tokens=inputs.global_num_tokens,
    )
    assert float(ours) == pytest.approx(float(verl), abs=ATOL)
    assert metrics["critic/vf_clipfrac"] == pytest.approx(float(verl_clipfrac), abs=ATOL)


def test_kl_reward_penalty_matches_verl_compute_rewards() -> None:
    from agentscope_rft.algorithms import apply_kl_penalty

    inputs = random_loss_inputs(5)
    scores = torch.randn(inputs.loss_mask.shape) * inputs.loss_mask
    kl = kl_estimate(inputs.old_logprobs, inputs.ref_logprobs, "k1")  # type: ignore[arg-type]
    ours = apply_kl_penalty(scores, kl, inputs.loss_mask, coef=0.2)
    verl = core_algos.compute_rewards(scores, inputs.old_logprobs, inputs.ref_logprobs, 0.2)
    _close(ours, verl, inputs.loss_mask.float())


def test_loss_inputs_are_not_mutated() -> None:
    inputs = random_loss_inputs(0)
    before = dataclasses.replace(inputs)
    policy_objective(inputs, _cfg(), step=0)
    assert torch.equal(before.advantages, inputs.advantages)


def test_groups_of_one_differ_from_verl_by_design() -> None:
    # verl gives a task with a single sample its raw score as advantage (GRPO: score / (1 + eps),
    # RLOO: score); with no other episode there is no baseline, so we give 0 (and count the group
    # as zero-variance, which the trainer drops). Groups of two or more agree (tests above).
    batch = random_rl_batch(0, group_sizes=(1, 3))
    mask = batch.loss_mask.float()
    single = batch.group_ids == 10
    for name, verl_fn in [
        ("grpo", core_algos.compute_grpo_outcome_advantage),
        ("rloo", core_algos.compute_rloo_outcome_advantage),
    ]:
        ours = compute_advantages(batch.advantage_inputs(), _cfg(advantage=name))
        verl, _ = verl_fn(batch.verl_token_level_rewards(), mask, _index(batch))
        assert ours.advantages[single].abs().sum() == 0
        assert verl[single].sum() == pytest.approx(
            float(batch.rewards[single] * mask[single].sum()), rel=1e-4
        )
        _close(ours.advantages[~single], verl[~single])
