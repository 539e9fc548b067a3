"""Task selection: which training tasks the explorer plays next.

A selector is a small object with one contract (`TaskSelector`): `next_batch(size)` picks tasks,
`observe(task_id, rewards)` hears how the explored ones went, and `state_dict` /
`load_state_dict` make it resumable exactly (the run saves the state with every checkpoint, and
a health rollback restores it). Built in:

- `uniform`: every task once per epoch, shuffled per epoch (the run's historical order).
- `curriculum`: tasks the policy can learn from now, by a per-task Beta posterior of their
  *learnability*. `learnability="informative"` (default): the chance that a task's group has
  rewards that differ (what a group-relative advantage learns from), for rewards of any scale: a
  task whose rewards are all near 0 but not equal is informative. `"success"`: p(1-p) of the
  success rate (as in BOTS, arXiv:2510.26374), where such a task looks as hard as one never
  solved. Tasks always solved or never solved score low and are rarely chosen. Older evidence
  decays, so a task that became easy drops out and one that became learnable comes back.

Both mix several task sets by weight (`mix`: the sets are the values of one task column) and keep
per-task statistics, exported to `task_stats.json` in the run folder.
"""

from __future__ import annotations

import array
import copy
import json
import math
import numbers
import random
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from agentscope_rft.explorer.tasks import Task, TaskSetError
from agentscope_rft.files import replace_text

STATS_FILE = "task_stats.json"
"""Per-task statistics, rewritten after every explored step."""


@runtime_checkable
class TaskSelector(Protocol):
    """Chooses the tasks of each explored batch; resumable.

    Example:
        >>> from agentscope_rft.explorer.tasks import load_tasks
        >>> selector = UniformSelector(load_tasks([{"id": i} for i in range(5)]), seed=0)
        >>> batch = selector.next_batch(3)
        >>> selector.observe(batch[0].id, [1.0, 0.0])
        >>> selector.load_state_dict(selector.state_dict())
    """

    def next_batch(self, size: int) -> list[Task]:
        """The next `size` tasks (a task repeats only when the set is smaller than `size`)."""
        ...

    def observe(self, task_id: str, rewards: Sequence[float]) -> None:
        """The rewards of the finished episodes of one explored task (failed ones left out)."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue exactly: a JSON-serialisable copy."""
        ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from a `state_dict`; raises `TaskSetError` when the task set changed."""
        ...

    def task_stats(self) -> list[dict[str, Any]]:
        """One JSON object per task: its statistics (written to `task_stats.json`)."""
        ...


@dataclass(slots=True)
class TaskStats:
    """What a selector knows about one task."""

    selected: int = 0
    """Times the task was put in a batch."""
    episodes: int = 0
    """Episodes observed (finished ones)."""
    reward_sum: float = 0.0
    """Sum of all observed rewards (for the all-time mean)."""
    last_mean: float | None = None
    """Mean reward of the task's latest explored group."""
    successes: float = 0.0
    """Decayed evidence of success (rewards clipped to [0, 1] count as fractional successes)."""
    failures: float = 0.0
    """Decayed evidence of failure."""
    last_observed: int = -1
    """The observation count (of the whole selector) when the task was last observed."""
    informative: float = 0.0
    """Decayed count of its groups whose rewards differed (a group-relative advantage learns)."""
    uninformative: float = 0.0
    """Decayed count of its groups whose rewards were all equal (nothing to learn)."""


