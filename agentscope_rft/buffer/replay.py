"""Prioritized replay: groups trained once may be trained again, chosen by a priority.

After a `get` takes its fresh groups, a buffer with replay adds up to `round(ratio * num_groups)`
groups that earlier steps trained, the highest-priority first, among those that

- were generated at most `max_staleness` policy versions before the step (the run's policy
  version at step s is s, so a group explored by version v qualifies while s - v <= max_staleness),
- were replayed fewer than `max_reuse` times, and
- have a positive priority.

Priorities are pure functions of a `ReplayCandidate` (like the algorithms): `advantage` (mean
absolute deviation of the group's rewards from their mean: a group whose rewards are all equal
teaches nothing under a group baseline and is never replayed), `recency` (newer policy versions
first) or a user's function by import path. Ties go to the newer group. Reuse counts live with the
groups (a table of the SQL buffer), so they survive resume, and a resumed run forgets the replays
of the steps it redoes. Replayed samples carry `metrics["replay/reuse"]` (which reuse this is);
`replay_metrics` turns a batch into the step's `replay/*` metrics.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from pydantic import Field

from agentscope_rft.config_base import Section
from agentscope_rft.types import Sample

REUSE_KEY = "replay/reuse"


@dataclass(frozen=True, slots=True)
class ReplayCandidate:
    """A trained group that may be replayed."""

    seq: int
    """Insertion order in the buffer (larger: newer)."""
    rewards: tuple[float, ...]
    """The rewards of its samples."""
    policy_version: int
    """The oldest policy version among its samples."""
    reuse_count: int
    """Times it was replayed so far (its first training not counted)."""


PriorityFn = Callable[[ReplayCandidate], float]


def advantage_priority(candidate: ReplayCandidate) -> float:
    """Mean |r - mean(r)| over the group: the size of its (unnormalised) GRPO advantages.

    Example:
        >>> advantage_priority(ReplayCandidate(0, (1.0, 0.0, 0.0, 1.0), 3, 0))
        0.5
    """
    rewards = candidate.rewards
    if not rewards:
        return 0.0
    mean = sum(rewards) / len(rewards)
    return sum(abs(r - mean) for r in rewards) / len(rewards)


def recency_priority(candidate: ReplayCandidate) -> float:
    """Newer policy versions first (version + 1, so every group is positive)."""
    return float(candidate.policy_version + 1)


PRIORITIES: dict[str, PriorityFn] = {
    "advantage": advantage_priority,
    "recency": recency_priority,
}


class ReplayConfig(Section):
    """Prioritized replay of trained groups (see docs/buffer.md)."""

    ratio: float = Field(default=0.5, gt=0, le=8)
    """Replayed groups added to each batch, as a share of its fresh groups (rounded)."""
    max_reuse: int = Field(default=1, ge=1)
    """Most times one group is replayed (its first training not counted)."""
    max_staleness: int = Field(default=2, ge=0)
    """Oldest policy a replayed group may come from, in versions before the training step."""
    priority: Literal["advantage", "recency"] | str = "advantage"
    """`advantage`, `recency`, or a function `pkg.mod:fn(candidate: ReplayCandidate) -> float`."""

    def priority_fn(self) -> PriorityFn:
        """The priority function; a custom one is imported here."""
        if self.priority in PRIORITIES:
            return PRIORITIES[self.priority]
        from agentscope_rft.api import load_callable

        fn = load_callable(self.priority, "buffer.replay.priority")
        if not callable(fn):
            raise ValueError(f"buffer.replay.priority {self.priority!r} is not callable")
        return fn


def replay_count(config: ReplayConfig, num_groups: int) -> int:
    """Replayed groups wanted beside `num_groups` fresh ones.

    Example:
        >>> replay_count(ReplayConfig(ratio=0.5), 4), replay_count(ReplayConfig(ratio=0.5), 1)
        (2, 1)
    """
    return max(0, math.floor(config.ratio * num_groups + 0.5))


def choose(
    candidates: Sequence[ReplayCandidate],
    count: int,
    *,
    step: int,
    config: ReplayConfig,
    priority: PriorityFn,
) -> list[ReplayCandidate]:
    """The `count` groups to replay at `step`: eligible, highest priority, newer on ties.

    Example:
        >>> cands = [ReplayCandidate(0, (1.0, 0.0), 0, 0), ReplayCandidate(1, (1.0, 1.0), 1, 0)]
        >>> [c.seq for c in choose(cands, 2, step=1, config=ReplayConfig(),
        ...                        priority=advantage_priority)]
        [0]
    """
    oldest = step - config.max_staleness
    scored = []
    for candidate in candidates:
        if candidate.reuse_count >= config.max_reuse or candidate.policy_version < oldest:
            continue
        value = float(priority(candidate))
        if value > 0 and math.isfinite(value):
            scored.append((value, candidate.seq, candidate))
    scored.sort(key=lambda item: (-item[0], -item[1]))
    return [candidate for _, _, candidate in scored[:count]]


def mark_reuse(samples: Sequence[Sample], reuse: int) -> list[Sample]:
    """The samples marked as their `reuse`-th replay."""
    return [dataclasses.replace(s, metrics={**s.metrics, REUSE_KEY: float(reuse)}) for s in samples]


def replay_metrics(samples: Sequence[Sample]) -> dict[str, float]:
    """`replay/samples` and `replay/share` of a training batch, `replay/max_reuse` seen.

    Example:
        >>> replay_metrics([])
        {}
    """
    reused = [s.metrics[REUSE_KEY] for s in samples if REUSE_KEY in s.metrics]
    if not reused:
        return {}
    return {
        "replay/samples": float(len(reused)),
        "replay/share": len(reused) / len(samples),
        "replay/max_reuse": max(reused),
    }
