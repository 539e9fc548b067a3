"""Training samples as padded tensors, and their split into micro-batches.

Layout convention (shared with the algorithm library): position t of every [N, T] tensor belongs
to token t; a log-prob at t scores token t given tokens < t, so position 0 is never trained.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from agentscope_rft.algorithms import encode_sample_kinds
from agentscope_rft.types import Sample


class EmptyBatchError(ValueError):
    """A batch with nothing to train on (rather than silently stepping on nothing)."""


@dataclass(frozen=True)
class TrainBatch:
    """A whole training batch, right-padded to its longest sample."""

    samples: list[Sample]
    input_ids: Tensor  # [N, T]
    attention_mask: Tensor  # [N, T]
    loss_mask: Tensor  # [N, T]
    rollout_logprobs: Tensor  # [N, T]
    token_rewards: Tensor  # [N, T]
    step_state_ids: Tensor  # [N, T] long: anchor state of each trained token's call, -1 = none
    rewards: Tensor  # [N]
    group_ids: Tensor  # [N] advantage groups: (sample group, agent)
    episode_ids: Tensor  # [N] trajectories: (rollout, agent), as each agent is grouped apart
    temperature: Tensor  # [N]
    lengths: Tensor  # [N]
    sample_kinds: Tensor  # [N]
    pair_index: Tensor  # [N]
    is_chosen: Tensor  # [N] bool

    @property
    def num_tokens(self) -> int:
        return int(self.lengths.sum())

    def select(self, rows: Sequence[int] | Tensor) -> TrainBatch:
        """The given rows, trimmed to their own longest sample."""
        index = torch.as_tensor(rows, dtype=torch.long)
        width = int(self.lengths[index].max()) if len(index) else 0
        values: dict[str, Any] = {}
        for name in TrainBatch.__dataclass_fields__:
            value = getattr(self, name)
            if name == "samples":
                values[name] = [value[i] for i in index.tolist()]
            elif value.dim() == 2:
                values[name] = value[index, :width]
            else:
                values[name] = value[index]
        return TrainBatch(**values)


def _ids(keys: Sequence[object]) -> Tensor:
    table: dict[object, int] = {}
    return torch.tensor([table.setdefault(k, len(table)) for k in keys], dtype=torch.long)


def trained_runs(loss_mask: Sequence[int]) -> list[tuple[int, int]]:
    """(start, end) of each run of trained tokens: one per call of a merged sample."""
    runs: list[tuple[int, int]] = []
    start = None
    for t, m in enumerate([*loss_mask, 0]):
        if m and start is None:
            start = t
        elif not m and start is not None:
            runs.append((start, t))
            start = None
    return runs


def _fill_step_states(samples: Sequence[Sample], out: Tensor) -> None:
    """Write each sample's per-call anchor states into `out` [N, T] as ids (shared table)."""
    table: dict[str, int] = {}
    for i, s in enumerate(samples):
        if s.step_states is None:
            continue
        runs = trained_runs(s.loss_mask)
        if len(runs) != len(s.step_states):
            raise ValueError(
                f"sample {s.sample_id}: {len(s.step_states)} step states for {len(runs)} runs of "
                "trained tokens; each call's completion must be one run"
            )
        for (start, end), key in zip(runs, s.step_states, strict=True):
            if key:
                out[i, start:end] = table.setdefault(key, len(table))


def build_batch(
    samples: Sequence[Sample], pad_id: int, max_length: int | None = None
) -> TrainBatch:
    """Pad samples into a `TrainBatch`.

    Raises:
        EmptyBatchError: no samples, or no sample has a trained token.
        ValueError: a sample longer than `max_length`, or one that trains its first token.

    Example:
        >>> batch = build_batch(samples, pad_id=2)  # doctest: +SKIP
    """
    if not samples:
        raise EmptyBatchError("the training batch has no samples")
    if all(s.num_trained_tokens == 0 for s in samples):
        raise EmptyBatchError(
            f"none of the {len(samples)} samples has a trained token (all loss masks are 0)"
        )
    for s in samples:
        if s.loss_mask and s.loss_mask[0]:
            raise ValueError(
                f"sample {s.sample_id}: its first token cannot be trained (no context)"
            )
        if max_length is not None and len(s.token_ids) > max_length:
            raise ValueError(
                f"sample {s.sample_id} has {len(s.token_ids)} tokens, more than "
                f"trainer.max_seq_len={max_length}"
            )
    n, width = len(samples), max(len(s.token_ids) for s in samples)
    ids = torch.full((n, width), pad_id, dtype=torch.long)
    attention = torch.zeros(n, width, dtype=torch.long)
    mask = torch.zeros(n, width, dtype=torch.long)
    logprobs = torch.zeros(n, width)
    token_rewards = torch.zeros(n, width)
    step_states = torch.full((n, width), -1, dtype=torch.long)
    _fill_step_states(samples, step_states)
    for i, s in enumerate(samples):
        k = len(s.token_ids)
        ids[i, :k] = torch.tensor(list(s.token_ids))
        attention[i, :k] = 1
        mask[i, :k] = torch.tensor(list(s.loss_mask))
        logprobs[i, :k] = torch.tensor(list(s.logprobs), dtype=torch.float32)
        if s.token_rewards is not None:
            token_rewards[i, :k] = torch.tensor(list(s.token_rewards), dtype=torch.float32)
    pairs = _ids([s.pair_id or f"row-{i}" for i, s in enumerate(samples)])
    return TrainBatch(
        samples=list(samples),
        input_ids=ids,
        attention_mask=attention,
        loss_mask=mask,
        rollout_logprobs=logprobs,
        token_rewards=token_rewards,
        step_state_ids=step_states,
        rewards=torch.tensor([s.reward for s in samples], dtype=torch.float32),
        group_ids=_ids([(s.group, s.agent_name) for s in samples]),
        episode_ids=_ids([(s.rollout_id, s.agent_name) for s in samples]),
        temperature=torch.tensor([s.temperature or 1.0 for s in samples], dtype=torch.float32),
        lengths=attention.sum(dim=1),
        sample_kinds=encode_sample_kinds([s.kind for s in samples]),
        pair_index=pairs,
        is_chosen=torch.tensor([s.kind == "dpo_chosen" for s in samples]),
    )


