"""`Monitor`: where a run's metrics go (console, `metrics.jsonl`, TensorBoard, W&B, MLflow) and
the reward curve drawn from them."""

from __future__ import annotations

import logging
import operator
import re
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Protocol

from rich.console import Console

from agentscope_rft.monitor.config import MonitorConfig
from agentscope_rft.monitor.mlflow_sink import MlflowSink
from agentscope_rft.monitor.optional import import_backend
from agentscope_rft.monitor.plot import plot_run
from agentscope_rft.monitor.progress import ProgressHandle
from agentscope_rft.monitor.records import (
    METRICS_FILE,
    RESUME_PHASE,
    MetricsFileError,
    MetricsWriter,
    normalize_metrics,
)
from agentscope_rft.monitor.status import run_ended, run_started
from agentscope_rft.monitor.step_line import format_step_line
from agentscope_rft.monitor.wandb_sink import WandbSink

logger = logging.getLogger(__name__)

_PHASE = re.compile(r"[a-z][a-z0-9_]*")


class MetricSink(Protocol):
    """A tracking backend: receives every logged record."""

    def log(self, step: int, metrics: Mapping[str, float], phase: str) -> None: ...

    def close(self, *, failed: bool) -> None: ...


class Monitor:
    """Reports a run: one console line per step, `metrics.jsonl`, TensorBoard, W&B and MLflow
    when enabled, progress bars, and `reward_curve.png` every `plot_every` steps and at the end.

    Call `log` once per step and phase with all of that step's metrics (several calls for one
    step also work: the plots merge them). Not thread-safe: call it from the loop's thread.

    Args:
        run_dir: The run folder; created if missing.
        config: The `monitor:` config section.
        run_name: Name of the run in W&B and MLflow.
        resolved_config: The full run config (W&B config, MLflow params, TensorBoard text).
        resume: Continue an earlier run in `run_dir`: append to its metrics (the first step
            logged after resuming supersedes the earlier records from that step on, a
            validation of the checkpoint resumed from excepted, in plots and TensorBoard) and
            continue its W&B/MLflow runs. Without it, an existing `metrics.jsonl` is replaced.
        console: Where the step lines and progress go; pass the console the CLI logs to, so
            that log lines, step lines and live bars share one display.

    Example:
        >>> with Monitor(Path("runs/demo"), MonitorConfig(), run_name="demo",
        ...              resolved_config={}) as monitor:  # doctest: +SKIP
        ...     with monitor.progress() as progress:
        ...         progress.reset("run", total=2)
        ...         for step in (1, 2):
        ...             monitor.log(step, {"reward/mean": 0.4, "success_rate": 0.5})
        ...             progress.advance("run")
    """

    def __init__(
        self,
        run_dir: Path,
        config: MonitorConfig,
        *,
        run_name: str,
        resolved_config: Mapping[str, object],
        resume: bool = False,
        console: Console | None = None,
    ) -> None:
        self.run_dir = run_dir
        self._plot_warned = False
        self.config = config
        self.console = console if console is not None else Console(stderr=True)
        # A missing optional package fails before anything is written or any run is started.
        if config.mlflow.enabled:
            import_backend("mlflow", "monitor.mlflow.enabled")
        if config.wandb.enabled:
            import_backend("wandb", "monitor.wandb.enabled")
        run_dir.mkdir(parents=True, exist_ok=True)
        self._writer = MetricsWriter(run_dir / METRICS_FILE, resume=resume)
        try:
            self._sinks = _open_sinks(
                run_dir, config, run_name=run_name, resolved_config=resolved_config, resume=resume
            )
        except BaseException:
            self._writer.close()
            raise
        self._resume_pending = resume
        self._closed = False
        self._error: str | None = None
        run_section = resolved_config.get("run")
        steps = run_section.get("steps") if isinstance(run_section, Mapping) else None
        self._status = run_started(run_dir, steps if isinstance(steps, int) else None)

    def log(self, step: int, metrics: Mapping[str, float], *, phase: str = "train") -> None:
        """Record the metrics of one step everywhere and print the step line.

        Args:
            step: The training step the metrics belong to (eval: the step evaluated after).
            metrics: Values by name (`reward/mean`, `success_rate`, ...); numpy and torch
                scalars are accepted. Non-finite values are `null` in `metrics.jsonl`.
            phase: `train`, `eval` or another lower-case name; outside `train` the backends
                get `<phase>/<name>` and the console line is marked.

        Raises:
            ValueError: a bad phase or a reserved metric name (`step`, `time`, `phase`).
            TypeError: `step` is not an integer, or a value is not a number.
        """
        if self._closed:
            raise RuntimeError("Monitor.log after close()")
        if not _PHASE.fullmatch(phase) or phase == RESUME_PHASE:
            raise ValueError(f"phase {phase!r} must be a lower-case name like 'train' or 'eval'")
        step = operator.index(step)  # numpy/torch integers pass; floats fail here, not in JSON
        values = normalize_metrics(metrics)
        now = time.time()
        if self._resume_pending:
            # The first step after a resume supersedes what the crashed attempt logged from it on.
            self._resume_pending = False
            self._writer.mark_resume(step, now)
        self._writer.write(step, now, phase, values)
        for sink in self._sinks:
            sink.log(step, values, phase)
        if self.config.console:
            line = format_step_line(step, values, phase=phase, keys=self.config.console_metrics)
            self.console.print(line, markup=False, highlight=False, soft_wrap=True)
        if phase == "train" and self.config.plot_every and step % self.config.plot_every == 0:
            self.plot()

    def supersede_from(self, step: int) -> None:
        """The run went back to `step` (a health rollback): what it logs from now on supersedes
        its records from that step on, as after a resume (a `resume` marker line goes first)."""
        del step  # the marker carries the step of the next record, which is this one
        self._resume_pending = True

    def progress(self) -> ProgressHandle:
        """Progress bars on this monitor's console (plain lines when it is not a terminal).

        Example:
            >>> with monitor.progress() as progress:  # doctest: +SKIP
            ...     progress.reset("explore", total=64)
            ...     progress.advance("explore")
        """
        return ProgressHandle(
            self.console,
            enabled=self.config.console,
            interval_s=self.config.progress_interval_s,
        )

    def plot(self) -> Path | None:
        """Redraw `<run_dir>/reward_curve.png`; None (and a warning) when there is nothing to plot.

        The plot is a by-product: a metrics file it cannot use never stops training.
        """
        try:
            return plot_run(self.run_dir)
        except OSError as exc:  # a full disk: the run's own writes say so
            logger.warning("no reward curve: cannot write it: %s", exc)
            return None
        except MetricsFileError as exc:
            # Once per run: steps without rewards (an offline run, warm-up steps) come in rows.
            log = logger.debug if self._plot_warned else logger.warning
            self._plot_warned = True
            log("no reward curve: %s", exc)
            return None

    def close(self, *, failed: bool = False) -> None:
        """Draw the final reward curve and close every backend; safe to call twice.

        Args:
            failed: The run ended with an error: W&B and MLflow mark the run failed.
        """
        if self._closed:
            return
        self._closed = True
        try:
            self._writer.close()
            run_ended(self.run_dir, self._status, (self._error or "failed") if failed else None)
        except OSError as exc:
            if not failed:
                raise
            # (a full disk that ended the run fails these too: its error is the one to show)
            logger.warning("%s: could not record the run's end: %s", self.run_dir, exc)
        try:
            path = self.plot()
            if path is not None:
                logger.info("reward curve: %s", path)
        finally:
            self._close_sinks(failed=failed)

    def _close_sinks(self, *, failed: bool) -> None:
        while self._sinks:
            self._sinks.pop().close(failed=failed)

    def __enter__(self) -> Monitor:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if exc is not None:
            self._error = f"{type(exc).__name__}: {exc}"[-1000:]
        self.close(failed=exc is not None)


def _open_sinks(
    run_dir: Path,
    config: MonitorConfig,
    *,
    run_name: str,
    resolved_config: Mapping[str, object],
    resume: bool,
) -> list[MetricSink]:
    """The enabled backends, opened in order; if one fails, those already open are closed."""
    sinks: list[MetricSink] = []
    try:
        if config.mlflow.enabled:
            sinks.append(
                MlflowSink(
                    config.mlflow,
                    run_dir,
                    run_name=run_name,
                    resolved_config=resolved_config,
                    resume=resume,
                )
            )
        if config.wandb.enabled:
            sinks.append(
                WandbSink(
                    config.wandb,
                    run_dir,
                    run_name=run_name,
                    resolved_config=resolved_config,
                    resume=resume,
                )
            )
        if config.tensorboard:
            from agentscope_rft.monitor.tensorboard_sink import TensorBoardSink  # slow import

            sinks.append(TensorBoardSink(run_dir / "tensorboard", resolved_config))
    except BaseException:
        for sink in reversed(sinks):
            sink.close(failed=True)
        raise
    return sinks
