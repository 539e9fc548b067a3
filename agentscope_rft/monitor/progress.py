"""Progress bars for a run: steps, exploring (episodes, rollouts/s), training (micro-batches).

On a terminal the bars redraw in place (rich `Progress`, lines printed through the same console
scroll above them). Elsewhere (CI logs, files) nothing redraws: a plain progress line is printed
at most every `interval_s` seconds, so logs get a heartbeat instead of a flood of frames.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from types import TracebackType
from typing import Literal

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

ProgressTask = Literal["run", "explore", "train"]
"""`run`: steps of the run; `explore`: episodes of the current batch; `train`: micro-batches."""

_TASKS: dict[ProgressTask, tuple[str, str]] = {
    # name -> (description, unit of the rate column; "" for no rate)
    "run": ("steps", ""),
    "explore": ("exploring", "rollouts"),
    "train": ("training", "batches"),
}


class _RateColumn(ProgressColumn):
    """`3.2 rollouts/s` for tasks that have a unit; blank until rich has a speed estimate."""

    def render(self, task: Task) -> Text:
        unit = task.fields.get("unit", "")
        speed = task.finished_speed or task.speed
        if not unit or speed is None:
            return Text("")
        return Text(f"{speed:.2g} {unit}/s" if speed < 10 else f"{speed:.0f} {unit}/s")


class ProgressHandle:
    """Progress of a run; use it as a context manager around the training loop.

    Tasks stay hidden until `reset` starts them.

    Args:
        console: Where bars or plain progress lines go.
        enabled: False: show nothing (no bars, no lines); counts are still kept.
        interval_s: Least seconds between plain progress lines when `console` is not a
            terminal; 0 turns them off.
        clock: Time source (tests pass a fake one).

    Example:
        >>> from rich.console import Console
        >>> with ProgressHandle(Console(force_terminal=False)) as progress:
        ...     progress.reset("run", total=100, completed=40)  # resumed at step 40
        ...     progress.reset("explore", total=64)
        ...     progress.advance("explore")  # one episode finished
        ...     progress.advance("run")
    """

    def __init__(
        self,
        console: Console,
        *,
        enabled: bool = True,
        interval_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.console = console
        self.live = enabled and console.is_terminal and not console.is_dumb_terminal
        self._plain_interval_s = interval_s if enabled and not self.live else 0.0
        self._clock = clock
        self._last_plain_line = clock()
        self._progress = Progress(
            TextColumn("{task.description:<9}"),
            BarColumn(),
            MofNCompleteColumn(),
            _RateColumn(),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            console=console,
            disable=not self.live,
            get_time=clock,
            speed_estimate_period=60.0,
        )
        self._ids: dict[ProgressTask, TaskID] = {
            name: self._progress.add_task(description, total=None, visible=False, unit=unit)
            for name, (description, unit) in _TASKS.items()
        }

    def start(self) -> None:
        """Start drawing (a no-op off a terminal)."""
        self._progress.start()

    def stop(self) -> None:
        """Stop drawing; the last frame stays on screen."""
        self._progress.stop()

    def __enter__(self) -> ProgressHandle:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def reset(self, task: ProgressTask, *, total: int | None, completed: int = 0) -> None:
        """Start `task` over at `completed` of `total` (None: total unknown) and show it."""
        task_id = self._ids[task]
        self._progress.reset(task_id, total=total, completed=completed, visible=True)
        if total is None:
            self._progress.tasks[task_id].total = None  # rich's update ignores total=None
        self._maybe_print_plain_line()

    def advance(self, task: ProgressTask, amount: int = 1) -> None:
        """Count `amount` more units of `task` as done (steps, episodes or micro-batches)."""
        self._progress.advance(self._ids[task], amount)
        self._maybe_print_plain_line()

    def completed(self, task: ProgressTask) -> float:
        """Units of `task` done so far."""
        return self._progress.tasks[self._ids[task]].completed

    def plain_line(self) -> str:
        """The visible tasks as one line, as printed off a terminal."""
        parts = []
        for task in self._progress.tasks:
            if not task.visible:
                continue
            total = "?" if task.total is None else f"{task.total:.0f}"
            part = f"{task.description} {task.completed:.0f}/{total}"
            rate = _RateColumn().render(task).plain
            parts.append(f"{part} ({rate})" if rate else part)
        return "progress | " + " | ".join(parts)

    def _maybe_print_plain_line(self) -> None:
        if self._plain_interval_s <= 0:
            return
        now = self._clock()
        if now - self._last_plain_line >= self._plain_interval_s:
            self._last_plain_line = now
            self.console.print(self.plain_line(), markup=False, highlight=False)
