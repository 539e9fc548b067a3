"""The embedded engine and the torch trainer on one CUDA device (marker `gpu`)."""

import pytest
import torch

from agentscope_rft.algorithms import AlgorithmConfig
from agentscope_rft.config import TorchTrainerConfig
from agentscope_rft.engines.embedded import EmbeddedEngine
from agentscope_rft.models import EMBEDDED_MODEL, resolve_model
from agentscope_rft.trainers.torch_trainer import TorchTrainer
from agentscope_rft.types import Sample, SamplingParams

pytestmark = pytest.mark.gpu


async def test_engine_generates_and_swaps_weights_on_cuda():
    engine = EmbeddedEngine(resolve_model(EMBEDDED_MODEL), device="cuda")
    await engine.start()
    try:
        assert engine.dtype == torch.bfloat16
        prompt = engine.renderer.render_ids([{"role": "user", "content": "Name a color."}])
        outs = await engine.generate(prompt, SamplingParams(max_tokens=16, n=8, seed=0))
        assert len(outs) == 8 and all(o.completion_ids for o in outs)
        model = engine.batcher.model
        weights = {k: v.float().cpu() + 0.01 for k, v in model.state_dict().items()}
        await engine.load_weights(weights, version=1)
        [after] = await engine.generate(prompt, SamplingParams(max_tokens=4, temperature=0))
        assert after.policy_version == 1
    finally:
        await engine.close()


def test_trainer_step_on_cuda_bf16():
    path = resolve_model(EMBEDDED_MODEL)
    trainer = TorchTrainer(
        path, TorchTrainerConfig(lr=1e-5, device="cuda"), AlgorithmConfig(), total_steps=1, seed=0
    )
    assert trainer.autocast_dtype == torch.bfloat16
    samples = [
        Sample(
            token_ids=list(range(100, 164)),
            loss_mask=[0] * 32 + [1] * 32,
            logprobs=[0.0] * 32 + [-1.0] * 32,
            reward=float(i % 2),
            rollout_id=f"r{i}",
            task_id="t",
            group_id="g",
        )
        for i in range(8)
    ]
    before = trainer.model.model.embed_tokens.weight.detach().clone()
    metrics = trainer.step(samples, step=0)
    assert metrics["grad_norm"] > 0
    assert not torch.equal(before, trainer.model.model.embed_tokens.weight.detach())
