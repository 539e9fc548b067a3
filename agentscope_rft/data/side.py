"""The data side of a run, built from `data:` and wired into the run at two points.

`build_selector` makes the task selector the explorer draws from; `DataSide.after_explore` is
called once per explored step, with the step's result, before its groups enter the buffer: the
selector observes the per-task rewards, `task_stats.json` is rewritten, and the operators run.
`apply_offline_operators` runs `data.offline_operators` over offline samples when they are read.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agentscope_rft.api import load_callable
from agentscope_rft.config_base import did_you_mean
from agentscope_rft.data.config import (
    CurriculumSelectorConfig,
    CustomOp,
    CustomSelectorConfig,
    DataConfig,
    DedupOp,
    FormatOp,
    GroupJudgeOp,
    LengthOp,
    OperatorConfig,
    RewardRangeOp,
    RubricJudgeOp,
    SelectorConfig,
    StatusOp,
    UniformSelectorConfig,
)
from agentscope_rft.data.judges import (
    GroupJudge,
    JudgeClient,
    RubricJudge,
    check_endpoint,
    judge_api_key,
)
from agentscope_rft.data.operators import (
    CustomOperator,
    Episode,
    FormatCheck,
    Group,
    MinHashDedup,
    Operator,
    Pipeline,
    length,
    reward_range,
    status,
)
from agentscope_rft.data.selection import (
    CurriculumSelector,
    TaskSelector,
    UniformSelector,
    write_task_stats,
)
from agentscope_rft.explorer.tasks import Task, TaskSetError
from agentscope_rft.types import Rollout, Sample

logger = logging.getLogger(__name__)


def build_selector(
    config: SelectorConfig, tasks: Sequence[Task], *, shuffle: bool = True, seed: int = 0
) -> TaskSelector:
    """The selector `config` describes over `tasks`.

    Raises:
        TaskSetError: a mix names a missing column or set.
        WorkflowError: a custom selector that does not import.

    Example:
        >>> selector = build_selector(CurriculumSelectorConfig(), tasks, seed=1)  # doctest: +SKIP
    """
    mix = getattr(config, "mix", None)
    mix_args: dict[str, Any] = (
        {"mix_field": mix.field, "mix_weights": mix.weights} if mix is not None else {}
    )
    if isinstance(config, UniformSelectorConfig):
        return UniformSelector(tasks, shuffle=shuffle, seed=seed, **mix_args)
    if isinstance(config, CurriculumSelectorConfig):
        return CurriculumSelector(
            tasks,
            seed=seed,
            sampling=config.sampling,
            prior=config.prior,
            decay=config.decay,
            uniform_share=config.uniform_share,
            learnability=config.learnability,
            **mix_args,
        )
    assert isinstance(config, CustomSelectorConfig)
    cls = load_callable(config.path, "data.selector.path")
    try:
        selector = cls(list(tasks), seed=seed, **config.args)
    except Exception as exc:  # the user's class: its error is the message, not a traceback
        raise TaskSetError(
            f"data.selector {config.path!r} could not be made as {config.path.rpartition(':')[2]}"
            f"(tasks, seed={seed}, **args) with args {sorted(config.args)}: "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    missing = [
        m
        for m in ("next_batch", "observe", "state_dict", "load_state_dict", "task_stats")
        if not callable(getattr(selector, m, None))
    ]
    if missing:
        raise TaskSetError(
            f"data.selector {config.path!r} lacks {missing}: a selector implements "
            "agentscope_rft.data.selection.TaskSelector"
        )
    return CheckedSelector(selector, tasks, config.path)


class CheckedSelector:
    """A user's selector whose batches are checked: `size` tasks of the task set, so that a
    wrong return value is named at the selector, not deep inside the explorer."""

    def __init__(self, selector: Any, tasks: Sequence[Task], path: str) -> None:
        self.inner = selector
        self.path = path
        self._ids = {task.id for task in tasks}

    def next_batch(self, size: int) -> list[Task]:
        batch = self.inner.next_batch(size)
        ok = isinstance(batch, list) and len(batch) == size
        bad = (
            next((t for t in batch if not isinstance(t, Task) or t.id not in self._ids), None)
            if ok
            else None
        )
        if not ok or bad is not None:
            got = (
                f"{type(batch).__name__} of {len(batch)}"
                if isinstance(batch, list | tuple)
                else type(batch).__name__
            )
            what = f"; {bad!r:.80} is not one of its Task objects" if bad is not None else ""
            raise TaskSetError(
                f"data.selector {self.path!r}: next_batch({size}) returned a {got}{what}; it must "
                f"return a list of {size} Task objects from the tasks it was given"
            )
        return batch

    def observe(self, task_id: str, rewards: Sequence[float]) -> None:
        self.inner.observe(task_id, rewards)

    def state_dict(self) -> dict[str, Any]:
        return dict(self.inner.state_dict())

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.inner.load_state_dict(state)

    def task_stats(self) -> list[dict[str, Any]]:
        return list(self.inner.task_stats())


def build_operator(
    config: OperatorConfig, *, policy_url: str | None = None, policy_model: str | None = None,
    policy_key: str | None = None,
) -> Operator:  # fmt: skip
    """One operator; judges with `base_url: policy` need the run's gateway URL and model."""
    if isinstance(config, RewardRangeOp):
        return reward_range(config.min, config.max)
    if isinstance(config, LengthOp):
        return length(config.min_tokens, config.max_tokens)
    if isinstance(config, StatusOp):
        return status(config.drop, config.stop_reasons)
    if isinstance(config, FormatOp):
        return FormatCheck(config.pattern, config.action, config.reward)
    if isinstance(config, DedupOp):
        return MinHashDedup(
            threshold=config.threshold,
            ngram=config.ngram,
            num_perm=config.num_perm,
            scope=config.scope,
        )
    if isinstance(config, GroupJudgeOp | RubricJudgeOp):
        endpoint = config.endpoint
        is_policy = endpoint.base_url == "policy"
        if is_policy and policy_url is None:
            raise ValueError(f"{config.type}: endpoint `policy` needs the run's gateway")
        client = JudgeClient(
            policy_url if is_policy else endpoint.base_url,  # type: ignore[arg-type]
            model=endpoint.model or policy_model or "",
            api_key=judge_api_key(endpoint.api_key_env, policy_key, is_policy),
            timeout=endpoint.timeout,
            max_retries=endpoint.max_retries,
            temperature=endpoint.temperature,
            max_tokens=endpoint.max_tokens,
            concurrency=endpoint.concurrency,
            structured_output=endpoint.structured_output,
        )
        common: dict[str, Any] = {
            "question_field": config.question_field,
            "reference_field": config.reference_field,
            "weight": config.weight,
            "on_failure": config.on_failure,
            "max_response_chars": config.max_response_chars,
        }
        if isinstance(config, GroupJudgeOp):
            return GroupJudge(client, instructions=config.instructions, **common)
        return RubricJudge(client, rubric=config.rubric, rubric_field=config.rubric_field, **common)
    assert isinstance(config, CustomOp)
    fn = load_callable(config.path, "data operator")
    return CustomOperator(fn, config.args, config.name or str(getattr(fn, "__name__", "custom")))


