"""The per-rollout store of recorded model calls.

The gateway appends every attributed call; the explorer (same process) takes a rollout's calls when
its episode ends; other processes read them over HTTP (`GET /rollouts/{id}`). Only the most recent
`max_rollouts` rollouts are kept, so a long-running `serve` cannot grow without bound.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib

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
        self._overflows: collections.OrderedDict[str, str] = collections.OrderedDict()
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

    async def take(self, rollout_id: str, wait_timeout: float = 5.0) -> list[Call]:
        """Remove and return a rollout's calls, first waiting briefly for calls in flight.

        An episode can end while a request it abandoned is still generating (e.g. its task was
        cancelled on timeout); waiting a little lets that call land in the right rollout.
        """
        event = self._idle.get(rollout_id)
        if event is not None and self._in_flight.get(rollout_id, 0) > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), wait_timeout)
        return self._calls.pop(rollout_id, [])

    def discard(self, rollout_id: str) -> None:
        self._calls.pop(rollout_id, None)
        self._overflows.pop(rollout_id, None)

    def note_overflow(self, rollout_id: str, message: str) -> None:
        """Remember that a request of `rollout_id` did not fit the context window."""
        self._overflows[rollout_id] = message
        self._overflows.move_to_end(rollout_id)
        while len(self._overflows) > self._max:
            self._overflows.popitem(last=False)

    def pop_overflow(self, rollout_id: str) -> str | None:
        """The context-window error of `rollout_id`, if one of its requests hit it (then forgotten).

        Example:
            >>> recorder = CallRecorder()
            >>> recorder.note_overflow("r1", "the conversation is 9000 tokens")
            >>> recorder.pop_overflow("r1"), recorder.pop_overflow("r1")
            ('the conversation is 9000 tokens', None)
        """
        return self._overflows.pop(rollout_id, None)

    @property
    def rollout_ids(self) -> list[str]:
        return list(self._calls)
