"""Experience operators: each drops or changes exactly what it should, and counts it."""

from __future__ import annotations

import pytest

from agentscope_rft.data.config import DataConfig
from agentscope_rft.data.operators import (
    Episode,
    FormatCheck,
    Group,
    MinHashDedup,
    Pipeline,
    length,
    reward_range,
    status,
)
from agentscope_rft.data.side import apply_offline_operators, build_operator, groups_from_explored
from agentscope_rft.types import Call, Rollout, RolloutStatus, Sample


def sample(rollout_id: str, reward: float, trained: int = 2, stop: str = "stop") -> Sample:
    return Sample(
        token_ids=[1] * (3 + trained),
        loss_mask=[0] * 3 + [1] * trained,
        logprobs=[0.0] * (3 + trained),
        reward=reward,
        rollout_id=rollout_id,
        task_id="task",
        group_id="g",
        stop_reason=stop,
        sample_id=f"{rollout_id}-s",
    )


def episode(rid: str, reward: float, response: str = "", **kw: object) -> Episode:
    trained = int(kw.pop("trained", 2))  # type: ignore[call-overload]
    stop = str(kw.pop("stop", "stop"))
    state = str(kw.pop("status", "ok"))
    return Episode(rid, (sample(rid, reward, trained, stop),), response, reward, state)


def group(gid: str, *episodes: Episode) -> Group:
    return Group(gid, {"question": "q"}, tuple(episodes))


def kept_ids(groups: list[Group]) -> list[list[str]]:
    return [[e.rollout_id for e in g.episodes] for g in groups]


async def test_reward_range_drops_outside_and_counts() -> None:
    pipeline = Pipeline([reward_range(0.0, 1.0)])
    groups = [group("a", episode("a0", -0.5), episode("a1", 0.0), episode("a2", 1.5))]
    groups.append(group("b", episode("b0", 2.0)))
    kept, metrics = await pipeline(groups)
    assert kept_ids(kept) == [["a1"]]
    assert metrics.pop("data/reward_range/wall_seconds") >= 0
    assert metrics == {
        "data/reward_range/episodes_dropped": 3.0,
        "data/reward_range/samples_dropped": 3.0,
        "data/reward_range/groups_dropped": 1.0,
        "data/reward_range/changed": 0.0,
    }


async def test_length_bounds_count_trained_tokens_only() -> None:
    groups = [group("a", episode("a0", 1, trained=1), episode("a1", 1, trained=4),
                    episode("a2", 1, trained=9))]  # fmt: skip
    kept, metrics = await Pipeline([length(2, 8)])(groups)
    assert kept_ids(kept) == [["a1"]]
    assert metrics["data/length/episodes_dropped"] == 2.0


async def test_status_drops_truncated_and_stop_reasons() -> None:
    groups = [
        group(
            "a",
            episode("a0", 1, status="truncated"),
            episode("a1", 1, stop="length"),
            episode("a2", 1),
        )
    ]
    kept, metrics = await Pipeline([status(["truncated"], [])])(groups)
    assert kept_ids(kept) == [["a1", "a2"]]
    kept, metrics = await Pipeline([status(["truncated"], ["length"])])(groups)
    assert kept_ids(kept) == [["a2"]]
    assert metrics["data/status/episodes_dropped"] == 2.0


async def test_format_rewards_or_drops_what_does_not_match() -> None:
    groups = [group("a", episode("a0", 1.0, "<answer>4</answer>"), episode("a1", 1.0, "4"),
                    episode("a2", 0.0, "nope"))]  # fmt: skip
    kept, metrics = await Pipeline([FormatCheck(r"<answer>.+</answer>", "reward", -1.0)])(groups)
    assert [e.reward for e in kept[0].episodes] == [1.0, -1.0, -1.0]
    assert [s.reward for s in kept[0].samples] == [1.0, -1.0, -1.0]  # the samples carry it
    assert metrics["data/format/changed"] == 2.0
    assert metrics["data/format/episodes_dropped"] == 0.0
    kept, metrics = await Pipeline([FormatCheck(r"<answer>.+</answer>", "drop", 0.0)])(groups)
    assert kept_ids(kept) == [["a0"]]
    assert metrics["data/format/episodes_dropped"] == 2.0
    with pytest.raises(ValueError, match="invalid pattern"):
        FormatCheck("(", "drop", 0.0)


@pytest.mark.parametrize(
    ("operator", "message"),
    [
        ({"type": "reward_range", "min": 1, "max": 0}, "min 1.0 > max 0.0 would drop every"),
        ({"type": "reward_range", "min": float("nan")}, "finite number"),
        ({"type": "length", "min_tokens": 9, "max_tokens": 5}, "min_tokens 9 > max_tokens 5"),
        (
            {"type": "format", "pattern": "<answer>(.+"},
            "pattern '<answer>\\(\\.\\+' is not a regex",
        ),
        ({"type": "format", "pattern": "x", "reward": float("inf")}, "finite number"),
        ({"type": "status", "stop_reasons": ["lenght"]}, "'stop', 'length' or 'tool_calls'"),
    ],
)
def test_an_operator_that_cannot_work_is_refused_by_the_config(
    operator: dict, message: str
) -> None:
    # (each used to pass and then drop every episode, or none, in silence)
    with pytest.raises(ValueError, match=message):
        DataConfig.model_validate({"operators": [operator]})


