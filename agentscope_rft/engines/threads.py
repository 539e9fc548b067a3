"""How many CPU threads each forward of the embedded engine computes with, chosen by measuring.

The engine computes in a thread of the process that also runs the event loop (agents, gateway).
Two things make "all cores" the wrong fixed choice there:

- Every OpenMP region started from a thread other than the process's main thread costs tens of
  microseconds more than from the main thread (libgomp; measured on 2 cores: a 1-row linear
  layer takes 118 us with 2 threads vs 91 us with 1, while the main thread does it in 54 us). A
  decode step of a few rows is hundreds of such regions, so it gets slower with more threads.
- When the event loop or another process takes a core, every barrier of a multi-threaded op
  waits for it.

A large forward (a prefill of hundreds of tokens, a decode step of dozens of rows) still gains
from every core. So `ThreadPolicy` keeps, per forward size (tokens in the forward, in powers of
two), a moving average of the seconds a forward takes with `low` threads and with `high`
threads, uses the faster, and retries the other every `retry_every` forwards of that size, so
it follows the machine's load.

Example:
    >>> policy = ThreadPolicy(low=1, high=2)
    >>> threads = policy.choose(tokens=48)
    >>> policy.record(48, threads, seconds=0.09)
"""

from __future__ import annotations

from dataclasses import dataclass, field

_SMOOTHING = 0.3  # weight of the newest time in the moving average


@dataclass
class _Bucket:
    seconds: dict[int, float] = field(default_factory=dict)  # threads -> moving average
    count: int = 0


class ThreadPolicy:
    """Picks `low` or `high` threads per forward size by measured time (see the module doc).

    With `low == high` it always answers that number.
    """

    def __init__(self, low: int, high: int, retry_every: int = 16) -> None:
        if not 1 <= low <= high:
            raise ValueError(f"need 1 <= low <= high threads, got low={low}, high={high}")
        self.low, self.high = low, high
        self.retry_every = retry_every
        self._buckets: dict[int, _Bucket] = {}

    @property
    def fixed(self) -> bool:
        return self.low == self.high

    def choose(self, tokens: int) -> int:
        """Threads for a forward over `tokens` tokens (prefill) or rows (decode)."""
        if self.fixed:
            return self.low
        bucket = self._buckets.setdefault(max(tokens, 1).bit_length(), _Bucket())
        bucket.count += 1
        for threads in (self.low, self.high):  # measure both first
            if threads not in bucket.seconds:
                return threads
        best = min(bucket.seconds, key=bucket.seconds.__getitem__)
        if bucket.count % self.retry_every == 0:
            return self.high if best == self.low else self.low
        return best

    def record(self, tokens: int, threads: int, seconds: float) -> None:
        """The forward over `tokens` with `threads` threads took `seconds`."""
        if self.fixed:
            return
        bucket = self._buckets.setdefault(max(tokens, 1).bit_length(), _Bucket())
        old = bucket.seconds.get(threads)
        bucket.seconds[threads] = (
            seconds if old is None else (1 - _SMOOTHING) * old + _SMOOTHING * seconds
        )

    def summary(self) -> dict[str, float]:
        """Per size bucket, the threads it currently picks (for engine metrics)."""
        out = {}
        for key in sorted(self._buckets):
            seconds = self._buckets[key].seconds
            if len(seconds) == 2:
                lo = 1 << (key - 1)
                out[f"threads/tokens_{lo}_{2 * lo - 1}"] = float(
                    min(seconds, key=seconds.__getitem__)
                )
        return out
