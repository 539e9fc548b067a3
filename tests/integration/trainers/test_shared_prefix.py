"""Shared-prefix passes: the prefix every sample shares runs once, with exactly the same result."""

import dataclasses
import random

import pytest
import torch

from agentscope_rft.algorithms import AlgorithmConfig
from agentscope_rft.config import TorchTrainerConfig
from agentscope_rft.trainers.batch import (
    build_batch,
    group_prefix_length,
    micro_batches,
    prefix_families,
    shared_prefix_length,
)
from agentscope_rft.trainers.torch_trainer import TorchTrainer
from agentscope_rft.types import Sample

PREFIX = 40


def prefixed_samples(vocab: int, seed: int = 0) -> list[Sample]:
    """Two groups of four; every sample starts with the same 40 tokens (a system prompt)."""
    rng = random.Random(seed)
    shared = [rng.randrange(100, vocab) for _ in range(PREFIX)]
    samples = []
    for g in range(2):
        question = [rng.randrange(100, vocab) for _ in range(6)]
        for e in range(4):
            answer = [rng.randrange(100, vocab) for _ in range(rng.randint(4, 16))]
            ids = shared + question + answer
            mask = [0] * (PREFIX + len(question)) + [1] * len(answer)
            lps = [0.0] * (PREFIX + len(question)) + [-rng.uniform(0.5, 3.0) for _ in answer]
            samples.append(
                Sample(
                    token_ids=ids,
                    loss_mask=mask,
                    logprobs=lps,
                    reward=float(e % 2) + 0.1 * e,
                    rollout_id=f"r{g}{e}",
                    task_id=f"t{g}",
                    sample_id=f"r{g}{e}",
                )
            )
    return samples


def sample(ids, mask):
    return Sample(
        token_ids=ids,
        loss_mask=mask,
        logprobs=[0.0] * len(ids),
        reward=0.0,
        rollout_id="r",
        task_id="t",
    )


def test_shared_prefix_length_stops_at_the_first_difference_and_before_trained_tokens():
    base = list(range(100, 160))
    rows = [sample(base, [0] * 50 + [1] * 10), sample(base[:45] + [7] * 15, [0] * 55 + [1] * 5)]
    assert shared_prefix_length(build_batch(rows, 0)) == 45
    # The hidden state predicting a trained token must stay in the suffix.
    rows[0] = sample(base, [0] * 40 + [1] * 20)
    assert shared_prefix_length(build_batch(rows, 0)) == 39
    assert shared_prefix_length(build_batch(rows, 0), minimum=40) == 0
    assert shared_prefix_length(build_batch(rows[:1], 0)) == 0  # one row: nothing to share


CASES = {
    "grpo": ({}, {}),
    "kl_recompute_entropy": (
        {"kl": {"coef": 0.05}, "entropy_coef": 0.01},
        {"old_logprobs": "recompute", "epochs": 2},
    ),
    "ppo_critic": ({"advantage": {"type": "gae", "lam": 0.95}}, {"mini_batches": 2}),
    "lora_kl": ({"kl": {"coef": 0.05}}, {"lora": {"rank": 4, "alpha": 8}}),
}


def two_steps_each_way(tiny_model_path, case, samples, switch):
    """The case's two training steps on `samples(vocab, seed)`, with the trainer key `switch` off
    and on: ((metrics, weights) off, (metrics, weights) on)."""
    algorithm_args, trainer_args = CASES[case]
    algorithm = AlgorithmConfig.model_validate(algorithm_args)
    results = {}
    for share in (False, True):
        config = TorchTrainerConfig(
            lr=1e-3, micro_batch_tokens=96, dtype="float32", **{switch: share}, **trainer_args
        )
        trainer = TorchTrainer(tiny_model_path, config, algorithm, total_steps=2, seed=0)
        vocab = int(trainer._base().config.vocab_size)
        metrics = [trainer.step(samples(vocab, seed=s), s) for s in range(2)]
        results[share] = (metrics, trainer.state_dict_for_sync())
    return results[False], results[True]


