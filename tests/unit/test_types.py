import pytest

from agentscope_rft.types import Call, Sample, SamplingParams, ToolCall


def test_sampling_params_validation_names_the_field():
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=3.0)
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0.0)
    with pytest.raises(ValueError, match="top_k"):
        SamplingParams(top_k=0)
    with pytest.raises(ValueError, match="max_tokens"):
        SamplingParams(max_tokens=0)
    assert SamplingParams(temperature=0).greedy


def test_sample_lengths_must_agree():
    with pytest.raises(ValueError, match="differ in length"):
        Sample(
            token_ids=[1, 2],
            loss_mask=[1],
            logprobs=[0.0, 0.0],
            reward=0,
            rollout_id="r",
            task_id="t",
        )
    with pytest.raises(ValueError, match="kind"):
        Sample(
            token_ids=[1],
            loss_mask=[1],
            logprobs=[0.0],
            reward=0,
            rollout_id="r",
            task_id="t",
            kind="bogus",
        )


def test_sample_and_call_round_trip():
    sample = Sample(
        token_ids=[1, 2, 3],
        loss_mask=[0, 1, 1],
        logprobs=[0.0, -1.0, -2.0],
        reward=0.5,
        rollout_id="r",
        task_id="t",
        metrics={"m": 1.0},
    )
    assert Sample.from_dict(sample.to_dict()) == sample
    call = Call(
        call_id="c",
        request_id="q",
        rollout_id="r",
        agent_name="a",
        messages=[],
        tools=None,
        prompt_ids=[1],
        completion_ids=[2, 3],
        logprobs=[-0.1, -0.2],
        finish_reason="tool_calls",
        policy_version=3,
        tool_calls=[ToolCall("id0", "add", '{"a": 1}')],
    )
    assert Call.from_dict(call.to_dict()) == call
    with pytest.raises(ValueError, match="log-probs"):
        Call(
            call_id="c",
            request_id="q",
            rollout_id=None,
            agent_name=None,
            messages=[],
            tools=None,
            prompt_ids=[],
            completion_ids=[1],
            logprobs=[],
            finish_reason="stop",
            policy_version=0,
        )
