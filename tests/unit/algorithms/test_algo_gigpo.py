"""GiGPO against hand-derived values, and the anchor-state plumbing from samples to tensors."""

from __future__ import annotations

import pytest
import torch

from agentscope_rft.algorithms import AdvantageInputs, AlgorithmConfig, compute_advantages
from agentscope_rft.trainers.batch import build_batch
from agentscope_rft.types import Sample
from tests.unit.algorithms.algo_helpers import random_rl_batch


def _cfg(advantage: object) -> AlgorithmConfig:
    return AlgorithmConfig.model_validate({"advantage": advantage})


def _per_turn_inputs() -> AdvantageInputs:
    """One group, per-turn samples (one call each, two trained tokens per call):
    episode 0 (reward 1): turns in states s0, s1; episode 1 (reward 0): s0, s2, s1."""
    return AdvantageInputs(
        rewards=torch.tensor([1.0, 1.0, 0.0, 0.0, 0.0]),
        group_ids=torch.zeros(5, dtype=torch.long),
        episode_ids=torch.tensor([0, 0, 1, 1, 1]),
        loss_mask=torch.tensor([[0, 1, 1]] * 5),
        step_state_ids=torch.tensor([[-1, 0, 0], [-1, 1, 1], [-1, 0, 0], [-1, 2, 2], [-1, 1, 1]]),
    )


def test_gigpo_mean_norm_by_hand() -> None:
    # Episode advantages: scores (1, 0), mean 0.5 -> +0.5, -0.5.
    # Turn returns, gamma 0.5: ep 0: G_1 = 1, G_0 = 0.5; ep 1: G = 0, 0, 0.
    # Step groups: s0 {0.5, 0}: mean 0.25 -> +0.25, -0.25; s1 {1, 0}: +0.5, -0.5;
    # s2 {0}: alone -> 0.
    # Sum: ep 0: 0.75, 1.0; ep 1: -0.75, -0.5, -1.0.
    out = compute_advantages(
        _per_turn_inputs(), _cfg({"type": "gigpo", "gamma": 0.5, "normalize_std": False})
    )
    expected = torch.tensor([0.75, 1.0, -0.75, -0.5, -1.0])
    torch.testing.assert_close(out.advantages[:, 1], expected, atol=1e-6, rtol=0)
    torch.testing.assert_close(out.advantages[:, 2], expected, atol=1e-6, rtol=0)
    assert out.advantages[:, 0].abs().sum() == 0
    assert out.metrics["advantage/step_groups"] == 3.0


def test_gigpo_std_norm_and_step_weight_by_hand() -> None:
    # Episode: (1, 0) / std 0.707107 -> +-0.707107. Step groups s0 {0.5, 0} and s1 {1, 0} both
    # normalize to +-0.707107; s2 alone -> 0. With step_weight 0.5:
    # ep 0: 0.707107 + 0.353553 = 1.060660 (both turns); ep 1: -1.060660, -0.707107, -1.060660.
    out = compute_advantages(
        _per_turn_inputs(), _cfg({"type": "gigpo", "gamma": 0.5, "step_weight": 0.5})
    )
    expected = torch.tensor([1.060660, 1.060660, -1.060660, -0.707107, -1.060660])
    torch.testing.assert_close(out.advantages[:, 1], expected, atol=1e-5, rtol=0)


def test_gigpo_in_a_merged_sample_uses_each_turns_state() -> None:
    # The same two episodes as merged samples: each run of trained tokens is one turn.
    inputs = AdvantageInputs(
        rewards=torch.tensor([1.0, 0.0]),
        group_ids=torch.tensor([0, 0]),
        episode_ids=torch.tensor([0, 1]),
        loss_mask=torch.tensor([[0, 1, 0, 1, 0, 0], [0, 1, 0, 1, 0, 1]]),
        step_state_ids=torch.tensor([[-1, 0, -1, 1, -1, -1], [-1, 0, -1, 2, -1, 1]]),
    )
    out = compute_advantages(inputs, _cfg({"type": "gigpo", "gamma": 0.5, "normalize_std": False}))
    expected = torch.tensor([[0, 0.75, 0, 1.0, 0, 0], [0, -0.75, 0, -0.5, 0, -1.0]])
    torch.testing.assert_close(out.advantages, expected, atol=1e-6, rtol=0)


def test_gigpo_without_states_or_step_weight_is_grpo() -> None:
    batch = random_rl_batch(seed=5)
    grpo = compute_advantages(batch.advantage_inputs(), _cfg("grpo"))
    no_states = compute_advantages(batch.advantage_inputs(), _cfg("gigpo"))
    torch.testing.assert_close(no_states.advantages, grpo.advantages, atol=1e-6, rtol=0)
    weightless = compute_advantages(_per_turn_inputs(), _cfg({"type": "gigpo", "step_weight": 0}))
    torch.testing.assert_close(
        weightless.advantages, compute_advantages(_per_turn_inputs(), _cfg("grpo")).advantages
    )


def test_step_groups_do_not_cross_task_groups() -> None:
    # Two groups, both episodes in state 0 with different returns; each is alone in its
    # (group, state) step group, so only the episode advantage (0: groups of one) remains.
    inputs = AdvantageInputs(
        rewards=torch.tensor([1.0, 0.0]),
        group_ids=torch.tensor([0, 1]),
        episode_ids=torch.tensor([0, 1]),
        loss_mask=torch.tensor([[0, 1], [0, 1]]),
        step_state_ids=torch.tensor([[-1, 0], [-1, 0]]),
    )
    out = compute_advantages(inputs, _cfg({"type": "gigpo", "normalize_std": False}))
    assert out.advantages.abs().sum() == 0


def _sample(mask: list[int], states: list[str] | None, rid: str = "r") -> Sample:
    n = len(mask)
    return Sample(
        token_ids=list(range(1, n + 1)),
        loss_mask=mask,
        logprobs=[0.0] * n,
        reward=1.0,
        rollout_id=rid,
        task_id="t",
        num_calls=len(states) if states else 1,
        step_states=states,
    )


def test_batch_places_each_calls_state_on_its_tokens() -> None:
    batch = build_batch(
        [
            _sample([0, 1, 1, 0, 1], ["kitchen", "fridge"]),
            _sample([0, 1, 0], ["fridge"], rid="q"),
            _sample([0, 1, 0], None, rid="u"),
            _sample([0, 1, 0, 1], ["", "kitchen"], rid="v"),
        ],
        pad_id=0,
    )
    assert batch.step_state_ids.tolist() == [
        [-1, 0, 0, -1, 1],
        [-1, 1, -1, -1, -1],
        [-1, -1, -1, -1, -1],
        [-1, -1, -1, 0, -1],
    ]


def test_states_that_do_not_match_the_calls_fail_clearly() -> None:
    with pytest.raises(ValueError, match="step_states has 1 entries for 2 calls"):
        Sample([1, 2], [0, 1], [0.0, 0.0], 1.0, "r", "t", num_calls=2, step_states=["a"])
    with pytest.raises(ValueError, match="2 step states for 1 runs of trained tokens"):
        build_batch([_sample([0, 1, 1], ["a", "b"])], pad_id=0)
