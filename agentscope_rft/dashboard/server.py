"""Serving the dashboard: bind checks, the token, and the `agentscope-rft dashboard` command."""

from __future__ import annotations

import json
import os
import re
import secrets
import socket
from pathlib import Path
from typing import Annotated

import typer

from agentscope_rft.dashboard.hosts import is_loopback

TOKEN_ENV = "AGENTSCOPE_RFT_DASHBOARD_TOKEN"


class DashboardError(ValueError):
    """A dashboard that cannot start as asked (the message says what to change)."""


def dashboard_token(host: str, token: str | None) -> str:
    """The token for writes: the one given (flag or `$AGENTSCOPE_RFT_DASHBOARD_TOKEN`), else a
    fresh random one. A bind beyond loopback must be given one explicitly.

    Raises:
        DashboardError: a non-loopback host without a token, or a token under 16 characters
            or with characters a URL or a header would not carry as they are.
    """
    token = token or os.environ.get(TOKEN_ENV) or None
    if token is None:
        if not is_loopback(host):
            raise DashboardError(
                f"--host {host} serves the dashboard beyond this machine: give it a token "
                f"(--token, or ${TOKEN_ENV}, at least 16 characters); every request will "
                "then need it"
            )
        return secrets.token_urlsafe(18)
    if len(token) < 16:
        raise DashboardError("the dashboard token must be at least 16 characters")
    if not re.fullmatch(r"[A-Za-z0-9._~-]+", token):
        raise DashboardError(
            "the dashboard token travels in the URL and a header: use letters, digits, '-', '_', "
            "'.' and '~' only"
        )
    return token


def dashboard_command(
    runs: Annotated[Path, typer.Argument(help="The runs folder (or one run folder).")] = Path(
        "runs"
    ),
    host: Annotated[str, typer.Option(help="Interface to listen on (loopback by default).")] = (
        "127.0.0.1"
    ),
    port: Annotated[int, typer.Option(help="Port (0: any free port).", min=0, max=65535)] = 8765,
    token: Annotated[
        str | None,
        typer.Option(help=f"Token for writes (and for any access beyond loopback); ${TOKEN_ENV}."),
    ] = None,
    export_reviews: Annotated[
        Path | None,
        typer.Option(
            "--export-reviews",
            help="Write the reviews of the run folder RUNS to this JSONL file and exit.",
        ),
    ] = None,
) -> None:
    """Browse runs, curves, episodes and token-level trajectories; review episodes.

    Reviews are stored in `<run>/reviews.jsonl`; `train` takes them with
    `offline.format: review` (docs/dashboard.md).
    """
    from agentscope_rft.cli import fail, setup_logging

    setup_logging("INFO")
    if export_reviews is not None:
        _export(runs, export_reviews)
        return
    if not runs.is_dir():
        raise fail(f"no runs folder {runs}: train a run first, or pass the folder that has them")
    try:
        secret = dashboard_token(host, token)
    except DashboardError as exc:
        raise fail(str(exc)) from exc
    import uvicorn

    from agentscope_rft.dashboard.app import create_app

    app = create_app(runs, token=secret, open_reads=is_loopback(host))
    config = uvicorn.Config(app, host=host, port=port, log_level="warning")
    server = uvicorn.Server(config)
    # Bound here, not by uvicorn (which exits with a log line): a port in use is one clear
    # error, and with --port 0 the URL shows the port picked.
    try:
        listening = _bind(host, port)
    except socket.gaierror as exc:
        raise fail(
            f"cannot listen on --host {host} ({exc.strerror or exc}): give an address or name of "
            "this machine (127.0.0.1, the default, for this machine only)"
        ) from exc
    except OSError as exc:
        raise fail(
            f"cannot listen on {host}:{port} ({exc.strerror or exc}): pick another --port "
            "(0: any free port)"
        ) from exc
    shown = "localhost" if is_loopback(host) else host
    port = listening.getsockname()[1]
    typer.echo(f"dashboard of {runs.resolve()}: http://{shown}:{port}/?token={secret}")
    server.run(sockets=[listening])


def _bind(host: str, port: int) -> socket.socket:
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    listening = socket.socket(family, kind, proto)
    try:
        listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listening.bind(address)
    except OSError:
        listening.close()
        raise
    return listening


def _export(run_folder: Path, out: Path) -> None:
    from agentscope_rft.cli import fail
    from agentscope_rft.dashboard.episodes import export_reviews
    from agentscope_rft.dashboard.runs import RunRef, is_run_folder

    if not is_run_folder(run_folder):
        raise fail(f"--export-reviews: {run_folder} is not a run folder (give runs/<name>)")
    records = export_reviews(RunRef(run_folder.name, run_folder))
    try:
        out.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    except OSError as exc:
        raise fail(
            f"--export-reviews: cannot write {out} ({exc.strerror or exc}): give a file path "
            "in a folder that exists and you can write to"
        ) from exc
    typer.echo(f"{len(records)} reviews -> {out}")
