"""Random batches with padded masks and unequal groups, shared by the algorithm tests."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from agentscope_rft.algorithms import AdvantageInputs, AlgorithmConfig, LossInputs


def random_mask(num_rows: int, length: int, gen: torch.Generator, gaps: bool = True) -> Tensor:
    """[N, T] masks: a prompt (0s), a response (1s) with maybe a tool-result gap, then padding."""
    mask = torch.zeros(num_rows, length, dtype=torch.long)
    for i in range(num_rows):
        start = int(torch.randint(0, 4, (1,), generator=gen))
        end = int(torch.randint(start + 1, length + 1, (1,), generator=gen))
        mask[i, start:end] = 1
        if gaps and end - start >= 5:
            gap = int(torch.randint(start + 2, end - 2, (1,), generator=gen))
            mask[i, gap : gap + 2] = 0
    return mask


@dataclass
class RLBatch:
    rewards: Tensor  # [N]
    group_ids: Tensor  # [N]
    episode_ids: Tensor  # [N]
    loss_mask: Tensor  # [N, T]
    token_rewards: Tensor  # [N, T], on trained tokens
    values: Tensor  # [N, T]

    def advantage_inputs(
        self, token_rewards: bool = False, values: bool = False
    ) -> AdvantageInputs:
        return AdvantageInputs(
            rewards=self.rewards,
            group_ids=self.group_ids,
            episode_ids=self.episode_ids,
            loss_mask=self.loss_mask,
            token_rewards=self.token_rewards if token_rewards else None,
            values=self.values if values else None,
        )

    def verl_token_level_rewards(self, token_rewards: bool = False) -> Tensor:
        """verl's token_level_rewards: the outcome reward on the last response token."""
        out = self.token_rewards.clone() if token_rewards else torch.zeros_like(self.values)
        last = self.loss_mask.shape[1] - 1 - torch.argmax(self.loss_mask.flip(-1), dim=-1)
        out[torch.arange(out.shape[0]), last] += self.rewards
        return out


def random_rl_batch(
    seed: int, group_sizes: tuple[int, ...] = (2, 3, 4, 5), length: int = 14, binary: bool = False
) -> RLBatch:
    """One sample per episode, groups of unequal size, shuffled order, padded masks with gaps."""
    gen = torch.Generator().manual_seed(seed)
    group_ids = torch.cat([torch.full((n,), 10 + g) for g, n in enumerate(group_sizes)])
    num = group_ids.numel()
    perm = torch.randperm(num, generator=gen)
    group_ids = group_ids[perm]
    if binary:
        rewards = torch.randint(0, 2, (num,), generator=gen).float()
    else:
        rewards = torch.randn(num, generator=gen)
    mask = random_mask(num, length, gen)
    token_rewards = torch.randn(num, length, generator=gen) * 0.3 * mask
    return RLBatch(
        rewards=rewards,
        group_ids=group_ids,
        episode_ids=torch.arange(num) * 3 + 100,
        loss_mask=mask,
        token_rewards=token_rewards,
        values=torch.randn(num, length, generator=gen),
    )


def random_loss_inputs(
    seed: int,
    num_rows: int = 6,
    length: int = 10,
    cfg: AlgorithmConfig | None = None,
    scale: float = 0.3,
) -> LossInputs:
    """Random log-probs near each other (ratios around 1, some clipped), padded masks."""
    gen = torch.Generator().manual_seed(seed)
    mask = random_mask(num_rows, length, gen)
    old = -torch.rand(num_rows, length, generator=gen) * 3.0
    logprobs = (old + torch.randn(num_rows, length, generator=gen) * scale).requires_grad_(True)
    rollout = old + torch.randn(num_rows, length, generator=gen) * scale
    advantages = torch.randn(num_rows, length, generator=gen) * mask
    ref = old + torch.randn(num_rows, length, generator=gen) * scale
    entropy = torch.rand(num_rows, length, generator=gen) * 2.0
    return LossInputs(
        logprobs=logprobs,
        old_logprobs=old,
        rollout_logprobs=rollout,
        advantages=advantages,
        loss_mask=mask,
        global_num_tokens=float(mask.sum()),
        global_num_seqs=float((mask.sum(-1) > 0).sum()),
        ref_logprobs=ref,
        entropy=entropy,
    )
