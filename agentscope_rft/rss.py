"""Where a run's memory peaks: the process's resident memory sampled per phase of a step.

`ru_maxrss` (what `/usr/bin/time -v` reports) is one number for the whole process; it does not
say whether exploring, the trainer's step, the weight sync or validation set it. `PhasePeaks`
samples the resident set size (RSS) in a daemon thread and hands out the peak since the last
read, so the training loop can log `memory/<phase>_peak_gib` for each phase of a step and
`memory/rss_gib` after it (in metrics.jsonl, beside the step's other metrics). In a
synchronous run the phases follow each other; in the overlapping modes (one-step-off, async)
exploring goes on during the trainer's step, so a phase's peak is the process's peak while that
phase ran, not its own share.

Off Linux (no `/proc/self/statm`) it samples with psutil where installed, else records nothing.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

GIB = 2**30
STATM = Path("/proc/self/statm")


def _statm_reader() -> Callable[[], int] | None:
    try:
        page = os.sysconf("SC_PAGE_SIZE")
        STATM.read_text()
    except (OSError, ValueError, AttributeError):
        return None

    def read() -> int:
        return int(STATM.read_text().split()[1]) * page

    return read


def _psutil_reader() -> Callable[[], int] | None:
    try:
        import psutil
    except ImportError:
        return None
    process = psutil.Process()
    return lambda: int(process.memory_info().rss)


def rss_reader() -> Callable[[], int] | None:
    """A function returning this process's resident bytes now (None: no way to read it here).

    Example:
        >>> read = rss_reader()
        >>> read is None or read() > 0
        True
    """
    return _statm_reader() or _psutil_reader()


class PhasePeaks:
    """Samples this process's RSS every `interval` seconds; `take()` is the peak (GiB) since the
    previous `take()` (or the start), sampled now too, so a phase shorter than the interval still
    counts its end. Use as a context manager (starts and stops the thread).

    Example:
        >>> with PhasePeaks(interval=0.01) as peaks:
        ...     block = bytearray(64 * 2**20)
        ...     peak = peaks.take()
        >>> peak is None or peak > 0.06
        True
    """

    def __init__(self, interval: float = 0.02, read: Callable[[], int] | None = None) -> None:
        self.interval = interval
        self._read = read if read is not None else rss_reader()
        self._peak = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def available(self) -> bool:
        return self._read is not None

    def _sample(self) -> int:
        assert self._read is not None
        now = self._read()
        with self._lock:
            self._peak = max(self._peak, now)
        return now

    def _watch(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self._sample()
            except (OSError, ValueError):  # /proc gone mid-read (interpreter exiting)
                return

    def start(self) -> PhasePeaks:
        if self._read is None or self._thread is not None:
            return self
        self._sample()
        self._thread = threading.Thread(target=self._watch, name="rss-peaks", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)
            self._thread = None

    def take(self) -> float | None:
        """The peak RSS in GiB since the last `take` (None where RSS cannot be read)."""
        if self._read is None:
            return None
        now = self._sample()
        with self._lock:
            peak, self._peak = self._peak, now
        return peak / GIB

    def peek(self) -> float | None:
        """The peak RSS in GiB since the last `take`, sampled now too, without starting a new
        phase (None where RSS cannot be read)."""
        if self._read is None:
            return None
        self._sample()
        with self._lock:
            return self._peak / GIB

    def now(self) -> float | None:
        """The RSS in GiB now (None where it cannot be read)."""
        return None if self._read is None else self._read() / GIB

    def __enter__(self) -> PhasePeaks:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def phase_metric(name: str) -> str:
    """The metric name of phase `name`'s peak.

    Example:
        >>> phase_metric("train")
        'memory/train_peak_gib'
    """
    return f"memory/{name}_peak_gib"
