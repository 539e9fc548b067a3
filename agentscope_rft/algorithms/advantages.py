"""Advantage estimators: one pure function and one config class each.

Each estimator is `fn(inputs: AdvantageInputs, cfg: ItsConfig) -> AdvantageOutputs`. Outcome
estimators score an episode by its outcome reward plus its token rewards (per-step rewards, KL
penalties); token-level estimators place the outcome reward on the episode's last trained token
and discount along the episode's trained tokens. A group whose episodes all scored the same (a
group of one included) gets advantage 0 from the group-baseline estimators.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field
from torch import Tensor

from agentscope_rft.algorithms.base import AdvantageInputs, AdvantageOutputs, masked_whiten
from agentscope_rft.algorithms.episodes import (
    PackedTokens,
    discounted_returns,
    episodes_of,
    group_stats,
    pack_trained_tokens,
    segment_reduce,
    turns_of,
)
from agentscope_rft.algorithms.spec import AdvantageConfigBase


def zero_variance_groups(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """[N] bool: True for samples whose group's rewards are all equal (groups of one included).

    Such groups give zero advantage under a group baseline; the trainer drops and counts them.
    Pass each sample's episode score (outcome + summed token rewards) when per-step rewards are on.

    Example:
        >>> zero_variance_groups(torch.tensor([1.0, 1.0, 0.0, 1.0]), torch.tensor([0, 0, 1, 1]))
        tensor([ True,  True, False, False])
    """
    _, group = torch.unique(group_ids, return_inverse=True)  # [N]
    num_groups = int(group.max()) + 1 if group.numel() else 0
    rewards = rewards.to(torch.float32)
    high = segment_reduce(rewards, group, num_groups, "amax")
    low = segment_reduce(rewards, group, num_groups, "amin")
    return (high == low)[group]


def _broadcast(episode_adv: Tensor, index: Tensor, loss_mask: Tensor) -> Tensor:
    """[E] episode advantages -> [N, T] on trained tokens."""
    return episode_adv[index].unsqueeze(-1) * loss_mask.to(episode_adv.dtype)


def _group_metrics(zero_variance: Tensor, group: Tensor, num_groups: int) -> dict[str, float]:
    flat = torch.zeros(num_groups, dtype=torch.bool, device=group.device)
    flat[group] = zero_variance
    return {
        "advantage/num_groups": float(num_groups),
        "advantage/zero_variance_groups": float(flat.sum()),
    }


class GRPOConfig(AdvantageConfigBase):
    """GRPO: the group-normalized outcome advantage."""

    type: Literal["grpo"] = "grpo"
    normalize_std: bool = True
    """Divide by the group's reward std (GRPO); false subtracts only the mean (Dr. GRPO)."""
    epsilon: float = Field(default=1e-6, gt=0.0)
    """Added to the std before dividing (verl: 1e-6; TRL: 1e-4)."""

    def uses_group_baseline(self) -> bool:
        return True


def grpo_advantages(inputs: AdvantageInputs, cfg: GRPOConfig) -> AdvantageOutputs:
    """GRPO advantage `(s_e - mean_g) / (std_g + eps)` of episode `e` in group `g`.

    Papers: DeepSeekMath (GRPO), https://arxiv.org/abs/2402.03300; Dr. GRPO (no std division),
    https://arxiv.org/abs/2503.20783. The std is unbiased, as in verl and TRL.
    """
    ep = episodes_of(inputs)
    stats = group_stats(ep.score, ep.group, ep.num_groups)
    centered = ep.score - stats.mean  # [E]
    adv = centered / (stats.std + cfg.epsilon) if cfg.normalize_std else centered
    adv = torch.where(stats.zero_variance, torch.zeros_like(adv), adv)
    return AdvantageOutputs(
        advantages=_broadcast(adv, ep.index, inputs.loss_mask),
        returns=None,
        metrics=_group_metrics(stats.zero_variance, ep.group, ep.num_groups),
    )


class RLOOConfig(AdvantageConfigBase):
    """RLOO: leave-one-out group baseline."""

    type: Literal["rloo"] = "rloo"

    def uses_group_baseline(self) -> bool:
        return True


