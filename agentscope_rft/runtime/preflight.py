"""Checks before any work: everything a config names is verified before a model loads.

A run that would fail on a bad workflow path, an unreadable task file or a missing model must
fail in seconds, not after the engine has loaded and the gateway has started. `preflight` checks,
cheapest first: the workflow and judge (import and signature), the task files (parsed), offline
data, the model path, the engine (a vLLM interpreter, a CUDA device) and the trainer's device;
what it loads (workflow, tasks) is handed to the run so nothing is read twice.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from agentscope_rft.api import Workflow, load_workflow
from agentscope_rft.config import EXPLORING_MODES, ConfigError, RunConfig
from agentscope_rft.explorer.tasks import Task, TaskSetError, load_tasks

if TYPE_CHECKING:
    from agentscope_rft.config import EngineConfig, TrainerConfig

logger = logging.getLogger(__name__)


@dataclass
class Checked:
    """What the checks loaded, for the run to use."""

    model_path: Path
    workflow: Workflow | None = None
    train_tasks: list[Task] = field(default_factory=list)
    eval_tasks: list[Task] = field(default_factory=list)


def _check_cuda(device: str, where: str) -> None:
    if not device.startswith("cuda"):
        return
    import torch

    if not torch.cuda.is_available():
        raise ConfigError(
            f"{where}: {device!r} asks for CUDA, but no CUDA device is visible; use `auto` or `cpu`"
        )


def _check_engine(engine: EngineConfig, on_ray: bool) -> None:
    if engine.type == "embedded":
        _check_cuda(engine.device, "engine.device")
        return
    # Servers to start here: the vLLM interpreter must exist. On Ray they start on the cluster's
    # nodes, whose host actors check their own interpreter (runtime/ray/engines.py).
    if not engine.urls and not on_ray:
        from agentscope_rft.engines.vllm_env import VLLMNotFoundError, find_vllm_python

        try:
            find_vllm_python(engine.python)
        except VLLMNotFoundError as exc:
            raise ConfigError(f"engine.python: {exc}") from exc
    for url in engine.urls:
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"engine.urls: {url!r} is not an http(s) URL")


def _check_trainer(trainer: TrainerConfig) -> None:
    if trainer.type == "torch":
        _check_cuda(trainer.device, "trainer.device")
        return
    import importlib.util

    if importlib.util.find_spec("verl") is None:
        raise ConfigError("trainer.type 'verl' needs verl: pip install 'agentscope-rft[verl]'")
    if trainer.device == "cuda":
        _check_cuda("cuda", "trainer.device")


def preflight(config: RunConfig) -> Checked:
    """Check everything the config names that can be checked without loading a model.

    Raises:
        WorkflowError, TaskSetError, ConfigError, ModelNotFoundError: naming the key and the fix.

    Example:
        >>> checked = preflight(load_config("run.yaml"))  # doctest: +SKIP
        >>> len(checked.train_tasks)  # doctest: +SKIP
        64
    """
    mode = config.run.mode
    workflow, train, evals = None, [], []
    if mode in EXPLORING_MODES:
        workflow = load_workflow(config.workflow or "", config.judge)
        for key, value in (("tasks.train", config.tasks.train), ("tasks.eval", config.tasks.eval)):
            if value is not None and not Path(value).is_file():  # before reading any (slow)
                raise TaskSetError(f"task file {value} does not exist ({key})")
        required = config.tasks.required_fields
        train = load_tasks(
            config.tasks.train or "", id_field=config.tasks.id_field, required_fields=required
        )
        if config.tasks.eval:
            evals = load_tasks(
                config.tasks.eval, id_field=config.tasks.id_field, required_fields=required
            )[: config.tasks.eval_limit]
        from agentscope_rft.data.side import check_data

        check_data(config.data, train, seed=config.run.seed)
        if len(train) < config.explorer.tasks_per_step:
            logger.info(
                "tasks.train has %d tasks, fewer than explorer.tasks_per_step=%d: tasks repeat "
                "within a step",
                len(train),
                config.explorer.tasks_per_step,
            )
    if config.uses_offline_data() and not Path(config.offline.path or "").is_file():
        raise TaskSetError(f"offline.path {config.offline.path} does not exist")
    if config.model.chat_template is not None:
        from agentscope_rft.engines.factory import read_chat_template

        try:
            read_chat_template(config.model.chat_template)
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
    if mode not in ("offline", "train_only"):
        _check_engine(config.engine, on_ray=config.runtime.type == "ray")
    _check_trainer(config.trainer)
    from agentscope_rft.models import resolve_model  # imports transformers: after the cheap checks

    model_path = resolve_model(config.model.name_or_path)
    return Checked(model_path=model_path, workflow=workflow, train_tasks=train, eval_tasks=evals)
