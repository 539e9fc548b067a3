"""SFT, DPO and the CHORD SFT+RL mix against hand-derived values (DPO also against TRL)."""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from agentscope_rft.algorithms import (
    SAMPLE_KIND_CODES,
    AlgorithmConfig,
    LossInputs,
    SFTMixConfig,
    encode_sample_kinds,
    loss_normalizers,
    policy_objective,
    sft_mix_weight,
)


def _cfg(**algorithm: object) -> AlgorithmConfig:
    return AlgorithmConfig.model_validate(algorithm)


def _inputs(logprobs: list[list[float]], mask: list[list[int]], **extra: object) -> LossInputs:
    lp = torch.tensor(logprobs, requires_grad=True)
    loss_mask = torch.tensor(mask)
    fields: dict[str, object] = {
        "logprobs": lp,
        "old_logprobs": lp.detach(),
        "rollout_logprobs": lp.detach(),
        "advantages": torch.zeros_like(lp),
        "loss_mask": loss_mask,
        "global_num_tokens": float(loss_mask.sum()),
        "global_num_seqs": float((loss_mask.sum(-1) > 0).sum()),
    }
    fields.update(extra)
    return LossInputs(**fields)  # type: ignore[arg-type]


def test_sft_is_token_mean_nll_of_trained_tokens() -> None:
    # Trained log-probs -2, -3 and -1: (2 + 3 + 1) / 3 = 2.
    inputs = _inputs([[-1.0, -2.0, -3.0], [-1.0, -5.0, -5.0]], [[0, 1, 1], [1, 0, 0]])
    loss, metrics = policy_objective(inputs, _cfg(objective="sft"), step=0)
    assert float(loss.detach()) == pytest.approx(2.0)
    assert metrics["sft/loss"] == pytest.approx(2.0)
    loss.backward()
    expected = -torch.tensor([[0, 1, 1], [1, 0, 0]]) / 3
    torch.testing.assert_close(inputs.logprobs.grad, expected.float())


# One pair: chosen log-ratio (-1 - -1.5) * 2 = +1, rejected (-2 - -1) = -1; beta 0.5:
# logits = 0.5 * (1 - (-1)) = 1; loss = -log sigmoid(1) = 0.313262.
DPO_LOGPROBS = [[-1.0, -1.0], [-2.0, 0.0]]
DPO_REF = torch.tensor([[-1.5, -1.5], [-1.0, 0.0]])
DPO_MASK = [[1, 1], [1, 0]]


def _dpo_inputs(**extra: object) -> LossInputs:
    fields: dict[str, object] = {
        "ref_logprobs": DPO_REF,
        "pair_index": torch.tensor([7, 7]),
        "sample_kinds": encode_sample_kinds(["dpo_chosen", "dpo_rejected"]),
    }
    fields.update(extra)
    return _inputs(DPO_LOGPROBS, DPO_MASK, **fields)


def test_dpo_by_hand() -> None:
    inputs = _dpo_inputs()
    loss, metrics = policy_objective(inputs, _cfg(objective="dpo", dpo={"beta": 0.5}), step=0)
    assert float(loss.detach()) == pytest.approx(-math.log(1 / (1 + math.exp(-1.0))), abs=1e-6)
    assert metrics["dpo/accuracy"] == 1.0
    assert metrics["dpo/margin"] == pytest.approx(1.0)
    assert metrics["dpo/chosen_reward"] == pytest.approx(0.5)
    assert metrics["dpo/rejected_reward"] == pytest.approx(-0.5)
    # d/dlogits = -(1 - sigmoid(1)) = -0.268941; chosen tokens get beta * that, rejected -beta *.
    loss.backward()
    g = -0.5 * (1 - 1 / (1 + math.exp(-1.0)))
    torch.testing.assert_close(
        inputs.logprobs.grad, torch.tensor([[g, g], [-g, 0.0]]), atol=1e-6, rtol=0
    )


def test_dpo_label_smoothing_and_explicit_is_chosen() -> None:
    # 0.9 * -log sigmoid(1) + 0.1 * -log sigmoid(-1) = 0.9 * 0.313262 + 0.1 * 1.313262
    inputs = _dpo_inputs(sample_kinds=None, is_chosen=torch.tensor([True, False]))
    cfg = _cfg(objective="dpo", dpo={"beta": 0.5, "label_smoothing": 0.1})
    loss, _ = policy_objective(inputs, cfg, step=0)
    assert float(loss.detach()) == pytest.approx(0.9 * 0.313262 + 0.1 * 1.313262, abs=1e-6)


def test_dpo_needs_both_members_of_a_pair() -> None:
    inputs = _dpo_inputs(pair_index=torch.tensor([7, 8]))
    with pytest.raises(ValueError, match="exactly one chosen and one rejected"):
        policy_objective(inputs, _cfg(objective="dpo"), step=0)
    with pytest.raises(ValueError, match="needs ref_logprobs"):
        policy_objective(dataclasses.replace(inputs, ref_logprobs=None), _cfg(objective="dpo"), 0)