def rloo_advantages(inputs: AdvantageInputs, cfg: RLOOConfig) -> AdvantageOutputs:
    """RLOO advantage `s_e - mean of the other episodes of its group = n/(n-1) (s_e - mean_g)`.

    Paper: Back to Basics: Revisiting REINFORCE-Style Optimization,
    https://arxiv.org/abs/2402.14740.
    """
    ep = episodes_of(inputs)
    stats = group_stats(ep.score, ep.group, ep.num_groups)
    n = stats.size
    adv = (ep.score - stats.mean) * n / (n - 1).clamp(min=1)
    adv = torch.where(stats.zero_variance, torch.zeros_like(adv), adv)
    return AdvantageOutputs(
        advantages=_broadcast(adv, ep.index, inputs.loss_mask),
        returns=None,
        metrics=_group_metrics(stats.zero_variance, ep.group, ep.num_groups),
    )


class ReinforcePlusPlusBaselineConfig(AdvantageConfigBase):
    """REINFORCE++-baseline: group-mean baseline, then whitening over the batch's tokens."""

    type: Literal["reinforce_plus_plus_baseline"] = "reinforce_plus_plus_baseline"

    def uses_group_baseline(self) -> bool:
        return True


def reinforce_plus_plus_baseline_advantages(
    inputs: AdvantageInputs, cfg: ReinforcePlusPlusBaselineConfig
) -> AdvantageOutputs:
    """REINFORCE++-baseline: `s_e - mean_g` on every token, whitened over all trained tokens.

    Paper: REINFORCE++, https://arxiv.org/abs/2501.03262. The whitening statistics are
    token-weighted, as in verl.
    """
    ep = episodes_of(inputs)
    stats = group_stats(ep.score, ep.group, ep.num_groups)
    centered = torch.where(stats.zero_variance, torch.zeros_like(ep.score), ep.score - stats.mean)
    mask = inputs.loss_mask.to(torch.float32)
    token_adv = _broadcast(centered, ep.index, mask)  # [N, T]
    return AdvantageOutputs(
        advantages=masked_whiten(token_adv, mask) * mask,
        returns=None,
        metrics=_group_metrics(stats.zero_variance, ep.group, ep.num_groups),
    )


def _episode_token_rewards(
    inputs: AdvantageInputs, outcome: Tensor, packed: PackedTokens
) -> Tensor:
    """[E, L] per-token rewards of each packed episode: its token rewards, plus the outcome reward
    on its last trained token."""
    if inputs.token_rewards is not None:
        rewards = packed.pack(inputs.token_rewards.to(torch.float32))
    else:
        rewards = outcome.new_zeros(packed.num_episodes, packed.length)
    with_tokens = (packed.lengths > 0).nonzero(as_tuple=True)[0]
    rewards[with_tokens, packed.lengths[with_tokens] - 1] += outcome[with_tokens]
    return rewards


class ReinforcePlusPlusConfig(AdvantageConfigBase):
    """REINFORCE++: discounted token returns, whitened over the batch (no critic, no group)."""

    type: Literal["reinforce_plus_plus"] = "reinforce_plus_plus"
    gamma: float = Field(default=1.0, ge=0.0, le=1.0)
    """Discount per trained token."""


def reinforce_plus_plus_advantages(
    inputs: AdvantageInputs, cfg: ReinforcePlusPlusConfig
) -> AdvantageOutputs:
    """REINFORCE++: `G_t = r_t + gamma * G_{t+1}` over each episode's trained tokens, whitened.

    Paper: REINFORCE++, https://arxiv.org/abs/2501.03262.
    """
    ep = episodes_of(inputs)
    packed = pack_trained_tokens(ep.index, inputs.loss_mask)
    rewards = _episode_token_rewards(inputs, ep.reward, packed)
    returns = packed.unpack(discounted_returns(rewards, cfg.gamma), inputs.loss_mask)  # [N, T]
    mask = inputs.loss_mask.to(torch.float32)
    return AdvantageOutputs(
        advantages=masked_whiten(returns, mask) * mask, returns=None, metrics={}
    )


class GAEConfig(AdvantageConfigBase):
    """PPO's generalized advantage estimation with a critic."""

    type: Literal["gae"] = "gae"
    gamma: float = Field(default=1.0, ge=0.0, le=1.0)
    """Discount per trained token."""
    lam: float = Field(default=1.0, ge=0.0, le=1.0)
    """GAE lambda: 1 is Monte-Carlo returns minus values, 0 is the one-step TD error."""
    whiten: bool = True
    """Whiten advantages over the batch's trained tokens (returns stay unwhitened)."""

    def uses_critic(self) -> bool:
        return True


