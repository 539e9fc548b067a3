"""Run configuration: one pydantic model per component, loaded from short YAML.

Defaults live only here. Unknown keys are errors with a did-you-mean suggestion.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from agentscope_rft.algorithms.config import AlgorithmConfig
from agentscope_rft.buffer.config import BufferConfig
from agentscope_rft.buffer.replay import replay_count
from agentscope_rft.config_base import Section
from agentscope_rft.config_errors import (
    ConfigError,
    config_file_problem,
    read_config_file,
    top_level_problem,
    validation_message,
)
from agentscope_rft.config_overrides import (  # noqa: F401  (SPLIT_ALIASES re-exported)
    SPLIT_ALIASES,
    apply_overrides,
    parse_override,
)
from agentscope_rft.config_paths import (  # noqa: F401  (relative_file_keys re-exported)
    relative_file_keys,
    resolve_file_keys,
)
from agentscope_rft.data.config import JUDGE_TYPES, DataConfig
from agentscope_rft.engines.config import (  # noqa: F401  (re-exported)
    EmbeddedEngineConfig,
    EngineConfig,
    VLLMEngineConfig,
)
from agentscope_rft.explorer.agents import AgentsConfig
from agentscope_rft.health.config import HealthConfig
from agentscope_rft.monitor.config import MonitorConfig
from agentscope_rft.runtime.config import RuntimeConfig
from agentscope_rft.runtime.gpus import GpuPlacement
from agentscope_rft.trainers.config import (  # noqa: F401  (re-exported)
    LoRAConfig,
    TorchTrainerConfig,
    TrainerConfig,
    TrainerSettings,
    VerlRayConfig,
    VerlTrainerConfig,
)

logger = logging.getLogger(__name__)


class ModelConfig(Section):
    """The policy model."""

    name_or_path: str = "smollm2-135m-instruct"
    """`smollm2-135m-instruct` (embedded default), `tiny-random` (tests), or a local HF folder of
    a causal LM transformers ships the code for (a folder's own code, `auto_map`, is never run)."""
    chat_template: str | None = None
    """A Jinja chat template (text or a path to a .jinja file) replacing the tokenizer's; the run's
    checkpoints (and so `agentscope-rft export`) carry it as their chat template."""
    max_model_len: int | None = Field(default=None, ge=16)
    """Context window in tokens; default and upper bound: the model's `max_position_embeddings`
    (checked before anything starts)."""


class GatewayConfig(Section):
    """The OpenAI-compatible endpoint the app's model calls go to."""

    host: str = "127.0.0.1"
    """Interface to bind; loopback by default."""
    port: int = Field(default=0, ge=0, le=65535)
    """Port; 0 picks a free one."""
    api_key: str | None = "auto"
    """`auto`: a random per-run key; a string: that key; null: no authentication."""
    runtime_state: Literal["keep", "freeze", "drop"] = "keep"
    """The `<system-reminder>` with the current time (and other runtime state) that an
    AgentScope `Agent` injects into its requests by default, rewritten by the gateway before the
    prompt is rendered (and recorded): `keep` as sent; `freeze` the time replaced by a fixed one
    (prompts repeat, so episodes are reproducible and the prefix cache hits); `drop` the
    reminder removed (a small model stops copying it into its replies). No edit to the app."""


class TasksConfig(Section):
    """Where tasks come from: JSONL, JSON, Parquet or CSV files (one task per row); paths in a
    config file are relative to its folder."""

    train: str | None = None
    """Training tasks (required unless `run.mode` is `offline` or `train_only`)."""
    val: str | None = None
    """Validation tasks (key `validation` also works): explored greedily every `run.eval_every`
    steps; the run keeps its best checkpoint by them (`run.best_metric`). Every choice a run makes
    (best checkpoint, health rules) uses this split, never the test split."""
    eval: str | None = None
    """Test tasks (key `test` also works): never used by the run for any choice; evaluate a
    checkpoint on them with `agentscope-rft explore --split test --checkpoint best`. Without
    `val`, the run evaluates on them every `run.eval_every` steps for monitoring only (no best
    checkpoint is kept), and says so."""
    id_field: str | list[Annotated[str, Field(min_length=1)]] = Field(default="id", min_length=1)
    """Column with each task's id (row numbers when missing), or several joined with `/`:
    `[data_source, id]` gives `nq/train_0` in a file of datasets that each number from 0."""
    required_fields: list[str] = Field(default_factory=list)
    """Columns every task must have (checked when loading, with the row named)."""
    shuffle: bool = True
    """Shuffle training tasks every epoch."""
    eval_limit: int | None = Field(default=None, ge=1)
    """Evaluate on N test tasks spread evenly over the file (all of them in `explore`)."""
    val_limit: int | None = Field(default=None, ge=1)
    """Evaluate on a slice of N validation tasks: stratified by `stratify_field` when set (each
    value keeps its share, at least one task each), else spread evenly over the file."""
    stratify_field: str | None = None
    """Task field whose values the `val_limit` slice keeps in proportion (e.g. a question type)."""

    @model_validator(mode="before")
    @classmethod
    def _split_aliases(cls, data: Any) -> Any:
        """`test` means `eval`, `validation` means `val` (one of each pair at most)."""
        if isinstance(data, dict):
            for alias, name in (("test", "eval"), ("validation", "val")):
                if alias in data:
                    if name in data:
                        raise ValueError(
                            f"tasks.{alias} and tasks.{name} name the same split: keep one"
                        )
                    data = {**{k: v for k, v in data.items() if k != alias}, name: data[alias]}
        return data


class SamplingConfig(Section):
    """Sampling forced on the workflow's model calls (null keeps what the app asks for)."""

    temperature: float | None = Field(default=1.0, ge=0, le=2)
    """Sampling temperature (the trainer divides logits by the same value)."""
    top_p: float | None = Field(default=1.0, gt=0, le=1)
    """Nucleus sampling; 1 is off."""
    top_k: int | None = -1
    """-1: off. Keep top_p 1 and top_k off when training: the trainer cannot reproduce
    truncated distributions, so importance ratios would be biased."""
    max_tokens: int | None = Field(default=None, ge=1)
    """Completion length limit per call (null: the app's own, else the context left)."""


class EvalSamplingConfig(SamplingConfig):
    """Sampling forced on evaluation episodes (validation, test, `explore`); greedy by default.

    Greedy unless `temperature` is given, also when only other keys (`max_tokens`) are."""

    temperature: float | None = Field(default=0.0, ge=0, le=2)
    """Sampling temperature (0: greedy)."""


class DynamicSamplingConfig(Section):
    """Dynamic sampling (DAPO): refill a step's batch with groups whose rewards differ.

    Under a group baseline (GRPO, RLOO, ...) a task whose episodes all got the same reward
    trains nothing. With this on, a step whose first batch of `tasks_per_step` tasks has fewer
    groups with unequal rewards explores further tasks (about as many as are missing, scaled by
    the share of useful groups seen so far, at most `tasks_per_step` at a time) until it has
    `tasks_per_step` such groups or has explored `max_batches` batches. The equal-reward groups
    are left out of the buffer; the step trains on the others."""

    max_batches: int = Field(default=3, ge=2)
    """Most batches of tasks explored for one step (the first included): it bounds the extra
    exploration of a step whose tasks are all solved, or all failed."""


class ExplorerConfig(Section):
    """How episodes are run."""

    group_size: int = Field(default=8, ge=1)
    """Episodes per task (the GRPO group)."""
    tasks_per_step: int = Field(default=8, ge=1)
    """Tasks explored per training step."""
    max_concurrency: int = Field(default=32, ge=1)
    """Episodes running at once."""
    episode_timeout: float = Field(default=300.0, gt=0)
    """Seconds an episode (its judge included) may run. At the deadline its rollout is closed
    (model calls in flight are aborted, new ones refused), the episode is cancelled and recorded
    as timed out."""
    late_call_grace: float = Field(default=2.0, ge=0)
    """Seconds model calls still in flight when an episode returns may take to finish (they are
    then aborted); both are counted as `episode/late_calls` and `episode/aborted_calls`."""
    max_tokens_per_call: int | None = Field(default=None, ge=1)
    """Cap on the completion tokens of every episode call, also when the app sets no `max_tokens`
    (null: a quarter of the context window, or `sampling.max_tokens` if that is larger)."""
    max_retries: int = Field(default=1, ge=0)
    """Retries of an episode that raised or timed out (a fresh rollout each time)."""
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    eval_sampling: EvalSamplingConfig = Field(default_factory=EvalSamplingConfig)
    """Sampling for evaluation episodes (greedy by default)."""
    eval_group_size: int = Field(default=1, ge=1)
    """Episodes per evaluation task."""
    stream: bool = False
    """Whether the injected model streams (AgentScope's default is True; off is faster)."""
    reward_spread: Literal["outcome", "last_call", "each_call", "discounted"] = "outcome"
    """Where the episode reward goes: each sample's outcome reward, or token rewards at the end
    of the last call / every call / every call discounted by `reward_gamma`."""
    reward_gamma: float = Field(default=1.0, ge=0, le=1)
    """Discount for `reward_spread: discounted` (per call from the end)."""
    success_threshold: float = 1.0
    """An episode succeeds when its reward reaches this (unless the Reward says otherwise)."""
    max_sample_length: int | None = Field(default=None, ge=16)
    """Longest training sample: longer merges split into several samples."""
    context_overflow_reward: float = 0.0
    """Reward of an episode whose conversation outgrew the context window: it is recorded as
    `truncated` and its calls are trained with this reward (not failed, not retried)."""
    seed: int | None = 0
    """Each training call without a seed gets one derived from this, its rollout and call
    number, so exploration is reproducible (null: unseeded). Follows the sweep seed of
    `--seeds` unless set."""
    agents: AgentsConfig = Field(default_factory=AgentsConfig)
    """Which agents of a multi-agent app train, e.g. `{skip: [critic]}` or `{train: [solver]}`
    (all agents' calls are served and recorded either way); their helper calls (context
    summaries, memory lookups, ...) only with their kind in `helpers`, e.g. `[compress]`."""
    dynamic_sampling: DynamicSamplingConfig | None = None
    """Refill each step with groups whose rewards differ (DAPO's dynamic sampling), e.g.
    `{max_batches: 3}`; null: off (one batch per step; its equal-reward groups are dropped by
    the trainer). Needs a group-baseline advantage with `algorithm.filter_zero_variance_groups`."""


class OfflineConfig(Section):
    """Training data from files: all of `run.mode: offline` (SFT or DPO), or demonstrations in an
    exploring run (`warmup_steps`, `algorithm.objective: sft_rl_mix`)."""

    path: str | None = None
    """Chat JSONL (`{"messages": [...]}`, or TRL's `{"prompt", "completion"}`) for SFT,
    `{"prompt", "chosen", "rejected"}` for DPO, or a run folder whose dashboard reviews to train
    on (format `review`)."""
    format: Literal["sft", "dpo", "review"] = "sft"
    """`sft`: chat JSONL; `dpo`: prompt/chosen/rejected JSONL; `review`: the human reviews of
    the run folder at `path` (docs/dashboard.md): objective `sft` trains its corrections, `dpo`
    its preferences and corrections as pairs, `rl` its rated groups with the reviewers'
    rewards; an exploring run's demonstrations are its corrections."""
    batch_size: int = Field(default=8, ge=1)
    """Samples (SFT), pairs (DPO) or rated groups (review, rl) per step (all, when fewer)."""
    warmup_steps: int = Field(default=0, ge=0)
    """Exploring modes: train the run's first N steps on `offline.path` (SFT demonstrations,
    objective `sft`, `batch_size` per step) before it starts exploring: a warm start for a model
    that never succeeds on its own. `run.steps` counts them. Torch trainer."""


class RunSettings(Section):
    """The run as a whole."""

    name: str | None = None
    """Run name, a folder inside runs/ (`quickstart`, `sweeps/lr-high`); default: the config
    file's name."""
    dir: str | None = None
    """Run folder; default `runs/<name>`."""
    steps: int = Field(default=20, ge=1)
    """Training steps."""
    mode: Literal["sync", "one_step_off", "async", "offline", "train_only"] = "sync"
    """`sync`: explore then train, on-policy. `one_step_off`: the explorer runs one batch ahead.
    `async`: it runs up to `max_staleness` batches ahead. `offline`: SFT/DPO from files.
    `train_only`: train from a durable buffer that other processes fill."""
    max_staleness: int = Field(default=2, ge=0)
    """async and train_only: drop samples from policies older than this many versions (in
    train_only, the version of the weights the process filling the buffer explored with)."""
    seed: int = 0
    """Seed of task order, trainer initialization and mini-batch order (`--seeds` sets it per
    seed: see seeds.md)."""
    checkpoint_every: int = Field(default=0, ge=0)
    """Save a checkpoint every N steps (0: only at the end)."""
    keep_checkpoints: int = Field(default=2, ge=1)
    """Checkpoints kept (the oldest are deleted)."""
    eval_every: int = Field(default=0, ge=0)
    """Evaluate on `tasks.val` every N steps and after the last (0: never; also before the first
    step if set). Without `tasks.val`: on `tasks.eval`, for monitoring only."""
    best_metric: str | list[str] = "val/reward/mean"
    """The validation metric the run keeps `checkpoints/best` by: `val/<metric>` of the
    validation phase (e.g. `val/success_rate`), or a list whose mean is the criterion (e.g. the
    per-stratum rewards `val/reward/by_<tasks.stratify_field>/<value>` of the strata that count)."""
    best_mode: Literal["max", "min"] = "max"
    """Whether a higher (`max`) or lower `best_metric` is better."""
    overwrite: bool = False
    """Replace an existing run folder, `explore-*` results included (otherwise a folder holding
    a run is an error; `explore` results alone stay beside the new run)."""
    get_timeout: float = Field(default=3600.0, gt=0)
    """Seconds the trainer waits for samples before failing with what it waits for."""
    allocator: str = "glibc"
    """The process's memory allocator (Linux): `glibc` (the C library's, as the environment sets
    it), `glibc-compact` (glibc returning every block above 64 KiB at once: low peak, but each
    large tensor's pages mapped afresh), `jemalloc` (Ray's wheel bundles one, else the system's
    `libjemalloc.so.2`; an error names the fix where none is found), `tcmalloc` (gperftools'
    `libtcmalloc_minimal.so.4`, e.g. `apt install libtcmalloc-minimal4`; `scripts/setup.sh`
    installs it where it runs as root with apt), `auto` (tcmalloc where found, else jemalloc,
    else glibc) or a path to an allocator library. The `agentscope-rft` command restarts
    itself with the library in `LD_PRELOAD` (its child processes keep their environment); a run
    started from Python says how in its error. On the quickstart with
    `trainer.memory_budget_gib: 2.8` and bf16 AdamW moments tcmalloc peaks at 3.80 GB at 1.03x
    glibc's wall time (jemalloc 3.47 GB at 1.18x, glibc-compact 1.28x); the quickstart's config
    ships `auto`; glibc stays the default as the one always present (docs/benchmarks.md)."""
    deterministic: bool = False
    """Two runs with one seed give the same metrics and weights (wall times, throughput and engine
    queue counters aside) with the embedded engine, the torch trainer and `mode: sync`: engine
    threads and dtype are fixed instead of timed, the engine computes each request alone (batch 1,
    no prefix cache) and episodes run one at a time (~5x the wall time on the quickstart),
    samples are trained in rollout order, torch uses deterministic algorithms. Each change is
    said in a log line; what still varies: docs/lifecycle.md."""

    @field_validator("name")
    @classmethod
    def _name_inside_runs(cls, value: str | None) -> str | None:
        # `runs/<name>` must stay inside runs/: `.`, `..` or `/x` would put the run (and what
        # run.overwrite deletes) at runs/ itself, the working folder or the file system's root.
        if value is None:
            return value
        if value.strip() and not value.startswith("/") and not {".", ".."} & set(value.split("/")):
            return value
        raise ValueError(
            f"run.name {value!r} must name a folder inside runs/ (e.g. quickstart, or "
            "sweeps/lr-high): no empty name, no `.` or `..`, no leading /; set run.dir to put "
            "the run folder elsewhere"
        )

    @field_validator("allocator")
    @classmethod
    def _allocator_choice(cls, value: str) -> str:
        from agentscope_rft.runtime.memory import ALLOCATORS

        if value in ALLOCATORS or "/" in value:
            return value
        raise ValueError(
            f"run.allocator {value!r}: use one of {', '.join(ALLOCATORS)}, or a path to an "
            "allocator library (e.g. /usr/lib/x86_64-linux-gnu/libjemalloc.so.2)"
        )


EXPLORING_MODES = ("sync", "one_step_off", "async")
"""Run modes with an explorer (episodes played by the run itself)."""


def _compact_allocator_moved(data: dict[str, Any]) -> dict[str, Any]:
    """`engine.compact_allocator` (before `run.allocator`): true is `run.allocator:
    glibc-compact`, false the default; configs written before keep loading."""
    engine = data.get("engine")
    if not isinstance(engine, dict) or "compact_allocator" not in engine:
        return data
    engine = dict(engine)
    compact = engine.pop("compact_allocator")
    data = {**data, "engine": engine}
    if str(compact).lower() in ("true", "1", "yes", "on"):
        run = dict(data.get("run") or {})
        if run.get("allocator", "glibc") not in ("auto", "glibc", "glibc-compact"):
            raise ValueError(
                f"engine.compact_allocator: true (glibc's settings) contradicts run.allocator "
                f"{run['allocator']!r}: keep run.allocator only"
            )
        run["allocator"] = "glibc-compact"
        data["run"] = run
    return data


def _sync_section_removed(data: dict[str, Any]) -> dict[str, Any]:
    """`sync: {method: ...}` (removed: no code read it; the engine picks how weights move).

    Resolved configs saved before list `sync: {method: auto}`, and keep loading; any other value
    never had an effect, and is refused with where the choice lives now."""
    if "sync" not in data:
        return data
    sync = data["sync"]
    saved = sync is None or (isinstance(sync, dict) and sync in ({}, {"method": "auto"}))
    if not saved:
        raise ValueError(
            f"sync ({sync!r}) was removed and never had an effect: weights reach the embedded "
            "engine in-process, and a vLLM engine by checkpoint reload, by NCCL with "
            "`engine.weight_transfer: nccl`, or as LoRA adapters with `engine.enable_lora: true` "
            "and `trainer.lora`; remove the `sync` section (a resumed run: --set sync=null)"
        )
    return {k: v for k, v in data.items() if k != "sync"}


class RunConfig(Section):
    """A whole run: `agentscope-rft train --config run.yaml`.

    Example:
        >>> cfg = RunConfig.model_validate({"workflow": "app.py:run",
        ...                                 "tasks": {"train": "tasks.jsonl"}})
        >>> cfg.explorer.group_size
        8
    """

    model: ModelConfig = Field(default_factory=ModelConfig)
    engine: EngineConfig = Field(default_factory=EmbeddedEngineConfig)
    """The inference engine: `embedded` (default) or `vllm`."""
    gateway: GatewayConfig = Field(default_factory=GatewayConfig)
    workflow: str | None = None
    """The episode function: `package.module:run` or `path/to/app.py:run` (a file path in a config
    file is relative to the file's folder, one given with `--set` to the working directory)."""
    judge: str | None = None
    """Optional `async def judge(task, response)` scoring the workflow's response (`pkg.mod:fn` or
    `path/to/file.py:fn`, like `workflow`)."""
    tasks: TasksConfig = Field(default_factory=TasksConfig)
    explorer: ExplorerConfig = Field(default_factory=ExplorerConfig)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    """Advantage estimator, policy loss, KL, objective: see algorithms.md."""
    trainer: TrainerConfig = Field(default_factory=TorchTrainerConfig)
    """The trainer: `torch` (default; plain PyTorch, CPU or one GPU) or `verl` (verl's FSDP engine:
    multi-GPU, multi-node)."""
    buffer: BufferConfig = Field(default_factory=BufferConfig)
    """Where samples wait between explorer and trainer (and prioritized replay)."""
    data: DataConfig = Field(default_factory=DataConfig)
    """Task selection (curriculum, mixing) and operators on explored groups and offline data:
    filters, near-duplicate removal, LLM judges. See data.md."""
    monitor: MonitorConfig = Field(default_factory=MonitorConfig)
    """Console, TensorBoard, W&B, MLflow, plots."""
    offline: OfflineConfig = Field(default_factory=OfflineConfig)
    health: HealthConfig = Field(default_factory=HealthConfig)
    """Run health: rules over the step metrics and their actions (warn, stop, rollback)."""
    runtime: RuntimeConfig = Field(default_factory=RuntimeConfig)
    """Where episodes run: `local` (default, in this process) or `ray` (isolated runner processes
    on a Ray cluster, one or many machines)."""
    gpus: GpuPlacement | None = None
    """Which GPUs serve vLLM and which train, on one node: `split` or `colocated` (vLLM sleeps
    while the trainer steps); required when a vLLM engine started here and a GPU trainer share
    a machine with GPUs (docs/verl.md). null: none (CPU, embedded engine, `engine.urls`)."""
    run: RunSettings = Field(default_factory=RunSettings)
    _user_keys: frozenset[str] | None = PrivateAttr(default=None)

    def __eq__(self, other: object) -> bool:
        # Two configs with the same values are the same run, whoever set which key.
        if not isinstance(other, RunConfig):
            return NotImplemented
        return type(self) is type(other) and self.__dict__ == other.__dict__

    __hash__ = None  # type: ignore[assignment]  # (mutable, like every pydantic model)

    @property
    def user_keys(self) -> frozenset[str] | None:
        """The dotted keys the user set (file and `--set`), as `load_config` recorded them; None
        for a config built in code (`config_effect.user_keys` then reads what was validated)."""
        return self._user_keys

    @model_validator(mode="before")
    @classmethod
    def _default_types(cls, data: Any) -> Any:
        """`engine: vllm` or `engine: {dtype: ...}` (no `type`) mean the obvious thing."""
        if isinstance(data, dict):
            for section, default in (("engine", "embedded"), ("trainer", "torch")):
                value = data.get(section)
                if isinstance(value, str):
                    data = {**data, section: {"type": value}}
                elif isinstance(value, dict) and "type" not in value:
                    data = {**data, section: {"type": default, **value}}
            data = _compact_allocator_moved(data)
            data = _sync_section_removed(data)
        return data

    def uses_offline_data(self) -> bool:
        """Whether the run trains on `offline.path`: all of an offline run, or an exploring run's
        warm-up steps and its CHORD mix (`algorithm.objective: sft_rl_mix`)."""
        if self.run.mode == "offline":
            return True
        return self.run.mode in EXPLORING_MODES and (
            bool(self.offline.warmup_steps) or self.algorithm.objective == "sft_rl_mix"
        )

    @model_validator(mode="after")
    def _consistent(self) -> RunConfig:
        mode = self.run.mode
        exploring = mode in EXPLORING_MODES
        if exploring:
            if self.workflow is None:
                raise ValueError(f"run.mode {mode!r} explores: set `workflow: pkg.mod:run`")
            if self.tasks.train is None:
                raise ValueError(f"run.mode {mode!r} explores: set `tasks.train: tasks.jsonl`")
        if exploring and self.algorithm.objective == "dpo":
            raise ValueError(
                f"algorithm.objective 'dpo' trains on preference pairs, which run.mode {mode!r} "
                "does not explore (its episodes have no chosen/rejected pairs): train pairs with "
                "run.mode 'offline' and offline.format 'dpo' (or 'review'), or explore with "
                "objective 'rl'"
            )
        if mode == "offline":
            if self.offline.path is None:
                raise ValueError("run.mode 'offline' trains from files: set `offline.path`")
            wanted = "dpo" if self.offline.format == "dpo" else "sft"
            review_objectives = ("sft", "dpo", "rl")
            if self.offline.format == "review":
                if self.algorithm.objective not in review_objectives:
                    raise ValueError(
                        "offline.format 'review' trains with algorithm.objective sft "
                        f"(corrections), dpo (pairs) or rl (rewards), not "
                        f"{self.algorithm.objective!r}"
                    )
            elif self.algorithm.objective != wanted:
                raise ValueError(
                    f"offline.format {self.offline.format!r} needs algorithm.objective "
                    f"{wanted!r} (it is {self.algorithm.objective!r})"
                )
        if self.offline.warmup_steps:
            if not exploring:
                raise ValueError(
                    "offline.warmup_steps warms up an exploring run (run.mode sync, one_step_off "
                    f"or async); run.mode {mode!r} does not explore: remove it"
                )
            if self.offline.warmup_steps >= self.run.steps:
                raise ValueError(
                    f"offline.warmup_steps ({self.offline.warmup_steps}) must be fewer than "
                    f"run.steps ({self.run.steps}), which counts them: raise run.steps"
                )
            if self.trainer.type != "torch":
                raise ValueError(
                    "offline.warmup_steps runs on the torch trainer; with trainer.type "
                    f"{self.trainer.type!r}, train the demonstrations in a `run.mode: offline` "
                    "run first and start this one from its checkpoint (model.name_or_path)"
                )
        if exploring and self.uses_offline_data():
            why = (
                "offline.warmup_steps"
                if self.offline.warmup_steps
                else "algorithm.objective 'sft_rl_mix'"
            )
            if self.offline.path is None:
                raise ValueError(
                    f"{why} trains on demonstrations: set `offline.path` to a chat JSONL file "
                    '(one {"messages": [...]} per line)'
                )
            if self.offline.format not in ("sft", "review"):
                raise ValueError(
                    f"{why} trains on SFT demonstrations: set offline.format 'sft' (or 'review': "
                    "a reviewed run's corrections)"
                )
        if self.explorer.dynamic_sampling is not None:
            if not exploring:
                raise ValueError(
                    f"explorer.dynamic_sampling refills explored batches; run.mode {mode!r} "
                    "does not explore: remove it"
                )
            if not self.algorithm.drops_zero_variance_groups():
                raise ValueError(
                    "explorer.dynamic_sampling replaces groups whose rewards are all equal, which "
                    "only a group-baseline advantage (grpo, rloo, ...) with "
                    "algorithm.filter_zero_variance_groups: true leaves untrained (advantage is "
                    f"{self.algorithm.advantage.type!r}); remove explorer.dynamic_sampling or "
                    "use such an advantage"
                )
        if self.health.rolls_back() and self.trainer.type == "verl":
            rollback = self.health.rollback
            if rollback.lr_factor != 1 or rollback.kl_coef or rollback.entropy_coef is not None:
                raise ValueError(
                    "health.rollback changes the learning rate, KL or entropy coefficient on the "
                    "torch trainer only; with trainer.type 'verl' set health.rollback.lr_factor: 1 "
                    "and leave kl_coef and entropy_coef null (a rollback then restores the "
                    "checkpoint alone)"
                )
        best = self.run.best_metric
        best = [best] if isinstance(best, str) else best
        if not best or any(not m.startswith("val/") or m == "val/" for m in best):
            raise ValueError(
                f"run.best_metric {self.run.best_metric!r} must be a validation metric "
                "`val/<name>` (or a non-empty list of them: their mean), e.g. val/reward/mean, "
                "val/success_rate or [val/reward/by_type/a, val/reward/by_type/b]"
            )
        self._check_data(exploring)
        self._check_replay(exploring or mode == "train_only")
        if mode == "train_only" and self.buffer.type != "sql":
            raise ValueError("run.mode 'train_only' reads a durable buffer: set `buffer.type: sql`")
        # (a saved resolved config lists every key with its default: only set values count)
        defaults = RuntimeConfig()
        placed = ("replica_cpus", "replica_gpus", "replica_nodes")
        replica_keys = [k for k in placed if getattr(self.runtime, k) != getattr(defaults, k)]
        if replica_keys and (self.engine.type != "vllm" or self.engine.urls):
            raise ValueError(
                f"runtime keys {replica_keys} place the vLLM replicas the run starts: they need "
                "`engine.type: vllm` without `engine.urls`; remove them"
            )
        if self.runtime.type == "ray" and self.trainer.type == "verl":
            ray = self.trainer.ray
            own = {"address": ray.address, "num_cpus": ray.num_cpus}
            if any(v is not None for v in own.values()):
                raise ValueError(
                    "trainer.ray.address/num_cpus choose a Ray for the verl trainer alone; with "
                    "`runtime.type: ray` its ranks join the run's cluster: set runtime.address / "
                    "runtime.num_cpus instead and remove trainer.ray"
                )
        return self

    def _check_replay(self, reads_buffer: bool) -> None:
        replay = self.buffer.replay
        if replay is None:
            return
        if not reads_buffer:
            raise ValueError(
                f"buffer.replay replays buffered groups; run.mode {self.run.mode!r} trains from "
                "offline files without the buffer: remove it"
            )
        per_step = self.explorer.tasks_per_step
        if replay_count(replay, per_step) == 0:
            raise ValueError(
                f"buffer.replay.ratio {replay.ratio} x explorer.tasks_per_step {per_step} rounds "
                f"to 0 replayed groups per step: nothing would be replayed; set ratio >= "
                f"{0.5 / per_step:g}"
            )

    def _check_data(self, exploring: bool) -> None:
        data = self.data
        if not exploring:
            defaults = DataConfig()
            if data.operators or data.selector != defaults.selector:
                raise ValueError(
                    f"data.selector and data.operators act on explored episodes; run.mode "
                    f"{self.run.mode!r} does not explore: remove them (data.offline_operators "
                    "filter offline data)"
                )
        if data.offline_operators and not self.uses_offline_data():
            raise ValueError(
                "data.offline_operators filter `offline.path`, which this run does not read: "
                "remove them"
            )
        rewriting = [
            op.type
            for op in data.operators
            if op.type in JUDGE_TYPES or (op.type == "format" and op.action == "reward")
        ]
        if rewriting and self.explorer.dynamic_sampling is not None:
            raise ValueError(
                f"explorer.dynamic_sampling keeps the groups whose workflow rewards differ, before "
                f"data.operators {rewriting} set the rewards that train: it would refill on the "
                "wrong rewards; remove explorer.dynamic_sampling (or those operators)"
            )
        if rewriting and self.explorer.reward_spread != "outcome":
            raise ValueError(
                f"data.operators {rewriting} set episode rewards, which needs "
                f"explorer.reward_spread 'outcome' (it is {self.explorer.reward_spread!r})"
            )


def load_config(path: str | Path | None, overrides: Sequence[str] = ()) -> RunConfig:
    """Read a YAML run config, apply `--set` overrides, and validate.

    File paths in the config file (`workflow`, `judge`, `tasks.*`, `offline.path`, a
    `model.chat_template` file, a local `model.name_or_path` folder, a custom algorithm's
    `file.py:fn` path) are relative to the file's folder; paths given with `--set` are relative
    to the working directory. The resolved config keeps them absolute, so a resumed run finds
    them from anywhere.

    Raises:
        ConfigError: unreadable YAML, or a key or value that does not validate.

    Example:
        >>> path = "examples/quickstart/config.yaml"
        >>> cfg = load_config(path, ["trainer.lr=1e-5"])  # doctest: +SKIP
    """
    from agentscope_rft.config_effect import looks_resolved, override_keys

    source = str(path) if path is not None else "(defaults)"
    data: Any = {}
    saved_keys: set[str] | None = None
    resolved = False
    lines: dict[Any, int] = {}
    if path is not None:
        file = Path(path)
        problem = config_file_problem(file)
        if problem is not None:
            raise ConfigError(problem)
        data, lines = read_config_file(file)
        problem = top_level_problem(file, data)
        if problem is not None and not (data is None and overrides):
            raise ConfigError(problem)
        try:
            data = resolve_file_keys(data or {}, file.resolve().parent)
        except ConfigError as exc:  # an unset environment variable in a path
            raise ConfigError(f"config file {file}: {exc}") from exc
        saved_keys = _saved_user_keys(file)
        resolved = saved_keys is None and looks_resolved(data, RunConfig.model_fields)
    data = apply_overrides(data, overrides)
    try:
        config = RunConfig.model_validate(data)
    except ValidationError as exc:
        overridden = {".".join(parse_override(o)[0]) for o in overrides}
        raise ConfigError(validation_message(exc, source, RunConfig, lines, overridden)) from exc
    if saved_keys is not None:  # a saved resolved config lists every key: its user set these
        config._user_keys = frozenset(
            saved_keys.union(*(override_keys(*parse_override(o)) for o in overrides))
        )
    else:  # every key of the file is the user's, unless it is a resolved config saved before
        from agentscope_rft.config_effect import changed_keys, set_keys

        given = changed_keys(config) if resolved else set_keys(config)
        if resolved:
            given |= {k for o in overrides for k in override_keys(*parse_override(o))}
        config._user_keys = frozenset(given)
    if config.run.name is None and path is not None:
        config.run.name = Path(path).stem
    return config


def _saved_user_keys(file: Path) -> set[str] | None:
    """The keys a resolved config saved by `dump_config` says its user set; None for a config
    the user wrote (every key in it is theirs)."""
    from agentscope_rft.config_effect import USER_KEYS_HEADER

    with file.open(encoding="utf-8") as text:
        first = text.readline()
    if not first.startswith(USER_KEYS_HEADER):
        return None
    return {k.strip() for k in first.removeprefix(USER_KEYS_HEADER).split(",") if k.strip()}


def dump_config(config: RunConfig) -> str:
    """The resolved config as YAML (saved in the run folder), every key listed; its first line
    (a comment) names the keys the user set, so a run resumed or a sweep's seed started from it
    still tells the user's keys from the defaults (`config_effect`)."""
    from agentscope_rft.config_effect import USER_KEYS_HEADER, user_keys

    header = f"{USER_KEYS_HEADER} {', '.join(sorted(user_keys(config)))}\n"
    return header + yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)
