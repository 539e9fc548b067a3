"""`samples.jsonl`: advantages as the trainer computes them, merge breaks, the per-step bound."""

import json

import pytest

from agentscope_rft.algorithms.config import AlgorithmConfig
from agentscope_rft.explorer.explorer import ExploreResult
from agentscope_rft.explorer.trajectory import TrajectoryStats
from agentscope_rft.runtime.sample_log import SampleLog, break_reasons, token_advantages
from agentscope_rft.types import Sample


def sample(rid, reward, group="g", tokens=(1, 2, 3, 4), mask=(0, 0, 1, 1), k=0, temp=1.0):
    return Sample(
        token_ids=list(tokens), loss_mask=list(mask), logprobs=[0.0, 0.0, -0.5, -0.5][: len(tokens)]
        + [-0.1] * (len(tokens) - 4), reward=reward, rollout_id=rid, task_id=group,
        group_id=group, agent_name="a", sample_id=f"{rid}:a:{k}", temperature=temp,
    )  # fmt: skip


def test_grpo_advantages_are_the_group_normalized_rewards_on_trained_tokens():
    rows = token_advantages(
        [sample("r1", 1.0), sample("r2", 0.0)], AlgorithmConfig.model_validate({})
    )
    # mean 0.5, unbiased std sqrt(0.5): (1 - 0.5) / 0.70711 = 0.70711
    assert rows[0] == pytest.approx([0, 0, 0.70711, 0.70711], abs=1e-4)
    assert rows[1] == pytest.approx([0, 0, -0.70711, -0.70711], abs=1e-4)


@pytest.mark.parametrize("advantage", ["rloo", "reinforce_plus_plus", "gae", "stepwise"])
def test_every_estimator_gives_advantages_or_none_never_an_error(advantage):
    config = AlgorithmConfig.model_validate({"advantage": advantage})
    rows = token_advantages([sample("r1", 1.0), sample("r2", 0.0)], config)
    if advantage == "gae":  # needs the critic's values: only the trainer has them
        assert rows == [None, None]
    else:
        assert rows[0] is not None and rows[0][2] > rows[1][2]


def test_no_advantages_for_an_sft_objective():
    rows = token_advantages(
        [sample("r1", 1.0)], AlgorithmConfig.model_validate({"objective": "sft"})
    )
    assert rows == [None]


def test_break_reasons_are_read_from_the_tokens():
    first = sample("r", 1, tokens=(1, 2, 3, 4), mask=(0, 0, 1, 1))
    rewritten = sample("r", 1, tokens=(1, 9, 3, 4, 5, 6), mask=(0, 0, 0, 0, 1, 1), k=1)
    retokenized = sample("q", 1, tokens=(1, 2, 3, 9, 5, 6), mask=(0, 0, 0, 0, 1, 1), k=1)
    too_long = sample("p", 1, tokens=(1, 2, 3, 4, 5, 6), mask=(0, 0, 0, 0, 1, 1), k=1)
    hotter = sample("o", 1, tokens=(1, 2, 3, 4, 5, 6), mask=(0, 0, 0, 0, 1, 1), k=1, temp=0.5)
    found = {}
    for later in (rewritten, retokenized, too_long, hotter):
        head = sample(later.rollout_id, 1, tokens=(1, 2, 3, 4), mask=(0, 0, 1, 1))
        found.update(break_reasons([head, later]))
    assert found == {
        "r:a:1": "history_rewritten",
        "q:a:1": "completion_retokenized",
        "p:a:1": "max_length",
        "o:a:1": "settings_changed",
    }
    assert break_reasons([first]) == {}


def test_the_log_keeps_whole_groups_up_to_its_limit(tmp_path):
    samples = [sample(f"r{i}", float(i % 2), group=f"g{i // 2}") for i in range(6)]
    result = ExploreResult(rollouts=[], samples=samples, trajectory=TrajectoryStats(), seconds=0)
    SampleLog(tmp_path, AlgorithmConfig.model_validate({}), limit=5).write(7, result)
    lines = [json.loads(x) for x in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert [x["rollout_id"] for x in lines] == ["r0", "r1", "r2", "r3"]
    assert lines[0]["step"] == 7 and lines[0]["call_spans"] == [[2, 4]]
    assert lines[1]["advantages"] == pytest.approx([0, 0, 0.7071, 0.7071], abs=1e-4)
    SampleLog(tmp_path / "off", AlgorithmConfig.model_validate({}), limit=0).write(7, result)
    assert not (tmp_path / "off").exists()
