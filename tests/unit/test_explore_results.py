"""`explore`'s per-task lines of results.jsonl."""

from __future__ import annotations

from agentscope_rft.runtime.explore import _task_result
from agentscope_rft.types import Rollout, RolloutStatus


def test_a_task_line_holds_the_mean_of_each_metric_its_episodes_reported() -> None:
    # A search answer's F1 is a metric beside the reward built on it (F1 plus a format term):
    # results.jsonl held only the reward, so a per-task F1 could not be re-made from it.
    rollouts = [
        Rollout("a", "t", {}, [], 1.1, metrics={"f1": 1.0, "em": 1.0}),
        Rollout("b", "t", {}, [], 0.6, metrics={"f1": 0.5}),
        Rollout("c", "t", {}, [], 0.0, status=RolloutStatus.FAILED, metrics={"f1": 0.0}),
    ]
    line = _task_result("t", rollouts)
    assert line["rewards"] == [1.1, 0.6, None]
    assert line["metrics"] == {"em": 1.0, "f1": 0.75}  # failed episodes are not data
    assert _task_result("u", [])["metrics"] == {}