def check_data(config: DataConfig, tasks: Sequence[Task], *, seed: int) -> None:
    """Fail fast (before any model loads) on a selector or custom operator that cannot work:
    the selector is built over the tasks, custom operators and priorities are imported."""
    build_selector(config.selector, tasks, seed=seed)
    for op in [*config.operators, *config.offline_operators]:
        if isinstance(op, CustomOp):
            load_callable(op.path, "data operator")
    for index, op in enumerate(config.operators):
        if isinstance(op, GroupJudgeOp | RubricJudgeOp):
            _check_judge_columns(op, f"data.operators[{index}] ({op.type})", tasks)


def _check_judge_columns(
    op: GroupJudgeOp | RubricJudgeOp, where: str, tasks: Sequence[Task]
) -> None:
    """A judge column that no task has is a typo: the judge would never see a reference (or a
    rubric); a question column that none has shows the judge each task's whole JSON instead."""
    columns = sorted({key for task in tasks for key in task.data})
    wanted = [("reference_field", op.reference_field)]
    if isinstance(op, RubricJudgeOp) and not op.rubric:
        wanted.append(("rubric_field", op.rubric_field))
    for key, column in wanted:
        if column is not None and not any(column in task.data for task in tasks):
            hint = did_you_mean(column, columns)
            raise TaskSetError(
                f"{where}: {key} {column!r} is a column of no training task{hint} (columns: "
                f"{', '.join(columns)})"
            )
    if not any(op.question_field in task.data for task in tasks):
        logger.warning(
            "%s: question_field %r is a column of no training task (columns: %s); the judge is "
            "shown each task's whole JSON instead",
            where,
            op.question_field,
            ", ".join(columns),
        )


