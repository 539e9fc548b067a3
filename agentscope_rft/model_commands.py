"""`agentscope-rft serve` and `export`: the commands that serve a model or checkpoint as an
OpenAI-compatible endpoint, and copy a run's checkpoint out as an HF model folder. Mounted on the
main command line by `agentscope_rft.cli`."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

import typer

if TYPE_CHECKING:
    from agentscope_rft.engines.base import Engine
    from agentscope_rft.gateway.live import LiveRecording
    from agentscope_rft.gateway.recorder import CallRecorder


def serve_command(
    model: Annotated[
        str,
        typer.Option(
            help="Model name, local HF folder, or a run's checkpoint: <run folder>:best, "
            "<run folder>:last (or :latest), <run folder>:<step>, a checkpoint folder."
        ),
    ] = "smollm2-135m-instruct",
    chat_template: Annotated[
        str | None,
        typer.Option(
            help="A Jinja chat template, a .jinja file or the text, replacing the model folder's "
            "(a base model's folder may have none)."
        ),
    ] = None,
    host: Annotated[str, typer.Option(help="Interface to bind (loopback by default).")] = (
        "127.0.0.1"
    ),
    port: Annotated[int, typer.Option(help="Port to listen on.", min=0, max=65535)] = 8000,
    api_key: Annotated[
        str | None, typer.Option(help="Require this key (Authorization: Bearer <key>).")
    ] = None,
    engine: Annotated[
        Literal["embedded", "vllm"], typer.Option(help="Inference engine.")
    ] = "embedded",
    dtype: Annotated[
        Literal["auto", "float32", "bfloat16", "float16"], typer.Option(help="Weights dtype.")
    ] = "auto",
    device: Annotated[str, typer.Option(help="auto, cpu or cuda[:N].")] = "auto",
    max_batch_size: Annotated[int, typer.Option(help="Embedded: sequences per batch.", min=1)] = 32,
    vllm_python: Annotated[
        str | None, typer.Option(help="vLLM: interpreter of the vLLM environment.")
    ] = None,
    enforce_eager: Annotated[bool, typer.Option(help="vLLM: faster start, slower decode.")] = False,
    vllm_arg: Annotated[
        list[str] | None, typer.Option(help="vLLM: extra server argument (repeatable).")
    ] = None,
    record: Annotated[
        Path | None,
        typer.Option(
            help="Write each finished rollout of /rollouts/<id>/v1 as an episode in this folder "
            "(a run folder's layout: review it in the dashboard, train on it with "
            "offline.format: review). End one with POST /rollouts/<id>/end.",
        ),
    ] = None,
    record_idle: Annotated[
        float,
        typer.Option(
            help="--record: seconds a rollout may stay idle before it is written (unrewarded) "
            "and its id closed.",
            min=1,
        ),
    ] = 600.0,
    reasoning_parser: Annotated[
        Literal["auto", "none", "think"],
        typer.Option(
            help="Reasoning models: `think` returns <think>...</think> as reasoning_content; "
            "auto: when the chat template writes </think>."
        ),
    ] = "auto",
    log_level: Annotated[str, typer.Option(help="Logging level.")] = "INFO",
) -> None:
    """Serve the policy as an OpenAI-compatible endpoint (try your app against it).

    Calls to /rollouts/<id>/v1 are recorded under <id> (GET /rollouts/<id> returns them);
    with --record, finished rollouts are written to a folder as episodes to review and train on.
    """
    from agentscope_rft.cli import fail, said, setup_logging

    setup_logging(log_level)
    from agentscope_rft.config import (
        EmbeddedEngineConfig,
        EngineConfig,
        ModelConfig,
        VLLMEngineConfig,
    )
    from agentscope_rft.engines.factory import build_engine
    from agentscope_rft.models import check_model_folder, resolve_model
    from agentscope_rft.runtime.preflight import bind_problem

    problem = bind_problem(host, port)  # before the model loads (minutes with vLLM)
    if problem is not None:
        raise fail(
            f"cannot listen on {host}:{port} ({problem}); pick another --port (or stop what uses "
            "it) and a --host of this machine"
        )
    engine_config: EngineConfig = (
        EmbeddedEngineConfig(
            dtype=dtype,
            device=device,
            max_batch_size=max_batch_size,
            reasoning_parser=reasoning_parser,
        )
        if engine == "embedded"
        else VLLMEngineConfig(
            python=vllm_python,
            dtype=dtype,
            enforce_eager=enforce_eager,
            extra_args=vllm_arg or [],
            reasoning_parser=reasoning_parser,
        )
    )
    recording = None
    try:
        resolved = _checkpoint_or_model(model)
        if record is not None:
            from agentscope_rft.gateway.live import LiveRecording

            recording = LiveRecording(record, resolved, chat_template)
        check_model_folder(resolve_model(resolved))  # before an engine loads it
        built = build_engine(
            ModelConfig(name_or_path=resolved, chat_template=chat_template), engine_config
        )
    except (ValueError, RuntimeError) as exc:
        raise fail(said(exc)) from exc
    # Clients may name the model as the user did (`runs/x:best`), not only as resolved.
    aliases = {model} - {resolved}
    asyncio.run(_serve(built, host, port, api_key, aliases, recording, record_idle))


def _checkpoint_or_model(model: str) -> str:
    """A run's checkpoint (`runs/x:best`, `runs/x:12`, a run or checkpoint folder) as its HF
    model folder; anything else (a model name, an HF folder) as given."""
    from agentscope_rft.runtime.best import resolve_checkpoint, split_checkpoint

    if not split_checkpoint(model)[0].is_dir():
        return model
    return str(resolve_checkpoint(model))


def export_command(
    checkpoint: Annotated[
        str,
        typer.Argument(
            help="<run folder>:best, <run folder>:last (or :latest), <run folder>:<step>, a run "
            "or checkpoint folder."
        ),
    ],
    out: Annotated[str, typer.Option(help="Folder to write the HF model to (must not exist).")],
    dtype: Annotated[
        str,
        typer.Option(
            help="Weights' dtype: auto (the model's own, as the run started from: a bf16 model "
            "exports in bf16), float32, bfloat16 or float16.",
        ),
    ] = "auto",
) -> None:
    """Copy a run's checkpoint out as a standalone HF model folder (serve it, share it).

    Example: agentscope-rft export runs/quickstart:best --out models/calculator
    """
    from agentscope_rft.cli import console, fail, said
    from agentscope_rft.runtime.best import CheckpointNotFoundError, resolve_checkpoint
    from agentscope_rft.runtime.disk import write_failure
    from agentscope_rft.runtime.export import export_model_folder
    from agentscope_rft.trainers.checkpoint import DTYPES

    if dtype != "auto" and dtype not in DTYPES:
        raise fail(f"--dtype {dtype}: use auto, {', '.join(DTYPES)}")
    target = Path(out)
    if target.exists():
        raise fail(f"{target} already exists: pick a new folder")
    try:
        source = resolve_checkpoint(checkpoint)
    except CheckpointNotFoundError as exc:
        raise fail(said(exc)) from exc
    try:
        written = export_model_folder(source, target, dtype)
    except OSError as exc:  # a path under a file, no space left: no half-copied model is left
        raise fail(f"cannot write {target}: {write_failure(exc, source)}") from exc
    except ValueError as exc:
        raise fail(str(exc)) from exc
    name = str(written).removeprefix("torch.")
    console.print(f"[green]exported[/] {source} -> {target} ({name})")


async def _serve(
    engine: Engine,
    host: str,
    port: int,
    api_key: str | None,
    aliases: set[str],
    recording: LiveRecording | None = None,
    record_idle: float = 600.0,
) -> None:
    from agentscope_rft.cli import console, fail, said
    from agentscope_rft.gateway.recorder import CallRecorder
    from agentscope_rft.gateway.server import Gateway

    try:
        await engine.start()
    except Exception as exc:
        await engine.close()
        raise fail(f"the {type(engine).__name__} did not start: {said(exc)}") from exc
    recorder = CallRecorder(max_age=record_idle) if recording is not None else None
    gateway = Gateway(
        engine, host=host, port=port, api_key=api_key, model_aliases=aliases, recorder=recorder
    )
    from agentscope_rft.gateway.live import add_live_routes, add_unrecording_routes

    if recording is not None:
        add_live_routes(gateway.app, gateway.state, recording)
    else:
        add_unrecording_routes(gateway.app, gateway.state)
    try:
        await gateway.start()
    except (OSError, SystemExit) as exc:
        await engine.close()
        raise fail(
            f"cannot listen on {host}:{port}: {exc}; pick another --port (or stop what uses it)"
        ) from exc
    console.print(
        f"[bold green]serving[/] {engine.model_name} at [bold]{gateway.base_url}[/]\n"
        f"  recorded calls: {gateway.rollout_base_url('<rollout-id>')}  (GET "
        f"http://{host}:{gateway.port}/rollouts/<rollout-id>)\n"
        "  Ctrl+C to stop"
    )
    if recording is not None:
        console.print(
            f"  recording finished rollouts to [bold]{recording.folder}[/] (end one: POST "
            f"http://{host}:{gateway.port}/rollouts/<rollout-id>/end)"
        )
    from agentscope_rft.runtime.signals import RunStop, stop_on_signals

    stop = RunStop()
    sweeper = None
    if recorder is not None:  # idle rollouts are written without waiting for new traffic
        sweeper = asyncio.create_task(_sweep(recorder, min(30.0, record_idle / 4)))
    with stop_on_signals(stop, "the server"):
        await stop.wait()
        if sweeper is not None:
            sweeper.cancel()
        console.print("stopping...")
        await gateway.stop()
        if recording is not None and (written := recording.flush()):
            console.print(f"wrote the {written} rollout(s) still open to {recording.folder}")
        await engine.close()


async def _sweep(recorder: CallRecorder, every: float) -> None:
    while True:
        await asyncio.sleep(every)
        recorder.sweep()