TEXT = "the quick brown fox jumps over the lazy dog near the river bank today"


def test_minhash_estimates_jaccard_and_is_deterministic() -> None:
    dedup = MinHashDedup(ngram=2, num_perm=256)
    assert dedup.similarity(TEXT, TEXT) == 1.0
    other = "a completely different sentence about markets and prices in spring"
    assert dedup.similarity(TEXT, other) < 0.05
    one_word = TEXT.replace("today", "tomorrow")  # 13 bigrams each, 12 shared: J = 12/14
    assert dedup.similarity(TEXT, one_word) == pytest.approx(12 / 14, abs=0.08)
    assert MinHashDedup(ngram=2).signature(TEXT) == MinHashDedup(ngram=2).signature(TEXT)


async def test_dedup_keeps_the_first_copy_per_group_or_batch() -> None:
    near = TEXT.replace("today", "TODAY")  # lower-cased: an exact duplicate
    far = "an unrelated answer with other words entirely and nothing shared at all"
    groups = [
        group("a", episode("a0", 1, TEXT), episode("a1", 0, near), episode("a2", 1, far)),
        group("b", episode("b0", 1, TEXT), episode("b1", 1, "short")),
    ]
    kept, metrics = await Pipeline([MinHashDedup(threshold=0.9)])(groups)
    assert kept_ids(kept) == [["a0", "a2"], ["b0", "b1"]]
    assert metrics["data/dedup/episodes_dropped"] == 1.0
    kept, metrics = await Pipeline([MinHashDedup(threshold=0.9, scope="batch")])(groups)
    assert kept_ids(kept) == [["a0", "a2"], ["b1"]]
    assert metrics["data/dedup/episodes_dropped"] == 2.0


async def test_pipeline_runs_in_order_and_names_repeated_operators() -> None:
    groups = [group("a", episode("a0", 0.5, "x"), episode("a1", 3.0, "<b>"))]
    pipeline = Pipeline(
        [FormatCheck("<b>", "reward", 5.0), reward_range(None, 4.0), reward_range(3.5, None)]
    )
    assert pipeline.names == ["format", "reward_range", "reward_range2"]
    kept, metrics = await pipeline(groups)
    assert kept == []
    assert metrics["data/format/changed"] == 1.0  # a0: 0.5 -> 5.0 (it has no <b>)
    assert metrics["data/reward_range/episodes_dropped"] == 1.0  # a0, now at 5.0
    assert metrics["data/reward_range/groups_dropped"] == 0.0  # a1 is left
    assert metrics["data/reward_range2/episodes_dropped"] == 1.0  # a1 at 3.0 < 3.5
    assert metrics["data/reward_range2/groups_dropped"] == 1.0


def double(groups: list[Group], args: dict) -> list[Group]:
    return [g.keep([e.with_reward(e.reward * args["factor"]) for e in g.episodes]) for g in groups]


async def drop_all(groups: list[Group], args: dict) -> list[Group]:
    return []


def not_groups(groups: list[Group], args: dict) -> str:
    return "oops"


async def test_custom_operators_sync_async_and_checked() -> None:
    groups = [group("a", episode("a0", 1.0), episode("a1", 0.0))]
    config = DataConfig.model_validate(
        {"operators": [{"type": "custom", "path": f"{__name__}:double", "args": {"factor": 2}}]}
    )
    op = build_operator(config.operators[0])
    kept, metrics = await Pipeline([op])(groups)
    assert [e.reward for e in kept[0].episodes] == [2.0, 0.0]
    assert metrics["data/double/changed"] == 1.0
    config = DataConfig.model_validate(
        {"operators": [{"type": "custom", "path": f"{__name__}:drop_all", "name": "nothing"}]}
    )
    kept, metrics = await Pipeline([build_operator(config.operators[0])])(groups)
    assert kept == [] and metrics["data/nothing/groups_dropped"] == 1.0
    bad = DataConfig.model_validate(
        {"operators": [{"type": "custom", "path": f"{__name__}:not_groups"}]}
    )
    with pytest.raises(TypeError, match="must return a list of Group"):
        await Pipeline([build_operator(bad.operators[0])])(groups)


def call(content: str) -> Call:
    return Call("c", "r", None, None, [], None, [1], [2], [-0.1], "stop", 0, content=content)


