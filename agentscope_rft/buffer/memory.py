"""`MemoryBuffer`: an in-process FIFO of groups, the default for synchronous runs.

Nothing survives the process. Groups consumed by the last `retain_steps` training steps are kept so
that a failed step can be redone with `requeue_after`; older ones are forgotten to bound memory.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from agentscope_rft.buffer.base import (
    STATS_KEYS,
    BufferTimeout,
    check_get_args,
    group_samples,
    timeout_message,
)
from agentscope_rft.buffer.codec import encode_sample, sample_where
from agentscope_rft.buffer.replay import (
    ReplayCandidate,
    ReplayConfig,
    choose,
    mark_reuse,
    replay_count,
)
from agentscope_rft.types import Sample


@dataclass(slots=True)
class _Group:
    seq: int
    samples: list[Sample]
    min_policy_version: int
    state: str = "pending"
    """`pending`, `consumed` or `dropped`."""
    step: int | None = None
    """The step that consumed or dropped the group; `None` while pending."""
    replays: list[int] = field(default_factory=list)
    """The steps that replayed the group (buffer replay)."""


class MemoryBuffer:
    """An in-memory `Buffer`: groups in insertion order, handed out once each.

    Args:
        retain_steps: how many of the latest training steps' groups `requeue_after` can give back.
        replay: replay trained groups (see `agentscope_rft.buffer.replay`); None: each group once.

    Example:
        >>> buffer = MemoryBuffer()
        >>> await buffer.put(samples_of_one_group)  # doctest: +SKIP
        >>> batch = await buffer.get(1, step=1, timeout=10)  # doctest: +SKIP
    """

    def __init__(self, *, retain_steps: int = 2, replay: ReplayConfig | None = None) -> None:
        if retain_steps < 0:
            raise ValueError(f"retain_steps must be >= 0, got {retain_steps}")
        self._retain_steps = retain_steps
        self._replay = replay
        self._priority = replay.priority_fn() if replay is not None else None
        self._replayable: list[_Group] = []  # trained groups within the replay staleness bound
        self._pending: deque[_Group] = deque()
        self._taken: list[_Group] = []  # consumed or dropped and still retained, by seq
        self._forgotten_through_step: int | None = None
        self._next_seq = 0
        self._counts = dict.fromkeys(STATS_KEYS, 0)
        self._changed: asyncio.Condition | None = None
        self._closed = False

    def _condition(self) -> asyncio.Condition:
        if self._changed is None:
            self._changed = asyncio.Condition()
        return self._changed

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the memory buffer is closed")

    async def put(self, samples: Sequence[Sample]) -> None:
        """Store whole groups; validates every sample first, so a bad one stores nothing."""
        self._check_open()
        for index, sample in enumerate(samples):
            encode_sample(sample, sample_where(sample, index))
        if not samples:
            return
        async with self._condition():
            for members in group_samples(samples).values():
                version = min(s.policy_version for s in members)
                self._pending.append(_Group(self._next_seq, list(members), version))
                self._next_seq += 1
                self._count("pending", 1, len(members))
            self._condition().notify_all()

    async def get(
        self,
        num_groups: int,
        *,
        step: int,
        min_policy_version: int = 0,
        timeout: float | None = None,
    ) -> list[Sample]:
        """The samples of the `num_groups` oldest fresh groups; see `Buffer.get`."""
        check_get_args(num_groups, timeout)
        self._check_open()
        start = time.monotonic()
        deadline = None if timeout is None else start + timeout
        dropped = 0
        async with self._condition():
            while True:
                dropped += self._drop_stale(min_policy_version, step)
                if len(self._pending) >= num_groups:
                    return self._take(num_groups, step)
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise BufferTimeout(
                        timeout_message(
                            waited=time.monotonic() - start,
                            num_groups=num_groups,
                            min_policy_version=min_policy_version,
                            ready=len(self._pending),
                            dropped=dropped,
                            where="the memory buffer",
                        )
                    )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._condition().wait(), remaining)
                self._check_open()

    def _drop_stale(self, min_policy_version: int, step: int) -> int:
        stale = [g for g in self._pending if g.min_policy_version < min_policy_version]
        if not stale:
            return 0
        self._pending = deque(
            g for g in self._pending if g.min_policy_version >= min_policy_version
        )
        for group in stale:
            self._retire(group, step, "dropped")
        return len(stale)

    def _take(self, num_groups: int, step: int) -> list[Sample]:
        batch: list[Sample] = []
        fresh = []
        for _ in range(num_groups):
            group = self._pending.popleft()
            self._retire(group, step, "consumed")
            batch.extend(group.samples)
            fresh.append(group)
        if self._replay is not None:
            batch.extend(self._replayed(num_groups, step))
            self._replayable.extend(fresh)
        self._forget_old(step)
        return batch

    def _replayed(self, num_groups: int, step: int) -> list[Sample]:
        assert self._replay is not None and self._priority is not None
        oldest = step - self._replay.max_staleness
        self._replayable = [g for g in self._replayable if g.min_policy_version >= oldest]
        by_seq = {g.seq: g for g in self._replayable if g.step is not None and g.step < step}
        candidates = [
            ReplayCandidate(g.seq, tuple(s.reward for s in g.samples), g.min_policy_version,
                            len(g.replays))
            for g in by_seq.values()
        ]  # fmt: skip
        chosen = choose(
            candidates,
            replay_count(self._replay, num_groups),
            step=step,
            config=self._replay,
            priority=self._priority,
        )
        out: list[Sample] = []
        for candidate in chosen:
            group = by_seq[candidate.seq]
            group.replays.append(step)
            out.extend(mark_reuse(group.samples, len(group.replays)))
        return out

    def _retire(self, group: _Group, step: int, state: str) -> None:
        group.step = step
        group.state = state
        self._count("pending", -1, -len(group.samples))
        self._count(state, 1, len(group.samples))
        bisect.insort(self._taken, group, key=lambda g: g.seq)

    def _forget_old(self, latest_step: int) -> None:
        oldest_kept = latest_step - self._retain_steps + 1
        forgotten = [g for g in self._taken if g.step is not None and g.step < oldest_kept]
        if forgotten:
            self._taken = [g for g in self._taken if g.step is None or g.step >= oldest_kept]
            last = max(g.step for g in forgotten if g.step is not None)
            self._forgotten_through_step = max(last, self._forgotten_through_step or last)

    def _count(self, state: str, groups: int, samples: int) -> None:
        self._counts[f"{state}_groups"] += groups
        self._counts[f"{state}_samples"] += samples

    async def requeue_after(self, step: int) -> int:
        """Give back the groups consumed or dropped by steps after `step`, in original order.

        Raises:
            ValueError: some of those groups were already forgotten (older than `retain_steps`).
        """
        self._check_open()
        if self._forgotten_through_step is not None and self._forgotten_through_step > step:
            raise ValueError(
                f"requeue_after({step}): the memory buffer keeps the groups of the last "
                f"{self._retain_steps} steps only and has forgotten those of steps up to "
                f"{self._forgotten_through_step}; use buffer type 'sql' to resume runs"
            )
        async with self._condition():
            self._unreplay_after(step)
            back = [g for g in self._taken if g.step is not None and g.step > step]
            if not back:
                return 0
            self._taken = [g for g in self._taken if g.step is None or g.step <= step]
            for group in back:
                self._count(group.state, -1, -len(group.samples))
                self._count("pending", 1, len(group.samples))
                group.state, group.step = "pending", None
            merged = sorted([*self._pending, *back], key=lambda g: g.seq)
            self._pending = deque(merged)
            self._condition().notify_all()
            return sum(len(g.samples) for g in back)

    def _unreplay_after(self, step: int) -> None:
        """Undo the replays of steps after `step`; their groups are no longer replayable."""
        for group in self._replayable:
            group.replays = [s for s in group.replays if s <= step]
        self._replayable = [g for g in self._replayable if g.step is None or g.step <= step]

    async def abandon_after(self, step: int) -> int:
        """Drop for good the groups taken by steps after `step` (a rollback abandoned them) and
        undo those steps' replays; returns the samples dropped (those still retained: the
        replayable ones always are, so none is replayed)."""
        self._check_open()
        async with self._condition():
            self._unreplay_after(step)
            gone = [g for g in self._taken if g.step is not None and g.step > step]
            self._taken = [g for g in self._taken if g.step is None or g.step <= step]
            for group in gone:
                self._count(group.state, -1, -len(group.samples))
                self._count("dropped", 1, len(group.samples))
                group.state, group.step = "dropped", None
            return sum(len(g.samples) for g in gone)

    async def discard_pending(self) -> int:
        """Forget every pending group (a resumed run re-explores them); returns samples."""
        self._check_open()
        async with self._condition():
            gone = sum(len(g.samples) for g in self._pending)
            for group in self._pending:
                self._count("pending", -1, -len(group.samples))
            self._pending.clear()
            return gone

    async def stats(self) -> dict[str, float]:
        """Counts of groups and samples by state (`STATS_KEYS`)."""
        self._check_open()
        return {key: float(value) for key, value in self._counts.items()}

    async def close(self) -> None:
        """Drop everything; waiting `get`s raise `RuntimeError`."""
        self._closed = True
        self._pending.clear()
        self._taken.clear()
        self._replayable.clear()
        if self._changed is not None:
            async with self._changed:
                self._changed.notify_all()
