"""Keys the user set that do nothing in the resolved config: one warning line each.

A key can validate and still have no effect: `run.max_staleness` in a `sync` run, W&B settings with
W&B off, vLLM launch settings when the engine connects to running servers (`engine.urls`).
`no_effect(config)` lists every such key the user set (in the YAML file or with `--set`; a saved
resolved config, which lists every key, carries the list of keys its user set in its first line,
and one saved without that line counts the keys set off their default) with why and what to do;
`preflight` logs them as warnings before a run starts, as vLLM warns about arguments it does not
use. Keys that contradict each other outright are refused by the config's own validation instead
(e.g. `explorer.dynamic_sampling` in an offline run).

Each rule below names the code that makes the key idle; docs/concepts.md has the table. A key read
by `agentscope-rft explore` with the same config (the workflow, task splits, engine and explorer
settings of an offline run, for evaluating its checkpoints) is never reported.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

if TYPE_CHECKING:
    from agentscope_rft.config import RunConfig

logger = logging.getLogger(__name__)

USER_KEYS_HEADER = "# keys set by the user:"
"""First line of a saved resolved config: the keys its user set (the rest are defaults)."""


@dataclass(frozen=True, slots=True)
class NoEffect:
    """A key the user set that does nothing in this config."""

    key: str
    why: str
    fix: str

    @property
    def message(self) -> str:
        return f"config key {self.key} has no effect: {self.why}; {self.fix}"


def set_keys(model: BaseModel, prefix: str = "") -> set[str]:
    """Dotted keys of the values given when `model` was validated (not its defaults), sections
    and list items included (`data.operators.0.reward`).

    Example:
        >>> sorted(set_keys(RunConfig.model_validate({"run": {"steps": 3}, ...})))  # doctest: +SKIP
        ['run.steps', ...]
    """
    keys: set[str] = set()
    for name in model.model_fields_set:
        key, value = prefix + name, getattr(model, name)
        items = list(enumerate(value)) if isinstance(value, list) else []
        if isinstance(value, BaseModel) and value.model_fields_set:
            keys |= set_keys(value, key + ".")
        elif items and all(isinstance(v, BaseModel) for _, v in items):
            for i, item in items:
                keys |= set_keys(item, f"{key}.{i}.") or {f"{key}.{i}"}
        else:
            keys.add(key)
    return keys


def changed_keys(
    model: BaseModel, prefix: str = "", reference: BaseModel | None = None
) -> set[str]:
    """Dotted keys whose value differs from its default: the user's keys of a resolved config
    saved without the list of them (before it was recorded), which lists every key.

    Example:
        >>> changed_keys(RunConfig.model_validate({"run": {"steps": 3}, ...}))  # doctest: +SKIP
        {'run.steps', ...}
    """
    keys: set[str] = set()
    for name, field in type(model).model_fields.items():
        value, key = getattr(model, name), prefix + name
        if reference is not None:
            default = getattr(reference, name)
        else:
            default = field.get_default(call_default_factory=True)
        if isinstance(value, BaseModel):
            same = isinstance(default, BaseModel) and type(default) is type(value)
            inner = changed_keys(value, key + ".", default if same else None)
            keys |= inner or ({key} if not same else set())
        elif isinstance(value, list) and value and all(isinstance(v, BaseModel) for v in value):
            if value != default:
                for i, item in enumerate(value):
                    keys |= changed_keys(item, f"{key}.{i}.") or {f"{key}.{i}"}
        elif value != default:
            keys.add(key)
    return keys


def looks_resolved(data: dict[str, Any], sections: Iterable[str]) -> bool:
    """Whether config data lists (nearly) every section, as a saved resolved config does."""
    names = list(sections)
    return sum(name in data for name in names) >= 0.8 * len(names)


def override_keys(path: list[str], value: Any) -> set[str]:
    """Dotted keys a `--set path=value` sets (`explorer.sampling={top_p: 1}` sets its leaves)."""
    key = ".".join(path)
    if isinstance(value, dict) and value:
        return {k for name, v in value.items() for k in override_keys([*path, str(name)], v)}
    return {key}


def under(keys: Iterable[str], *prefixes: str, but: Iterable[str] = ()) -> list[str]:
    """The keys equal to or below one of `prefixes`, except those equal to or below `but`."""
    skip = tuple(but)

    def below(key: str, prefix: str) -> bool:
        return key == prefix or key.startswith(prefix + ".")

    return sorted(
        k for k in keys if any(below(k, p) for p in prefixes) and not any(below(k, b) for b in skip)
    )


Rule = Callable[["RunConfig", set[str]], list[NoEffect]]


def idle(
    keys: set[str], why: str, fix: str, *prefixes: str, but: Iterable[str] = ()
) -> list[NoEffect]:
    """A `NoEffect` for each of `keys` under `prefixes` (not under `but`)."""
    return [NoEffect(key, why, fix) for key in under(keys, *prefixes, but=but)]


def _staleness(config: RunConfig, keys: set[str]) -> list[NoEffect]:
    # runtime/training.py: `LEAD.get(mode, run.max_staleness)`: sync 0, one_step_off 1; offline
    # runs read no explored samples.
    mode = config.run.mode
    if mode in ("async", "train_only"):
        return []
    why = f"run.mode is {mode!r}, and only async and train_only runs bound staleness by it"
    return idle(keys, why, "remove it, or set run.mode: async", "run.max_staleness")


def _offline_mode(config: RunConfig, keys: set[str]) -> list[NoEffect]:
    # runtime/training.py `_next_batch`: an offline run trains batches of its files; it never
    # takes groups from the buffer (get_timeout) nor explores batches (tasks_per_step), and
    # `explore` reads neither (buffer.replay there is refused by RunConfig).
    if config.run.mode != "offline":
        return []
    why = "run.mode 'offline' trains batches of offline.path and takes no explored groups"
    idle_keys = ("run.get_timeout", "explorer.tasks_per_step")
    return idle(keys, why, "remove it (offline.batch_size sizes the batches)", *idle_keys)


def _validation(config: RunConfig, keys: set[str]) -> list[NoEffect]:
    # runtime/training.py `_evaluate`: the run evaluates only with an explorer and eval_every > 0,
    # on tasks.val (else tasks.eval); `BestCheckpoint.consider` only on the val phase.
    from agentscope_rft.config import EXPLORING_MODES

    tasks, run = config.tasks, config.run
    best = ("run.best_metric", "run.best_mode")
    if config.run.mode not in EXPLORING_MODES:
        why = f"run.mode {run.mode!r} does not explore, so the run never evaluates"
        fix = "remove it (evaluate checkpoints with `agentscope-rft explore --checkpoint`)"
        return idle(keys, why, fix, "run.eval_every", *best)
    out = []
    if tasks.val is None and tasks.eval is None:
        why = "neither tasks.val nor tasks.eval is set, so there is nothing to evaluate"
        out += idle(keys, why, "set tasks.val, or remove it", "run.eval_every")
    if tasks.val is None:
        why = "the best checkpoint is chosen on the validation split, and tasks.val is not set"
        out += idle(keys, why, "set tasks.val and run.eval_every, or remove it", *best)
    elif not run.eval_every:
        why = "run.eval_every is 0, so the run never validates"
        out += idle(keys, why, "set run.eval_every, or remove it", *best)
        why += " and keeps no checkpoints/best (`explore --split val` still reads it)"
        out += idle(keys, why, "set run.eval_every (e.g. 5) to validate", "tasks.val")
    return out


def _splits(config: RunConfig, keys: set[str]) -> list[NoEffect]:
    # preflight and runtime/explore.py: val_limit slices tasks.val, eval_limit tasks.eval;
    # stratify_field shapes the val slice and splits either evaluation's metrics; the eval
    # sampling and group size serve those splits only (training's `_evaluate`, `explore --split
    # val/test`); data/side.py `build_selector`: only the uniform selector shuffles.
    tasks, out = config.tasks, []
    if tasks.val is None:
        out += idle(keys, "tasks.val is not set", "set tasks.val, or remove it", "tasks.val_limit")
    if tasks.eval is None:
        fix = "set tasks.eval, or remove it"
        out += idle(keys, "tasks.eval is not set", fix, "tasks.eval_limit")
    if tasks.val is None and tasks.eval is None:
        why = "neither tasks.val nor tasks.eval is set, so nothing is evaluated"
        evaluation = ("tasks.stratify_field", "explorer.eval_sampling", "explorer.eval_group_size")
        out += idle(keys, why, "set tasks.val, or remove it", *evaluation)
    if config.data.selector.type != "uniform":
        why = f"the {config.data.selector.type} selector (data.selector) picks the task order"
        out += idle(keys, why, "remove it", "tasks.shuffle")
    return out


def _rewards(config: RunConfig, keys: set[str]) -> list[NoEffect]:
    # explorer/trajectory.py `_token_rewards`: gamma only in the `discounted` spread.
    if config.explorer.reward_spread == "discounted":
        return []
    why = f"explorer.reward_spread is {config.explorer.reward_spread!r}, not 'discounted'"
    fix = "set explorer.reward_spread: discounted, or remove it"
    return idle(keys, why, fix, "explorer.reward_gamma")


RL_KEYS = (
    "advantage",
    "policy_loss",
    "loss_agg",
    "loss_agg_horizon",
    "normalize_per_rollout",
    "kl",
    "entropy_coef",
    "tis",
    "filter_zero_variance_groups",
    "critic",
)
"""Algorithm keys only the RL objectives read (algorithms/objective.py `_rl_terms`)."""


def _algorithm(config: RunConfig, keys: set[str]) -> list[NoEffect]:
    # algorithms/objective.py: sft and dpo objectives read none of RL_KEYS; `dpo_objective` reads
    # algorithm.dpo, `sft_rl_mix_objective` algorithm.sft_mix; `value_loss` (needs_critic) the
    # critic (a loss_agg_horizon without seq-mean-token-sum-norm is refused by AlgorithmConfig);
    # the zero-variance filter acts in `drops_zero_variance_groups` (a group baseline) only.
    algo, out = config.algorithm, []
    if not algo.is_rl():
        why = f"algorithm.objective {algo.objective!r} trains without advantages or a policy loss"
        out += idle(keys, why, "remove it", *(f"algorithm.{k}" for k in RL_KEYS))
    else:
        if not algo.needs_critic():
            why = f"advantage {algo.advantage.type!r} has no value head (only gae does)"
            out += idle(keys, why, "remove it", "algorithm.critic")
        if not algo.advantage.uses_group_baseline():
            why = f"advantage {algo.advantage.type!r} has no group baseline to filter groups for"
            out += idle(keys, why, "remove it", "algorithm.filter_zero_variance_groups")
        if algo.tis is not None and config.trainer.old_logprobs == "rollout":
            # objective.py `_rl_terms`: TIS weighs by exp(old - rollout), and with `rollout` the
            # ratio's old log-probs are the engine's own: every weight is exp(0), capped.
            why = (
                "trainer.old_logprobs is 'rollout': the importance ratio already divides by the "
                "engine's log-probs, so every TIS weight exp(old - rollout) is 1 (at most cap)"
            )
            fix = (
                "set trainer.old_logprobs: recompute (TIS then corrects engine and staleness "
                "against the trainer's log-probs before the update), or remove it"
            )
            out += idle(keys, why, fix, "algorithm.tis")
    fix = "remove it, or set algorithm.objective to the one that uses it"
    for objective, section in (("dpo", "algorithm.dpo"), ("sft_rl_mix", "algorithm.sft_mix")):
        if algo.objective != objective:
            why = f"algorithm.objective is {algo.objective!r}, not {objective!r}"
            out += idle(keys, why, fix, section)
    return out


def _offline(config: RunConfig, keys: set[str]) -> list[NoEffect]:
    # runtime/training.py: offline data is read when `uses_offline_data()` (an offline run, or an
    # exploring run's warm-up steps or sft_rl_mix); offline.batch_size sizes offline batches only.
    if config.uses_offline_data():
        return []
    why = (
        f"run.mode {config.run.mode!r} reads no offline data (an exploring run does only with "
        "offline.warmup_steps or algorithm.objective 'sft_rl_mix')"
    )
    fix = "remove it, or set offline.warmup_steps"
    return idle(keys, why, fix, "offline", but=["offline.warmup_steps"])


def _trainer(config: RunConfig, keys: set[str]) -> list[NoEffect]:
    # trainers/common.py `LRSchedule`: the floor applies to linear/cosine decay only;
    # torch_trainer.py: `share_prefix and share_group_prefix`, the meter only with a footprint
    # (`memory_budget_gib`); verl/settings.py: Ray only for more than one rank.
    trainer, out = config.trainer, []
    if trainer.lr_schedule == "constant":
        why = "trainer.lr_schedule is 'constant' (the floor is of linear or cosine decay)"
        fix = "set trainer.lr_schedule: cosine, or remove it"
        out += idle(keys, why, fix, "trainer.min_lr_ratio")
    if trainer.type == "torch":
        if not trainer.share_prefix:
            why = "trainer.share_prefix is false"
            out += idle(keys, why, "remove it", "trainer.share_group_prefix")
        if trainer.memory_budget_gib is None:
            why = "trainer.memory_budget_gib is not set"
            fix = "set a budget, or remove it"
            out += idle(keys, why, fix, "trainer.memory_budget_measured")
    elif trainer.world_size == 1:
        why = "the verl trainer has one rank, which runs in this process without Ray"
        out += idle(keys, why, "remove it", "trainer.ray")
    return out


VLLM_LAUNCH_KEYS = (
    "python",
    "replicas",
    "port",
    "dtype",
    "enforce_eager",
    "kv_cache_space_gib",
    "extra_args",
    "env",
    "startup_timeout",
    "max_restarts",
    "tool_call_parser",
    "max_lora_rank",
    "max_loras",
)
"""vLLM engine keys that only shape the servers the engine starts (engines/vllm.py `launch`)."""


def _engine(config: RunConfig, keys: set[str]) -> list[NoEffect]:
    # engines/vllm.py: with `urls` no server is started (`launch` is unused); the tool parser
    # serves vLLM's chat endpoint (chat_rendering vllm), the prompt builder ours; the LoRA limits
    # are server flags of `enable_lora`. engines/embedded.py: the prefix cache's size and block
    # only with `prefix_caching`.
    engine = config.engine
    if engine.type == "embedded":
        if engine.prefix_caching:
            return []
        prefix = ("engine.prefix_cache_gib", "engine.prefix_block_tokens")
        return idle(keys, "engine.prefix_caching is false", "remove it", *prefix)
    if engine.urls:
        why = "engine.urls connects to running vLLM servers; the engine starts none"
        fix = "set it on those servers, or remove engine.urls to start them here"
        return idle(keys, why, fix, *(f"engine.{k}" for k in VLLM_LAUNCH_KEYS))
    out = []
    if engine.chat_rendering != "vllm":
        why = "engine.chat_rendering is 'engine': our template and tool parser render the calls"
        fix = "remove it, or set engine.chat_rendering: vllm"
        out += idle(keys, why, fix, "engine.tool_call_parser")
    else:
        why = "engine.chat_rendering is 'vllm': vLLM renders each prompt from the messages"
        out += idle(keys, why, "remove it", "engine.reuse_prompt_tokens")
    if not engine.enable_lora:
        fix = "set engine.enable_lora: true (with trainer.lora), or remove it"
        lora = ("engine.max_lora_rank", "engine.max_loras")
        out += idle(keys, "engine.enable_lora is false", fix, *lora)
    return out


def _monitor(config: RunConfig, keys: set[str]) -> list[NoEffect]:
    # monitor/monitor.py: the W&B and MLflow sinks exist only when enabled; the step line and
    # progress lines only with `console`.
    monitor, out = config.monitor, []
    for name in ("wandb", "mlflow"):
        if not getattr(monitor, name).enabled:
            section = f"monitor.{name}"
            fix = f"set {section}.enabled: true, or remove it"
            why = f"{section}.enabled is false"
            out += idle(keys, why, fix, section, but=[f"{section}.enabled"])
    if not monitor.console:
        console = ("monitor.console_metrics", "monitor.progress_interval_s")
        out += idle(keys, "monitor.console is false", "remove it", *console)
    return out


def _health(config: RunConfig, keys: set[str]) -> list[NoEffect]:
    # health/config.py `named_rules`: nothing when disabled, no rule whose action is `off`;
    # runtime/training.py rolls back only when a rule's action is `rollback`.
    health = config.health
    if not health.enabled:
        fix = "set health.enabled: true, or remove it"
        return idle(keys, "health.enabled is false", fix, "health", but=["health.enabled"])
    out = []
    if config.run.mode == "offline":  # health/watcher.py `policy_from`: no RL step to judge
        why = "run.mode 'offline' has no RL step: of the health rules only non_finite judges it"
        policy = ("health.rules", "health.custom")
        out += idle(keys, why, "remove it", *policy, but=["health.rules.non_finite"])
    if not health.rolls_back():
        why = "no health rule that is on has action 'rollback'"
        out += idle(keys, why, "give a rule `action: rollback`, or remove it", "health.rollback")
    rules = [
        (f"health.rules.{n}", getattr(health.rules, n)) for n in type(health.rules).model_fields
    ]
    rules += [(f"health.custom.{i}", rule) for i, rule in enumerate(health.custom)]
    for prefix, rule in rules:
        if rule.action == "off":
            why = f"{prefix}.action is 'off'"
            out += idle(keys, why, "remove it", prefix, but=[f"{prefix}.action"])
    return out


def _data(config: RunConfig, keys: set[str]) -> list[NoEffect]:
    # data/operators.py: a format check's reward only with `action: reward`; data/side.py runs
    # every offline dedup across the whole file (`scope: batch`).
    out = []
    for field in ("operators", "offline_operators"):
        for i, op in enumerate(getattr(config.data, field)):
            prefix = f"data.{field}.{i}"
            if op.type == "format" and op.action != "reward":
                why = f"{prefix}.action is {op.action!r}: failing episodes are dropped"
                out += idle(keys, why, "remove it", f"{prefix}.reward")
            if op.type == "dedup" and field == "offline_operators":
                why = "offline data is always deduplicated across the whole file"
                out += idle(keys, why, "remove it", f"{prefix}.scope")
    return out


RULES: tuple[Rule, ...] = (
    _staleness,
    _offline_mode,
    _validation,
    _splits,
    _rewards,
    _algorithm,
    _offline,
    _trainer,
    _engine,
    _monitor,
    _health,
    _data,
)
"""Every condition under which a key does nothing; a key is reported by its first rule."""


def user_keys(config: RunConfig) -> set[str]:
    """The keys the user set: recorded by `load_config` (a saved config's list plus `--set`s),
    else the values given when the config was validated."""
    recorded = config.user_keys
    return set(recorded) if recorded is not None else set_keys(config)


def no_effect(config: RunConfig) -> list[NoEffect]:
    """The keys the user set that do nothing in `config`, one entry each.

    Example:
        >>> cfg = load_config(None, ["workflow=app.py:run", "tasks.train=t.jsonl",
        ...                          "run.max_staleness=4"])  # doctest: +SKIP
        >>> [n.key for n in no_effect(cfg)]  # doctest: +SKIP
        ['run.max_staleness']
    """
    keys = user_keys(config)
    found: dict[str, NoEffect] = {}
    for rule in RULES:
        for item in rule(config, keys):
            found.setdefault(item.key, item)
    return sorted(found.values(), key=lambda item: item.key)


def warn_no_effect(config: RunConfig) -> list[NoEffect]:
    """Log one warning per key the user set that does nothing; returns them."""
    found = no_effect(config)
    for item in found:
        logger.warning("%s", item.message)
    return found