def test_groups_from_explored_take_the_last_response_and_rollout_reward() -> None:
    rollouts = [
        Rollout("r0", "task", {"question": "q?"}, [call("first"), call("final")], 0.7),
        Rollout("r1", "task", {"question": "q?"}, [call("x")], 0.2, RolloutStatus.TRUNCATED),
    ]
    groups = [[sample("r0", 0.7), sample("r0", 0.7), sample("r1", 0.2)]]
    (made,) = groups_from_explored(rollouts, groups)
    assert made.task == {"question": "q?"}
    assert [
        (e.rollout_id, e.response, e.reward, e.status, len(e.samples)) for e in made.episodes
    ] == [
        ("r0", "final", 0.7, "ok", 2),
        ("r1", "x", 0.2, "truncated", 1),
    ]


def test_offline_operators_filter_units_by_their_decoded_text() -> None:
    config = DataConfig.model_validate(
        {"offline_operators": [{"type": "dedup"}, {"type": "length", "min_tokens": 2}]}
    )
    units = {
        "u0": [sample("u0", 0.0, trained=3)],
        "u1": [sample("u1", 0.0, trained=3)],  # same tokens: a duplicate of u0
        "u2": [sample("u2", 0.0, trained=1)],
    }
    decode = lambda ids: " ".join(str(i) for i in ids) + f" {len(ids)}"  # noqa: E731
    kept = apply_offline_operators(config.offline_operators, units, decode)
    assert list(kept) == ["u0"]


def nan_reward(groups: list[Group], args: dict) -> list[Group]:
    return [g.keep([e.with_reward(float("nan")) for e in g.episodes]) for g in groups]


async def test_a_custom_operator_that_gives_a_reward_that_is_not_a_number_is_named() -> None:
    # (the step failed at the buffer, naming a sample but not the operator that set it)
    config = DataConfig.model_validate(
        {"operators": [{"type": "custom", "path": f"{__name__}:nan_reward", "name": "mine"}]}
    )
    groups = [group("a", episode("a0", 1.0))]
    with pytest.raises(ValueError, match=r"custom operator 'mine' gave episode 'a0' of group"):
        await Pipeline([build_operator(config.operators[0])])(groups)


def score_by_length(groups: list[Group], args: dict) -> list[Group]:
    """A stand-in judge: scores each episode by its response's length."""
    return [g.keep([e.with_reward(len(e.response) / 10) for e in g.episodes]) for g in groups]


async def test_the_selector_hears_the_rewards_the_operators_leave(tmp_path) -> None:
    """A judge gives the rewards that train: the curriculum must learn from them, not from the
    environment's (all 0 here: every task would look like one with nothing to learn)."""
    from agentscope_rft.data.selection import CurriculumSelector
    from agentscope_rft.data.side import DataSide
    from agentscope_rft.explorer.tasks import load_tasks

    config = DataConfig.model_validate(
        {"operators": [{"type": "custom", "path": f"{__name__}:score_by_length"},
                       {"type": "reward_range", "max": 0.5}]}
    )  # fmt: skip
    selector = CurriculumSelector(load_tasks([{"id": "t"}, {"id": "u"}]), decay=1.0)
    side = DataSide(selector, Pipeline([build_operator(op) for op in config.operators]), tmp_path)
    rollouts = [
        Rollout("r0", "t", {}, [call("a")], 0.0),
        Rollout("r1", "t", {}, [call("abc")], 0.0),
        Rollout("r2", "t", {}, [call("too long to keep")], 0.0),
        Rollout("r3", "u", {}, [call("far too long to keep")], 0.0),
    ]
    groups = [[sample("r0", 0.0), sample("r1", 0.0), sample("r2", 0.0)], [sample("r3", 0.0)]]
    kept, metrics = await side.after_explore(0, rollouts, groups)
    assert [[s.rollout_id for s in g] for g in kept] == [["r0", "r1"]]
    assert metrics["data/tasks_observed"] == 2.0
    stats = {row["task_id"]: row for row in selector.task_stats()}
    # t: heard the kept episodes' scores 0.1 and 0.3 (they differ: informative)
    assert stats["t"]["episodes"] == 2 and stats["t"]["informative_groups"] == 1.0
    assert stats["t"]["mean_reward"] == pytest.approx(0.2)
    # u: every episode dropped: heard with its own reward
    assert stats["u"]["episodes"] == 1 and stats["u"]["mean_reward"] == 0.0


def test_reward_setting_operators_and_dynamic_sampling_are_refused_together() -> None:
    from agentscope_rft.config import ConfigError, load_config

    base = ["workflow=app.py:run", "tasks.train=t.jsonl", "explorer.dynamic_sampling={}"]
    for op in ("{type: group_judge}", "{type: format, pattern: x}"):
        with pytest.raises(ConfigError, match=r"dynamic_sampling keeps the groups whose workflow"):
            load_config(None, [*base, f"data.operators=[{op}]"])
    filtered = load_config(
        None, [*base, "data.operators=[{type: format, pattern: x, action: drop}]"]
    )
    assert filtered.explorer.dynamic_sampling is not None  # a filter alone is fine
