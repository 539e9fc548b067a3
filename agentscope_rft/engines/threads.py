"""How many CPU threads each forward of the embedded engine computes with, chosen by measuring.

The engine computes in a thread of the process that also runs the event loop (agents, gateway).
All cores is not always the faster choice there: when the event loop or another process takes a
core, every barrier of a multi-threaded op waits for it, and a decode step of a few rows is
hundreds of small ops. A large forward (a prefill of hundreds of tokens, a decode step of dozens
of rows) gains from every core.

So `ThreadPolicy` measures, per forward size (tokens in the forward, in powers of two), which of
`low` and `high` threads is faster, and uses that one. Times within a size class drift as the
context grows, so it compares the two counts in pairs: now and then (`retry_every` forwards) it
runs the other count and compares that forward with the forward just before it, and keeps a
moving average of the log of that ratio. A retry that loses doubles the wait before the next
(up to `max_retry_every`): each costs a forward at the slower count, hundreds of milliseconds for
a prefill on one thread. A forward much slower than the ones before it (a core was taken) brings
the next retry forward.

The module's second half keeps the engine thread's OpenMP team the only one in the process (see
"one OpenMP team" below): without that, small ops on 2 threads are slower than on 1.

Example:
    >>> policy = ThreadPolicy(low=1, high=2)
    >>> threads = policy.choose(tokens=48)
    >>> policy.record(48, threads, seconds=0.09)
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ParamSpec, TypeVar

import torch

logger = logging.getLogger(__name__)

_P = ParamSpec("_P")
_T = TypeVar("_T")

_SMOOTHING = 0.5  # weight of the newest paired comparison in the moving average
_JUMP = 1.5  # a forward this much slower than the one before of its size: retry next


@dataclass
class _Bucket:
    retry_every: int  # forwards between retries of the slower count
    next_retry: int
    count: int = 0
    last: dict[int, float] = field(default_factory=dict)  # threads -> latest seconds
    previous: tuple[int, float] | None = None  # the latest forward at the best count: size, s
    log_ratio: float = 0.0  # moving average of log(seconds with low / seconds with high)


class ThreadPolicy:
    """Picks `low` or `high` threads per forward size by paired measurements (see the module
    doc). With `low == high` it always answers that number."""

    def __init__(
        self, low: int, high: int, retry_every: int = 16, max_retry_every: int = 512
    ) -> None:
        if not 1 <= low <= high:
            raise ValueError(f"need 1 <= low <= high threads, got low={low}, high={high}")
        self.low, self.high = low, high
        self.retry_every, self.max_retry_every = retry_every, max(retry_every, max_retry_every)
        self._buckets: dict[int, _Bucket] = {}

    @property
    def fixed(self) -> bool:
        return self.low == self.high

    def _bucket(self, tokens: int) -> _Bucket:
        key = max(tokens, 1).bit_length()
        if key not in self._buckets:
            self._buckets[key] = _Bucket(self.retry_every, next_retry=self.retry_every)
        return self._buckets[key]

    def _best(self, bucket: _Bucket) -> int:
        return self.high if bucket.log_ratio > 0 else self.low

    def choose(self, tokens: int) -> int:
        """Threads for a forward over `tokens` tokens (prefill) or rows (decode)."""
        if self.fixed:
            return self.low
        bucket = self._bucket(tokens)
        bucket.count += 1
        for threads in (self.low, self.high):  # measure both first, one after the other
            if threads not in bucket.last:
                return threads
        best = self._best(bucket)
        if bucket.count >= bucket.next_retry:
            bucket.next_retry = bucket.count + bucket.retry_every
            return self.high if best == self.low else self.low
        return best

    def record(self, tokens: int, threads: int, seconds: float) -> None:
        """The forward over `tokens` with `threads` threads took `seconds`."""
        if self.fixed:
            return
        bucket = self._bucket(tokens)
        other = self.high if threads == self.low else self.low
        first_pair = len(bucket.last) == 1 and other in bucket.last
        if first_pair or (len(bucket.last) == 2 and threads != self._best(bucket)):
            # A retry (or the first measurement of the second count): against the forward
            # just before it, of about the same size and context.
            pair = {threads: seconds, other: bucket.last[other]}
            ratio = math.log(max(pair[self.low], 1e-9) / max(pair[self.high], 1e-9))
            if first_pair:
                bucket.log_ratio = ratio
            else:
                lost = (ratio > 0) == (bucket.log_ratio > 0)
                bucket.log_ratio = (1 - _SMOOTHING) * bucket.log_ratio + _SMOOTHING * ratio
                bucket.retry_every = (
                    min(2 * bucket.retry_every, self.max_retry_every) if lost else self.retry_every
                )
                bucket.next_retry = bucket.count + bucket.retry_every
            bucket.previous = None
        elif len(bucket.last) == 2:  # the best count: a sudden slowdown may be a taken core
            previous = bucket.previous
            if previous is not None and previous[0] == tokens and seconds > _JUMP * previous[1]:
                bucket.next_retry = min(bucket.next_retry, bucket.count + 1)
            bucket.previous = (tokens, seconds)
        bucket.last[threads] = seconds

    def summary(self) -> dict[str, float]:
        """Per size bucket, the threads it currently picks (for engine metrics)."""
        out = {}
        for key in sorted(self._buckets):
            bucket = self._buckets[key]
            if len(bucket.last) == 2:
                lo = 1 << (key - 1)
                out[f"threads/tokens_{lo}_{2 * lo - 1}"] = float(self._best(bucket))
        return out


class ForwardRunner:
    """Runs the engine thread's forwards with the threads a `ThreadPolicy` picks, and tells the
    policy how long each took (no policy: torch's setting stays). Thread counts set here hold
    for the calling thread only.

    Example:
        >>> run = ForwardRunner(policy=None)  # a ThreadPolicy: its pick, timed
        >>> run(3, lambda: 1 + 2)
        3
    """

    def __init__(self, policy: ThreadPolicy | None) -> None:
        self.policy = policy
        self._threads_now = 0

    def __call__(self, tokens: int, forward: Callable[[], _T]) -> _T:
        """`forward()` (over `tokens` tokens or rows), timed for the policy."""
        policy = self.policy
        if policy is None:
            return forward()
        threads = policy.choose(tokens)
        if threads != self._threads_now:
            torch.set_num_threads(threads)
            self._threads_now = threads
        start = time.perf_counter()
        out = forward()
        policy.record(tokens, threads, time.perf_counter() - start)
        return out


# ---------------------------------------------------------------------------- one OpenMP team
# libgomp spins a finished team's threads for a while so that the next region starts at once,
# but only while the process's OpenMP threads are no more than its CPUs; past that every region
# wakes its threads from sleep. Each thread that ever ran a multi-threaded torch op keeps a team
# until it ends (the main thread's, and a pool thread's, never end). So a second team anywhere
# in the process slows every small op of the engine's decode step: measured on 2 cores, a 1-row
# linear layer takes 53 us with 2 threads while the engine's team is the only one, 107-117 us
# with one more (and 84 us with 1 thread). The two functions below keep the engine's team the
# only one that lasts: other torch work runs single-threaded or in a thread that ends with it.


def confine_main_thread() -> None:
    """Make the process's main thread compute torch ops single-threaded from now on (a team it
    starts would never end, see above). A no-op in any other thread."""
    if threading.current_thread() is threading.main_thread() and torch.get_num_threads() > 1:
        torch.set_num_threads(1)
        logger.info(
            "torch ops in the main thread now run single-threaded: the embedded engine's "
            "OpenMP team stays the only one in the process (engines/threads.py)"
        )


async def in_own_thread(fn: Callable[_P, _T], /, *args: _P.args, **kwargs: _P.kwargs) -> _T:
    """`asyncio.to_thread` in a new thread that ends when `fn` returns, and its OpenMP team
    with it (a pool thread's would last, see above). For torch work beside the engine: training
    steps, weight copies, loading and saving checkpoints.

    Like `asyncio.to_thread`, cancelling the await does not stop `fn`.
    """
    loop = asyncio.get_running_loop()
    done: asyncio.Future[_T] = loop.create_future()
    context = contextvars.copy_context()

    def settle(result: _T | None, error: BaseException | None) -> None:
        if done.cancelled():
            return
        if error is not None:
            done.set_exception(error)
        else:
            done.set_result(result)  # type: ignore[arg-type]

    def work() -> None:
        result, error = None, None
        try:
            result = context.run(fn, *args, **kwargs)
        except BaseException as exc:  # handed to the awaiting task, like to_thread does
            error = exc
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody waits
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=work, name=f"torch-{getattr(fn, '__name__', 'work')}").start()
    return await done
