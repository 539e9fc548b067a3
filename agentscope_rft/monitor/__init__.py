"""Monitoring: console step lines and progress bars, `metrics.jsonl`, TensorBoard, W&B, MLflow,
and reward-curve plots.

Example:
    A training loop (the CLI builds the config and passes its console)::

        with Monitor(run_dir, MonitorConfig(), run_name="demo", resolved_config=cfg) as monitor:
            with monitor.progress() as progress:
                progress.reset("run", total=num_steps)
                for step in range(1, num_steps + 1):
                    ...
                    monitor.log(step, {"reward/mean": 0.4, "success_rate": 0.5})
                    progress.advance("run")
        # run_dir/metrics.jsonl, run_dir/tensorboard/, run_dir/reward_curve.png
"""

from agentscope_rft.monitor.commands import plot_command
from agentscope_rft.monitor.config import (
    DEFAULT_CONSOLE_METRICS,
    MlflowConfig,
    MonitorConfig,
    WandbConfig,
)
from agentscope_rft.monitor.monitor import Monitor
from agentscope_rft.monitor.optional import MissingBackendError
from agentscope_rft.monitor.plot import REWARD_CURVE_FILE, plot_run
from agentscope_rft.monitor.progress import ProgressHandle, ProgressTask
from agentscope_rft.monitor.records import (
    METRICS_FILE,
    MetricRecord,
    MetricsFileError,
    read_metrics,
)
from agentscope_rft.monitor.step_line import format_step_line

__all__ = [
    "DEFAULT_CONSOLE_METRICS",
    "METRICS_FILE",
    "REWARD_CURVE_FILE",
    "MetricRecord",
    "MetricsFileError",
    "MissingBackendError",
    "MlflowConfig",
    "Monitor",
    "MonitorConfig",
    "ProgressHandle",
    "ProgressTask",
    "WandbConfig",
    "format_step_line",
    "plot_command",
    "plot_run",
    "read_metrics",
]
