"""Weights & Biases: one run per training run in `<run_dir>/wandb`, offline unless configured."""

from __future__ import annotations

import logging
import secrets
from collections.abc import Mapping
from pathlib import Path

from agentscope_rft.monitor.config import WandbConfig
from agentscope_rft.monitor.optional import import_backend
from agentscope_rft.monitor.records import plain_config, qualified_name

logger = logging.getLogger(__name__)

RUN_ID_FILE = "wandb_run_id.txt"


class WandbSink:
    """Metrics against a `step` metric (so a resumed run that re-logs earlier steps is not
    dropped by W&B's monotonic internal step); the resolved config as the run's config.

    The run id is kept in `<run_dir>/wandb_run_id.txt`; a resumed training run continues it.
    """

    def __init__(
        self,
        config: WandbConfig,
        run_dir: Path,
        *,
        run_name: str,
        resolved_config: Mapping[str, object],
        resume: bool,
    ) -> None:
        wandb = import_backend("wandb", "monitor.wandb.enabled")
        id_file = run_dir / RUN_ID_FILE
        run_id = id_file.read_text().strip() if resume and id_file.is_file() else None
        if run_id is None:
            run_id = secrets.token_hex(4)  # W&B ids: 8 lower-case alphanumerics
            id_file.write_text(run_id + "\n")
        self._run = wandb.init(
            project=config.project,
            entity=config.entity,
            group=config.group,
            tags=config.tags or None,
            name=run_name,
            id=run_id,
            # Offline runs cannot resume on a server; the same id lets `wandb sync` merge them.
            resume="allow" if config.mode == "online" else None,
            mode=config.mode,
            dir=str(run_dir),
            config=plain_config(resolved_config),
            # W&B must not wrap stdout/stderr: rich's live progress display owns the terminal.
            settings=wandb.Settings(console="off"),
        )
        self._run.define_metric("step")
        self._run.define_metric("*", step_metric="step")
        if config.mode == "offline":
            run_folder = Path(self._run.dir).parent
            logger.info("W&B offline run in %s (upload: wandb sync %s)", run_folder, run_folder)

    def log(self, step: int, metrics: Mapping[str, float], phase: str) -> None:
        values: dict[str, float] = {qualified_name(phase, n): v for n, v in metrics.items()}
        self._run.log({"step": step, **values})

    def close(self, *, failed: bool) -> None:
        self._run.finish(exit_code=1 if failed else 0)
