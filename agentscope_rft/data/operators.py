"""Experience operators: filters and transforms applied to finished groups before the buffer.

The unit is an `Episode` (one rollout: its samples, final response text and reward) inside a
`Group` (the episodes of one task explored together: the advantage group). An operator takes a
list of groups and returns the list to keep, with episodes dropped or their reward changed; the
`Pipeline` runs the operators in order and counts, per operator, the episodes (and samples) it
dropped and the episodes whose reward it changed. Offline data runs through the same operators,
each sample (or DPO pair) as a one-episode group.

Built in: `reward_range`, `length`, `status`, `format`, `dedup` (MinHash near-duplicates), the
LLM judges in `agentscope_rft.data.judges`, and `custom` functions by import path.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import math
import numbers
import re
import struct
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from agentscope_rft.types import JSON, Sample


@dataclass(frozen=True, slots=True)
class Episode:
    """One rollout as operators see it."""

    rollout_id: str
    samples: tuple[Sample, ...]
    response: str
    """The episode's final response text (its last model call's content)."""
    reward: float
    status: str = "ok"
    """`ok` or `truncated` (failed episodes have no samples and never reach operators)."""

    @property
    def num_tokens(self) -> int:
        """Policy-sampled (trained) tokens over all its samples."""
        return sum(sum(s.loss_mask) for s in self.samples)

    def with_reward(self, reward: float) -> Episode:
        """The episode with `reward` on each of its samples (outcome reward)."""
        samples = tuple(dataclasses.replace(s, reward=reward) for s in self.samples)
        return dataclasses.replace(self, samples=samples, reward=reward)


@dataclass(frozen=True, slots=True)
class Group:
    """The episodes of one task explored together (they share an advantage baseline)."""

    group_id: str
    task: JSON
    episodes: tuple[Episode, ...]

    @property
    def samples(self) -> list[Sample]:
        return [s for e in self.episodes for s in e.samples]

    def keep(self, episodes: Sequence[Episode]) -> Group:
        return dataclasses.replace(self, episodes=tuple(episodes))


class Operator(Protocol):
    """Transforms a batch of groups; `name` keys its metrics.

    Example:
        >>> class DropEmpty:
        ...     name = "drop_empty"
        ...     async def __call__(self, groups):
        ...         return [g.keep([e for e in g.episodes if e.response]) for g in groups]
    """

    name: str

    async def __call__(self, groups: list[Group]) -> list[Group]: ...


class EpisodeFilter:
    """An operator that keeps the episodes for which `keep(group, episode)` is true."""

    def __init__(self, name: str, keep: Callable[[Group, Episode], bool]) -> None:
        self.name = name
        self._keep = keep

    async def __call__(self, groups: list[Group]) -> list[Group]:
        return [g.keep([e for e in g.episodes if self._keep(g, e)]) for g in groups]


def reward_range(low: float | None, high: float | None) -> EpisodeFilter:
    """Keep episodes with `low <= reward <= high` (None: unbounded)."""
    return EpisodeFilter(
        "reward_range",
        lambda _, e: (low is None or e.reward >= low) and (high is None or e.reward <= high),
    )


def length(min_tokens: int, max_tokens: int | None) -> EpisodeFilter:
    """Keep episodes whose sampled tokens are within [min_tokens, max_tokens]."""
    return EpisodeFilter(
        "length",
        lambda _, e: (
            e.num_tokens >= min_tokens and (max_tokens is None or e.num_tokens <= max_tokens)
        ),
    )


def status(drop: Sequence[str], stop_reasons: Sequence[str]) -> EpisodeFilter:
    """Drop episodes with a status in `drop` or a sample stopped for one of `stop_reasons`."""
    statuses, reasons = set(drop), set(stop_reasons)
    return EpisodeFilter(
        "status",
        lambda _, e: (
            e.status not in statuses and not any(s.stop_reason in reasons for s in e.samples)
        ),
    )


class FormatCheck:
    """Episodes whose response does not contain `pattern`: dropped, or given `reward`."""

    def __init__(self, pattern: str, action: str, reward: float) -> None:
        try:
            self.pattern = re.compile(pattern, re.DOTALL)
        except re.error as exc:
            raise ValueError(f"format operator: invalid pattern {pattern!r}: {exc}") from exc
        self.name = "format"
        self.action = action
        self.reward = reward

    async def __call__(self, groups: list[Group]) -> list[Group]:
        out = []
        for group in groups:
            kept = []
            for episode in group.episodes:
                if self.pattern.search(episode.response):
                    kept.append(episode)
                elif self.action == "reward":
                    kept.append(episode.with_reward(self.reward))
            out.append(group.keep(kept))
        return out


_MERSENNE = (1 << 61) - 1


class MinHashDedup:
    """Drops episodes whose response is a near-duplicate of an earlier kept one.

    Responses become sets of word n-grams (lower-cased); two sets are duplicates when their
    Jaccard similarity reaches `threshold`, estimated by `num_perm` MinHash values (hash
    functions (a*x + b) mod 2^61-1 over a blake2b hash of the shingle, with a and b from a fixed
    seed, so results are the same in every process and run). Texts shorter than `ngram` words
    are one shingle. Order decides which copy stays: the first.

    Example:
        >>> dedup = MinHashDedup(threshold=0.8)
        >>> dedup.similarity("the cat sat on the mat", "the cat sat on the mat")
        1.0
    """

    def __init__(
        self, *, threshold: float = 0.9, ngram: int = 3, num_perm: int = 128, scope: str = "group"
    ) -> None:
        self.name = "dedup"
        self.threshold = threshold
        self.ngram = ngram
        self.scope = scope
        seed = hashlib.blake2b(b"agentscope-rft-minhash", digest_size=64).digest()
        params = []
        for i in range(num_perm):
            block = hashlib.blake2b(seed + struct.pack("<I", i), digest_size=16).digest()
            a, b = struct.unpack("<QQ", block)
            params.append((a % (_MERSENNE - 1) + 1, b % _MERSENNE))
        self._params = params

    def shingles(self, text: str) -> set[int]:
        words = text.lower().split()
        grams = (
            [" ".join(words[i : i + self.ngram]) for i in range(len(words) - self.ngram + 1)]
            if len(words) >= self.ngram
            else [" ".join(words)]
        )
        return {
            int.from_bytes(hashlib.blake2b(g.encode(), digest_size=8).digest(), "little")
            for g in grams
        }

    def signature(self, text: str) -> tuple[int, ...]:
        hashes = self.shingles(text)
        return tuple(min((a * h + b) % _MERSENNE for h in hashes) for a, b in self._params)

    def similarity(self, first: str, second: str) -> float:
        """Estimated Jaccard similarity of two texts' n-gram sets."""
        one, two = self.signature(first), self.signature(second)
        return sum(x == y for x, y in zip(one, two, strict=True)) / len(one)

    def _is_duplicate(self, signature: tuple[int, ...], kept: list[tuple[int, ...]]) -> bool:
        need = self.threshold * len(signature)
        return any(sum(x == y for x, y in zip(signature, k, strict=True)) >= need for k in kept)

    async def __call__(self, groups: list[Group]) -> list[Group]:
        kept_batch: list[tuple[int, ...]] = []
        out = []
        for group in groups:
            kept_group: list[tuple[int, ...]] = []
            seen = kept_batch if self.scope == "batch" else kept_group
            kept = []
            for episode in group.episodes:
                signature = self.signature(episode.response)
                if self._is_duplicate(signature, seen):
                    continue
                seen.append(signature)
                kept.append(episode)
            out.append(group.keep(kept))
        return out


