"""Checks before any work: everything a config names is verified before a model loads.

First, every key the user set that has no effect in this config is logged as a warning, one line
each (`config_effect`). A run that would fail on a bad workflow path, an unreadable task file or
a missing model must fail in seconds, not after the engine has loaded and the gateway has
started. `preflight` checks, cheapest first: the workflow and judge (import and signature), the
task files (parsed), that the offline data exists, the engine (a vLLM interpreter, a CUDA
device), the GPU placement (which also limits this process to the trainer's GPUs), the trainer's
device, the model folder (a causal LM whose embedding covers its tokenizer), and last the
offline data itself (every line parsed and rendered with the model's tokenizer); what it loads
(workflow, tasks, offline data) is handed to the run so nothing is read twice.
"""

from __future__ import annotations

import json
import logging
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from agentscope_rft.api import Workflow, load_workflow
from agentscope_rft.config import EXPLORING_MODES, ConfigError, RunConfig
from agentscope_rft.explorer.tasks import Task, TaskSetError, load_tasks, stratified_slice
from agentscope_rft.runtime.gpus import PlacementError, check_placement, restrict_trainer_gpus

if TYPE_CHECKING:
    from agentscope_rft.config import EngineConfig, TrainerConfig
    from agentscope_rft.trainers.config import LoRAConfig
    from agentscope_rft.types import Sample

logger = logging.getLogger(__name__)


@dataclass
class Checked:
    """What the checks loaded, for the run to use."""

    model_path: Path
    workflow: Workflow | None = None
    train_tasks: list[Task] = field(default_factory=list)
    eval_tasks: list[Task] = field(default_factory=list)
    """The test split (`tasks.eval`), `eval_limit` applied."""
    val_tasks: list[Task] = field(default_factory=list)
    """The validation split (`tasks.val`), `val_limit` applied."""
    offline_units: dict[str, list[Sample]] | None = None
    """`offline.path` read and rendered (`load_offline_units`), when the run trains on it."""


def _check_health_rules(config: RunConfig) -> None:
    """Import the user's health rules now, not after the model and engine have loaded."""
    from agentscope_rft.health.config import CustomRule
    from agentscope_rft.health.rules import rule_function

    for name, settings in config.health.named_rules():
        if isinstance(settings, CustomRule):
            try:
                rule_function(name, settings)
            except (TypeError, ValueError) as exc:  # WorkflowError: a bad path, module or name
                raise ConfigError(f"health.custom: {exc}") from exc


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
    from agentscope_rft.engines.vllm_server import url_problem

    for url in engine.urls:  # one that waiting cannot bring fails before the model loads
        problem = url_problem(url, resolve=not on_ray)  # a cluster's names may not resolve here
        if problem is not None:
            raise ConfigError(f"engine.urls: {problem}; fix engine.urls")


def bind_problem(host: str, port: int) -> str | None:
    """Why a server could not listen on `host:port` (a port in use, a host that is not this
    machine's), or None. A gateway starts after its engine has loaded (minutes with vLLM): this
    finds the problem first.

    Example:
        >>> bind_problem("127.0.0.1", 0) is None
        True
    """
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds
            probe.bind(address)
    except OSError as exc:
        return str(exc.strerror or exc)
    return None


