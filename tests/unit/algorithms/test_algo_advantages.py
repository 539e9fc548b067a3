"""Advantage estimators against values worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch
from algo_helpers import random_rl_batch

from agentscope_rft.algorithms import (
    AdvantageInputs,
    AlgorithmConfig,
    compute_advantages,
    zero_variance_groups,
)


def _cfg(advantage: object) -> AlgorithmConfig:
    return AlgorithmConfig.model_validate({"advantage": advantage})


# Three groups: A has episodes scoring 1, 0, 0 (episode 0 split into two samples), B scores 2, 4,
# C scores 5, 5 (zero variance). Each sample trains its last token only, except where noted.
REWARDS = torch.tensor([1.0, 1.0, 0.0, 0.0, 2.0, 4.0, 5.0, 5.0])
GROUPS = torch.tensor([0, 0, 0, 0, 1, 1, 2, 2])
EPISODES = torch.tensor([0, 0, 1, 2, 3, 4, 5, 6])
MASK = torch.tensor([[0, 1]] * 8)


def _per_sample(advantages: torch.Tensor) -> list[float]:
    return advantages[:, 1].tolist()


def test_grpo_normalizes_within_group_over_episodes() -> None:
    # A: mean 1/3, unbiased var ((2/3)^2 + 2 (1/3)^2) / 2 = 1/3, std 0.57735:
    #    (1 - 1/3) / 0.57735 = 1.15470, (0 - 1/3) / 0.57735 = -0.57735 (episode 0 counted once).
    # B: mean 3, std sqrt(2): -/+ 0.70711.  C: zero variance -> 0.
    out = compute_advantages(AdvantageInputs(REWARDS, GROUPS, EPISODES, MASK), _cfg("grpo"))
    expected = [1.15470, 1.15470, -0.57735, -0.57735, -0.70711, 0.70711, 0.0, 0.0]
    assert _per_sample(out.advantages) == pytest.approx(expected, abs=1e-5)
    assert out.advantages[:, 0].abs().sum() == 0  # untrained tokens stay 0
    assert out.returns is None
    assert out.metrics["advantage/zero_variance_groups"] == 1.0
    assert out.metrics["advantage/num_groups"] == 3.0


def test_dr_grpo_only_centers() -> None:
    out = compute_advantages(
        AdvantageInputs(REWARDS, GROUPS, EPISODES, MASK),
        _cfg({"type": "grpo", "normalize_std": False}),
    )
    expected = [2 / 3, 2 / 3, -1 / 3, -1 / 3, -1.0, 1.0, 0.0, 0.0]
    assert _per_sample(out.advantages) == pytest.approx(expected, abs=1e-6)


def test_rloo_leaves_one_out() -> None:
    # A: 1 - mean(0, 0) = 1; 0 - mean(1, 0) = -0.5.  B: 2 - 4 = -2; 4 - 2 = 2.
    out = compute_advantages(AdvantageInputs(REWARDS, GROUPS, EPISODES, MASK), _cfg("rloo"))
    assert _per_sample(out.advantages) == pytest.approx([1, 1, -0.5, -0.5, -2, 2, 0, 0], abs=1e-6)


def test_reinforce_plus_plus_baseline_whitens_over_tokens() -> None:
    # Centered: 0.5, -0.5 (group 0) and 1, -1 (group 1); sample 0 has 2 trained tokens.
    # Tokens 0.5, 0.5, -0.5, 1, -1: mean 0.1, unbiased var 2.7 / 4 = 0.675, std 0.821584.
    inputs = AdvantageInputs(
        rewards=torch.tensor([1.0, 0.0, 3.0, 1.0]),
        group_ids=torch.tensor([0, 0, 1, 1]),
        episode_ids=torch.arange(4),
        loss_mask=torch.tensor([[1, 1], [0, 1], [1, 0], [0, 1]]),
    )
    out = compute_advantages(inputs, _cfg("reinforce_plus_plus_baseline"))
    std = math.sqrt(0.675)
    expected = torch.tensor([[0.4, 0.4], [0.0, -0.6], [0.9, 0.0], [0.0, -1.1]]) / std
    torch.testing.assert_close(out.advantages, expected, atol=1e-5, rtol=0)


def test_reinforce_plus_plus_discounts_across_tool_gap() -> None:
    # Trained tokens at 1, 2, 4 (3 is a tool result); step reward 0.5 on token 2, outcome 1.
    # gamma 0.5: G(4) = 1, G(2) = 0.5 + 0.5 * 1 = 1, G(1) = 0.5 * 1 = 0.5.
    # Whitened: mean 2.5/3, unbiased var (1/9 + 2/36) / 2 = 1/12 -> -1.1547, 0.57735, 0.57735.
    mask = torch.tensor([[0, 1, 1, 0, 1]])
    inputs = AdvantageInputs(
        rewards=torch.tensor([1.0]),
        group_ids=torch.tensor([0]),
        episode_ids=torch.tensor([0]),
        loss_mask=mask,
        token_rewards=torch.tensor([[0.0, 0.0, 0.5, 0.0, 0.0]]),
    )
    out = compute_advantages(inputs, _cfg({"type": "reinforce_plus_plus", "gamma": 0.5}))
    expected = torch.tensor([[0.0, -1.1547, 0.57735, 0.0, 0.57735]])
    torch.testing.assert_close(out.advantages, expected, atol=1e-4, rtol=0)


def test_token_level_estimators_treat_a_split_episode_as_one_sequence() -> None:
    # The same episode as one sample, or split into two samples (its two calls), in call order.
    whole = AdvantageInputs(
        rewards=torch.tensor([1.0, 0.0]),
        group_ids=torch.tensor([0, 0]),
        episode_ids=torch.tensor([0, 1]),
        loss_mask=torch.tensor([[0, 1, 1, 0, 1], [0, 1, 1, 1, 0]]),
        token_rewards=torch.tensor([[0.0, 0.0, 0.5, 0.0, 0.0], [0.0] * 5]),
        values=torch.tensor([[9.0, 0.1, 0.2, 9.0, 0.3], [9.0, 0.4, 0.5, 0.6, 9.0]]),
    )
    split = AdvantageInputs(
        rewards=torch.tensor([1.0, 0.0, 1.0]),
        group_ids=torch.tensor([0, 0, 0]),
        episode_ids=torch.tensor([0, 1, 0]),
        loss_mask=torch.tensor([[0, 1, 1, 0, 0], [0, 1, 1, 1, 0], [0, 0, 0, 0, 1]]),
        token_rewards=torch.tensor([[0.0, 0.0, 0.5, 0.0, 0.0], [0.0] * 5, [0.0] * 5]),
        values=torch.tensor(
            [[9.0, 0.1, 0.2, 9.0, 9.0], [9.0, 0.4, 0.5, 0.6, 9.0], [9.0] * 4 + [0.3]]
        ),
    )
    for advantage in [
        {"type": "reinforce_plus_plus", "gamma": 0.9},
        {"type": "gae", "gamma": 0.9, "lam": 0.8},
        {"type": "stepwise", "gamma": 0.5},
        "grpo",
    ]:
        a = compute_advantages(whole, _cfg(advantage))
        b = compute_advantages(split, _cfg(advantage))
        merged = b.advantages[0] + b.advantages[2]
        torch.testing.assert_close(a.advantages[0], merged, atol=1e-6, rtol=0, msg=str(advantage))
        torch.testing.assert_close(a.advantages[1], b.advantages[1], atol=1e-6, rtol=0)


def test_gae_by_hand() -> None:
    # Trained tokens at 0, 2, 3 (1 is a tool result whose value is ignored); outcome 1 at the end.
    # gamma 0.9, lam 0.8, values 0.5, 0.6, 0.7:
    #   delta = 1 - 0.7 = 0.3;  0.9*0.7 - 0.6 = 0.03;  0.9*0.6 - 0.5 = 0.04
    #   A = 0.3;  0.03 + 0.72*0.3 = 0.246;  0.04 + 0.72*0.246 = 0.21712;  returns = A + V.
    inputs = AdvantageInputs(
        rewards=torch.tensor([1.0]),
        group_ids=torch.tensor([0]),
        episode_ids=torch.tensor([0]),
        loss_mask=torch.tensor([[1, 0, 1, 1]]),
        values=torch.tensor([[0.5, 100.0, 0.6, 0.7]]),
    )
    out = compute_advantages(
        inputs, _cfg({"type": "gae", "gamma": 0.9, "lam": 0.8, "whiten": False})
    )
    torch.testing.assert_close(
        out.advantages, torch.tensor([[0.21712, 0.0, 0.246, 0.3]]), atol=1e-6, rtol=0
    )
    assert out.returns is not None
    torch.testing.assert_close(
        out.returns, torch.tensor([[0.71712, 0.0, 0.846, 1.0]]), atol=1e-6, rtol=0
    )
    with pytest.raises(ValueError, match="needs critic values"):
        compute_advantages(
            AdvantageInputs(inputs.rewards, inputs.group_ids, inputs.episode_ids, inputs.loss_mask),
            _cfg("gae"),
        )


def test_stepwise_discounts_per_turn() -> None:
    # Episode 0: turns at tokens 0-1 and 3; step reward 0.2 ends turn 0; outcome 1; gamma 0.5:
    #   G_1 = 1, G_0 = 0.2 + 0.5 * 1 = 0.7.  Episode 1: one turn, outcome 0: G_0 = 0.
    # Group statistics of G_0 = (0.7, 0): mean 0.35, std 0.494975.
    #   ep 0 turn 0: 0.35 / 0.494975 = 0.70711; turn 1: 0.65 / 0.494975 = 1.31320; ep 1: -0.70711.
    inputs = AdvantageInputs(
        rewards=torch.tensor([1.0, 0.0]),
        group_ids=torch.tensor([0, 0]),
        episode_ids=torch.tensor([0, 1]),
        loss_mask=torch.tensor([[1, 1, 0, 1], [1, 0, 0, 0]]),
        token_rewards=torch.tensor([[0.0, 0.2, 0.0, 0.0], [0.0] * 4]),
    )
    out = compute_advantages(inputs, _cfg({"type": "stepwise", "gamma": 0.5}))
    expected = torch.tensor([[0.70711, 0.70711, 0.0, 1.31320], [-0.70711, 0.0, 0.0, 0.0]])
    torch.testing.assert_close(out.advantages, expected, atol=1e-5, rtol=0)
    assert out.metrics["advantage/turns_per_episode"] == 1.5


def test_stepwise_with_gamma_one_and_outcome_rewards_is_grpo() -> None:
    batch = random_rl_batch(seed=3)
    stepwise = compute_advantages(batch.advantage_inputs(), _cfg("stepwise"))
    grpo = compute_advantages(batch.advantage_inputs(), _cfg("grpo"))
    torch.testing.assert_close(stepwise.advantages, grpo.advantages, atol=1e-6, rtol=0)


def test_zero_variance_groups_by_hand() -> None:
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.5])
    groups = torch.tensor([3, 3, 7, 7, 9])  # group 9 has one sample: no variance either
    assert zero_variance_groups(rewards, groups).tolist() == [True, True, False, False, True]


def test_equal_scores_can_still_carry_turn_level_advantages() -> None:
    # Both episodes succeed (outcome 1): episode 0 in one turn, episode 1 in two. Equal scores, so
    # the filter drops the group, but with gamma 0.5 the returns differ: G_0 = 1 and 0.5.
    # stepwise: mean 0.75, std 0.353553: ep 0: 0.70711; ep 1 turn 0: -0.70711, turn 1 (G = 1):
    # 0.70711. gigpo, turns 0 in one anchor state: A_E = 0, A_S = the same +-0.70711.
    inputs = AdvantageInputs(
        rewards=torch.tensor([1.0, 1.0]),
        group_ids=torch.tensor([0, 0]),
        episode_ids=torch.tensor([0, 1]),
        loss_mask=torch.tensor([[0, 1, 0, 0], [0, 1, 0, 1]]),
        step_state_ids=torch.tensor([[-1, 0, -1, -1], [-1, 0, -1, 1]]),
    )
    assert zero_variance_groups(inputs.rewards, inputs.group_ids).all()
    stepwise = compute_advantages(inputs, _cfg({"type": "stepwise", "gamma": 0.5}))
    expected = torch.tensor([[0.0, 0.70711, 0.0, 0.0], [0.0, -0.70711, 0.0, 0.70711]])
    torch.testing.assert_close(stepwise.advantages, expected, atol=1e-5, rtol=0)
    gigpo = compute_advantages(inputs, _cfg({"type": "gigpo", "gamma": 0.5}))
    expected = torch.tensor([[0.0, 0.70711, 0.0, 0.0], [0.0, -0.70711, 0.0, 0.0]])
    torch.testing.assert_close(gigpo.advantages, expected, atol=1e-5, rtol=0)
    # the default drops such groups; the docs say how to keep them
    assert _cfg("stepwise").drops_zero_variance_groups()
    keep = {"advantage": "gigpo", "filter_zero_variance_groups": False}
    assert not AlgorithmConfig.model_validate(keep).drops_zero_variance_groups()


def test_config_says_when_to_drop_zero_variance_groups() -> None:
    assert _cfg("grpo").drops_zero_variance_groups()
    assert not _cfg("gae").drops_zero_variance_groups()
    assert not _cfg("reinforce_plus_plus").drops_zero_variance_groups()
    off = AlgorithmConfig.model_validate(
        {"advantage": "rloo", "filter_zero_variance_groups": False}
    )
    assert not off.drops_zero_variance_groups()


def test_bad_advantage_inputs_fail_clearly() -> None:
    with pytest.raises(ValueError, match="different rewards"):
        compute_advantages(
            AdvantageInputs(torch.tensor([1.0, 0.0]), GROUPS[:2], torch.tensor([0, 0]), MASK[:2]),
            _cfg("grpo"),
        )
    with pytest.raises(ValueError, match="untrained tokens"):
        compute_advantages(
            AdvantageInputs(
                REWARDS[:1],
                GROUPS[:1],
                EPISODES[:1],
                MASK[:1],
                token_rewards=torch.tensor([[1.0, 0]]),
            ),
            _cfg("grpo"),
        )
    with pytest.raises(ValueError, match=r"rewards must be \[N\]"):
        compute_advantages(AdvantageInputs(REWARDS[:3], GROUPS, EPISODES, MASK), _cfg("grpo"))
    with pytest.raises(ValueError, match="trains without advantages"):
        compute_advantages(
            AdvantageInputs(REWARDS, GROUPS, EPISODES, MASK),
            AlgorithmConfig.model_validate({"objective": "sft"}),
        )
