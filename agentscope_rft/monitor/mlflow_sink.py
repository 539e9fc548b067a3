"""MLflow: one run per training run, through `MlflowClient` (no global fluent-API state)."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from pathlib import Path

from agentscope_rft.monitor.config import MlflowConfig
from agentscope_rft.monitor.optional import import_backend
from agentscope_rft.monitor.records import plain_config, qualified_name

RUN_ID_FILE = "mlflow_run_id.txt"
_PARAM_VALUE_LIMIT = 500  # the smallest limit across MLflow versions and stores
_BATCH = 100  # MLflow's limit on params per log_batch call


def flatten_config(config: Mapping[str, object], prefix: str = "") -> Iterator[tuple[str, str]]:
    """Dotted keys and string values of a nested config, for MLflow parameters.

    Example:
        >>> dict(flatten_config({"algorithm": {"advantage": {"type": "grpo"}}, "lr": 1e-6}))
        {'algorithm.advantage.type': 'grpo', 'lr': '1e-06'}
    """
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            yield from flatten_config(value, prefix=f"{name}.")
        else:
            yield name, str(value)[:_PARAM_VALUE_LIMIT]


class MlflowSink:
    """Metrics per step (`eval/<name>` for eval), the flattened config as parameters and the
    full config as the `config.json` artifact. Tracking URI default: `file:<run_dir>/mlruns`.

    The run id is kept in `<run_dir>/mlflow_run_id.txt`; a resumed training run continues it.
    """

    def __init__(
        self,
        config: MlflowConfig,
        run_dir: Path,
        *,
        run_name: str,
        resolved_config: Mapping[str, object],
        resume: bool,
    ) -> None:
        mlflow = import_backend("mlflow", "monitor.mlflow.enabled")
        entities = import_backend("mlflow.entities", "monitor.mlflow.enabled")
        self._metric_type = entities.Metric
        uri = config.tracking_uri or (run_dir / "mlruns").resolve().as_uri()
        self._client = mlflow.MlflowClient(tracking_uri=uri)
        id_file = run_dir / RUN_ID_FILE
        if resume and id_file.is_file():
            self.run_id = id_file.read_text().strip()
            self._client.update_run(self.run_id, status="RUNNING")
            return
        experiment = self._client.get_experiment_by_name(config.experiment)
        experiment_id = (
            experiment.experiment_id
            if experiment is not None
            else self._client.create_experiment(config.experiment)
        )
        run = self._client.create_run(experiment_id, run_name=run_name)
        self.run_id = run.info.run_id
        id_file.write_text(self.run_id + "\n")
        plain = plain_config(resolved_config)
        params = [entities.Param(k, v) for k, v in flatten_config(plain)]
        for start in range(0, len(params), _BATCH):
            self._client.log_batch(self.run_id, params=params[start : start + _BATCH])
        self._client.log_dict(self.run_id, plain, "config.json")

    def log(self, step: int, metrics: Mapping[str, float], phase: str) -> None:
        timestamp_ms = int(time.time() * 1000)
        batch = [
            self._metric_type(qualified_name(phase, name), float(value), timestamp_ms, step)
            for name, value in metrics.items()
        ]
        self._client.log_batch(self.run_id, metrics=batch)

    def close(self, *, failed: bool) -> None:
        self._client.set_terminated(self.run_id, status="FAILED" if failed else "FINISHED")
