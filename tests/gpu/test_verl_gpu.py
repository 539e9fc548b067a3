"""verl's FSDP2 engine on one CUDA device, bf16 compute, against the fp32 plain-PyTorch step.

Run with `pytest -m gpu tests/gpu`. The CPU platform is never registered in this process: verl
detects CUDA itself. Step time and MFU for docs/benchmarks.md come from benchmarks/verl_step.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("verl", reason="verl is not installed (pip install 'agentscope-rft[verl]')")

sys.path.insert(0, str(Path(__file__).parents[1] / "integration" / "verl"))
from verl_reference import (
    LR,
    MAX_GRAD_NORM,
    WEIGHT_DECAY,
    make_samples,
    ppo_clip_loss,
    reference_steps,
)

from agentscope_rft.trainers.verl.convert import build_batch
from agentscope_rft.trainers.verl.engine import VerlEngineSettings, VerlTrainingEngine
from agentscope_rft.trainers.verl.loss import VerlLoss


@pytest.mark.gpu
@pytest.mark.parametrize("param_dtype", ["fp32", "bf16"])
def test_cuda_step_matches_plain_torch(tiny_model_path: str, param_dtype: str) -> None:
    settings = VerlEngineSettings(
        model_path=tiny_model_path,
        device="cuda",
        micro_batch_size=2,
        param_dtype=param_dtype,
        lr=LR,
        weight_decay=WEIGHT_DECAY,
        max_grad_norm=MAX_GRAD_NORM,
    )
    engine = VerlTrainingEngine(settings, VerlLoss(ppo_clip_loss, weighting="tokens"))
    samples, advantages = make_samples()
    batch = build_batch(samples, advantages, pad_token_id=engine.pad_token_id)
    before = engine.state_dict_for_sync()
    metrics = engine.train_step(batch)
    after = engine.state_dict_for_sync()
    losses, _, want = reference_steps(
        tiny_model_path, samples, advantages, engine.pad_token_id, steps=1
    )
    # bf16 compute rounds log-probs to ~3 significant digits; fp32 on GPU matches like on CPU
    rel = 1e-5 if param_dtype == "fp32" else 2e-2
    assert metrics["loss"] == pytest.approx(losses[0], rel=rel)
    assert all(not torch.equal(after[k], before[k]) for k in after)
    if param_dtype == "fp32":
        worst = max((after[k] - want[k].to(after[k].dtype)).abs().max().item() for k in want)
        assert worst <= 1e-3 * LR


@pytest.mark.gpu
@pytest.mark.parametrize("algorithm", [{}, {"kl": {"coef": 0.05}}], ids=["grpo", "grpo-kl"])
def test_cuda_verl_trainer_equals_the_torch_trainer(tiny_model_path: str, algorithm: dict) -> None:
    """The trainer protocol on one GPU, fp32: `VerlTrainer` (reference engine offloaded to CPU by
    verl's `forward_only` mode when KL is on) against `TorchTrainer` on the same batch. Not yet
    run on a GPU: tolerances are the CPU ones relaxed 10x for cuBLAS reduction order."""
    from verl_reference import TRAINER_SETTINGS, grpo_samples, run_steps

    from agentscope_rft.algorithms import AlgorithmConfig
    from agentscope_rft.config import TorchTrainerConfig, VerlTrainerConfig
    from agentscope_rft.trainers.torch_trainer import TorchTrainer
    from agentscope_rft.trainers.verl.trainer import VerlTrainer

    algo = AlgorithmConfig.model_validate(algorithm)
    torch_trainer = TorchTrainer(
        tiny_model_path, TorchTrainerConfig(device="cuda", **TRAINER_SETTINGS), algo, total_steps=2
    )
    verl_trainer = VerlTrainer(
        tiny_model_path,
        VerlTrainerConfig(device="cuda", micro_batch_size=2, **TRAINER_SETTINGS),
        algo,
        total_steps=2,
    )
    samples = grpo_samples()
    start = {k: v.clone() for k, v in torch_trainer.state_dict_for_sync().items()}
    got, want = run_steps(verl_trainer, samples, 2), run_steps(torch_trainer, samples, 2)
    for g, w in zip(got, want, strict=True):
        for key in ("loss", "grad_norm", "actor/pg_loss", "entropy/mean"):
            assert g[key] == pytest.approx(w[key], rel=1e-4, abs=1e-4), key
    after, reference = verl_trainer.state_dict_for_sync(), torch_trainer.state_dict_for_sync()
    gap = sum(float(((after[k].cpu() - reference[k].cpu()) ** 2).sum()) for k in start) ** 0.5
    update = sum(float(((reference[k].cpu() - start[k].cpu()) ** 2).sum()) for k in start) ** 0.5
    assert update > 0 and gap <= 1e-3 * update
    verl_trainer.close()
