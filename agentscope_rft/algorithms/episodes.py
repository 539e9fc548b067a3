"""From samples to episodes: episode scores, group statistics, and packed token streams.

Outcome estimators (GRPO, RLOO, ...) work on one score per episode, so an episode split into
several samples is counted once. Token-level estimators (REINFORCE++, GAE, step-wise) work on each
episode's trained tokens packed into one row, in call order, so returns flow from a later call's
sample back into an earlier one's, exactly as if the episode had been one sequence.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from agentscope_rft.algorithms.base import AdvantageInputs, masked_sum


def segment_reduce(values: Tensor, index: Tensor, size: int, reduce: str) -> Tensor:
    """[size] `reduce` ("amax", "amin", "sum") of `values` [M] per segment `index` [M]."""
    return values.new_zeros(size).scatter_reduce(0, index, values, reduce, include_self=False)


@dataclass(frozen=True)
class Episodes:
    """The episodes of a batch of `N` samples: `E` episodes in `G` groups."""

    index: Tensor  # [N] long, episode of each sample in [0, E)
    group: Tensor  # [E] long, group of each episode in [0, G)
    reward: Tensor  # [E] outcome reward
    score: Tensor  # [E] outcome reward + the episode's token rewards (what outcome estimators use)
    num_groups: int


def episodes_of(inputs: AdvantageInputs) -> Episodes:
    """Collapse samples to episodes; checks that samples of an episode agree on reward and group."""
    _, index = torch.unique(inputs.episode_ids, return_inverse=True)  # [N]
    num_episodes = int(index.max()) + 1 if index.numel() else 0
    _, group_of_sample = torch.unique(inputs.group_ids, return_inverse=True)  # [N]
    num_groups = int(group_of_sample.max()) + 1 if group_of_sample.numel() else 0

    rewards = inputs.rewards.to(torch.float32)
    reward = segment_reduce(rewards, index, num_episodes, "amax")
    reward_min = segment_reduce(rewards, index, num_episodes, "amin")
    if not torch.allclose(reward, reward_min, atol=1e-6, rtol=0.0):
        raise ValueError("samples of one episode (same episode_ids) have different rewards")
    group = segment_reduce(group_of_sample, index, num_episodes, "amax")
    group_min = segment_reduce(group_of_sample, index, num_episodes, "amin")
    if not torch.equal(group, group_min):
        raise ValueError("samples of one episode (same episode_ids) have different group_ids")

    score = reward.clone()
    if inputs.token_rewards is not None:
        per_sample = masked_sum(inputs.token_rewards.to(torch.float32), inputs.loss_mask, dim=-1)
        score.index_add_(0, index, per_sample)
    return Episodes(index=index, group=group, reward=reward, score=score, num_groups=num_groups)


@dataclass(frozen=True)
class GroupStats:
    """Per-episode statistics of its group's episode scores."""

    mean: Tensor  # [E]
    std: Tensor  # [E] unbiased (as torch.std), 0 for a group of one
    size: Tensor  # [E] episodes in the group
    zero_variance: Tensor  # [E] bool: all scores in the group are equal (includes groups of one)


def group_stats(score: Tensor, group: Tensor, num_groups: int) -> GroupStats:
    """Mean, unbiased std and size of each episode's group, and whether the group is constant."""
    zeros = score.new_zeros(num_groups)
    size = torch.bincount(group, minlength=num_groups).to(score.dtype)  # [G]
    mean = zeros.clone().index_add_(0, group, score) / size
    dev2 = zeros.clone().index_add_(0, group, (score - mean[group]) ** 2)
    std = torch.sqrt(dev2 / (size - 1).clamp(min=1))
    high = segment_reduce(score, group, num_groups, "amax")
    low = segment_reduce(score, group, num_groups, "amin")
    constant = high == low
    return GroupStats(mean[group], std[group], size[group], constant[group])