GROUP_PREFIX_MINIMUM = 32
"""Tokens past the batch's shared prefix that rows must share to be a prefix family."""


def micro_batches(
    batch: TrainBatch, token_budget: int, skip: int = 0, *, families: bool = False
) -> list[list[int]]:
    """Rows grouped so each micro-batch's padded size (rows x longest) stays within the budget.

    Longest samples first, so padding is small; both samples of a DPO pair stay together; a
    sample longer than the budget gets a micro-batch of its own. `skip` leading tokens (a prefix
    computed once for all rows) do not count against the budget. With `families`, rows that share
    a prompt past those (`prefix_families`: a GRPO group's task) are packed among themselves, so
    each micro-batch can run that prompt once (`group_prefix_length`).

    Example:
        >>> micro_batches(batch, token_budget=4096)  # doctest: +SKIP
        [[3, 0], [1, 2, 4]]
    """
    units: dict[int, list[int]] = {}
    for row, pair in enumerate(batch.pair_index.tolist()):
        units.setdefault(pair, []).append(row)
    if not families:
        return _pack(list(units.values()), batch.lengths - skip, token_budget)
    out: list[list[int]] = []
    for family in prefix_families(batch, list(units.values()), skip):
        rows = [row for unit in family for row in unit]
        shared = group_prefix_length(batch.select(rows), skip)
        # a pass runs the family's prompt once and each row's tokens after it
        out.extend(_pack(family, batch.lengths - skip - shared, max(token_budget - shared, 1)))
    return out


def prefix_families(
    batch: TrainBatch, units: list[list[int]], skip: int, minimum: int = GROUP_PREFIX_MINIMUM
) -> list[list[list[int]]]:
    """`units` (rows packed together: one sample, or a DPO pair) grouped by the `minimum` tokens
    after the first `skip` that all their rows share (and may run once: before any row's first
    trained token and last token); units that share them with no other unit are one more group.

    Example:
        >>> prefix_families(batch, [[0], [1], [2]], skip=0)  # doctest: +SKIP
        [[[0], [2]], [[1]]]
    """
    trained = batch.loss_mask.bool()
    first_trained = torch.where(trained.any(1), trained.int().argmax(1), batch.lengths)
    limit = torch.minimum(batch.lengths, first_trained) - 1
    groups: dict[tuple[int, ...], list[list[int]]] = {}
    rest: list[list[int]] = []
    for unit in units:
        keys = {tuple(batch.input_ids[row, skip : skip + minimum].tolist()) for row in unit}
        if len(keys) == 1 and all(int(limit[row]) >= skip + minimum for row in unit):
            groups.setdefault(keys.pop(), []).append(unit)
        else:
            rest.append(unit)
    out = []
    for family in groups.values():
        if len(family) == 1 and len(family[0]) == 1:
            rest.extend(family)
        else:
            out.append(family)
    return out + ([sorted(rest)] if rest else [])


def group_prefix_length(batch: TrainBatch, skip: int, minimum: int = GROUP_PREFIX_MINIMUM) -> int:
    """Tokens after the first `skip` that every row of `batch` (a micro-batch) shares and that
    can run once for all of them (0 if fewer than `minimum`; see `shared_prefix_length`)."""
    total = shared_prefix_length(batch, minimum=skip + minimum)
    return total - skip if total else 0


def _pack(units: list[list[int]], lengths: Tensor, token_budget: int) -> list[list[int]]:
    """Units packed longest first into micro-batches of at most `token_budget` padded tokens."""
    ordered = sorted(units, key=lambda u: -int(lengths[u].max()))
    out: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for unit in ordered:
        unit_len = int(lengths[unit].max())
        new_longest = max(longest, unit_len)
        if current and new_longest * (len(current) + len(unit)) > token_budget:
            out.append(current)
            current, new_longest = [], unit_len
        current = current + unit
        longest = new_longest
    if current:
        out.append(current)
    return out


def shared_prefix_length(batch: TrainBatch, minimum: int = 32) -> int:
    """Leading tokens that every row shares and that a prefix pass can compute once (0 if fewer
    than `minimum`).

    The prefix ends before the hidden state that predicts any row's first trained token, and
    before any row's last token, so every loss position stays in the per-row suffix.

    Example:
        >>> shared_prefix_length(batch)  # doctest: +SKIP
        412
    """
    ids, lengths = batch.input_ids, batch.lengths
    if len(ids) < 2:
        return 0
    trained = batch.loss_mask.bool()
    first_trained = torch.where(trained.any(1), trained.int().argmax(1), lengths)
    limit = min(int(lengths.min()) - 1, int(first_trained.min()) - 1)
    if limit < minimum:
        return 0
    differs = (ids[:, :limit] != ids[:1, :limit]).any(0).nonzero()
    length = int(differs[0]) if len(differs) else limit
    return length if length >= minimum else 0
