"""The per-rollout store of recorded model calls, bounded in count, age and memory.

The gateway appends every attributed call; the explorer (same process) takes a rollout's calls when
its episode ends; other processes read them over HTTP (`GET /rollouts/{id}`). In a training run the
store holds only the episodes running now. In a long-lived `serve` nobody may ever take a rollout,
so the store evicts: rollouts idle longer than `max_age` seconds, then the least recently active
ones while there are more than `max_rollouts` or their calls take more than `max_bytes`. Only
idle rollouts (no call in flight) are evicted; evictions are counted by reason.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable

from agentscope_rft.types import Call

logger = logging.getLogger(__name__)

EVICTION_REASONS = ("age", "count", "bytes")


def call_bytes(call: Call) -> int:
    """An estimate of the memory one recorded call holds (Python objects, not serialized).

    Token ids and log-probs are lists of Python ints and floats (~36 and ~32 bytes each with the
    list slot); messages and tools are dicts of strings (~2 bytes a character plus ~400 bytes per
    message). `benchmarks/recorder_memory.py` checks the estimate against resident memory.
    """
    chars = 0
    for message in call.messages:
        content = message.get("content")
        if isinstance(content, str):
            chars += len(content)
        elif isinstance(content, list):
            chars += sum(
                len(str(part.get("text", ""))) for part in content if isinstance(part, dict)
            )
        chars += sum(len(str(tc)) for tc in message.get("tool_calls") or [])
    tools = sum(len(str(tool)) for tool in call.tools or [])
    tokens = len(call.prompt_ids) + len(call.completion_ids)
    text = chars + tools + len(call.content or "")
    return 36 * tokens + 32 * len(call.logprobs) + 2 * text + 400 * len(call.messages)


class CallRecorder:
    """Recorded calls by rollout id (single event loop; no locking needed).

    Args:
        max_rollouts: Most rollouts kept.
        max_age: Seconds a rollout may stay idle (no new call) before it is evicted.
        max_bytes: Most memory (by `call_bytes`) the kept calls may take.
        clock: Time source (tests).

    Example:
        >>> recorder = CallRecorder(max_rollouts=1000, max_age=600, max_bytes=2**28)
        >>> recorder.calls("r1")
        []
    """

    def __init__(
        self,
        max_rollouts: int = 10_000,
        max_age: float = 3600.0,
        max_bytes: int = 1 << 30,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_rollouts < 1 or max_age <= 0 or max_bytes < 1:
            raise ValueError("max_rollouts, max_age and max_bytes must be positive")
        self._calls: dict[str, list[Call]] = {}
        self._bytes: dict[str, int] = {}
        # Rollouts by last activity, least recent first (calls or in-flight requests).
        self._active: collections.OrderedDict[str, float] = collections.OrderedDict()
        self._in_flight: collections.Counter[str] = collections.Counter()
        self._started: collections.OrderedDict[str, int] = collections.OrderedDict()
        self._idle: dict[str, asyncio.Event] = {}
        self._overflows: collections.OrderedDict[str, str] = collections.OrderedDict()
        self._max, self._max_age, self._max_bytes = max_rollouts, max_age, max_bytes
        self._clock = clock
        self.total_calls = 0
        self.held_bytes = 0
        self.evictions: collections.Counter[str] = collections.Counter()
        """Rollouts evicted, by reason (`age`, `count`, `bytes`)."""
        self.evicted_calls = 0
        self.on_evict: Callable[[str, list[Call], str], None] | None = None
        """Called with an evicted rollout's calls and the reason (`serve --record` writes them
        as an episode instead of dropping them)."""

    def _touch(self, rollout_id: str) -> None:
        self._active[rollout_id] = self._clock()
        self._active.move_to_end(rollout_id)

    def begin(self, rollout_id: str) -> None:
        """Mark a call of `rollout_id` as in flight (so `take` can wait for it)."""
        self._in_flight[rollout_id] += 1
        self._started[rollout_id] = self._started.get(rollout_id, 0) + 1
        self._started.move_to_end(rollout_id)
        while len(self._started) > self._max:  # call numbers outlive `take` (seeds stay unique)
            self._started.popitem(last=False)
        self._touch(rollout_id)
        self._idle.setdefault(rollout_id, asyncio.Event()).clear()
        self._evict()

    def end(self, rollout_id: str, calls: list[Call]) -> None:
        """Record the finished calls of one request (possibly none, if it failed)."""
        if calls:
            self._calls.setdefault(rollout_id, []).extend(calls)
            size = sum(call_bytes(c) for c in calls)
            self._bytes[rollout_id] = self._bytes.get(rollout_id, 0) + size
            self.held_bytes += size
            self.total_calls += len(calls)
        self._touch(rollout_id)
        self._in_flight[rollout_id] -= 1
        if self._in_flight[rollout_id] <= 0:
            del self._in_flight[rollout_id]
            event = self._idle.pop(rollout_id, None)
            if event is not None:
                event.set()
        self._evict()

    def _over(self, now: float, oldest: str) -> str | None:
        if now - self._active[oldest] > self._max_age:
            return "age"
        if len(self._active) > self._max:
            return "count"
        if self.held_bytes > self._max_bytes:
            return "bytes"
        return None

    def _evict(self) -> None:
        now = self._clock()
        for rollout_id in list(self._active):  # least recently active first
            reason = self._over(now, rollout_id)
            if reason is None:
                return
            if rollout_id in self._in_flight:
                continue  # never under a running request; it is bounded by concurrency
            calls = self._drop_calls(rollout_id)
            del self._active[rollout_id]
            if not calls:
                continue  # nothing recorded (taken already, or its requests failed)
            if self.on_evict is not None:
                try:
                    self.on_evict(rollout_id, calls, reason)
                except Exception:  # the request path must not fail for it
                    logger.exception("gateway recorder: on_evict failed for %s", rollout_id)
            if not self.evictions and self.on_evict is None:
                logger.warning(
                    "gateway recorder: evicting rollout %s (%s limit); calls of rollouts nobody "
                    "takes are dropped after max_age=%gs, or beyond %d rollouts / %d MiB",
                    rollout_id, reason, self._max_age, self._max, self._max_bytes >> 20,
                )  # fmt: skip
            self.evictions[reason] += 1
            self.evicted_calls += len(calls)

    def sweep(self) -> None:
        """Evict what is over the bounds now (idle rollouts age out without new traffic)."""
        self._evict()

    def _drop_calls(self, rollout_id: str) -> list[Call]:
        self.held_bytes -= self._bytes.pop(rollout_id, 0)
        return self._calls.pop(rollout_id, [])

    def restart_call_numbers(self) -> None:
        """Number every rollout's calls from 0 again (a run rolled back to a checkpoint replays
        its rollout ids with the seeds a run resumed there would use)."""
        self._started.clear()

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
        calls = self._drop_calls(rollout_id)
        if rollout_id not in self._in_flight:
            self._active.pop(rollout_id, None)
        return calls

    def discard(self, rollout_id: str) -> None:
        self._drop_calls(rollout_id)
        if rollout_id not in self._in_flight:
            self._active.pop(rollout_id, None)
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

    def stats(self) -> dict[str, float]:
        """Gauges and counters for monitoring (`/metrics`)."""
        return {
            "recorder_rollouts": float(len(self._active)),
            "recorder_calls": float(sum(len(c) for c in self._calls.values())),
            "recorder_bytes": float(self.held_bytes),
            "recorder_evicted_calls": float(self.evicted_calls),
            **{f"recorder_evictions_{r}": float(self.evictions[r]) for r in EVICTION_REASONS},
        }
