"""Every algorithm trains a few steps through the real torch trainer; SFT/DPO through the loop."""

import json
import random
from pathlib import Path

import pytest
import torch

from agentscope_rft.algorithms import AlgorithmConfig
from agentscope_rft.config import TorchTrainerConfig, load_config
from agentscope_rft.runtime.local import train
from agentscope_rft.trainers.torch_trainer import TorchTrainer
from agentscope_rft.types import Sample

DATA = Path(__file__).resolve().parents[2] / "data"

ALGORITHMS = {
    "grpo": {},
    "dr_grpo": {"advantage": {"type": "grpo", "normalize_std": False}},
    "rloo": {"advantage": "rloo"},
    "reinforce_pp": {"advantage": "reinforce_plus_plus"},
    "reinforce_pp_baseline": {"advantage": "reinforce_plus_plus_baseline"},
    "stepwise": {"advantage": {"type": "stepwise", "gamma": 0.9}},
    "ppo_critic": {
        "advantage": {"type": "gae", "gamma": 1.0, "lam": 0.95},
        "kl": {"coef": 0.01, "apply_to": "reward"},
    },
    "gspo": {"policy_loss": "gspo", "loss_agg": "seq-mean-token-mean"},
    "cispo": {"policy_loss": "cispo"},
    "dual_clip_tis_kl_entropy": {
        "policy_loss": {"type": "ppo", "clip_high": 0.28, "dual_clip": 3.0},
        "tis": {"cap": 2.0},
        "kl": {"coef": 0.01},
        "entropy_coef": 0.001,
        "normalize_per_rollout": True,
    },
}


def rl_samples(vocab: int, seed: int = 0) -> list[Sample]:
    """Two task groups of four episodes; one episode split into two samples, a step reward."""
    rng = random.Random(seed)
    samples = []
    for g in range(2):
        for e in range(4):
            parts = 2 if (g, e) == (0, 0) else 1
            for part in range(parts):
                n = rng.randint(12, 24)
                prompt = rng.randint(4, 8)
                ids = [rng.randrange(100, vocab) for _ in range(n)]
                mask = [0] * prompt + [1] * (n - prompt)
                lps = [0.0] * prompt + [-rng.uniform(0.5, 3.0) for _ in range(n - prompt)]
                token_rewards = [0.0] * n
                if part == 1:
                    token_rewards[-1] = 0.2
                samples.append(
                    Sample(
                        token_ids=ids,
                        loss_mask=mask,
                        logprobs=lps,
                        reward=float(e % 2),
                        rollout_id=f"r{g}{e}",
                        task_id=f"t{g}",
                        group_id=f"s0:t{g}",
                        sample_id=f"r{g}{e}:{part}",
                        token_rewards=token_rewards,
                    )
                )
    return samples


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_each_algorithm_trains(tiny_model_path, name):
    algorithm = AlgorithmConfig.model_validate(ALGORITHMS[name])
    trainer = TorchTrainer(
        tiny_model_path,
        TorchTrainerConfig(lr=1e-3, micro_batch_tokens=128, dtype="float32"),
        algorithm,
        total_steps=3,
        seed=0,
    )
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    vocab = int(trainer.model.config.vocab_size)
    for step in range(2):
        metrics = trainer.step(rl_samples(vocab, seed=step), step)
        assert all(torch.isfinite(torch.tensor(v)) for v in metrics.values()), metrics
        assert metrics["train/samples"] > 0
    after = trainer.model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    if algorithm.needs_critic():
        assert "critic/vf_loss" in metrics
    if algorithm.needs_reference():
        assert "kl/mean" in metrics


def test_lora_trains_and_syncs_merged_weights(tiny_model_path):
    config = TorchTrainerConfig(lr=1e-2, dtype="float32", lora={"rank": 4, "alpha": 8})
    trainer = TorchTrainer(tiny_model_path, config, AlgorithmConfig(), total_steps=2, seed=0)
    initial = trainer.state_dict_for_sync()
    vocab = int(trainer.model.config.vocab_size)
    trainer.step(rl_samples(vocab), 0)
    synced = trainer.state_dict_for_sync()
    assert set(synced) == set(initial)  # plain HF names, no lora_ keys
    assert any(not torch.equal(initial[k], synced[k]) for k in initial)
    # the merged weights are what the adapted model computes
    from agentscope_rft.models import load_causal_lm

    plain = load_causal_lm(tiny_model_path, dtype=torch.float32)
    plain.load_state_dict(synced, strict=False)
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        torch.testing.assert_close(
            plain(ids).logits, trainer.model(ids).logits, atol=1e-5, rtol=1e-5
        )


@pytest.mark.parametrize(
    ("fmt", "objective", "file"),
    [("sft", "sft", "sft_tiny.jsonl"), ("dpo", "dpo", "dpo_tiny.jsonl")],
)
async def test_offline_sft_and_dpo_train_from_shipped_files(
    tiny_model_path, tmp_path, fmt, objective, file
):
    config = load_config(
        None,
        [
            f"model.name_or_path={tiny_model_path}",
            "run.mode=offline",
            f"offline.format={fmt}",
            f"offline.path={DATA / file}",
            "offline.batch_size=2",
            f"algorithm.objective={objective}",
            "trainer.lr=1e-3",
            "trainer.dtype=float32",
            "run.steps=3",
            f"run.dir={tmp_path / 'run'}",
            "run.name=offline",
            "monitor.tensorboard=false",
        ],
    )
    last = await train(config, tmp_path / "run")
    key = "sft/loss" if fmt == "sft" else "dpo/loss"
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    losses = [r[key] for r in rows if key in r]
    assert len(losses) == 3 and all(v == v for v in losses)
    assert last["train/samples"] >= 2