class CustomOperator:
    """A user function `fn(groups, args) -> groups` (sync or async) as an operator."""

    def __init__(self, fn: Callable[..., Any], args: Mapping[str, Any], name: str) -> None:
        self.name = name
        self._fn = fn
        self._args = dict(args)

    async def __call__(self, groups: list[Group]) -> list[Group]:
        result = self._fn(groups, self._args)
        if inspect.isawaitable(result):
            result = await result
        if not isinstance(result, list) or not all(isinstance(g, Group) for g in result):
            raise TypeError(
                f"custom operator {self.name!r} must return a list of Group, got "
                f"{type(result).__name__}"
            )
        for group in result:
            for episode in group.episodes:
                rewards = [episode.reward, *(s.reward for s in episode.samples)]
                if not all(_finite_number(r) for r in rewards):
                    raise ValueError(
                        f"custom operator {self.name!r} gave episode {episode.rollout_id!r} of "
                        f"group {group.group_id!r} the reward {episode.reward!r} (samples: "
                        f"{[s.reward for s in episode.samples]!r:.80}); rewards must be finite "
                        "numbers (set them with Episode.with_reward)"
                    )
        return result


def _finite_number(value: object) -> bool:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return False
    return math.isfinite(float(value))


@dataclass
class OperatorCounts:
    """What one operator did over a batch."""

    episodes_dropped: int = 0
    samples_dropped: int = 0
    groups_dropped: int = 0
    changed: int = 0
    """Episodes kept whose reward the operator changed."""
    extra: dict[str, float] = field(default_factory=dict)
    """The operator's own counters (a judge's calls, failures, seconds)."""


