"""Watching the event loop the episodes share: who blocks it, and for how long.

In the local runtime every episode is an asyncio task of one event loop, beside the gateway that
serves their model calls. An app that runs blocking work in its async `run` (`time.sleep`,
`requests.get`, a CPU-heavy simulator step) stops every other episode, every deadline and the
gateway while it runs, and through the GIL slows the engine's thread too. Nothing fails: the run
is just slow, or episodes time out in the blocker's place. `LoopMonitor` makes that visible:

- a heartbeat task sleeps `tick` seconds at a time; how late it wakes is the loop's lag, and the
  largest lag of a batch is the step metric `explore/loop_lag_max`;
- a watchdog thread looks at the loop thread's stack while a heartbeat is overdue by more than
  `threshold`, so a stall is attributed to the code that ran, not guessed. A stall counts as a
  block (`explore/loop_blocks`) when it lasted past the threshold and two looks in a row caught the
  same call running (the same episode's code, not just the same function: many episodes' short
  callbacks make a slow loop, not a block); episodes that block back to back count once each.
  The first block at each place logs one warning line naming the file, line and source, and the
  fix (`await asyncio.to_thread(...)`).

The threshold is 0.5 s, five times asyncio's own debug-mode `slow_callback_duration` (0.1 s). Its
0.1 s is for one callback on a quiet machine; the heartbeat's lag adds up a whole loop iteration
(every ready callback of every running episode), descheduling on a machine whose few cores are
shared with other processes (tens to a few hundred milliseconds), and GIL hand-offs with the
engine's thread (5 ms each). What the look at the stack adds: a loop that waits for the operating
system is caught in its selector and a busy loop in changing places, so neither counts as a
block. A real block of a second or more (the ones that hurt: every episode and the gateway stand
still meanwhile) is always caught.

The trainer may run in this process beside the episodes (in a thread, in the asynchronous modes);
its steps, weight syncs and checkpoints compete for the GIL, so the monitor is `paused()` around
them and a heartbeat that overlapped a pause is not counted.

Example:
    >>> monitor = LoopMonitor()
    >>> async with monitor.watching() as window:  # doctest: +SKIP
    ...     await run_the_episodes()
    >>> window.metrics()  # doctest: +SKIP
    {'explore/loop_lag_max': 0.012, 'explore/loop_blocks': 0.0}
"""

from __future__ import annotations

import asyncio
import contextlib
import linecache
import logging
import os
import sys
import sysconfig
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from types import FrameType

logger = logging.getLogger(__name__)

BLOCK_THRESHOLD = 0.5
"""Seconds a heartbeat may be late before the stall is looked at (see the module doc)."""
TICK = 0.1
"""Seconds between heartbeats, and between the watchdog's looks during a stall."""
MAX_WARNED_PLACES = 5
"""Distinct blocking places warned about per monitor; later ones are only counted."""

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_LIBRARY_DIRS = tuple(
    {
        os.path.abspath(path)
        for key in ("stdlib", "platstdlib", "purelib", "platlib")
        if (path := sysconfig.get_paths().get(key))
    }
)
_LIBRARY_MARKERS = (f"{os.sep}site-packages{os.sep}", f"{os.sep}dist-packages{os.sep}")


@dataclass
class LoopStats:
    """What one window of watching saw (one batch of episodes)."""

    lag_max: float = 0.0
    """The largest lag of the heartbeat, in seconds."""
    blocks: int = 0
    """Stalls past the threshold attributed to code outside agentscope-rft (the app's)."""

    def merge(self, other: LoopStats) -> None:
        self.lag_max = max(self.lag_max, other.lag_max)
        self.blocks += other.blocks

    def metrics(self) -> dict[str, float]:
        return {"explore/loop_lag_max": round(self.lag_max, 4), "explore/loop_blocks": self.blocks}


@dataclass(frozen=True)
class _Look:
    """Where the watchdog caught the loop thread during a stall."""

    key: tuple[int, str, str, int]
    """The running call the looks must agree on: the outermost frame of the blamed code (an
    episode's `run`, alive for the whole episode), by identity and (file, function, first
    line). By identity, so a loop busy with many episodes' short callbacks, each under its own
    `run`, does not look like one block."""
    place: tuple[str, str, int]
    """(file, function, first line) of the innermost frame of the blamed code: warned once."""
    where: str
    """`file:line in function: source` for the warning."""
    ours: bool
    """No frame outside agentscope-rft and the libraries: the framework's own code."""