class _StatsKeeper:
    """Per-task statistics and the optional mix of task sets; shared by the built-in selectors."""

    kind = "base"

    def __init__(
        self,
        tasks: Sequence[Task],
        *,
        seed: int,
        mix_field: str | None = None,
        mix_weights: Mapping[str, float] | None = None,
    ) -> None:
        if not tasks:
            raise TaskSetError("a task selector needs at least one task")
        self.tasks = list(tasks)
        self.seed = seed
        self.by_id = {t.id: t for t in self.tasks}
        self.stats = {t.id: TaskStats() for t in self.tasks}
        self.observations = 0
        self.rng = random.Random(seed)
        self.sets: dict[str, list[int]] = {}
        self.weights: dict[str, float] = {}
        if mix_field is not None:
            self._init_mix(mix_field, dict(mix_weights or {}))

    def _init_mix(self, field: str, weights: dict[str, float]) -> None:
        for index, task in enumerate(self.tasks):
            if field not in task.data:
                raise TaskSetError(
                    f"selector.mix.field {field!r}: task {task.id!r} has no such column (it has "
                    f"{sorted(task.data)}); add it to every task or change the field"
                )
            value = task.data[field]
            if not isinstance(value, str | numbers.Real):
                shown = json.dumps(value, default=str)
                shown = shown if len(shown) <= 60 else shown[:57] + "..."
                raise TaskSetError(
                    f"selector.mix.field {field!r}: task {task.id!r} has {shown} there; every "
                    "task needs a task set name (a string or a number) in it"
                )
            self.sets.setdefault(str(value), []).append(index)
        unknown = sorted(set(weights) - set(self.sets))
        if unknown:
            raise TaskSetError(
                f"selector.mix.weights names task sets {unknown} that no task has in column "
                f"{field!r} (sets: {sorted(self.sets)})"
            )
        # Sets not named get weight 0 only when some are named; none named: equal weights.
        self.weights = {
            name: float(weights.get(name, 0.0 if weights else 1.0)) for name in self.sets
        }
        if sum(self.weights.values()) <= 0:
            raise TaskSetError("selector.mix.weights: at least one task set needs a weight > 0")

    def _draw_sets(self, size: int) -> list[str | None]:
        """The task set of each slot of a batch (None everywhere without a mix)."""
        if not self.sets:
            return [None] * size
        names = sorted(self.sets)
        return self.rng.choices(names, weights=[self.weights[n] for n in names], k=size)

    def observe(self, task_id: str, rewards: Sequence[float]) -> None:
        stats = self.stats.get(task_id)
        if stats is None or not rewards:
            return
        self.observations += 1
        stats.episodes += len(rewards)
        stats.reward_sum += float(sum(rewards))
        stats.last_mean = float(sum(rewards)) / len(rewards)
        stats.last_observed = self.observations
        self._update_evidence(stats, rewards)

    def _update_evidence(self, stats: TaskStats, rewards: Sequence[float]) -> None:
        wins = sum(min(1.0, max(0.0, float(r))) for r in rewards)
        stats.successes += wins
        stats.failures += len(rewards) - wins
        if group_differs(rewards):
            stats.informative += 1
        else:
            stats.uninformative += 1

    def _base_state(self) -> dict[str, Any]:
        return {
            "selector": self.kind,
            "num_tasks": len(self.tasks),
            "observations": self.observations,
            "rng": _rng_to_json(self.rng),
            "stats": {task_id: asdict(s) for task_id, s in self.stats.items()},
        }

    def _load_base(self, state: Mapping[str, Any]) -> None:
        if state.get("num_tasks") != len(self.tasks):
            raise TaskSetError(
                f"the task set changed since the checkpoint ({state.get('num_tasks')} tasks "
                f"then, {len(self.tasks)} now); resume needs the same task file"
            )
        kind = state.get("selector", "uniform")
        if kind != self.kind:
            raise TaskSetError(
                f"the checkpoint's task selector is {kind!r}, the config's is {self.kind!r}; "
                "resume with the same data.selector.type"
            )
        self.observations = int(state.get("observations", 0))
        if "rng" in state:
            self.rng.setstate(_rng_from_json(state["rng"]))
        saved = state.get("stats", {})
        unknown = sorted(set(saved) - set(self.stats))
        if unknown:
            raise TaskSetError(
                f"the checkpoint has statistics of tasks {unknown[:5]} that are not in the task "
                "set; resume needs the same task file"
            )
        for task_id, values in saved.items():
            self.stats[task_id] = TaskStats(**values)

    def task_stats(self) -> list[dict[str, Any]]:
        rows = []
        for task in self.tasks:
            s = self.stats[task.id]
            rows.append(
                {
                    "task_id": task.id,
                    "selected": s.selected,
                    "episodes": s.episodes,
                    "mean_reward": s.reward_sum / s.episodes if s.episodes else None,
                    "last_mean_reward": s.last_mean,
                    "successes": round(s.successes, 6),
                    "failures": round(s.failures, 6),
                    "informative_groups": round(s.informative, 6),
                    "uninformative_groups": round(s.uninformative, 6),
                    **self._extra_stats(task, s),
                }
            )
        return rows

    def _extra_stats(self, task: Task, stats: TaskStats) -> dict[str, Any]:
        return {}