def check_judges(config: DataConfig) -> None:
    """Fail fast on a judge with an endpoint URL that cannot be asked: nothing listens there, or
    its API key variable is unset (`policy` judges use the run's own gateway).

    Raises:
        ConfigError: naming the operator (`data.operators[2] (group_judge)`) and the fix.
    """
    from agentscope_rft.config import ConfigError  # (the config module imports this package)

    for key, ops in (
        ("operators", config.operators),
        ("offline_operators", config.offline_operators),
    ):
        for index, op in enumerate(ops):
            if isinstance(op, GroupJudgeOp | RubricJudgeOp) and op.endpoint.base_url != "policy":
                where = f"data.{key}[{index}] ({op.type})"
                try:
                    check_endpoint(op.endpoint.base_url, op.endpoint.api_key_env, where)
                except ValueError as exc:
                    raise ConfigError(str(exc)) from None


def groups_from_explored(
    rollouts: Sequence[Rollout], groups: Sequence[Sequence[Sample]]
) -> list[Group]:
    """The step's sample groups as operator `Group`s (episodes from their rollouts)."""
    by_id = {r.rollout_id: r for r in rollouts}
    out = []
    for members in groups:
        episodes: dict[str, list[Sample]] = {}
        for sample in members:
            episodes.setdefault(sample.rollout_id, []).append(sample)
        items = []
        task: dict[str, Any] = {}
        for rollout_id, samples in episodes.items():
            rollout = by_id.get(rollout_id)
            response = ""
            state = "ok"
            reward = samples[0].reward
            if rollout is not None:
                task = rollout.task
                response = next((c.content for c in reversed(rollout.calls) if c.content), "")
                state = str(rollout.status)
                reward = rollout.reward
            items.append(Episode(rollout_id, tuple(samples), response or "", reward, state))
        out.append(Group(members[0].group, task, tuple(items)))
    return out


