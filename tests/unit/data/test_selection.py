"""Task selectors: exact choices for fixed inputs, resume, mixing, statistics."""

from __future__ import annotations

import json
import random

import pytest
import yaml

from agentscope_rft.data.config import (
    CurriculumSelectorConfig,
    CustomSelectorConfig,
    MixConfig,
    UniformSelectorConfig,
)
from agentscope_rft.data.selection import (
    CurriculumSelector,
    UniformSelector,
    write_task_stats,
)
from agentscope_rft.data.side import build_selector
from agentscope_rft.explorer.tasks import Task, TaskSetError, load_tasks


def tasks(n: int, **columns: list[str]) -> list[Task]:
    rows = [{"id": f"t{i}", **{k: v[i] for k, v in columns.items()}} for i in range(n)]
    return load_tasks(rows)


def ids(batch: list[Task]) -> list[str]:
    return [t.id for t in batch]


def test_uniform_keeps_the_historical_order_of_every_seed() -> None:
    # The order runs always had: epoch e shuffled by Random(seed * 100003 + e).
    selector = UniformSelector(tasks(5), seed=3)
    first = list(range(5))
    random.Random(3 * 100_003).shuffle(first)
    second = list(range(5))
    random.Random(3 * 100_003 + 1).shuffle(second)
    got = ids(selector.next_batch(7))
    assert got == [f"t{i}" for i in first + second[:2]]
    assert selector.state_dict()["epoch"] == 1 and selector.state_dict()["position"] == 2


def test_uniform_without_shuffle_is_file_order() -> None:
    selector = UniformSelector(tasks(3), shuffle=False)
    assert ids(selector.next_batch(4)) == ["t0", "t1", "t2", "t0"]


def test_old_sampler_state_without_statistics_still_loads() -> None:
    selector = UniformSelector(tasks(5), seed=0)
    selector.load_state_dict({"epoch": 2, "position": 3, "num_tasks": 5})
    order = list(range(5))
    random.Random(2).shuffle(order)
    assert ids(selector.next_batch(2)) == [f"t{order[3]}", f"t{order[4]}"]


def observe_all(selector: CurriculumSelector, results: dict[str, list[float]]) -> None:
    for task_id, rewards in results.items():
        selector.observe(task_id, rewards)


def test_greedy_curriculum_picks_by_learnability_unseen_first() -> None:
    # t0 always solved, t1 half, t2 never, t3 unseen, t4 mostly solved.
    selector = CurriculumSelector(tasks(5), sampling="greedy", decay=1.0, learnability="success")
    observe_all(
        selector,
        {"t0": [1, 1, 1, 1], "t1": [1, 0, 1, 0], "t2": [0, 0, 0, 0], "t4": [1, 1, 1, 0]},
    )
    # Beta(1+s, 1+f) means: t0 5/6, t1 1/2, t2 1/6, t3 1/2 (prior), t4 4/6.
    # p(1-p): t0 .139, t1 .25, t2 .139, t3 .25, t4 .222. Ties: fewer selections, then file order.
    assert selector.learnability("t1") == pytest.approx(0.25)
    assert selector.learnability("t4") == pytest.approx(4 / 6 * 2 / 6)
    assert ids(selector.next_batch(3)) == ["t1", "t3", "t4"]
    # t1 and t3 were selected once now; t0 and t2 tie at .139: t0 (file order) first.
    assert ids(selector.next_batch(5)) == ["t1", "t3", "t4", "t0", "t2"]


def test_decay_lets_a_task_that_became_easy_drop_out() -> None:
    selector = CurriculumSelector(tasks(2), sampling="greedy", decay=0.5)
    selector.observe("t0", [1, 0])  # s=1, f=1
    selector.observe("t0", [1, 1])  # s=0.5+2, f=0.5
    stats = selector.stats["t0"]
    assert (stats.successes, stats.failures) == (2.5, 0.5)
    assert ids(selector.next_batch(1)) == ["t1"]  # unseen beats mostly solved


def test_fractional_rewards_count_as_partial_successes() -> None:
    selector = CurriculumSelector(tasks(1), sampling="greedy", decay=1.0, learnability="success")
    selector.observe("t0", [0.25, 2.0, -1.0])  # clipped to [0, 1]: 0.25 + 1 + 0
    assert selector.stats["t0"].successes == pytest.approx(1.25)
    assert selector.stats["t0"].failures == pytest.approx(1.75)
    assert selector.stats["t0"].reward_sum == pytest.approx(1.25)