def _is_library(filename: str) -> bool:
    path = os.path.abspath(filename)
    return any(m in path for m in _LIBRARY_MARKERS) or path.startswith(_LIBRARY_DIRS)


def _look(frame: FrameType) -> _Look | None:
    """Blame for a stall from the loop thread's stack: the app's code (not a library's, not
    agentscope-rft's), else agentscope-rft's; None when the loop is waiting in its selector (for
    the operating system, not held up by code)."""
    if os.path.basename(frame.f_code.co_filename) == "selectors.py":
        return None
    app: list[FrameType] = []  # innermost first
    ours: list[FrameType] = []
    current: FrameType | None = frame
    while current is not None:
        code = current.f_code
        filename = code.co_filename
        named = not code.co_name.startswith("<")  # a genexpr or lambda: blame what runs it
        if named and not filename.startswith("<"):
            if os.path.abspath(filename).startswith(_PACKAGE_DIR + os.sep):
                ours.append(current)
            elif not _is_library(filename):
                app.append(current)
        current = current.f_back
    if app:
        return _describe(app[0], app[-1], ours=False)
    return _describe(ours[0], ours[-1], ours=True) if ours else None


def _code_key(frame: FrameType) -> tuple[str, str, int]:
    code = frame.f_code
    return code.co_filename, code.co_name, code.co_firstlineno


def _describe(innermost: FrameType, outermost: FrameType, *, ours: bool) -> _Look:
    code = innermost.f_code
    line = innermost.f_lineno
    source = linecache.getline(code.co_filename, line).strip()
    where = f"{code.co_filename}:{line} in {code.co_name}" + (f": {source[:120]}" if source else "")
    key = (id(outermost), *_code_key(outermost))
    return _Look(key, _code_key(innermost), where, ours)


def _blame(looks: list[_Look | None]) -> list[_Look]:
    """The calls a stall is blamed on: each caught by at least two looks in a row (it held the
    loop from one look to the next, a `tick` apart), in order. Several episodes that block back to
    back make one long stall with one run of looks each; a loop busy with many short callbacks
    is caught in a different call at every look, and blamed on none."""
    blamed: list[_Look] = []
    previous: _Look | None = None
    run = 0
    for look in looks:
        same = look is not None and previous is not None and look.key == previous.key
        run = run + 1 if same else 1
        if look is not None and run == 2:
            blamed.append(look)
        previous = look
    return blamed