class DataSide:
    """The selector and operators of a run (see the module docstring).

    Example:
        >>> side = DataSide(selector, Pipeline([]), run_dir)  # doctest: +SKIP
        >>> groups, metrics = await side.after_explore(1, rollouts, groups)  # doctest: +SKIP
    """

    def __init__(self, selector: TaskSelector, pipeline: Pipeline, run_dir: Path) -> None:
        self.selector = selector
        self.pipeline = pipeline
        self.run_dir = run_dir

    @classmethod
    def build(
        cls,
        config: DataConfig,
        tasks: Sequence[Task],
        run_dir: Path,
        *,
        shuffle: bool,
        seed: int,
        policy_url: str | None = None,
        policy_model: str | None = None,
        policy_key: str | None = None,
    ) -> DataSide:
        """The data side of a run; logs what it does when it is not the default."""
        selector = build_selector(config.selector, tasks, shuffle=shuffle, seed=seed)
        operators = [
            build_operator(
                op, policy_url=policy_url, policy_model=policy_model, policy_key=policy_key
            )
            for op in config.operators
        ]
        if config.selector.type != "uniform" or operators:
            logger.info(
                "data: selector %s, operators [%s]",
                config.selector.type,
                ", ".join(op.name for op in operators),
            )
        return cls(selector, Pipeline(operators), run_dir)

    async def after_explore(
        self, step: int, rollouts: Sequence[Rollout], groups: list[list[Sample]]
    ) -> tuple[list[list[Sample]], dict[str, float]]:
        """Run the operators, then tell the selector each explored task's rewards and export
        task statistics: the groups that go into the buffer and the step's `data/*` metrics.

        The selector hears the rewards that are trained: those of the task's episodes the
        operators kept, as they left them (a judge's scores); a task whose episodes were all
        dropped is heard with its episodes' own rewards.
        """
        metrics: dict[str, float] = {}
        trained: dict[str, float] = {}
        if self.pipeline and groups:
            kept, op_metrics = await self.pipeline(groups_from_explored(rollouts, groups))
            metrics.update(op_metrics)
            groups = [g.samples for g in kept]
            trained = {e.rollout_id: e.reward for g in kept for e in g.episodes}
        rewards: dict[str, list[float]] = {}
        kept_rewards: dict[str, list[float]] = {}
        for rollout in rollouts:
            if rollout.ok:
                rewards.setdefault(rollout.task_id, []).append(rollout.reward)
                if rollout.rollout_id in trained:
                    kept_rewards.setdefault(rollout.task_id, []).append(trained[rollout.rollout_id])
        for task_id, values in rewards.items():
            self.selector.observe(task_id, kept_rewards.get(task_id) or values)
        write_task_stats(self.run_dir, self.selector, step)
        metrics["data/tasks_observed"] = float(len(rewards))
        return groups, metrics

    async def close(self) -> None:
        await close_operators(self.pipeline)


async def close_operators(pipeline: Pipeline) -> None:
    """Release what the operators hold (the judges' HTTP clients)."""
    for op in pipeline.operators:
        closer = getattr(op, "close", None)
        if closer is not None:
            await closer()


def apply_offline_operators(
    operators: Sequence[OperatorConfig], units: dict[str, list[Sample]], decode: Any
) -> dict[str, list[Sample]]:
    """Offline units (a sample, or a DPO pair) kept by `operators`, each a one-episode group whose
    response is the decoded text of its trained tokens. Logs what each operator did."""
    if not operators:
        return units
    # every unit is its own group: near-duplicates are looked for across the whole file
    pipeline = Pipeline(
        [
            build_operator(op.model_copy(update={"scope": "batch"}) if op.type == "dedup" else op)
            for op in operators
        ]
    )
    groups = []
    for key, samples in units.items():
        text = "\n".join(
            decode([t for t, m in zip(s.token_ids, s.loss_mask, strict=True) if m]) for s in samples
        )
        groups.append(Group(key, {}, (Episode(key, tuple(samples), text, samples[0].reward),)))

    result: dict[str, Any] = {}

    def work() -> None:  # own loop in a thread: the caller may be inside a running loop
        async def run() -> None:
            try:
                result["out"] = await pipeline(groups)
            finally:
                for op in pipeline.operators:
                    closer = getattr(op, "close", None)
                    if closer is not None:
                        await closer()

        try:
            asyncio.run(run())
        except BaseException as exc:  # re-raised in the caller's thread
            result["error"] = exc

    thread = threading.Thread(target=work, name="offline-operators")
    thread.start()
    thread.join()
    if "error" in result:
        raise result["error"]
    kept, metrics = result["out"]
    logger.info(
        "offline data: operators kept %d of %d units (%s)",
        len(kept),
        len(units),
        ", ".join(f"{k.removeprefix('data/')}={v:g}" for k, v in metrics.items() if v),
    )
    if not kept:
        raise TaskSetError("data.offline_operators dropped every offline sample")
    return {g.group_id: g.samples for g in kept}