def gae_advantages(inputs: AdvantageInputs, cfg: GAEConfig) -> AdvantageOutputs:
    """GAE: `A_t = delta_t + gamma*lam*A_{t+1}`, `delta_t = r_t + gamma*V_{t+1} - V_t`, along
    each episode's trained tokens (tool results and prompts are skipped, as in verl); returns
    `A_t + V_t` are the critic targets.

    Paper: High-Dimensional Continuous Control Using GAE, https://arxiv.org/abs/1506.02438.
    """
    if inputs.values is None:
        raise ValueError("advantage 'gae' needs critic values (AdvantageInputs.values)")
    ep = episodes_of(inputs)
    packed = pack_trained_tokens(ep.index, inputs.loss_mask)
    rewards = _episode_token_rewards(inputs, ep.reward, packed)  # [E, L]
    values = packed.pack(inputs.values.detach().to(torch.float32))  # [E, L], 0 after the end
    next_values = torch.cat([values[:, 1:], values.new_zeros(values.shape[0], 1)], dim=1)
    deltas = rewards + cfg.gamma * next_values - values
    adv_packed = discounted_returns(deltas, cfg.gamma * cfg.lam)
    advantages = packed.unpack(adv_packed, inputs.loss_mask)
    returns = packed.unpack(adv_packed + values, inputs.loss_mask)
    mask = inputs.loss_mask.to(torch.float32)
    if cfg.whiten:
        advantages = masked_whiten(advantages, mask) * mask
    return AdvantageOutputs(advantages=advantages, returns=returns, metrics={})


class StepwiseConfig(AdvantageConfigBase):
    """Turn-level discounted returns for multi-turn episodes, normalized within the group."""

    type: Literal["stepwise"] = "stepwise"
    gamma: float = Field(default=1.0, ge=0.0, le=1.0)
    """Discount per turn (model call), not per token."""
    normalize_std: bool = True
    """Divide by the std of the group's episode returns (false: subtract the mean only)."""
    epsilon: float = Field(default=1e-6, gt=0.0)
    """Added to the std before dividing."""

    def uses_group_baseline(self) -> bool:
        return True


def stepwise_advantages(inputs: AdvantageInputs, cfg: StepwiseConfig) -> AdvantageOutputs:
    """Turn-level advantages: each turn k (a run of trained tokens, i.e. one model call) gets
    `(G_k - mean_g) / (std_g + eps)` with `G_k = r_k + gamma * G_{k+1}` over the episode's turns,
    `r_k` the turn's token rewards (+ the outcome reward on the last turn), and mean/std over the
    group's episode returns `G_0`. With gamma=1 and outcome rewards only it equals GRPO. A
    constant group gets 0 with std normalization; without it, differences between its turns stay.

    Related: multi-turn credit assignment with per-turn rewards, e.g. "Reinforcing Multi-Turn
    Reasoning in LLM Agents via Turn-Level Credit Assignment", https://arxiv.org/abs/2505.11821.
    """
    ep = episodes_of(inputs)
    packed = pack_trained_tokens(ep.index, inputs.loss_mask)
    token_rewards = _episode_token_rewards(inputs, ep.reward, packed)  # [E, L]
    turns = turns_of(packed, token_rewards)
    turn_returns = discounted_returns(turns.rewards, cfg.gamma)  # [E, K]
    turn_episode, turn_pos, turn = turns.episode, turns.pos, turns.turn
    turns_per_episode = turns.per_episode
    num_turns = turns.num_turns

    num_episodes = ep.reward.numel()
    episode_return = turn_returns[:, 0] if num_turns else ep.reward.new_zeros(num_episodes)
    stats = group_stats(episode_return, ep.group, ep.num_groups)
    centered = turn_returns - stats.mean.unsqueeze(-1)
    adv = centered / (stats.std + cfg.epsilon).unsqueeze(-1) if cfg.normalize_std else centered
    if cfg.normalize_std:
        adv = torch.where(stats.zero_variance.unsqueeze(-1), torch.zeros_like(adv), adv)
    token_adv = adv[turn_episode, turn_pos][turn]  # [M]
    advantages = inputs.loss_mask.new_zeros(inputs.loss_mask.shape, dtype=torch.float32)
    advantages[packed.rows, packed.cols] = token_adv
    return AdvantageOutputs(
        advantages=advantages,
        returns=None,
        metrics={
            **_group_metrics(stats.zero_variance, ep.group, ep.num_groups),
            "advantage/turns_per_episode": float(turns_per_episode.float().mean()),
        },
    )