class LoopMonitor:
    """The heartbeat and the watchdog of the event loop it is started on (see the module doc).

    Example:
        >>> monitor = LoopMonitor(threshold=0.5)
        >>> async with monitor.watching() as window:  # doctest: +SKIP
        ...     await asyncio.gather(*episodes)
        >>> window.blocks  # doctest: +SKIP
        0
    """

    def __init__(self, threshold: float = BLOCK_THRESHOLD, tick: float = TICK) -> None:
        if not 0 < tick < threshold:
            raise ValueError(f"need 0 < tick < threshold, got tick={tick}, threshold={threshold}")
        self.threshold = threshold
        self.tick = tick
        self._windows: list[LoopStats] = []
        self._paused = 0
        self._pause_epoch = 0
        self._lock = threading.Lock()
        self._beat = time.monotonic()
        """When the heartbeat in progress began (its timer is due `tick` later)."""
        self._beat_open = False
        self._beat_epoch = 0
        self._looks: list[_Look | None] = []
        """What the watchdog caught during the heartbeat in progress."""
        self._loop_thread: int | None = None
        self._heartbeat: asyncio.Task[None] | None = None
        self._watchdog: threading.Thread | None = None
        self._stop = threading.Event()
        self._warned: set[tuple[str, str, int]] = set()  # places warned about

    @contextlib.asynccontextmanager
    async def watching(self) -> AsyncIterator[LoopStats]:
        """Watch the running loop while the block runs; yields the window's `LoopStats` (filled
        in as it goes). Windows may overlap (a validation batch beside a training batch): each
        sees every heartbeat while it is open."""
        window = LoopStats()
        self._windows.append(window)
        if self._heartbeat is None:
            self._start()
        try:
            yield window
        finally:
            # A stall that ends the window (the last episode blocked, then returned) is this
            # window's: count the heartbeat in progress now, then start the next one.
            self._end_beat()
            self._begin_beat()
            self._windows.remove(window)
            if not self._windows:
                await self._stop_watching()

    def take(self, window: LoopStats) -> LoopStats:
        """What `window` saw since the last take, the heartbeat in progress counted now (a stall
        that just ended is the caller's); `window` starts over. For a window kept open across
        many episodes (a runner process's), so each stall is reported once.

        Example:
            >>> stats = monitor.take(window)  # doctest: +SKIP
        """
        self._end_beat()
        self._begin_beat()
        taken = LoopStats(window.lag_max, window.blocks)
        window.lag_max, window.blocks = 0.0, 0
        return taken

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Not watching meanwhile (a trainer step in this process competes for the GIL)."""
        self._paused += 1
        self._pause_epoch += 1
        try:
            yield
        finally:
            self._paused -= 1
            self._pause_epoch += 1

    def _start(self) -> None:
        self._loop_thread = threading.get_ident()
        self._begin_beat()
        self._stop = threading.Event()
        self._heartbeat = asyncio.create_task(self._beats(), name="loop-monitor")
        self._watchdog = threading.Thread(
            target=self._watch, args=(self._stop,), name="loop-monitor", daemon=True
        )
        self._watchdog.start()

    async def _stop_watching(self) -> None:
        heartbeat, watchdog = self._heartbeat, self._watchdog
        self._heartbeat = self._watchdog = None
        self._beat_open = False
        self._stop.set()
        if heartbeat is not None:
            heartbeat.cancel()
            await asyncio.wait({heartbeat})
        if watchdog is not None:
            watchdog.join(timeout=1.0)

    async def _beats(self) -> None:
        while True:
            await asyncio.sleep(self.tick)
            self._end_beat()
            self._begin_beat()

    def _begin_beat(self) -> None:
        with self._lock:
            self._beat = time.monotonic()
            self._beat_open = True
            self._beat_epoch = self._pause_epoch
            self._looks = []

    def _end_beat(self) -> None:
        """The heartbeat in progress is over: observe how late it is (unless a pause overlapped)."""
        with self._lock:
            if not self._beat_open:
                return
            self._beat_open = False
            lag = max(0.0, time.monotonic() - self._beat - self.tick)
            looks, self._looks = self._looks, []
            counted = not self._paused and self._beat_epoch == self._pause_epoch
        if counted:
            self._observe(lag, looks)

    def _watch(self, stop: threading.Event) -> None:
        """The watchdog thread: during a stall, look at what the loop thread runs."""
        while not stop.wait(self.tick):
            if self._paused:
                continue
            with self._lock:
                beat, beat_open = self._beat, self._beat_open
            if not beat_open or time.monotonic() - beat < self.threshold:
                continue
            frame = sys._current_frames().get(self._loop_thread or 0)
            look = _look(frame) if frame is not None else None
            with self._lock:
                if self._beat == beat and self._beat_open:  # (else the stall ended meanwhile)
                    self._looks.append(look)

    def _observe(self, lag: float, looks: list[_Look | None]) -> None:
        for window in self._windows:
            window.lag_max = max(window.lag_max, lag)
        if lag < self.threshold:
            return
        blamed = _blame(looks)
        if not blamed:
            logger.debug("the event loop stalled for %.2fs (not in code: busy or descheduled)", lag)
        for look in blamed:
            self._blamed(look, lag)

    def _blamed(self, look: _Look, lag: float) -> None:
        if look.ours:
            logger.debug("the event loop stalled for %.2fs in agentscope-rft: %s", lag, look.where)
            return
        for window in self._windows:
            window.blocks += 1
        if look.place not in self._warned and len(self._warned) < MAX_WARNED_PLACES:
            self._warned.add(look.place)
            logger.warning(
                "blocking code held the event loop (a stall of %.1fs) at %s: every concurrent "
                "episode and the gateway stood still meanwhile; run it with `await "
                "asyncio.to_thread(fn, ...)` (or use an async API, e.g. `await asyncio.sleep`) "
                "(counted in explore/loop_blocks; warned once per place)",
                lag,
                look.where,
            )