class UniformSelector(_StatsKeeper):
    """Every task once per epoch, in a shuffled order per epoch (`shuffle: false`: file order).

    With a `mix`, each batch slot first draws a task set by weight, then takes that set's next
    task in its own per-epoch order.

    Example:
        >>> from agentscope_rft.explorer.tasks import load_tasks
        >>> selector = UniformSelector(load_tasks([{"id": i} for i in range(5)]), seed=0)
        >>> len(selector.next_batch(3)), selector.state_dict()["position"]
        (3, 3)
    """

    kind = "uniform"

    def __init__(
        self,
        tasks: Sequence[Task],
        *,
        shuffle: bool = True,
        seed: int = 0,
        mix_field: str | None = None,
        mix_weights: Mapping[str, float] | None = None,
    ) -> None:
        super().__init__(tasks, seed=seed, mix_field=mix_field, mix_weights=mix_weights)
        self.shuffle = shuffle
        self.epoch = 0
        self.position = 0
        self._order = self._epoch_order(list(range(len(self.tasks))), 0, "")
        # With a mix: per task set, its epoch and position in its own order.
        self.set_cursors: dict[str, list[int]] = {name: [0, 0] for name in self.sets}

    def _epoch_order(self, members: list[int], epoch: int, name: str) -> list[int]:
        order = list(members)
        if self.shuffle:
            # Unmixed: the order runs always had (seed * 100003 + epoch), so seeds keep their runs.
            salt = self.seed * 100_003 + epoch
            random.Random(salt if not name else f"{salt}:{name}").shuffle(order)
        return order

    def next_batch(self, size: int) -> list[Task]:
        batch: list[Task] = []
        for name in self._draw_sets(size):
            index = self._next_index() if name is None else self._next_in_set(name)
            task = self.tasks[index]
            self.stats[task.id].selected += 1
            batch.append(task)
        return batch

    def _next_index(self) -> int:
        if self.position >= len(self._order):
            self.epoch += 1
            self.position = 0
            self._order = self._epoch_order(list(range(len(self.tasks))), self.epoch, "")
        index = self._order[self.position]
        self.position += 1
        return index

    def _next_in_set(self, name: str) -> int:
        cursor = self.set_cursors[name]
        members = self.sets[name]
        if cursor[1] >= len(members):
            cursor[0], cursor[1] = cursor[0] + 1, 0
        order = self._epoch_order(members, cursor[0], name)
        index = order[cursor[1]]
        cursor[1] += 1
        return index

    def state_dict(self) -> dict[str, Any]:
        return {
            **self._base_state(),
            "epoch": self.epoch,
            "position": self.position,
            "set_cursors": copy.deepcopy(self.set_cursors),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._load_base(state)
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
        self._order = self._epoch_order(list(range(len(self.tasks))), self.epoch, "")
        cursors = state.get("set_cursors", {})
        if set(cursors) != set(self.set_cursors):
            raise TaskSetError(
                f"the checkpoint mixes task sets {sorted(cursors)}, the config {sorted(self.sets)}"
                "; resume with the same data.selector.mix"
            )
        self.set_cursors = {name: [int(v) for v in c] for name, c in cursors.items()}


class CurriculumSelector(_StatsKeeper):
    """Picks the tasks with the highest learnability under a per-task Beta posterior.

    `learnability="success"`: each task's success evidence (rewards clipped to [0, 1]; binary
    rewards are successes and failures, F1-like rewards count fractionally) gives Beta(prior +
    successes, prior + failures), and a task scores p(1-p). `learnability="informative"`: the
    evidence is the task's groups, informative when their rewards differ (compared in float32,
    as the trainer finds equal-reward groups) and uninformative when all equal; Beta(prior +
    informative, prior + uninformative) gives the chance q that its next group teaches
    something, and a task scores q. For 0/1 rewards and groups of G, q = 1 - p^G - (1-p)^G, at
    its highest where p(1-p) is; it needs no reward scale, so a task whose rewards are small but
    varied (a partial-credit reward the policy has only begun to earn) is preferred to one
    always 0. `sampling: thompson` draws p (or q) from the posterior per task and batch
    (exploration, as in BOTS); `greedy` uses its mean. The batch is the `size` highest scores
    (ties: fewer times selected, then file order); a task repeats in a batch only when the set
    is smaller. Before each update the task's earlier evidence is multiplied by `decay`, so
    recent results weigh most. `uniform_share` of each batch is drawn uniformly at random
    (robustness against a wrong estimate). Unseen tasks score p = 0.5: under `success` the
    maximum, so they are explored first; under `informative` after tasks seen to vary.

    Example:
        >>> from agentscope_rft.explorer.tasks import load_tasks
        >>> tasks = load_tasks([{"id": "easy"}, {"id": "mid"}, {"id": "hard"}])
        >>> selector = CurriculumSelector(tasks, sampling="greedy")
        >>> for task_id, rewards in [("easy", [1, 1, 1, 1]), ("mid", [1, 0, 1, 0]),
        ...                          ("hard", [0, 0, 0, 0])]:
        ...     selector.observe(task_id, rewards)
        >>> [t.id for t in selector.next_batch(1)]
        ['mid']
        >>> tasks = load_tasks([{"id": "zeros"}, {"id": "small"}])
        >>> selector = CurriculumSelector(tasks, sampling="greedy", learnability="informative")
        >>> selector.observe("zeros", [0.0] * 4)
        >>> selector.observe("small", [0.0, 0.1, 0.0, 0.05])
        >>> [t.id for t in selector.next_batch(1)]
        ['small']
    """

    kind = "curriculum"

    def __init__(
        self,
        tasks: Sequence[Task],
        *,
        seed: int = 0,
        sampling: str = "thompson",
        prior: float = 1.0,
        decay: float = 1.0,
        uniform_share: float = 0.0,
        learnability: str = "informative",
        mix_field: str | None = None,
        mix_weights: Mapping[str, float] | None = None,
    ) -> None:
        super().__init__(tasks, seed=seed, mix_field=mix_field, mix_weights=mix_weights)
        if sampling not in ("thompson", "greedy"):
            raise ValueError(
                f"curriculum sampling must be 'thompson' or 'greedy', not {sampling!r}"
            )
        if learnability not in ("success", "informative"):
            raise ValueError(
                f"curriculum learnability must be 'success' or 'informative', not {learnability!r}"
            )
        self.learnability_kind = learnability
        self.sampling = sampling
        self.prior = prior
        self.decay = decay
        self.uniform_share = uniform_share

    def _update_evidence(self, stats: TaskStats, rewards: Sequence[float]) -> None:
        stats.successes *= self.decay
        stats.failures *= self.decay
        stats.informative *= self.decay
        stats.uninformative *= self.decay
        super()._update_evidence(stats, rewards)

    def _posterior(self, stats: TaskStats) -> tuple[float, float]:
        if self.learnability_kind == "informative":
            return self.prior + stats.informative, self.prior + stats.uninformative
        return self.prior + stats.successes, self.prior + stats.failures

    def _value(self, p: float) -> float:
        return p if self.learnability_kind == "informative" else p * (1 - p)

    def learnability(self, task_id: str) -> float:
        """The task's score at its posterior mean: p(1-p), or q (`informative`)."""
        a, b = self._posterior(self.stats[task_id])
        return self._value(a / (a + b))

    def next_batch(self, size: int) -> list[Task]:
        slots = self._draw_sets(size)
        num_uniform = math.floor(self.uniform_share * size + 1e-9)
        scores = [self._score(task) for task in self.tasks]
        batch: list[int] = []
        for slot, name in enumerate(slots):
            members = list(range(len(self.tasks))) if name is None else self.sets[name]
            fresh = [i for i in members if i not in batch] or members
            if slot < num_uniform:
                index = self.rng.choice(fresh)
            else:
                index = max(
                    fresh, key=lambda i: (scores[i], -self.stats[self.tasks[i].id].selected, -i)
                )
            batch.append(index)
        chosen = [self.tasks[i] for i in batch]
        for task in chosen:
            self.stats[task.id].selected += 1
        return chosen

    def _score(self, task: Task) -> float:
        a, b = self._posterior(self.stats[task.id])
        p = self.rng.betavariate(a, b) if self.sampling == "thompson" else a / (a + b)
        return round(self._value(p), 12)  # equal in exact arithmetic: a tie, not float noise

    def state_dict(self) -> dict[str, Any]:
        return self._base_state()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._load_base(state)

    def _extra_stats(self, task: Task, stats: TaskStats) -> dict[str, Any]:
        return {"learnability": round(self.learnability(task.id), 6)}


def group_differs(rewards: Sequence[float]) -> bool:
    """Whether a group's rewards are not all equal, compared in float32 as the trainer's
    equal-reward test compares them (a group of one never differs).

    Example:
        >>> group_differs([0.0, 0.05]), group_differs([1.0, 1.0]), group_differs([0.3])
        (True, False, False)
    """
    return len(set(array.array("f", [float(r) for r in rewards]))) > 1


def _rng_to_json(rng: random.Random) -> list[Any]:
    version, internal, gauss = rng.getstate()
    return [version, list(internal), gauss]


def _rng_from_json(data: Sequence[Any]) -> tuple[Any, ...]:
    version, internal, gauss = data
    return (int(version), tuple(int(x) for x in internal), gauss)


def write_task_stats(run_dir: Path, selector: TaskSelector, step: int) -> None:
    """Write `task_stats.json` (atomically): the step and one object per task."""
    replace_text(
        run_dir / STATS_FILE, json.dumps({"step": step, "tasks": selector.task_stats()}, indent=1)
    )
