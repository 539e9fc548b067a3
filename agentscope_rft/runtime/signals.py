"""Stopping a run cleanly: on SIGINT or SIGTERM, finish what cannot be interrupted, save, exit.

Schedulers (Kubernetes, Slurm) preempt a job with SIGTERM and kill it a grace period later;
Ctrl-C sends SIGINT. The first signal asks the run to stop: exploring stops at once (its episodes
are cancelled and their rollouts closed), a training step already running finishes, then the run
writes a checkpoint and its state, flushes metrics, stops what it started and exits with
`EXIT_STOPPED`; `--resume` continues from there. A second signal exits at once (child processes
are killed, nothing is saved) with the shell's code for that signal (128 + its number).

`RunStop` is also the programmatic way to stop a run: `stop.request()` from any coroutine.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Awaitable, Iterator
from typing import TypeVar

from agentscope_rft.runtime.processes import kill_descendants

logger = logging.getLogger(__name__)

T = TypeVar("T")

EXIT_STOPPED = 75
"""Exit code after a clean stop on a signal (checkpoint written; resume with `--resume`). It is
`EX_TEMPFAIL` ("try again later"), distinct from success (0), errors (1) and bad input (2)."""


class Stopping(Exception):
    """Raised inside the run's loops when a stop was requested while they waited."""


class RunStopped(Exception):
    """A run or an exploration stopped on request (a signal) after saving its work.

    Example:
        >>> str(RunStopped("SIGTERM", "stopped on SIGTERM after step 3"))
        'stopped on SIGTERM after step 3'
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class RunStop:
    """A stop request shared by a run's loops.

    Example:
        >>> stop = RunStop()
        >>> stop.requested
        False
        >>> stop.request("test")
        >>> stop.reason
        'test'
    """

    def __init__(self) -> None:
        self.reason: str | None = None
        self._event: asyncio.Event | None = None

    @property
    def requested(self) -> bool:
        return self.reason is not None

    def _wake(self) -> asyncio.Event:
        if self._event is None:
            self._event = asyncio.Event()
            if self.requested:
                self._event.set()
        return self._event

    def request(self, reason: str = "request") -> None:
        """Ask the run to stop (idempotent; the first reason is kept)."""
        if self.reason is None:
            self.reason = reason
        if self._event is not None:
            self._event.set()

    async def wait(self) -> None:
        """Return once a stop is requested."""
        await self._wake().wait()

    async def until(self, awaitable: Awaitable[T]) -> T:
        """Await `awaitable`, unless a stop comes first: then cancel it and raise `Stopping`."""
        task = asyncio.ensure_future(awaitable)
        waiter = asyncio.ensure_future(self._wake().wait())
        try:
            await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
            if not task.done():
                task.cancel()
                await asyncio.wait({task})
        if task.cancelled() or self.requested:
            if not task.cancelled():
                task.exception()  # seen: the stop wins, whatever the step ended with
            raise Stopping(self.reason)
        return task.result()


@contextlib.contextmanager
def stop_on_signals(stop: RunStop, what: str = "the run") -> Iterator[RunStop]:
    """Route SIGINT and SIGTERM to `stop` while the block runs (on the running event loop).

    The first signal requests the stop; a second one kills child processes and exits at once.
    """
    loop = asyncio.get_running_loop()
    signals = (signal.SIGINT, signal.SIGTERM)

    def handle(signum: int) -> None:
        name = signal.Signals(signum).name
        if stop.requested:
            logger.error("second signal (%s): exiting now, without saving", name)
            kill_descendants(grace=0.0)
            os._exit(128 + signum)
        logger.warning(
            "%s: stopping %s cleanly (send it again to exit at once, without saving)", name, what
        )
        stop.request(name)

    for signum in signals:
        loop.add_signal_handler(signum, handle, signum)
    try:
        yield stop
    finally:
        for signum in signals:
            loop.remove_signal_handler(signum)
