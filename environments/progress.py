"""A shared rich progress bar for the generation commands."""

from __future__ import annotations

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


def progress_bar() -> Progress:
    """A rich progress bar with counts and times, for `with progress_bar() as progress:`.

    Example:
        >>> with progress_bar() as progress:  # doctest: +SKIP
        ...     task = progress.add_task("games", total=10)
        ...     progress.advance(task)
    """
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    )
