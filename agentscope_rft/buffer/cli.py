"""`agentscope-rft buffer ...`: export, import and count the samples of a SQL buffer.

Mounted by the main CLI with `app.add_typer(buffer_app, name="buffer")`.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from agentscope_rft.buffer.base import BufferFormatError, BufferInputError
from agentscope_rft.buffer.export import (
    DEFAULT_EXPORT_FIELDS,
    SAMPLE_FIELDS,
    ExportState,
    export_samples,
    import_to_buffer,
)
from agentscope_rft.buffer.sql import SQLBuffer

buffer_app = typer.Typer(
    help="Inspect, export and import the samples of a SQL buffer (SQLite file or database URL).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
_stderr = Console(stderr=True)

UrlOption = Annotated[
    str, typer.Option("--url", help="SQLAlchemy URL or SQLite file path of the buffer.")
]


def _fail(message: str) -> typer.Exit:
    _stderr.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    return typer.Exit(code=2)


@buffer_app.command("export")
def export_command(
    url: UrlOption,
    out: Annotated[Path, typer.Option("--out", help="JSONL file to write.")],
    fields: Annotated[
        str,
        typer.Option(help="Comma-separated sample fields, or 'all'."),
    ] = ",".join(DEFAULT_EXPORT_FIELDS),
    state: Annotated[
        ExportState, typer.Option(help="Samples of which groups: all, pending, consumed, dropped.")
    ] = "all",
) -> None:
    """Write the buffer's samples to a JSONL file, one sample per line."""
    names = SAMPLE_FIELDS if fields == "all" else [f.strip() for f in fields.split(",") if f]
    try:
        count = export_samples(url, out, names, state=state)
    except (BufferFormatError, ValueError) as err:
        raise _fail(str(err)) from err
    _stderr.print(f"wrote {count} samples to {out}", highlight=False, soft_wrap=True)


@buffer_app.command("import")
def import_command(
    url: UrlOption,
    input_path: Annotated[Path, typer.Option("--input", help="JSONL file of samples.")],
) -> None:
    """Add the samples of a JSONL file to the buffer (created when absent), in one transaction;
    samples sharing a group (`group_id`, else `task_id`) form one group. Samples the buffer already
    holds (pending or trained) and repeats within the file are skipped and listed."""
    try:
        report = asyncio.run(import_to_buffer(input_path, url))
    except (BufferFormatError, BufferInputError) as err:
        raise _fail(str(err)) from err
    lines = report.lines()
    lines[0] = f"{input_path}: {lines[0]}"
    for line in lines:
        _stderr.print(line, highlight=False, soft_wrap=True, markup=False)


async def _stats(url: str) -> dict[str, float]:
    buffer = SQLBuffer(url, create=False)
    try:
        return await buffer.stats()
    finally:
        await buffer.close()


@buffer_app.command("stats")
def stats_command(url: UrlOption) -> None:
    """Print how many groups and samples are pending, consumed and dropped."""
    try:
        counts = asyncio.run(_stats(url))
    except BufferFormatError as err:
        raise _fail(str(err)) from err
    table = Table(title=f"buffer {url}")
    table.add_column("state")
    table.add_column("groups", justify="right")
    table.add_column("samples", justify="right")
    for state in ("pending", "consumed", "dropped"):
        table.add_row(
            state, f"{counts[f'{state}_groups']:.0f}", f"{counts[f'{state}_samples']:.0f}"
        )
    Console().print(table)