class Pipeline:
    """Runs operators in order over a batch of groups and counts what each dropped or changed.

    Example:
        >>> pipeline = Pipeline([reward_range(0.0, 1.0)])
        >>> kept, metrics = await pipeline(groups)  # doctest: +SKIP
        >>> metrics["data/reward_range/episodes_dropped"]  # doctest: +SKIP
        2.0
    """

    def __init__(self, operators: Sequence[Operator]) -> None:
        self.operators = list(operators)
        names: dict[str, int] = {}
        self.names: list[str] = []
        for op in self.operators:
            count = names.get(op.name, 0)
            names[op.name] = count + 1
            self.names.append(op.name if count == 0 else f"{op.name}{count + 1}")

    def __bool__(self) -> bool:
        return bool(self.operators)

    async def __call__(self, groups: list[Group]) -> tuple[list[Group], dict[str, float]]:
        metrics: dict[str, float] = {}
        for name, op in zip(self.names, self.operators, strict=True):
            before = {e.rollout_id: e for g in groups for e in g.episodes}
            group_ids = {g.group_id for g in groups if g.episodes}
            started = time.perf_counter()
            groups = [g for g in await op(groups) if g.episodes]
            wall = time.perf_counter() - started
            counts = OperatorCounts()
            after = {e.rollout_id: e for g in groups for e in g.episodes}
            for rollout_id, episode in before.items():
                kept = after.get(rollout_id)
                if kept is None:
                    counts.episodes_dropped += 1
                    counts.samples_dropped += len(episode.samples)
                elif kept.reward != episode.reward:
                    counts.changed += 1
            counts.groups_dropped = len(group_ids - {g.group_id for g in groups})
            take = getattr(op, "take_counters", None)
            if take is not None:
                counts.extra = take()
            metrics.update(_counts_metrics(name, counts))
            metrics[f"data/{name}/wall_seconds"] = wall
        return groups, metrics


def _counts_metrics(name: str, counts: OperatorCounts) -> dict[str, float]:
    out = {
        f"data/{name}/episodes_dropped": float(counts.episodes_dropped),
        f"data/{name}/samples_dropped": float(counts.samples_dropped),
        f"data/{name}/groups_dropped": float(counts.groups_dropped),
        f"data/{name}/changed": float(counts.changed),
    }
    out.update({f"data/{name}/{k}": float(v) for k, v in counts.extra.items()})
    return out
