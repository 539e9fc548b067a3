"""The per-rollout store of recorded model calls.

The gateway appends every attributed call; the explorer (same process) takes a rollout's calls when
its episode ends; other processes read them over HTTP (`GET /rollouts/{id}`). Only the most recent
`max_rollouts` rollouts are kept, so a long-running `serve` cannot grow without bound.
"""

from __future__ import annotations

import asyncio
import collections

from agentscope_rft.types import Call


class CallRecorder:
    """Recorded calls by rollout id (single event loop; no locking needed).

    Example:
        >>> recorder = CallRecorder()
        >>> recorder.calls("r1")
        []
    """

    def __init__(self, max_rollouts: int = 10_000) -> None:
        self._calls: collections.OrderedDict[str, list[Call]] = collections.OrderedDict()
        self._in_flight: collections.Counter[str] = collections.Counter()
        self._started: collections.OrderedDict[str, int] = collections.OrderedDict()
        self._idle: dict[str, asyncio.Event] = {}
        self._max = max_rollouts
        self.total_calls = 0

    def begin(self, rollout_id: str) -> None:
        """Mark a call of `rollout_id` as in flight (so `take` can wait for it)."""
        self._in_flight[rollout_id] += 1
        self._started[rollout_id] = self._started.get(rollout_id, 0) + 1
        self._started.move_to_end(rollout_id)
        while len(self._started) > self._max:
            self._started.popitem(last=False)
        self._idle.setdefault(rollout_id, asyncio.Event()).clear()

    def end(self, rollout_id: str, calls: list[Call]) -> None:
        """Record the finished calls of one request (possibly none, if it failed)."""
        if calls:
            self._calls.setdefault(rollout_id, []).extend(calls)
            self._calls.move_to_end(rollout_id)
            self.total_calls += len(calls)
            while len(self._calls) > self._max:
                self._calls.popitem(last=False)
        self._in_flight[rollout_id] -= 1
        if self._in_flight[rollout_id] <= 0:
            del self._in_flight[rollout_id]
            event = self._idle.pop(rollout_id, None)
            if event is not None:
                event.set()

    def started(self, rollout_id: str) -> int:
        """How many requests of `rollout_id` have begun (its calls' running numbers)."""
        return self._started.get(rollout_id, 0)

    def calls(self, rollout_id: str) -> list[Call]:
        return list(self._calls.get(rollout_id, []))

    def in_flight(self, rollout_id: str) -> int:
        return self._in_flight.get(rollout_id, 0)

    async def wait_idle(self, rollout_id: str, timeout: float) -> bool:
        """Wait up to `timeout` s until no call of `rollout_id` is in flight; False on timeout."""
        event = self._idle.get(rollout_id)
        if event is None or self._in_flight.get(rollout_id, 0) <= 0:
            return True
        try:
            await asyncio.wait_for(event.wait(), timeout)
        except TimeoutError:
            return False
        return True

    async def take(self, rollout_id: str, wait_timeout: float = 5.0) -> list[Call]:
        """Remove and return a rollout's calls, first waiting briefly for calls in flight.

        The explorer closes a rollout (`close_rollout`) before taking it, so nothing is in flight
        then; a caller that does not close may lose a call that is still running.
        """
        await self.wait_idle(rollout_id, wait_timeout)
        return self._calls.pop(rollout_id, [])

    def discard(self, rollout_id: str) -> None:
        self._calls.pop(rollout_id, None)

    @property
    def rollout_ids(self) -> list[str]:
        return list(self._calls)
