"""The `agentscope-rft plot` command (the CLI mounts `plot_command`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.text import Text

from agentscope_rft.monitor.plot import plot_run
from agentscope_rft.monitor.records import MetricsFileError


def plot_command(
    run_dir: Annotated[
        Path, typer.Argument(help="Run folder holding metrics.jsonl (or the metrics file).")
    ],
    out: Annotated[
        Path | None,
        typer.Option("--out", "-o", help="PNG to write (default: <run-dir>/reward_curve.png)."),
    ] = None,
) -> None:
    """Draw the reward curve (and success rate) of a run from its metrics.jsonl.

    Example: agentscope-rft plot runs/gsm8k-grpo
    """
    try:
        if (run_dir / "sweep.json").is_file() and not (run_dir / "metrics.jsonl").is_file():
            raise MetricsFileError(
                f"{run_dir} is a seed sweep: plot one of its seeds (`agentscope-rft plot "
                f"{run_dir / 'seed-0'}`); its seeds together are {run_dir / 'seeds.png'} "
                f"(`agentscope-rft sweep-summary {run_dir}` redraws it)"
            )
        if out is not None and out.is_dir():
            raise MetricsFileError(
                f"--out {out} is a folder: give the PNG to write (e.g. {out / 'reward_curve.png'})"
            )
        try:
            path = plot_run(run_dir, out)
        except OSError as exc:  # a folder or file that cannot be read or written
            raise MetricsFileError(f"{exc.filename or out}: {exc.strerror or exc}") from exc
    except MetricsFileError as exc:
        Console(stderr=True).print(Text.assemble(("error: ", "bold red"), str(exc)))
        raise typer.Exit(code=2) from None
    typer.echo(str(path))
