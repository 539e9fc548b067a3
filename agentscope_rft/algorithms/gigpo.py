"""GiGPO: group-in-group advantages, an episode-level group plus step-level anchor-state groups.

Paper: Feng et al., "Group-in-Group Policy Optimization for LLM Agent Training" (2025),
https://arxiv.org/abs/2505.10978; reference implementation in verl-agent (`gigpo/core_gigpo.py`).
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field

from agentscope_rft.algorithms.advantages import _episode_token_rewards, _group_metrics
from agentscope_rft.algorithms.base import AdvantageInputs, AdvantageOutputs
from agentscope_rft.algorithms.episodes import (
    discounted_returns,
    episodes_of,
    group_stats,
    pack_trained_tokens,
    segment_reduce,
    turns_of,
)
from agentscope_rft.algorithms.spec import AdvantageConfigBase


class GiGPOConfig(AdvantageConfigBase):
    """GiGPO: GRPO's episode advantage plus a step advantage within anchor-state groups."""

    type: Literal["gigpo"] = "gigpo"
    step_weight: float = Field(default=1.0, ge=0.0)
    """Weight of the step advantage (the paper's omega; 0 gives GRPO)."""
    gamma: float = Field(default=0.95, ge=0.0, le=1.0)
    """Discount per turn of the step returns (the paper uses 0.95)."""
    normalize_std: bool = True
    """Divide both advantages by their group's std (verl-agent `mean_std_norm`); false subtracts
    the mean only (`mean_norm`)."""
    epsilon: float = Field(default=1e-6, gt=0.0)
    """Added to the std before dividing."""

    def uses_group_baseline(self) -> bool:
        return True


def gigpo_advantages(inputs: AdvantageInputs, cfg: GiGPOConfig) -> AdvantageOutputs:
    """GiGPO advantage of turn `k` of episode `e`: `A_E(e) + step_weight * A_S(e, k)`.

    `A_E` is GRPO over the group's episode scores (outcome + token rewards). `A_S` compares turns
    that acted in the same state: the turns of one group whose call recorded the same anchor
    state (`step_state_ids`, from `emit_state`) form a step group, and each gets
    `(G_k - mean_s) / (std_s + eps)` over its step group, where `G_k = r_k + gamma * G_{k+1}` is
    the turn's discounted return (turn rewards = its token rewards, plus the outcome on the
    episode's last turn). A turn without an anchor state, a step group of one and a constant step
    group get `A_S = 0` (verl-agent gives a group of one its raw return instead); with
    `normalize_std`, a constant episode group gets `A_E = 0`.

    Example:
        >>> out = gigpo_advantages(inputs, GiGPOConfig())  # doctest: +SKIP
    """
    ep = episodes_of(inputs)
    packed = pack_trained_tokens(ep.index, inputs.loss_mask)
    turns = turns_of(packed, _episode_token_rewards(inputs, ep.reward, packed))
    returns = discounted_returns(turns.rewards, cfg.gamma)[turns.episode, turns.pos]  # [num_turns]

    stats = group_stats(ep.score, ep.group, ep.num_groups)
    episode_adv = ep.score - stats.mean  # [E]
    if cfg.normalize_std:
        episode_adv = episode_adv / (stats.std + cfg.epsilon)
        episode_adv = torch.where(stats.zero_variance, torch.zeros_like(episode_adv), episode_adv)

    # The anchor state of a turn (equal on all its tokens); -1: none recorded.
    if inputs.step_state_ids is None:
        states = torch.full((packed.rows.numel(),), -1, dtype=torch.long)
    else:
        states = inputs.step_state_ids[packed.rows, packed.cols].long()  # [M]
    turn_state = segment_reduce(states, turns.turn, turns.num_turns, "amax")  # [num_turns]
    anchored = turn_state >= 0
    step_adv = returns.new_zeros(turns.num_turns)
    if bool(anchored.any()):
        keys = torch.stack([ep.group[turns.episode], turn_state], dim=1)[anchored]  # [A, 2]
        _, step_group = torch.unique(keys, dim=0, return_inverse=True)  # [A]
        num_step_groups = int(step_group.max()) + 1
        step_stats = group_stats(returns[anchored], step_group, num_step_groups)
        centered = returns[anchored] - step_stats.mean
        if cfg.normalize_std:
            centered = centered / (step_stats.std + cfg.epsilon)
        step_adv[anchored] = torch.where(
            step_stats.zero_variance, torch.zeros_like(centered), centered
        )
        sizes = torch.bincount(step_group, minlength=num_step_groups)
    else:
        sizes = torch.zeros(0, dtype=torch.long)

    turn_adv = episode_adv[turns.episode] + cfg.step_weight * step_adv  # [num_turns]
    advantages = inputs.loss_mask.new_zeros(inputs.loss_mask.shape, dtype=torch.float32)
    advantages[packed.rows, packed.cols] = turn_adv[turns.turn]
    return AdvantageOutputs(
        advantages=advantages,
        returns=None,
        metrics={
            **_group_metrics(stats.zero_variance, ep.group, ep.num_groups),
            "advantage/anchored_turns": float(anchored.float().mean()) if turns.num_turns else 0.0,
            "advantage/step_groups": float(sizes.numel()),
            "advantage/step_group_size": float(sizes.float().mean()) if sizes.numel() else 0.0,
        },
    )
