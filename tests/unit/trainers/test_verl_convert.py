"""Samples <-> verl batch layout: exact round trips, padding/trimming, hand-checked layouts."""

from __future__ import annotations

import logging

import pytest
import torch

pytest.importorskip("verl", reason="verl is not installed (pip install 'agentscope-rft[verl]')")

from agentscope_rft.trainers.verl.convert import (
    build_batch,
    num_trained_sequences,
    padding_needed,
    prompt_length,
    response_values_to_tokens,
    shard,
    to_engine_layout,
    unpack_batch,
)
from agentscope_rft.types import Sample

PAD = 2


def _sample(ids, mask, *, task="t", temperature=1.0, reward=0.0) -> Sample:
    logprobs = [(-0.25 * (i + 1)) if m else 0.0 for i, m in enumerate(mask)]
    return Sample(
        token_ids=ids,
        loss_mask=mask,
        logprobs=logprobs,
        reward=reward,
        rollout_id=f"r{ids[0]}",
        task_id=task,
        temperature=temperature,
    )


def _samples() -> list[Sample]:
    return [
        # two assistant turns with a tool result (8) between them
        _sample([5, 6, 7, 8, 9, 10], [0, 1, 1, 0, 1, 1], task="a", reward=1.0),
        _sample([11, 12, 13], [0, 0, 1], task="a", temperature=0.7),
        _sample([14, 15, 16, 17], [0, 0, 0, 0], task="b"),  # nothing trained: kept, masked
    ]


def _advantages(samples: list[Sample]) -> torch.Tensor:
    width = max(len(s.token_ids) for s in samples) + 2  # wider than needed is fine
    adv = torch.zeros(len(samples), width)
    for i, s in enumerate(samples):
        mask = torch.tensor(list(s.loss_mask), dtype=torch.float32)
        adv[i, : len(s.token_ids)] = mask * torch.arange(1, len(s.token_ids) + 1) * (i + 1)
    return adv


def test_layout_by_hand() -> None:
    batch = build_batch(_samples(), _advantages(_samples()), pad_token_id=PAD)
    assert batch["prompts"].tolist() == [[PAD, PAD, 5], [PAD, 11, 12], [14, 15, 16]]
    assert batch["responses"].tolist() == [
        [6, 7, 8, 9, 10],
        [13, PAD, PAD, PAD, PAD],
        [17, PAD, PAD, PAD, PAD],
    ]
    assert batch["response_mask"].tolist() == [[1, 1, 0, 1, 1], [1, 0, 0, 0, 0], [0] * 5]
    assert batch["attention_mask"][1].tolist() == [0, 1, 1, 1, 0, 0, 0, 0]
    assert batch["position_ids"][1].tolist() == [0, 0, 1, 2, 0, 0, 0, 0]
    assert batch["input_ids"][0].tolist() == [PAD, PAD, 5, 6, 7, 8, 9, 10]
    assert batch["advantages"][0].tolist() == [2.0, 3.0, 0.0, 5.0, 6.0]
    assert batch["rollout_log_probs"][1].tolist() == [-0.75, 0.0, 0.0, 0.0, 0.0]
    assert torch.equal(batch["old_log_probs"], batch["rollout_log_probs"])
    assert batch["sample_index"].tolist() == [0, 1, 2]
    assert list(batch["uid"]) == ["a", "a", "b"]
    assert batch["temperature"].tolist() == pytest.approx([1.0, 0.7, 1.0])
    assert num_trained_sequences(batch) == 2
    assert "ref_log_prob" not in batch


def test_round_trip_is_exact() -> None:
    samples = _samples()
    advantages = _advantages(samples)
    old = torch.full_like(advantages, -3.0)
    batch = build_batch(samples, advantages, pad_token_id=PAD, old_logprobs=old, multiple_of=4)
    back = unpack_batch(batch)
    assert [u.sample_index for u in back] == [0, 1, 2]
    for sample, row, unpacked in zip(samples, advantages, back, strict=True):
        n = len(sample.token_ids)
        p = prompt_length(sample)
        assert unpacked.token_ids == list(sample.token_ids)
        assert unpacked.loss_mask == list(sample.loss_mask)
        assert unpacked.uid == sample.task_id
        f32 = torch.tensor(list(sample.logprobs), dtype=torch.float32)
        assert torch.equal(torch.tensor(unpacked.rollout_logprobs[p:]), f32[p:])
        assert torch.equal(torch.tensor(unpacked.advantages), torch.cat([torch.zeros(p), row[p:n]]))
        assert unpacked.old_logprobs == [0.0] * p + [-3.0] * (n - p)
        assert unpacked.temperature == pytest.approx(sample.temperature)
        assert unpacked.reward == sample.reward