@pytest.mark.parametrize("case", list(CASES))
def test_sharing_the_prefix_changes_nothing_but_the_cost(tiny_model_path, case):
    (plain_metrics, plain_weights), (shared_metrics, shared_weights) = two_steps_each_way(
        tiny_model_path, case, prefixed_samples, "share_prefix"
    )
    assert shared_metrics[0]["train/shared_prefix_tokens"] >= PREFIX
    assert plain_metrics[0]["train/shared_prefix_tokens"] == 0
    for plain, shared in zip(plain_metrics, shared_metrics, strict=True):
        for key in ("loss", "grad_norm", "entropy/mean"):
            assert shared[key] == pytest.approx(plain[key], rel=1e-4, abs=1e-6), key
    # Adam turns float noise in near-zero gradients into updates of up to lr (1e-3): allow a tenth.
    for name, weight in plain_weights.items():
        torch.testing.assert_close(shared_weights[name], weight, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("case", ["grpo", "ppo_critic", "lora_kl"])
def test_recomputing_the_prefix_for_its_backward_gives_the_same_step(tiny_model_path, case):
    """`StepPlan.recompute_prefix` (what a tight memory budget picks): the prefix runs without a
    graph before the passes and again with one after them; the step is the kept graph's."""
    algorithm_args, trainer_args = CASES[case]
    algorithm = AlgorithmConfig.model_validate(algorithm_args)
    results = {}
    for recompute in (False, True):
        config = TorchTrainerConfig(lr=1e-3, micro_batch_tokens=96, dtype="float32", **trainer_args)
        trainer = TorchTrainer(tiny_model_path, config, algorithm, total_steps=2, seed=0)
        trainer.plan = dataclasses.replace(trainer.plan, recompute_prefix=recompute)
        vocab = int(trainer._base().config.vocab_size)
        # the second step's groups also run their own prompts once, after the shared prefix
        batches = [prefixed_samples(vocab, seed=0), grouped_samples(vocab, seed=1)]
        metrics = [trainer.step(samples, s) for s, samples in enumerate(batches)]
        assert trainer.plan.recompute_prefix is recompute  # no budget: the plan stays
        results[recompute] = (metrics, trainer.state_dict_for_sync(), torch.random.get_rng_state())
    (kept_metrics, kept_weights, kept_rng), (re_metrics, re_weights, re_rng) = (
        results[False],
        results[True],
    )
    assert re_metrics[0]["train/shared_prefix_tokens"] >= PREFIX
    assert re_metrics[1]["train/group_prefix_tokens"] > 0
    for kept, recomputed in zip(kept_metrics, re_metrics, strict=True):
        for key in ("loss", "grad_norm", "entropy/mean"):
            assert recomputed[key] == pytest.approx(kept[key], rel=1e-5, abs=1e-7), key
    for name, weight in kept_weights.items():
        torch.testing.assert_close(re_weights[name], weight, rtol=1e-5, atol=1e-6)
    assert torch.equal(re_rng, kept_rng)  # the recompute leaves the random stream where it was


def grouped_samples(vocab: int, seed: int = 0) -> list[Sample]:
    """Three groups of three, each with its own 40-token prompt (a task and its first
    observation), and one sample alone; odd seeds put a 40-token prefix common to all in front
    (so the shared prefix and the groups' prompts run once each, the latter after the former)."""
    rng = random.Random(seed)
    system = [rng.randrange(100, vocab) for _ in range(PREFIX)] if seed % 2 else []
    samples = []
    for g in range(3):
        prompt = system + [rng.randrange(100, vocab) for _ in range(40)]
        for e in range(3):
            answer = [rng.randrange(100, vocab) for _ in range(rng.randint(4, 16))]
            samples.append(
                Sample(
                    token_ids=prompt + answer,
                    loss_mask=[0] * len(prompt) + [1] * len(answer),
                    logprobs=[0.0] * len(prompt) + [-rng.uniform(0.5, 3.0) for _ in answer],
                    reward=float(e % 2) + 0.1 * e + 0.05 * g,
                    rollout_id=f"r{g}{e}",
                    task_id=f"t{g}",
                    sample_id=f"r{g}{e}",
                )
            )
    alone = system + [rng.randrange(100, vocab) for _ in range(30)]
    samples.append(sample(alone, [0] * (len(alone) - 10) + [1] * 10))
    return samples


def test_prefix_families_group_rows_sharing_a_prompt_past_the_shared_prefix():
    rows = [
        sample([1] * 10 + [2] * 40 + [9] * 5, [0] * 50 + [1] * 5),
        sample([1] * 10 + [3] * 40 + [9] * 5, [0] * 50 + [1] * 5),
        sample([1] * 10 + [2] * 40 + [8] * 5, [0] * 50 + [1] * 5),
        sample([1] * 10 + [2] * 20 + [8] * 25, [0] * 30 + [1] * 25),  # trained too early
    ]
    batch = build_batch(rows, 0)
    units = [[0], [1], [2], [3]]
    assert prefix_families(batch, units, skip=10) == [[[0], [2]], [[1], [3]]]
    assert micro_batches(batch, 10_000, skip=10, families=True) == [[0, 2], [1, 3]]
    assert micro_batches(batch, 10_000, skip=10) == [[0, 1, 2, 3]]
    assert group_prefix_length(batch.select([0, 2]), skip=10) == 39  # up to the first trained
    assert group_prefix_length(batch.select([0, 1]), skip=10) == 0


@pytest.mark.parametrize("case", list(CASES))
def test_sharing_each_groups_prompt_changes_nothing_but_the_cost(tiny_model_path, case):
    (plain_metrics, plain_weights), (shared_metrics, shared_weights) = two_steps_each_way(
        tiny_model_path, case, grouped_samples, "share_group_prefix"
    )
    assert plain_metrics[0]["train/group_prefix_tokens"] == 0
    assert shared_metrics[0]["train/group_prefix_tokens"] > 0
    assert shared_metrics[1]["train/group_prefix_tokens"] > 0
    assert shared_metrics[1]["train/shared_prefix_tokens"] >= PREFIX
    for plain, shared in zip(plain_metrics, shared_metrics, strict=True):
        for key in ("loss", "grad_norm", "entropy/mean"):
            assert shared[key] == pytest.approx(plain[key], rel=1e-4, abs=1e-6), key
    # As above; here a handful of elements whose gradient is float noise (rows of tokens the batch
    # barely touches) may move by up to lr per Adam update: at most 1 in 100,000 of them.
    for name, weight in plain_weights.items():
        diff = (shared_weights[name] - weight).abs()
        assert float(diff.max()) <= 4 * 1e-3, name  # 4 updates (2 steps x 2 epochs) of lr 1e-3
        assert int((diff > 1e-4 + 1e-4 * weight.abs()).sum()) <= max(1, weight.numel() // 100_000)