def test_informative_curriculum_prefers_varied_groups_at_any_reward_scale() -> None:
    # t0: rewards near 0 but varied (a partial-credit reward just starting); t1: always 0;
    # t2: always 1; t3: unseen; t4: varied once, then equal once. Rewards outside [0, 1] too.
    selector = CurriculumSelector(
        tasks(5), sampling="greedy", decay=1.0, learnability="informative"
    )
    observe_all(
        selector,
        {
            "t0": [0.0, 0.05, 0.0, 0.1],
            "t1": [0.0, 0.0, 0.0, 0.0],
            "t2": [1.0, 1.0, 1.0, 1.0],
            "t4": [-3.0, 7.0],
        },
    )
    selector.observe("t4", [7.0, 7.0])
    # Beta(1 + informative, 1 + uninformative) means: t0 2/3, t1 1/3, t2 1/3, t3 1/2, t4 1/2.
    assert selector.learnability("t0") == pytest.approx(2 / 3)
    assert selector.learnability("t4") == pytest.approx(1 / 2)
    # Under `success` t0 (p ~ 0.1) would rank below the unseen t3 and level with t1.
    assert ids(selector.next_batch(3)) == ["t0", "t3", "t4"]
    stats = selector.stats["t4"]
    assert (stats.informative, stats.uninformative) == (1.0, 1.0)
    success = CurriculumSelector(tasks(5), sampling="greedy", decay=1.0, learnability="success")
    observe_all(success, {"t0": [0.0, 0.05, 0.0, 0.1], "t1": [0.0] * 4, "t2": [1.0] * 4})
    assert ids(success.next_batch(1)) == ["t3"]


def test_informative_evidence_decays_and_compares_as_the_trainer_does() -> None:
    selector = CurriculumSelector(
        tasks(2), sampling="greedy", decay=0.5, learnability="informative"
    )
    selector.observe("t0", [0.0, 1.0])  # informative 1
    selector.observe("t0", [0.5, 0.5])  # informative 0.5, uninformative 1
    selector.observe("t0", [0.1, 0.1 + 1e-12])  # equal in float32: uninformative 0.5 + 1
    stats = selector.stats["t0"]
    assert (stats.informative, stats.uninformative) == (0.25, 1.5)
    selector.observe("t1", [0.3])  # a group of one never differs
    assert selector.stats["t1"].uninformative == 1.0
    with pytest.raises(ValueError, match="learnability must be 'success' or 'informative'"):
        CurriculumSelector(tasks(2), learnability="variance")


def test_state_saved_before_informative_counts_existed_still_loads() -> None:
    selector = CurriculumSelector(tasks(2), seed=1, learnability="informative")
    selector.observe("t0", [0.0, 1.0])
    state = json.loads(json.dumps(selector.state_dict()))
    for values in state["stats"].values():
        del values["informative"], values["uninformative"]
    again = CurriculumSelector(tasks(2), seed=1, learnability="informative")
    again.load_state_dict(state)
    assert (again.stats["t0"].informative, again.stats["t0"].uninformative) == (0.0, 0.0)


def test_thompson_choices_are_seeded_and_follow_the_posterior() -> None:
    def run(seed: int) -> list[str]:
        selector = CurriculumSelector(tasks(6), seed=seed, decay=1.0, learnability="success")
        observe_all(selector, {f"t{i}": [1.0] * 16 for i in range(3)})  # solved, p ~ .94
        return [tid for _ in range(20) for tid in ids(selector.next_batch(2))]

    assert run(1) == run(1)
    picks = run(1)
    # The solved tasks' posterior is narrow near 1 (learnability ~.05); unseen ones ~.17 on average.
    assert sum(t in ("t3", "t4", "t5") for t in picks) >= 0.8 * len(picks)


def test_uniform_share_draws_that_part_of_the_batch_at_random() -> None:
    selector = CurriculumSelector(tasks(4), sampling="greedy", uniform_share=0.5, seed=0)
    batch = ids(selector.next_batch(2))
    rng = random.Random(0)
    assert batch[0] == f"t{rng.choice(range(4))}"  # the random slot, from the seeded RNG
    assert batch[1] != batch[0] and len(set(batch)) == 2