def _check_port_free(host: str, port: int) -> None:
    problem = bind_problem(host, port)
    if problem is not None:
        raise ConfigError(
            f"gateway: cannot listen on {host}:{port} ({problem}); set gateway.port "
            "to a free port (0, the default, picks one) and gateway.host to an interface of this "
            "machine (127.0.0.1, the default)"
        )


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
        WorkflowError, TaskSetError, ConfigError, ModelNotFoundError, OfflineDataError,
            ReviewDataError: naming the key (or file and line) and the fix.

    Example:
        >>> checked = preflight(load_config("run.yaml"))  # doctest: +SKIP
        >>> len(checked.train_tasks)  # doctest: +SKIP
        64
    """
    from agentscope_rft.config_effect import warn_no_effect

    warn_no_effect(config)  # keys the user set that do nothing here: one line each
    _check_health_rules(config)
    mode = config.run.mode
    workflow, train, evals, vals = None, [], [], []
    if mode in EXPLORING_MODES:
        _check_groups(config)
        workflow = load_workflow(config.workflow or "", config.judge)
        splits = {"train": config.tasks.train, "val": config.tasks.val, "eval": config.tasks.eval}
        for key, value in splits.items():
            if value is not None and not Path(value).is_file():  # before reading any (slow)
                what = "is a folder, not a file" if Path(value).is_dir() else "does not exist"
                raise TaskSetError(
                    f"task file {value} {what} (tasks.{key}): correct the path, or give the file "
                    f"with --set tasks.{key}=PATH (config paths are relative to its folder)"
                )
        required = config.tasks.required_fields
        train = load_tasks(
            config.tasks.train or "", id_field=config.tasks.id_field, required_fields=required
        )
        if config.tasks.eval:
            evals = stratified_slice(  # spread evenly: a file ordered by dataset keeps them all
                load_tasks(
                    config.tasks.eval, id_field=config.tasks.id_field, required_fields=required
                ),
                config.tasks.eval_limit,
                None,
            )
        if config.tasks.val:
            vals = stratified_slice(
                load_tasks(
                    config.tasks.val, id_field=config.tasks.id_field, required_fields=required
                ),
                config.tasks.val_limit,
                config.tasks.stratify_field,
            )
            if config.run.eval_every:
                from agentscope_rft.runtime.best import best_metric_problem

                problem = best_metric_problem(
                    config.run.best_metric, config.tasks.stratify_field, [t.data for t in vals]
                )
                if problem is not None:
                    raise ConfigError(problem)
        elif config.tasks.eval and config.run.eval_every:
            logger.warning(
                "tasks.val not set: evaluating on the test split (tasks.eval) every %d steps for "
                "monitoring only; no best checkpoint is kept. Set tasks.val to a validation file "
                "to choose checkpoints without looking at the test split",
                config.run.eval_every,
            )
        _warn_overlap(train, vals, evals, config.tasks.id_field)
        from agentscope_rft.data.side import check_data

        check_data(config.data, train, seed=config.run.seed)
        if len(train) < config.explorer.tasks_per_step:
            logger.info(
                "tasks.train has %d tasks, fewer than explorer.tasks_per_step=%d: tasks repeat "
                "within a step",
                len(train),
                config.explorer.tasks_per_step,
            )
    if config.uses_offline_data():
        _check_offline_path(config)
    from agentscope_rft.data.side import check_judges

    check_judges(config.data)
    if config.buffer.replay is not None:  # a custom priority imports now, not after the model
        try:
            config.buffer.replay.priority_fn()
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
    if config.model.chat_template is not None:
        from agentscope_rft.engines.factory import read_chat_template

        try:
            read_chat_template(config.model.chat_template)
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
    if mode not in ("offline", "train_only"):
        _check_engine(config.engine, on_ray=config.runtime.type == "ray")
    if mode in EXPLORING_MODES:
        _check_port_free(config.gateway.host, config.gateway.port)
    try:
        check_placement(config)
    except PlacementError as exc:
        raise ConfigError(str(exc)) from exc
    restrict_trainer_gpus(config.gpus)  # before anything initialises CUDA
    _check_trainer(config.trainer)
    # imports transformers: after the cheap checks
    from agentscope_rft.models import check_model_folder, resolve_model

    model_path = resolve_model(config.model.name_or_path)
    check_model_folder(model_path)
    _check_lora_targets(config.trainer.lora, model_path)
    _check_context_window(config, model_path)
    offline_units = None
    if config.uses_offline_data():  # every line parsed and rendered: a bad one fails here
        from agentscope_rft.runtime.offline import load_offline_units

        offline_units = load_offline_units(config)
    return Checked(
        model_path=model_path,
        workflow=workflow,
        train_tasks=train,
        eval_tasks=evals,
        val_tasks=vals,
        offline_units=offline_units,
    )


def _check_context_window(config: RunConfig, model_path: Path) -> None:
    """`model.max_model_len` over the model's positions: vLLM refuses it after its start-up (tens
    of seconds), the embedded engine would shorten it; both are said now instead."""
    wanted = config.model.max_model_len
    if wanted is None or "VLLM_ALLOW_LONG_MAX_MODEL_LEN" in getattr(config.engine, "env", {}):
        return
    try:
        model_config = json.loads((model_path / "config.json").read_text())
    except (OSError, ValueError):
        return  # the engine reports an unreadable model folder with its own error
    text = model_config.get("text_config") or model_config
    limit = text.get("max_position_embeddings")
    if not isinstance(limit, int) or text.get("rope_scaling") or wanted <= limit:
        return  # with rope scaling the engines derive a longer window themselves
    raise ConfigError(
        f"model.max_model_len {wanted} is longer than the model's context window "
        f"(max_position_embeddings {limit} in {model_path / 'config.json'}); set it to at most "
        f"{limit}, or leave it unset to use {limit}"
    )


def _check_lora_targets(lora: LoRAConfig | None, model_path: Path) -> None:
    """Every name in `trainer.lora.target_modules` must name layers of the model: peft refused
    a list matching none with a traceback when the trainer started, and ignored a misspelt name
    beside a matching one (that layer silently not trained)."""
    if lora is None or isinstance(lora.target_modules, str):
        return
    from accelerate import init_empty_weights
    from torch import nn
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.pytorch_utils import Conv1D

    with init_empty_weights():
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(model_path)))
    names = [name for name, _ in model.named_modules()]
    missing = [
        target
        for target in lora.target_modules
        if not any(name == target or name.endswith("." + target) for name in names)
    ]
    if missing:
        linear = sorted(
            {
                name.rsplit(".", 1)[-1]
                for name, module in model.named_modules()
                if isinstance(module, nn.Linear | Conv1D) and name != "lm_head"
            }
        )
        raise ConfigError(
            f"trainer.lora.target_modules names {', '.join(missing)}, which the model in "
            f"{model_path} does not have; its linear layers are {', '.join(linear)} (or set "
            "`all-linear`)"
        )


def _check_groups(config: RunConfig) -> None:
    """A group-baseline advantage with groups of one would train nothing, step after step."""
    algorithm = config.algorithm
    if (
        config.explorer.group_size == 1
        and algorithm.objective == "rl"
        and algorithm.drops_zero_variance_groups()
    ):
        raise ConfigError(
            f"explorer.group_size 1 with algorithm.advantage {algorithm.advantage.type!r} trains "
            "nothing: its baseline compares the episodes of a task, so every group of one is "
            "dropped as equal-reward; set explorer.group_size to 2 or more (e.g. 8), or use an "
            "advantage without a group baseline (reinforce_plus_plus)"
        )


def _warn_overlap(
    train: list[Task], vals: list[Task], tests: list[Task], id_field: str | list[str]
) -> None:
    """Say when a held-out split shares tasks (by id or content) with a split it must not:
    validation with train or test, test with train."""
    id_fields = {id_field} if isinstance(id_field, str) else set(id_field)

    def keys(task: Task) -> set[str]:
        content = repr(sorted((k, repr(v)) for k, v in task.data.items() if k not in id_fields))
        return {f"id:{task.id}", content}

    if not vals and not tests:
        return
    train_keys, val_keys, test_keys = (
        [keys(task) for task in split] for split in (train, vals, tests)
    )
    flatter = "validation scores then flatter the policy"
    pairs = (
        ("tasks.val", val_keys, "tasks.train", train_keys, flatter),
        ("tasks.val", val_keys, "tasks.eval (test)", test_keys, flatter),
        (
            "tasks.eval (test)",
            test_keys,
            "tasks.train",
            train_keys,
            "test scores then count tasks the policy trained on; remove them from one file",
        ),
    )
    for name, split_keys, other_name, other, effect in pairs:
        if not split_keys or not other:
            continue
        other_keys = set().union(*other)
        shared = sum(bool(k & other_keys) for k in split_keys)  # a task once, by either key
        if shared:
            logger.warning(
                "%s shares %d task(s) (same id or content) with %s: %s",
                name,
                shared,
                other_name,
                effect,
            )


def _check_offline_path(config: RunConfig) -> None:
    path = Path(config.offline.path or "")
    if config.offline.format == "review":
        if not (path / "reviews.jsonl").is_file():
            raise TaskSetError(
                f"offline.path {path} has no reviews.jsonl: with offline.format 'review' it is "
                "a run folder reviewed in `agentscope-rft dashboard`"
            )
    elif not path.is_file():
        raise TaskSetError(f"offline.path {path} does not exist")
