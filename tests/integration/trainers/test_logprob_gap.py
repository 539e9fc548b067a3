"""The engine-vs-trainer log-prob gap compares only samples explored by the trained weights."""

import dataclasses

import pytest
import torch

from agentscope_rft.algorithms import AlgorithmConfig
from agentscope_rft.config import TorchTrainerConfig
from agentscope_rft.trainers.torch_trainer import TorchTrainer
from agentscope_rft.types import Sample

STEP = 3  # the trainer holds policy version 3 at step 3


def _samples(vocab: int) -> list[Sample]:
    """Two groups of two episodes: 6 prompt tokens, then 10 sampled ones."""
    gen = torch.Generator().manual_seed(0)
    samples = []
    for g in range(2):
        for e in range(2):
            ids = torch.randint(100, vocab, (16,), generator=gen).tolist()
            samples.append(
                Sample(
                    token_ids=ids,
                    loss_mask=[0] * 6 + [1] * 10,
                    logprobs=[0.0] * 16,
                    reward=float(e),
                    rollout_id=f"r{g}{e}",
                    task_id=f"t{g}",
                    group_id=f"s{STEP}:t{g}",
                    sample_id=f"r{g}{e}:0",
                )
            )
    return samples


def _own_logprobs(model: torch.nn.Module, sample: Sample) -> list[float]:
    """The model's log-probs of the sample's tokens (0 where untrained), as an engine records."""
    ids = torch.tensor([sample.token_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, :-1].float()
    picked = logits.log_softmax(-1).gather(-1, ids[0, 1:, None])[:, 0]
    values = [0.0, *picked.tolist()]
    return [v if m else 0.0 for v, m in zip(values, sample.loss_mask, strict=True)]


@pytest.mark.parametrize("old_logprobs", ["rollout", "recompute"])
def test_stale_samples_are_left_out_of_the_gap_and_counted(tiny_model_path, old_logprobs):
    # Group t0 was explored by the trainer's own weights (version 3): the engine's log-probs are
    # the trainer's, gap 0. Group t1 by version 1, whose log-probs were 0.5 lower on every token:
    # that is the policy's change since, not an engine that samples another policy.
    trainer = TorchTrainer(
        tiny_model_path,
        TorchTrainerConfig(lr=1e-3, dtype="float32", old_logprobs=old_logprobs),
        AlgorithmConfig(),
        total_steps=STEP + 2,
        seed=0,
    )
    samples = []
    for sample in _samples(trainer.model.config.vocab_size):
        own = _own_logprobs(trainer.model, sample)
        if sample.task_id == "t1":
            own = [v - 0.5 if m else 0.0 for v, m in zip(own, sample.loss_mask, strict=True)]
            sample = dataclasses.replace(sample, policy_version=STEP - 2)
        else:
            sample = dataclasses.replace(sample, policy_version=STEP)
        samples.append(dataclasses.replace(sample, logprobs=own))

    metrics = trainer.step(samples, STEP)
    assert metrics["train/rollout_trainer_logprob_diff"] == pytest.approx(0.0, abs=1e-4)
    assert metrics["train/stale_samples"] == 2.0
    assert metrics["train/staleness_max"] == 2.0

    # A step whose samples are all stale measures no gap at all (not a gap of 0).
    stale = [dataclasses.replace(s, policy_version=STEP) for s in samples]
    metrics = trainer.step(stale, STEP + 1)
    assert "train/rollout_trainer_logprob_diff" not in metrics
    assert metrics["train/stale_samples"] == 4.0 and metrics["train/staleness_max"] == 1.0