@pytest.mark.parametrize("kind", ["uniform", "curriculum", "informative"])
def test_state_after_resume_equals_before_and_choices_continue(kind: str) -> None:
    def make() -> UniformSelector | CurriculumSelector:
        if kind == "uniform":
            return UniformSelector(tasks(7), seed=5)
        if kind == "informative":
            return CurriculumSelector(tasks(7), seed=5, learnability="informative")
        return CurriculumSelector(tasks(7), seed=5)

    first = make()
    for step in range(3):
        for task in first.next_batch(3):
            first.observe(task.id, [float((step + int(task.id[1:])) % 2), 1.0])
    saved = json.loads(json.dumps(first.state_dict()))  # through JSON, as state.json stores it
    second = make()
    second.load_state_dict(saved)
    assert second.state_dict() == first.state_dict()
    assert second.task_stats() == first.task_stats()
    assert ids(second.next_batch(4)) == ids(first.next_batch(4))


def test_state_dict_is_a_snapshot_not_a_live_view() -> None:
    selector = CurriculumSelector(tasks(2))
    snapshot = selector.state_dict()
    selector.observe("t0", [1.0])
    assert snapshot["stats"]["t0"]["episodes"] == 0


def test_resume_refuses_another_task_set_or_selector() -> None:
    state = UniformSelector(tasks(3)).state_dict()
    with pytest.raises(TaskSetError, match="task set changed"):
        UniformSelector(tasks(4)).load_state_dict(state)
    with pytest.raises(TaskSetError, match=r"selector is 'uniform'.*'curriculum'"):
        CurriculumSelector(tasks(3)).load_state_dict(state)


def test_mix_draws_sets_by_weight() -> None:
    source = ["a"] * 4 + ["b"] * 4
    selector = UniformSelector(
        tasks(8, source=source), seed=0, mix_field="source", mix_weights={"a": 3, "b": 1}
    )
    picks = [t.data["source"] for t in selector.next_batch(400)]
    assert 0.70 < picks.count("a") / 400 < 0.80
    # Each set is walked in its own per-epoch order: every "a" task before any repeats.
    first_a = [t.id for t in selector.tasks if t.data["source"] == "a"]
    again = UniformSelector(
        tasks(8, source=source), seed=0, mix_field="source", mix_weights={"a": 1}
    )
    assert sorted(ids(again.next_batch(4))) == first_a


def test_mix_errors_name_the_column_and_sets() -> None:
    with pytest.raises(TaskSetError, match="task 't0' has no such column"):
        UniformSelector(tasks(2), mix_field="source")
    with pytest.raises(TaskSetError, match=r"names task sets \['c'\]"):
        UniformSelector(tasks(2, source=["a", "b"]), mix_field="source", mix_weights={"c": 1})


@pytest.mark.parametrize(
    ("value", "shown"), [(None, "null"), (["x"], r'\["x"\]'), ({"k": 1}, r'\{"k": 1\}')]
)
def test_a_mix_column_that_holds_no_set_name_is_named(value: object, shown: str) -> None:
    # (a `source: null` task used to form a set "None" that named weights gave weight 0: never
    # explored, silently)
    with pytest.raises(TaskSetError, match=rf"task 't1' has {shown} there; every task needs"):
        UniformSelector(tasks(2, source=["a", value]), mix_field="source")


def test_a_numeric_mix_column_is_weighted_by_its_values_as_yaml_writes_them() -> None:
    mix = MixConfig.model_validate(yaml.safe_load("{field: difficulty, weights: {1: 3, 2: 0}}"))
    assert mix.weights == {"1": 3.0, "2": 0.0}
    selector = build_selector(UniformSelectorConfig(mix=mix), tasks(4, difficulty=[1, 2, 1, 2]))
    assert sorted(t.data["difficulty"] for t in selector.next_batch(6)) == [1] * 6
    for bad in (float("nan"), float("inf"), -1):
        with pytest.raises(ValueError, match=r"mix\.weights must be finite numbers >= 0"):
            MixConfig.model_validate({"weights": {"a": bad}})


