"""Prioritized replay in the memory and SQL buffers: exact choices, limits, resume."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentscope_rft.buffer import MemoryBuffer, SQLBuffer
from agentscope_rft.buffer.config import BufferConfig
from agentscope_rft.buffer.replay import (
    REUSE_KEY,
    ReplayCandidate,
    ReplayConfig,
    advantage_priority,
    choose,
    recency_priority,
    replay_count,
    replay_metrics,
)
from agentscope_rft.types import Sample


def sample(group: str, index: int, reward: float, version: int) -> Sample:
    return Sample(
        token_ids=[1, 2, 3],
        loss_mask=[0, 1, 1],
        logprobs=[0.0, -0.5, -0.25],
        reward=reward,
        rollout_id=f"{group}-r{index}",
        task_id=group,
        group_id=group,
        policy_version=version,
        sample_id=f"{group}-s{index}",
    )


def grp(name: str, rewards: list[float], version: int) -> list[Sample]:
    return [sample(name, i, r, version) for i, r in enumerate(rewards)]


def groups_of(batch: list[Sample]) -> list[tuple[str, float]]:
    """(group, reuse) per group in batch order; reuse 0: fresh."""
    seen: dict[str, float] = {}
    for s in batch:
        seen.setdefault(s.group, s.metrics.get(REUSE_KEY, 0.0))
    return list(seen.items())


def test_priorities_by_hand() -> None:
    assert advantage_priority(ReplayCandidate(0, (1.0, 0.0, 0.0, 0.0), 0, 0)) == pytest.approx(
        0.375  # mean .25: |.75| + 3 * |.25| over 4
    )
    assert advantage_priority(ReplayCandidate(0, (0.5, 0.5), 0, 0)) == 0.0
    assert recency_priority(ReplayCandidate(0, (), 4, 0)) == 5.0
    assert [replay_count(ReplayConfig(ratio=r), 4) for r in (0.1, 0.125, 0.5, 2.0)] == [0, 1, 2, 8]


def test_choose_filters_then_ranks_with_ties_to_the_newer() -> None:
    config = ReplayConfig(max_reuse=2, max_staleness=2)
    cands = [
        ReplayCandidate(0, (1.0, 0.0), 5, 0),  # priority .5
        ReplayCandidate(1, (1.0, 0.0), 5, 0),  # .5, newer than 0
        ReplayCandidate(2, (1.0, 0.0, 0.0, 0.0), 5, 1),  # .375
        ReplayCandidate(3, (1.0, 0.0), 5, 2),  # reused twice: out
        ReplayCandidate(4, (1.0, 0.0), 3, 0),  # version 3 < 6 - 2: out
        ReplayCandidate(5, (1.0, 1.0), 6, 0),  # priority 0: out
    ]
    got = choose(cands, 3, step=6, config=config, priority=advantage_priority)
    assert [c.seq for c in got] == [1, 0, 2]
    assert [
        c.seq for c in choose(cands, 1, step=6, config=config, priority=advantage_priority)
    ] == [1]


def memory(config: ReplayConfig, tmp_path: Path) -> MemoryBuffer:
    return MemoryBuffer(retain_steps=5, replay=config)


def sqlite(config: ReplayConfig, tmp_path: Path) -> SQLBuffer:
    return SQLBuffer(
        tmp_path / "buffer.db", poll_interval=0.01, synchronous="normal", replay=config
    )


@pytest.fixture(params=[memory, sqlite], ids=["memory", "sqlite"])
def make(request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    return request.param


async def test_replay_adds_the_highest_priority_trained_groups(make, tmp_path) -> None:  # type: ignore[no-untyped-def]
    buffer = make(ReplayConfig(ratio=1.0, max_reuse=1, max_staleness=2), tmp_path)
    # step 0 trains a (priority .5) and b (priority 0: equal rewards)
    await buffer.put(grp("a", [1.0, 0.0], 0) + grp("b", [1.0, 1.0], 0))
    first = await buffer.get(2, step=0, timeout=1)
    assert groups_of(first) == [("a", 0.0), ("b", 0.0)]  # nothing trained yet to replay
    # step 1: c (.375) fresh; a is replayed (b never: priority 0)
    await buffer.put(grp("c", [1.0, 0.0, 0.0, 0.0], 1) + grp("d", [0.0, 0.0], 1))
    second = await buffer.get(2, step=1, timeout=1)
    assert groups_of(second) == [("c", 0.0), ("d", 0.0), ("a", 1.0)]
    assert [s.reward for s in second if s.group == "a"] == [1.0, 0.0]
    # step 2: a reached max_reuse; c is next (d: priority 0)
    await buffer.put(grp("e", [0.0, 1.0], 2) + grp("f", [0.0, 0.0], 2))
    third = await buffer.get(2, step=2, timeout=1)
    assert groups_of(third) == [("e", 0.0), ("f", 0.0), ("c", 1.0)]
    # step 5: e (version 2) is older than 5 - 2 = 3: nothing to replay
    await buffer.put(grp("g", [0.0, 0.0], 5))
    assert groups_of(await buffer.get(1, step=5, timeout=1)) == [("g", 0.0)]
    assert replay_metrics(second) == {
        "replay/samples": 2.0,
        "replay/share": 0.25,  # 2 of 8 samples (c 4, d 2, a 2)
        "replay/max_reuse": 1.0,
    }
    await buffer.close()


async def test_ratio_and_recency_choose_the_replays(make, tmp_path) -> None:  # type: ignore[no-untyped-def]
    buffer = make(
        ReplayConfig(ratio=0.5, max_reuse=2, max_staleness=10, priority="recency"), tmp_path
    )
    await buffer.put(grp("a", [0.0], 0) + grp("b", [0.0], 0))
    await buffer.get(2, step=0, timeout=1)
    used = []
    for step in range(1, 5):
        await buffer.put(grp(f"n{step}", [0.0], step) + grp(f"m{step}", [0.0], step))
        batch = await buffer.get(2, step=step, timeout=1)
        used.append([g for g, reuse in groups_of(batch) if reuse])
    # recency: the newest trained group first, one replay per step (ratio .5 of 2); ties in
    # version go to the later-inserted group.
    assert used == [["b"], ["m1"], ["m2"], ["m3"]]
    await buffer.close()


async def test_a_group_is_replayed_at_most_max_reuse_times(make, tmp_path) -> None:  # type: ignore[no-untyped-def]
    buffer = make(ReplayConfig(ratio=1.0, max_reuse=2, max_staleness=10), tmp_path)
    await buffer.put(grp("a", [1.0, 0.0], 0))
    await buffer.get(1, step=0, timeout=1)
    reuses = []
    for step in range(1, 4):
        await buffer.put(grp(f"n{step}", [0.0, 0.0], step))  # priority 0: never replayed
        reuses.append(groups_of(await buffer.get(1, step=step, timeout=1))[1:])
    assert reuses == [[("a", 1.0)], [("a", 2.0)], []]
    await buffer.close()


async def test_requeue_forgets_the_replays_of_lost_steps(make, tmp_path) -> None:  # type: ignore[no-untyped-def]
    buffer = make(ReplayConfig(ratio=1.0, max_reuse=1, max_staleness=5), tmp_path)
    await buffer.put(grp("a", [1.0, 0.0], 0))
    await buffer.get(1, step=0, timeout=1)
    await buffer.put(grp("b", [0.0, 0.0], 1))
    assert groups_of(await buffer.get(1, step=1, timeout=1)) == [("b", 0.0), ("a", 1.0)]
    # step 1 is lost (crash): b goes back, and a's replay by step 1 did not happen
    await buffer.requeue_after(0)
    assert groups_of(await buffer.get(1, step=1, timeout=1)) == [("b", 0.0), ("a", 1.0)]
    await buffer.close()


async def test_the_groups_of_steps_a_rollback_abandons_are_never_replayed(make, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A rollback to step 1 left the groups of the abandoned steps 1 and 2 replayable (their
    policies the ones rolled back from), and step 2's replay of a counted against its reuse."""
    buffer = make(ReplayConfig(ratio=1.0, max_reuse=1, max_staleness=5), tmp_path)
    await buffer.put(grp("a", [1.0, 0.0], 0))
    await buffer.get(1, step=0, timeout=1)
    await buffer.put(grp("b", [1.0, 0.0, 0.0, 0.0], 1))
    assert groups_of(await buffer.get(1, step=1, timeout=1)) == [("b", 0.0), ("a", 1.0)]
    await buffer.put(grp("c", [1.0, 0.0], 2))
    await buffer.get(1, step=2, timeout=1)
    assert await buffer.abandon_after(0) == 6  # b and c
    stats = await buffer.stats()
    assert (stats["consumed_groups"], stats["dropped_groups"]) == (1.0, 2.0)
    await buffer.put(grp("b2", [0.0, 0.0], 1))  # step 1 redone, its task explored again
    assert groups_of(await buffer.get(1, step=1, timeout=1)) == [("b2", 0.0), ("a", 1.0)]
    await buffer.put(grp("c2", [0.0, 0.0], 2))
    assert groups_of(await buffer.get(1, step=2, timeout=1)) == [("c2", 0.0)]  # not b nor c
    await buffer.close()