def test_per_sample_advantages_spread_over_trained_tokens() -> None:
    samples = _samples()
    batch = build_batch(samples, torch.tensor([2.0, -1.0, 5.0]), pad_token_id=PAD)
    assert batch["advantages"].tolist() == [
        [2.0, 2.0, 0.0, 2.0, 2.0],
        [-1.0, 0.0, 0.0, 0.0, 0.0],
        [0.0] * 5,
    ]


def test_padding_rows_are_fully_masked_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    samples = _samples()
    with caplog.at_level(logging.INFO, logger="agentscope_rft.trainers.verl.convert"):
        batch = build_batch(samples, _advantages(samples), pad_token_id=PAD, multiple_of=4)
    assert "batch of 3 samples padded with 1 fully-masked samples to 4" in caplog.text
    assert batch.batch_size[0] == 4
    assert batch["sample_index"].tolist() == [0, 1, 2, -1]
    assert batch["response_mask"][3].sum() == 0
    assert batch["attention_mask"][3].sum() == 2  # one prompt + one response token
    assert int(batch["response_mask"].sum()) == sum(s.num_trained_tokens for s in samples)
    assert len(unpack_batch(batch)) == 3


def test_trim_drops_trailing_samples(caplog: pytest.LogCaptureFixture) -> None:
    samples = _samples()
    with caplog.at_level(logging.INFO, logger="agentscope_rft.trainers.verl.convert"):
        batch = build_batch(
            samples, _advantages(samples), pad_token_id=PAD, multiple_of=2, pad_policy="trim"
        )
    assert "trimmed by 1 samples" in caplog.text
    assert batch["sample_index"].tolist() == [0, 1]


@pytest.mark.parametrize(
    ("num", "multiple", "policy", "change"),
    [(8, 4, "pad", 0), (10, 4, "pad", 2), (10, 4, "trim", -2), (1, 3, "pad", 2)],
)
def test_padding_needed(num: int, multiple: int, policy: str, change: int) -> None:
    assert padding_needed(num, multiple, policy) == change  # type: ignore[arg-type]


def test_trim_to_nothing_fails() -> None:
    with pytest.raises(ValueError, match="nothing would be left"):
        padding_needed(3, 4, "trim")


def test_bad_input_is_named() -> None:
    samples = _samples()
    with pytest.raises(ValueError, match="0 samples"):
        build_batch([], torch.zeros(0), pad_token_id=PAD)
    with pytest.raises(ValueError, match="nothing to train on"):
        build_batch(samples[2:], torch.zeros(1), pad_token_id=PAD)
    with pytest.raises(ValueError, match="loss_mask\\[0\\] is 1"):
        build_batch([_sample([1, 2], [1, 1])], torch.zeros(1), pad_token_id=PAD)
    with pytest.raises(ValueError, match="advantages: row 0 has 2 columns for 6 tokens"):
        build_batch(samples, torch.zeros(3, 2), pad_token_id=PAD)
    with pytest.raises(ValueError, match="at least 2 tokens"):
        build_batch([_sample([1], [0]), samples[0]], torch.zeros(2), pad_token_id=PAD)


def test_shard_and_engine_layout() -> None:
    samples = _samples()
    batch = build_batch(samples, _advantages(samples), pad_token_id=PAD, multiple_of=4)
    halves = [shard(batch, rank, 2) for rank in range(2)]
    assert [h["sample_index"].tolist() for h in halves] == [[0, 1], [2, -1]]
    with pytest.raises(ValueError, match="does not split across 3"):
        shard(batch, 0, 3)

    engine = to_engine_layout(halves[0])
    assert engine["input_ids"].is_nested
    assert [t.tolist() for t in engine["input_ids"].unbind()] == [
        list(samples[0].token_ids),
        list(samples[1].token_ids),
    ]
    assert [t.tolist() for t in engine["position_ids"].unbind()] == [list(range(6)), [0, 1, 2]]
    assert torch.equal(engine["loss_mask"], halves[0]["response_mask"])
    assert "input_ids" in halves[0]  # the padded batch is left untouched


def test_response_values_back_to_token_positions() -> None:
    samples = _samples()
    batch = build_batch(samples, _advantages(samples), pad_token_id=PAD, multiple_of=4)
    values = torch.arange(20, dtype=torch.float32).reshape(4, 5)
    assert response_values_to_tokens(values, batch) == [
        [0.0, 0.0, 1.0, 2.0, 3.0, 4.0],
        [0.0, 0.0, 5.0],
        [0.0, 0.0, 0.0, 10.0],
    ]
