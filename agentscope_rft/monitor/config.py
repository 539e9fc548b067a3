"""`MonitorConfig`: the `monitor:` section of a run config.

Short YAML works; everything has a default::

    monitor: {plot_every: 5}
    monitor: {wandb: {enabled: true, project: my-agent}}
    monitor: {mlflow: {enabled: true, tracking_uri: http://127.0.0.1:5000}}
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from agentscope_rft.config_base import Section

DEFAULT_CONSOLE_METRICS: tuple[str, ...] = (
    "reward/mean",
    "success_rate",
    "response_length/mean",
    "kl/mean",
    "entropy/mean",
    "grad_norm",
    "tokens_per_s",
    "time/explore",
    "time/train",
    "time/sync",
    "explore/failed",
)
"""Metrics on the one-line step summary, in order (`reward/std` rides along with the mean)."""


class MonitorSection(Section):
    """Base of the monitor's config models: unknown keys fail with a did-you-mean message."""

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        cls.key_label = cls.__name__


class WandbConfig(MonitorSection):
    """Weights & Biases logging (needs `pip install 'agentscope-rft[monitor]'`)."""

    enabled: bool = False
    """Log metrics and the resolved config to a W&B run in `<run_dir>/wandb`."""
    project: str = "agentscope-rft"
    """W&B project name."""
    entity: str | None = None
    """W&B team or user; default: your default entity."""
    mode: Literal["offline", "online"] = "offline"
    """`offline` writes locally and never touches the network (upload later with
    `wandb sync <run_dir>/wandb/offline-run-*`); `online` streams to the W&B server."""
    tags: list[str] = Field(default_factory=list)
    """Tags on the W&B run."""
    group: str | None = None
    """Group runs together in the W&B UI (for example one group per sweep)."""


class MlflowConfig(MonitorSection):
    """MLflow tracking (needs `pip install 'agentscope-rft[monitor]'`)."""

    enabled: bool = False
    """Log metrics, parameters (the flattened resolved config) and the config file to MLflow."""
    tracking_uri: str | None = None
    """Tracking server or store, e.g. `http://127.0.0.1:5000`; default: `file:<run_dir>/mlruns`."""
    experiment: str = "agentscope-rft"
    """Experiment name; created if it does not exist."""


class MonitorConfig(MonitorSection):
    """What the run reports and where: console, `metrics.jsonl`, TensorBoard, W&B, MLflow, plots.

    `<run_dir>/metrics.jsonl` is always written: it is the record the plots are drawn from.

    Example:
        >>> cfg = MonitorConfig.model_validate({"plot_every": 5, "wandb": {"enabled": True}})
        >>> cfg.tensorboard, cfg.wandb.mode, cfg.plot_every
        (True, 'offline', 5)
    """

    console: bool = True
    """Print one summary line per step and show progress bars."""
    console_metrics: list[str] = Field(default_factory=lambda: list(DEFAULT_CONSOLE_METRICS))
    """Metrics on the step line, in order. Known names get compact labels (`reward 0.41±0.33`,
    `success 44%`); other names print as `name value`. Metrics not listed are still logged."""
    progress_interval_s: float = Field(default=60.0, ge=0.0)
    """When the console is not a terminal (CI logs), print a plain progress line at most this
    often instead of redrawing bars; 0: no progress lines there."""
    tensorboard: bool = True
    """Write TensorBoard event files to `<run_dir>/tensorboard`."""
    wandb: WandbConfig = Field(default_factory=WandbConfig)
    """Weights & Biases (off by default; offline mode when on)."""
    mlflow: MlflowConfig = Field(default_factory=MlflowConfig)
    """MLflow tracking (off by default)."""
    sample_log: int = Field(default=64, ge=0)
    """Training samples per step written to `<run_dir>/samples.jsonl` (token ids, loss mask,
    log-probs, per-token advantages, merge breaks; whole groups first) for the dashboard's
    trajectory viewer and for reviews that become training data; 0: no file."""
    plot_every: int = Field(default=10, ge=0)
    """Redraw `<run_dir>/reward_curve.png` every this many steps (0: only at the end of the run,
    when it is always drawn)."""

    @field_validator("console_metrics")
    @classmethod
    def _no_duplicates(cls, names: list[str]) -> list[str]:
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"console_metrics lists {', '.join(duplicates)} more than once")
        return names