@dataclass(frozen=True)
class PackedTokens:
    """Where each trained token of a batch goes when episodes are packed into rows.

    Trained token `m` of the batch (in episode, then batch, then position order) sits at
    `[rows[m], cols[m]]` in the batch and at `[episode[m], pos[m]]` in the packed `[E, L]` tensor.
    """

    rows: Tensor  # [M] sample row
    cols: Tensor  # [M] position in the sample
    episode: Tensor  # [M] episode index
    pos: Tensor  # [M] position in the episode's packed row
    lengths: Tensor  # [E] trained tokens per episode
    num_episodes: int
    length: int  # L = max trained tokens of an episode

    def pack(self, values: Tensor) -> Tensor:
        """[N, T] -> [E, L], zero-padded at the end of each row."""
        out = values.new_zeros(self.num_episodes, self.length)
        out[self.episode, self.pos] = values[self.rows, self.cols]
        return out

    def unpack(self, packed: Tensor, like: Tensor) -> Tensor:
        """[E, L] -> [N, T] shaped like `like`, zero on untrained tokens."""
        out = torch.zeros_like(like, dtype=packed.dtype)
        out[self.rows, self.cols] = packed[self.episode, self.pos]
        return out


def pack_trained_tokens(episode_index: Tensor, loss_mask: Tensor) -> PackedTokens:
    """Pack each episode's trained tokens into one row, in call (batch) order."""
    num_episodes = int(episode_index.max()) + 1 if episode_index.numel() else 0
    order = torch.argsort(
        episode_index, stable=True
    )  # samples grouped by episode, batch order kept
    sorted_rows, cols = loss_mask[order].bool().nonzero(as_tuple=True)  # row-major: call order
    rows = order[sorted_rows]  # [M]
    episode = episode_index[rows]  # [M], non-decreasing
    lengths = torch.bincount(episode, minlength=num_episodes)  # [E]
    starts = torch.cumsum(lengths, 0) - lengths
    pos = torch.arange(rows.numel(), device=rows.device) - starts[episode]
    length = int(lengths.max()) if lengths.numel() else 0
    return PackedTokens(rows, cols, episode, pos, lengths, num_episodes, length)


def discounted_returns(rewards: Tensor, gamma: float) -> Tensor:
    """[E, L] reward-to-go `G_t = r_t + gamma * G_{t+1}` along each row (zero-padded at the end)."""
    returns = torch.zeros_like(rewards)
    running = rewards.new_zeros(rewards.shape[0])
    for t in reversed(range(rewards.shape[1])):
        running = rewards[:, t] + gamma * running
        returns[:, t] = running
    return returns


@dataclass(frozen=True)
class Turns:
    """The turns (model calls) of packed episodes: a turn is a run of consecutive trained tokens
    of one sample. `M` trained tokens, `K` = most turns of an episode."""

    turn: Tensor  # [M] global turn id of each packed trained token
    episode: Tensor  # [num_turns] episode of each turn
    pos: Tensor  # [num_turns] index of the turn within its episode
    per_episode: Tensor  # [E] turns per episode
    rewards: Tensor  # [E, K] summed token rewards of each turn (0 after an episode's last turn)
    num_turns: int


def turns_of(packed: PackedTokens, token_rewards: Tensor) -> Turns:
    """Split packed episodes into turns and sum `token_rewards` [E, L] per turn."""
    flat_rewards = token_rewards[packed.episode, packed.pos]  # [M]
    # A turn starts at an episode's first trained token or after a gap in the sample's positions.
    new_turn = torch.ones_like(packed.rows, dtype=torch.bool)
    new_turn[1:] = (
        (packed.episode[1:] != packed.episode[:-1])
        | (packed.rows[1:] != packed.rows[:-1])
        | (packed.cols[1:] != packed.cols[:-1] + 1)
    )
    turn = torch.cumsum(new_turn.long(), 0) - 1  # [M]
    num_turns = int(turn.max()) + 1 if turn.numel() else 0
    turn_episode = segment_reduce(packed.episode, turn, num_turns, "amax")
    turn_reward = flat_rewards.new_zeros(num_turns).index_add_(0, turn, flat_rewards)
    per_episode = torch.bincount(turn_episode, minlength=packed.num_episodes)  # [E]
    turn_start = torch.cumsum(per_episode, 0) - per_episode
    turn_pos = torch.arange(num_turns, device=turn.device) - turn_start[turn_episode]
    by_turn = turn_reward.new_zeros(packed.num_episodes, int(per_episode.max()) if num_turns else 0)
    by_turn[turn_episode, turn_pos] = turn_reward
    return Turns(turn, turn_episode, turn_pos, per_episode, by_turn, num_turns)
