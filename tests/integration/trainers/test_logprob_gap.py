"""The engine-vs-trainer log-prob gap compares only samples explored by the trained weights."""

import dataclasses
import math

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


def _two_versions(trainer: TorchTrainer, step: int) -> list[Sample]:
    """Group t0 explored by the trainer's own weights (version `step`): the engine's log-probs
    are the trainer's. Group t1 by version `step - 2`, whose log-probs were 0.5 lower on every
    trained token: the policy's change since, not an engine that samples another policy."""
    samples = []
    for sample in _samples(trainer.model.config.vocab_size):
        own = _own_logprobs(trainer.model, sample)
        version = step
        if sample.task_id == "t1":
            own = [v - 0.5 if m else 0.0 for v, m in zip(own, sample.loss_mask, strict=True)]
            version = step - 2
        samples.append(dataclasses.replace(sample, logprobs=own, policy_version=version))
    return samples


E = math.exp(0.5)  # pi_trainer / pi_engine on every trained token of the stale group

# (old_logprobs, algorithm, expected first-update metrics) by hand, over 40 trained tokens, 20 per
# group; in each group one sample has A > 0 and one A < 0 (rewards 0 and 1), clip 0.2, dual 3.
# - rollout: ratio pi / pi_engine = 1 on fresh tokens, e^0.5 = 1.65 on stale ones; PPO clips
#   the 10 stale tokens with A > 0 (1.65 > 1.2): clipfrac 10/40; A < 0 keeps 1.65|A| < 3|A|.
#   ppo_kl = mean(old - new) = (20 * 0 + 20 * -0.5) / 40.
# - recompute: ratio 1 everywhere (old = the trainer's own, before the update); TIS weighs a
#   token by min(pi_trainer / pi_engine, cap): 1 fresh, min(e^0.5, cap) stale; sequence level
#   uses the product over the sample's 10 tokens, e^5, capped.
CASES = [
    ("rollout", {}, {"clipfrac": 0.25, "clipfrac_dual": 0.0, "ppo_kl": -0.25}),
    (
        "recompute",
        {"tis": {"cap": 2.0}},
        {"clipfrac": 0.0, "ppo_kl": 0.0, "tis_weight": (1 + E) / 2, "tis_capped": 0.0},
    ),
    ("recompute", {"tis": {"cap": 1.5}}, {"tis_weight": (1 + 1.5) / 2, "tis_capped": 0.5}),
    (
        "recompute",
        {"tis": {"cap": 2.0, "level": "sequence"}},
        {"tis_weight": (1 + 2.0) / 2, "tis_capped": 0.5},
    ),
]


@pytest.mark.parametrize("old_logprobs", ["rollout", "recompute"])
def test_a_two_version_batch_by_hand(tiny_model_path, old_logprobs):
    trainer = TorchTrainer(
        tiny_model_path,
        TorchTrainerConfig(lr=1e-3, dtype="float32", old_logprobs=old_logprobs),
        AlgorithmConfig(),
        total_steps=STEP + 4,
        seed=0,
    )
    step = STEP
    for _, algorithm, expected in [c for c in CASES if c[0] == old_logprobs]:
        trainer.adjust(1.0, AlgorithmConfig.model_validate(algorithm))
        samples = _two_versions(trainer, step)
        metrics = trainer.step(samples, step)
        for name, value in expected.items():
            assert metrics[f"actor/{name}"] == pytest.approx(value, abs=1e-4), (algorithm, name)
        # the gap compares only the fresh group, where engine and trainer agree; the stale one
        # is counted instead
        assert metrics["train/rollout_trainer_logprob_diff"] == pytest.approx(0.0, abs=1e-4)
        assert metrics["train/stale_samples"] == 2.0
        assert metrics["train/staleness_max"] == 2.0
        step += 1

    # A step whose samples are all stale measures no gap at all (not a gap of 0).
    stale = [dataclasses.replace(s, policy_version=step - 1) for s in samples]
    metrics = trainer.step(stale, step)
    assert "train/rollout_trainer_logprob_diff" not in metrics
    assert metrics["train/stale_samples"] == 4.0 and metrics["train/staleness_max"] == 1.0