async def test_sql_reuse_counts_survive_reopening(tmp_path) -> None:
    config = ReplayConfig(ratio=1.0, max_reuse=1, max_staleness=5)
    buffer = sqlite(config, tmp_path)
    await buffer.put(grp("a", [1.0, 0.0], 0) + grp("b", [1.0, 0.0, 0.0, 0.0], 0))
    await buffer.get(2, step=0, timeout=1)
    await buffer.put(grp("c", [0.0, 0.0], 1))
    assert groups_of(await buffer.get(1, step=1, timeout=1)) == [("c", 0.0), ("a", 1.0)]
    await buffer.close()
    again = sqlite(config, tmp_path)  # a resumed run: a was replayed once already
    await again.put(grp("d", [0.0, 0.0], 2))
    assert groups_of(await again.get(1, step=2, timeout=1)) == [("d", 0.0), ("b", 1.0)]
    await again.close()


async def test_without_replay_nothing_is_trained_twice(make, tmp_path) -> None:  # type: ignore[no-untyped-def]
    buffer = MemoryBuffer() if make is memory else SQLBuffer(tmp_path / "b.db", poll_interval=0.01)
    await buffer.put(grp("a", [1.0, 0.0], 0))
    await buffer.get(1, step=0, timeout=1)
    await buffer.put(grp("b", [1.0, 0.0], 1))
    assert groups_of(await buffer.get(1, step=1, timeout=1)) == [("b", 0.0)]
    await buffer.close()


