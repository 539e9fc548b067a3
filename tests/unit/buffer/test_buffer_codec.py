"""Samples to storage rows and back: exact layout, exact round trips, clear errors."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from buffer_helpers import make_sample, stored_form

from agentscope_rft.buffer import BufferInputError
from agentscope_rft.buffer.codec import STORED_FIELDS, decode_sample, encode_sample
from agentscope_rft.types import Sample


def test_every_sample_field_is_stored() -> None:
    # A new Sample field must be added to the codec (and the schema), not silently dropped.
    assert {f.name for f in dataclasses.fields(Sample)} == STORED_FIELDS


def test_blobs_are_little_endian_fixed_width_arrays() -> None:
    sample = Sample([1, 256, 2**31 - 1], [0, 1, 1], [0.0, -0.5, -1.25], 1.0, "r", "t")
    row = encode_sample(sample, "s")

    assert row["token_ids"] == bytes.fromhex("0100000000010000ffffff7f")
    assert row["loss_mask"] == b"\x00\x01\x01"
    assert row["logprobs"] == bytes.fromhex("00000000000000bf0000a0bf")
    assert row["token_rewards"] is None
    assert row["num_tokens"] == 3


@pytest.mark.parametrize("index", [0, 1, 2, 3])
def test_round_trip_is_exact_up_to_float32_logprobs(index: int) -> None:
    sample = make_sample("g", index, num_tokens=50)

    back = decode_sample(encode_sample(sample, "s"))

    assert back == stored_form(sample)
    assert back.token_ids == list(sample.token_ids)
    assert back.reward == sample.reward  # float64 column: exact
    assert np.max(np.abs(np.subtract(back.logprobs, sample.logprobs))) <= 5 * 2**-24


def test_float32_precision_is_what_comes_back() -> None:
    sample = Sample([1], [1], [-0.1], 0.0, "r", "t", token_rewards=[0.1])
    back = decode_sample(encode_sample(sample, "s"))
    assert back.logprobs == [float(np.float32(-0.1))] == [-0.10000000149011612]
    assert back.token_rewards == [float(np.float32(0.1))]


def test_numpy_inputs_and_empty_samples_are_stored() -> None:
    sample = Sample(np.arange(4), np.array([0, 0, 1, 1], dtype=bool), np.zeros(4), 0.5, "r", "t")
    back = decode_sample(encode_sample(sample, "s"))
    assert (back.token_ids, back.loss_mask) == ([0, 1, 2, 3], [0, 0, 1, 1])
    empty = decode_sample(encode_sample(Sample([], [], [], 0.0, "r", "t"), "s"))
    assert (empty.token_ids, empty.loss_mask, empty.logprobs) == ([], [], [])


def _bad(**changes: object) -> Sample:
    return dataclasses.replace(Sample([1, 2], [0, 1], [0.0, -1.0], 1.0, "r", "t"), **changes)


@pytest.mark.parametrize(
    ("sample", "message"),
    [
        (_bad(token_ids=[1, -(2**31) - 1]), "field 'token_ids' has a value outside int32"),
        (_bad(token_ids=[1.0, 2.5]), "field 'token_ids' must hold integers, got float64"),
        (_bad(token_ids=[[1], [2]]), "field 'token_ids' must be a flat list, got 2-d"),
        (_bad(loss_mask=[0, 2]), "field 'loss_mask' must hold only 0 and 1"),
        (_bad(logprobs=["a", "b"]), "field 'logprobs' must hold numbers"),
        (_bad(reward=math.nan), "field 'reward' must be a finite number, got nan"),
        (_bad(policy_version=1.5), "field 'policy_version' must be an integer"),
        (_bad(rollout_id=7), "field 'rollout_id' must be a string"),
        (_bad(agent_name=3), "field 'agent_name' must be a string or null"),
        (_bad(metrics={"ok": "yes"}), "field 'metrics' must map names to numbers"),
    ],
)
def test_bad_fields_are_named(sample: Sample, message: str) -> None:
    with pytest.raises(BufferInputError, match=rf"^samples\[4\] \(r\): {message}"):
        encode_sample(sample, "samples[4] (r)")


def test_non_samples_are_refused() -> None:
    with pytest.raises(BufferInputError, match="expected a Sample, got dict"):
        encode_sample({"token_ids": []}, "samples[0]")  # type: ignore[arg-type]