def test_dpo_matches_trl() -> None:
    dpo_trainer = pytest.importorskip("trl.trainer.dpo_trainer", reason="trl is not installed")
    gen = torch.Generator().manual_seed(0)
    pairs, length = 3, 6
    mask = (torch.rand(2 * pairs, length, generator=gen) > 0.3).long()
    mask[:, 0] = 1
    logprobs = -torch.rand(2 * pairs, length, generator=gen) * 3
    ref = logprobs + torch.randn(2 * pairs, length, generator=gen) * 0.3
    is_chosen = torch.tensor(
        [True] * pairs + [False] * pairs
    )  # TRL's layout: chosen, then rejected
    inputs = LossInputs(
        logprobs=logprobs.clone().requires_grad_(True),
        old_logprobs=logprobs,
        rollout_logprobs=logprobs,
        advantages=torch.zeros_like(logprobs),
        loss_mask=mask,
        global_num_tokens=float(mask.sum()),
        global_num_seqs=float(2 * pairs),
        ref_logprobs=ref,
        pair_index=torch.arange(2 * pairs) % pairs,
        is_chosen=is_chosen,
    )
    loss, _ = policy_objective(inputs, _cfg(objective="dpo", dpo={"beta": 0.3}), step=0)

    zeros = torch.zeros(2 * pairs, length)
    model_out = SimpleNamespace(
        log_probs=logprobs * mask, entropy=zeros, mean_logits=zeros, is_top1=zeros.bool()
    )
    ref_sums = (ref * mask).sum(-1)
    trainer = SimpleNamespace(
        model=SimpleNamespace(training=True),
        accelerator=SimpleNamespace(
            device="cpu", gather=lambda t: t, gather_for_metrics=lambda t: t
        ),
        aux_loss_enabled=False,
        ld_alpha=None,
        precompute_ref_logps=True,
        f_divergence_type="reverse_kl",
        loss_types=["sigmoid"],
        loss_weights=[1.0],
        beta=0.3,
        label_smoothing=0.0,
        use_weighting=False,
        _metrics={"train": defaultdict(list)},
        _total_train_tokens=0,
        _tp_size=1,
    )
    trl_inputs = {
        "input_ids": torch.zeros(2 * pairs, length + 1, dtype=torch.long),
        "attention_mask": torch.ones(2 * pairs, length + 1, dtype=torch.long),
        "completion_mask": torch.cat([torch.zeros(2 * pairs, 1, dtype=torch.long), mask], dim=1),
        "ref_chosen_logps": ref_sums[:pairs],
        "ref_rejected_logps": ref_sums[pairs:],
    }
    trl_loss = dpo_trainer.DPOTrainer._compute_loss(
        trainer, lambda **kwargs: model_out, trl_inputs, return_outputs=False
    )
    assert float(loss.detach()) == pytest.approx(float(trl_loss), abs=1e-5)


def test_chord_schedule_by_hand() -> None:
    cfg = SFTMixConfig(mu_peak=0.8, mu_valley=0.2, warmup_steps=4, decay_steps=10)
    assert sft_mix_weight(cfg, 0) == 0.0
    assert sft_mix_weight(cfg, 2) == pytest.approx(0.4)  # linear warmup: 2/4 * 0.8
    assert sft_mix_weight(cfg, 4) == pytest.approx(0.8)  # peak
    assert sft_mix_weight(cfg, 9) == pytest.approx(0.5)  # half-way: 0.2 + 0.6 * 0.5
    assert sft_mix_weight(cfg, 14) == pytest.approx(0.2)
    assert sft_mix_weight(cfg, 100) == pytest.approx(0.2)


def test_sft_rl_mix_by_hand() -> None:
    # Row 0 (rl): ratio 1, advantage 2 -> PPO loss -2 per token, token-mean over its 2 tokens -2.
    # Row 1 (sft): log-probs log 0.5 on 2 tokens; its advantages (9) are ignored.
    # Without phi: SFT = -log 0.5 = 0.693147. With phi, each token weighs 0.5 * 0.5 = 0.25.
    # mu at step 0 with warmup 0 and decay 10 from 0.6 -> 0.6.
    half = math.log(0.5)
    inputs = _inputs(
        [[-1.0, -1.0], [half, half]],
        [[1, 1], [1, 1]],
        advantages=torch.tensor([[2.0, 2.0], [9.0, 9.0]]),
        sample_kinds=encode_sample_kinds(["rl", "sft"]),
    )
    cfg = _cfg(
        objective="sft_rl_mix", sft_mix={"mu_peak": 0.6, "mu_valley": 0.0, "decay_steps": 10}
    )
    norms = loss_normalizers(inputs.loss_mask, cfg, sample_kinds=inputs.sample_kinds)
    assert (norms.num_tokens, norms.num_seqs, norms.num_sft_tokens) == (2.0, 1.0, 2.0)
    inputs = dataclasses.replace(
        inputs,
        global_num_tokens=norms.num_tokens,
        global_num_seqs=norms.num_seqs,
        global_num_sft_tokens=norms.num_sft_tokens,
    )
    loss, metrics = policy_objective(inputs, cfg, step=0)
    assert float(loss.detach()) == pytest.approx(0.4 * -2.0 + 0.6 * 0.25 * -half, abs=1e-6)
    assert metrics["sft/loss"] == pytest.approx(0.25 * -half, abs=1e-6)
    no_phi = cfg.model_copy(
        update={
            "sft_mix": SFTMixConfig(mu_peak=0.6, mu_valley=0.0, decay_steps=10, phi_weighting=False)
        }
    )
    loss, _ = policy_objective(inputs, no_phi, step=10)  # mu = valley = 0: RL only
    assert float(loss.detach()) == pytest.approx(-2.0, abs=1e-6)
    with pytest.raises(ValueError, match="needs sample_kinds"):
        policy_objective(dataclasses.replace(inputs, sample_kinds=None), cfg, step=0)
    dpo_kind = torch.tensor([SAMPLE_KIND_CODES["rl"], SAMPLE_KIND_CODES["dpo_chosen"]])
    with pytest.raises(ValueError, match="only rl and sft"):
        policy_objective(dataclasses.replace(inputs, sample_kinds=dpo_kind), cfg, step=0)