def test_curriculum_within_a_mix_picks_from_the_drawn_set() -> None:
    selector = build_selector(
        CurriculumSelectorConfig(
            sampling="greedy", decay=1.0, mix=MixConfig(field="source", weights={"b": 1})
        ),
        tasks(4, source=["a", "a", "b", "b"]),
    )
    selector.observe("t2", [1, 1, 1])
    assert ids(selector.next_batch(2)) == ["t3", "t2"]


def test_the_config_chooses_the_learnability_estimate() -> None:
    config = CurriculumSelectorConfig.model_validate(
        {"learnability": "informative", "sampling": "greedy"}
    )
    selector = build_selector(config, tasks(2))
    assert isinstance(selector, CurriculumSelector)
    selector.observe("t0", [0.0, 0.01])
    assert ids(selector.next_batch(1)) == ["t0"]  # `success` would pick the unseen t1
    with pytest.raises(ValueError, match="learnability"):
        CurriculumSelectorConfig.model_validate({"learnability": "variance"})


def test_task_stats_file(tmp_path) -> None:
    selector = CurriculumSelector(tasks(2), sampling="greedy", decay=1.0, learnability="success")
    selector.next_batch(1)
    selector.observe("t0", [1.0, 0.0])
    write_task_stats(tmp_path, selector, step=4)
    data = json.loads((tmp_path / "task_stats.json").read_text())
    assert data["step"] == 4
    assert data["tasks"][0] == {
        "task_id": "t0",
        "selected": 1,
        "episodes": 2,
        "mean_reward": 0.5,
        "last_mean_reward": 0.5,
        "successes": 1.0,
        "failures": 1.0,
        "informative_groups": 1.0,
        "uninformative_groups": 0.0,
        "learnability": 0.25,
    }
    assert data["tasks"][1]["episodes"] == 0 and data["tasks"][1]["mean_reward"] is None


class FirstTasks:
    """A custom selector: always the first `size` tasks."""

    def __init__(self, tasks, seed: int = 0, offset: int = 0) -> None:
        self.tasks = tasks
        self.offset = offset
        self.seen: dict[str, int] = {}

    def next_batch(self, size):
        return self.tasks[self.offset : self.offset + size]

    def observe(self, task_id, rewards):
        self.seen[task_id] = self.seen.get(task_id, 0) + len(rewards)

    def state_dict(self):
        return {"seen": dict(self.seen)}

    def load_state_dict(self, state):
        self.seen = dict(state["seen"])

    def task_stats(self):
        return [{"task_id": k, "episodes": v} for k, v in self.seen.items()]


class NotASelector:
    def __init__(self, tasks, seed: int = 0) -> None:
        pass


def test_custom_selector_by_import_path() -> None:
    config = CustomSelectorConfig(path=f"{__name__}:FirstTasks", args={"offset": 1})
    selector = build_selector(config, tasks(4))
    assert ids(selector.next_batch(2)) == ["t1", "t2"]
    with pytest.raises(TaskSetError, match=r"lacks \['next_batch'"):
        build_selector(CustomSelectorConfig(path=f"{__name__}:NotASelector"), tasks(2))


class ReturnsIds(FirstTasks):
    def next_batch(self, size):
        return [t.id for t in self.tasks[:size]]


def test_a_custom_selector_that_breaks_its_contract_is_named() -> None:
    with pytest.raises(
        TaskSetError,
        match=r"made as FirstTasks\(tasks, seed=0, \*\*args\) with args \['ofset'\]: TypeError",
    ):
        build_selector(
            CustomSelectorConfig(path=f"{__name__}:FirstTasks", args={"ofset": 1}), tasks(4)
        )
    short = build_selector(
        CustomSelectorConfig(path=f"{__name__}:FirstTasks", args={"offset": 3}), tasks(4)
    )
    with pytest.raises(
        TaskSetError, match=r"next_batch\(2\) returned a list of 1; it must return a list of 2 Task"
    ):
        short.next_batch(2)
    wrong = build_selector(CustomSelectorConfig(path=f"{__name__}:ReturnsIds"), tasks(4))
    with pytest.raises(
        TaskSetError, match=r"next_batch\(2\) returned a list of 2; 't0' is not one of its Task"
    ):
        wrong.next_batch(2)
    ok = build_selector(CustomSelectorConfig(path=f"{__name__}:FirstTasks"), tasks(4))
    ok.observe("t0", [1.0])
    assert ok.state_dict() == {"seen": {"t0": 1}} and ok.task_stats()[0]["episodes"] == 1
