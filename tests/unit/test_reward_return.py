"""What a workflow may return as its reward: finite real numbers, numpy's included."""

import fractions
import json

import numpy as np
import pytest
import torch

from agentscope_rft.explorer.runner import WorkflowReturnError, as_reward
from agentscope_rft.types import Reward


@pytest.mark.parametrize(
    ("returned", "value"),
    [
        (0.25, 0.25),
        (True, 1.0),
        (3, 3.0),
        (np.float32(0.5), 0.5),
        (np.float64(-2.0), -2.0),
        (np.int64(1), 1.0),
        (fractions.Fraction(1, 4), 0.25),
        (np.bool_(True), 1.0),  # `prediction == answer` on numpy values
        (np.array(0.5), 0.5),  # a 0-d array, as numpy reductions of object arrays give
        (torch.tensor(0.5), 0.5),
        (torch.tensor(1.0, requires_grad=True), 1.0),
    ],
)
def test_real_numbers_are_rewards(returned, value):
    reward = as_reward(returned, "workflow `run`")
    assert reward.value == value and type(reward.value) is float


def test_a_reward_is_made_of_plain_json_values():
    returned = Reward(
        np.float32(0.75),
        metrics={"em": np.float32(1.0), "solved": np.bool_(True), "f1": np.array(0.5)},
        success=np.bool_(True),
    )
    reward = as_reward(returned, "workflow `run`")
    metrics = {"em": 1.0, "solved": 1.0, "f1": 0.5}
    assert (reward.value, reward.metrics, reward.success) == (0.75, metrics, True)
    # the rollout log writes these as they are
    assert json.dumps([reward.value, reward.metrics, reward.success]) == (
        '[0.75, {"em": 1.0, "solved": 1.0, "f1": 0.5}, true]'
    )


@pytest.mark.parametrize(
    ("returned", "message"),
    [
        (None, "returned NoneType None"),
        (float("nan"), "returned float nan"),
        ({"reward": 1.0}, "returned dict"),
        ("1.0", "returned str"),
        (Reward(float("nan")), "returned Reward(value=nan); its value must be a finite float"),
        (Reward(float("inf")), "returned Reward(value=inf)"),
        (Reward("0.5"), "returned Reward(value='0.5')"),
        (Reward(1.0, metrics={"note": "good"}), "metrics {'note': 'good'} are not numbers"),
        (np.array([0.5, 1.0]), "returned ndarray"),
        (np.float64("nan"), "returned float64 np.float64(nan)"),
        (torch.tensor(float("nan")), "returned Tensor"),
    ],
)
def test_anything_else_is_a_clear_error(returned, message):
    with pytest.raises(WorkflowReturnError, match="the workflow `run`") as error:
        as_reward(returned, "workflow `run`")
    assert message in str(error.value)


def test_step_rewards_take_the_same_numbers():
    from agentscope_rft import emit_reward
    from agentscope_rft.integration.agentscope import RolloutScope, rollout_scope

    scope = RolloutScope(rollout_id="r", base_url="http://127.0.0.1:9/v1", api_key="k")
    with rollout_scope(scope):
        for value in (np.bool_(True), np.array(0.5), torch.tensor(0.25), np.float32(2.0)):
            emit_reward(value)
        with pytest.raises(ValueError, match="a step reward must be a finite number"):
            emit_reward(np.array([0.5, 1.0]))
    assert [r.value for r in scope.step_rewards] == [1.0, 0.5, 0.25, 2.0]
    assert all(type(r.value) is float for r in scope.step_rewards)