def test_config_shorthand_and_custom_priority(tmp_path) -> None:
    config = BufferConfig.model_validate(
        {"type": "sql", "replay": {"priority": f"{__name__}:by_size"}}
    )
    assert config.replay is not None
    fn = config.replay.priority_fn()
    assert fn(ReplayCandidate(0, (1.0, 2.0), 0, 0)) == 2.0


def by_size(candidate: ReplayCandidate) -> float:
    return float(len(candidate.rewards))


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (["explorer.tasks_per_step=1", "buffer.replay={ratio: 0.3}"], r"rounds to 0 replayed"),
        (["explorer.tasks_per_step=4", "buffer.replay={ratio: 0.1}"], r"set ratio >= 0\.125"),
        (
            [
                "run.mode=offline",
                "offline.path=d.jsonl",
                "algorithm.objective=sft",
                "buffer.replay={}",
            ],
            "run.mode 'offline' trains from offline files without the buffer",
        ),
    ],
)
def test_a_replay_that_can_never_happen_is_a_config_error(sets: list[str], message: str) -> None:
    from agentscope_rft.config import ConfigError, load_config

    base = ["workflow=app.py:run", "tasks.train=t.jsonl"]
    with pytest.raises(ConfigError, match=message):
        load_config(None, [*base, *sets])
    ok = load_config(None, [*base, "explorer.tasks_per_step=1", "buffer.replay={ratio: 0.5}"])
    assert ok.buffer.replay is not None and replay_count(ok.buffer.replay, 1) == 1


def test_a_custom_priority_that_does_not_import_stops_the_run_at_preflight(tmp_path) -> None:
    from agentscope_rft.api import WorkflowError
    from agentscope_rft.config import load_config
    from agentscope_rft.runtime.preflight import preflight

    app = tmp_path / "app.py"
    app.write_text("async def run(task, model):\n    return 1.0\n")
    (tmp_path / "t.jsonl").write_text('{"id": "a"}\n')
    config = load_config(
        None,
        [
            f"workflow={app}:run",
            f"tasks.train={tmp_path / 't.jsonl'}",
            "model.name_or_path=/no/such/model",  # preflight stops before it reaches the model
            "buffer.replay={priority: no_such_module_here:fn}",
        ],
    )
    with pytest.raises(WorkflowError, match=r"buffer\.replay\.priority 'no_such_module_here:fn'"):
        preflight(config)
