"""verl's real FSDP2 engine on CPU (gloo), against a plain-PyTorch step on the same batch.

Tolerances (fp32, measured on the tiny model, lr 1e-2): loss and grad norm agree to ~1e-7
relative; updated weights to ~2e-6 absolute, i.e. ~1e-4 of one AdamW step (asserted: 1e-3 of a
step). The residue comes from packed (verl) vs padded (reference) attention summing in a different
order, amplified by Adam's division on gradients near its eps.
"""

from __future__ import annotations

import logging
import socket

import pytest
import torch

pytest.importorskip("verl", reason="verl is not installed (pip install 'agentscope-rft[verl]')")

from verl_reference import (
    LR,
    MAX_GRAD_NORM,
    WEIGHT_DECAY,
    make_samples,
    ppo_clip_loss,
    reference_steps,
    run_rank,
    token_logprobs,
)

from agentscope_rft.trainers.verl.convert import build_batch, response_values_to_tokens
from agentscope_rft.trainers.verl.engine import VerlEngineSettings, VerlTrainingEngine
from agentscope_rft.trainers.verl.loss import VerlLoss

WEIGHT_ATOL = 1e-3 * LR  # 0.1% of one Adam step (an Adam step moves a weight by about lr)


def _engine(model_path: str, **overrides: object) -> VerlTrainingEngine:
    values: dict = {
        "micro_batch_size": 2,
        "lr": LR,
        "weight_decay": WEIGHT_DECAY,
        "max_grad_norm": MAX_GRAD_NORM,
        **overrides,
    }
    settings = VerlEngineSettings(model_path=model_path, **values)
    return VerlTrainingEngine(settings, VerlLoss(ppo_clip_loss, weighting="tokens"))


def _assert_weights_close(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert set(got) == set(want), "verl's exported names differ from the HF model's"
    worst = max((got[k] - want[k]).abs().max().item() for k in want)
    assert worst <= WEIGHT_ATOL, f"max weight difference {worst:.3g} > {WEIGHT_ATOL:.3g}"


def test_train_steps_match_plain_torch(tiny_model_path: str) -> None:
    samples, advantages = make_samples()
    engine = _engine(tiny_model_path)  # 6 rows, 2 per micro-batch: 3 accumulation steps
    batch = build_batch(samples, advantages, pad_token_id=engine.pad_token_id)
    before = engine.state_dict_for_sync()
    metrics = [engine.train_step(batch) for _ in range(2)]
    after = engine.state_dict_for_sync()

    losses, grad_norms, want = reference_steps(
        tiny_model_path, samples, advantages, engine.pad_token_id, steps=2
    )
    for got, loss, grad_norm in zip(metrics, losses, grad_norms, strict=True):
        assert got["loss"] == pytest.approx(loss, rel=1e-5)
        assert got["pg_loss"] == pytest.approx(loss, rel=1e-5)
        assert got["grad_norm"] == pytest.approx(grad_norm, rel=1e-4)
        assert got["num_tokens"] == sum(s.num_trained_tokens for s in samples)
    _assert_weights_close(after, want)
    moved = max((after[k] - before[k]).abs().max().item() for k in after)
    assert moved > 100 * WEIGHT_ATOL  # the comparison above is not vacuous


def test_two_data_parallel_ranks_match_plain_torch(tiny_model_path: str, tmp_path) -> None:
    import torch.multiprocessing as mp

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    out = str(tmp_path / "rank0.pt")
    mp.spawn(run_rank, args=(2, port, tiny_model_path, out), nprocs=2, join=True)
    result = torch.load(out)
    assert result["rows"] == 6  # 6 samples over 2 ranks x 1 row per micro-batch: no padding

    samples, advantages = make_samples()
    losses, _, want = reference_steps(tiny_model_path, samples, advantages, 2, steps=2)
    for got, loss in zip(result["metrics"], losses, strict=True):
        assert got["loss"] == pytest.approx(loss, rel=1e-5)
    _assert_weights_close(result["weights"], want)


def test_logprobs_match_hf_forward(tiny_model_path: str) -> None:
    from transformers import AutoModelForCausalLM

    samples, advantages = make_samples()
    engine = _engine(tiny_model_path, micro_batch_size=1)
    batch = build_batch(samples, advantages, pad_token_id=engine.pad_token_id)
    got = response_values_to_tokens(engine.compute_logprobs(batch), batch)

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, attn_implementation="sdpa")
    with torch.no_grad():
        want = token_logprobs(model.eval(), samples, engine.pad_token_id)
    for i, sample in enumerate(samples):
        prompt = next(j for j, m in enumerate(sample.loss_mask) if m)
        n = len(sample.token_ids)
        row = torch.tensor(got[i])
        assert torch.equal(row[:prompt], torch.zeros(prompt))
        torch.testing.assert_close(row[prompt:], want[i, prompt:n], rtol=1e-5, atol=1e-5)


def _grpo_advantages(rewards: torch.Tensor, groups: list[str]) -> torch.Tensor:
    """(r - mean_group) / (std_group + 1e-6), the GRPO outcome advantage (test-local)."""
    out = torch.zeros_like(rewards)
    for group in set(groups):
        idx = torch.tensor([i for i, g in enumerate(groups) if g == group])
        r = rewards[idx]
        std = r.std() if len(r) > 1 else torch.tensor(0.0)
        out[idx] = (r - r.mean()) / (std + 1e-6)
    return out


def test_grpo_step_changes_weights_and_exports_hf(
    tiny_model_path: str, tmp_path, caplog: pytest.LogCaptureFixture
) -> None:
    from transformers import AutoModelForCausalLM

    samples, _ = make_samples(num=5)  # 5 rows do not split into micro-batches of 2
    rewards = torch.tensor([s.reward for s in samples])
    advantages = _grpo_advantages(rewards, [s.task_id for s in samples])
    engine = _engine(tiny_model_path)
    with caplog.at_level(logging.INFO, logger="agentscope_rft.trainers.verl.convert"):
        batch = build_batch(
            samples, advantages, pad_token_id=engine.pad_token_id, multiple_of=engine.batch_multiple
        )
    assert batch.batch_size[0] == 6
    assert "padded with 1 fully-masked samples to 6" in caplog.text
    before = engine.state_dict_for_sync()
    metrics = engine.train_step(batch)
    after = engine.state_dict_for_sync()
    assert torch.isfinite(torch.tensor(metrics["loss"]))
    changed = [k for k in after if not torch.equal(after[k], before[k])]
    assert len(changed) == len(after)

    folder = engine.save_hf(tmp_path / "hf")
    reloaded = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    for name, tensor in reloaded.state_dict().items():
        assert torch.equal(tensor, after[name]), name


def test_lora_step_exports_a_peft_adapter(tiny_model_path: str, tmp_path) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    samples, advantages = make_samples()
    engine = _engine(tiny_model_path, lora_rank=4, lora_alpha=8)
    batch = build_batch(samples, advantages, pad_token_id=engine.pad_token_id)
    metrics = engine.train_step(batch)
    assert torch.isfinite(torch.tensor(metrics["loss"]))
    adapter = engine.state_dict_for_sync()
    assert adapter and all("lora_" in name for name in adapter)
    lora_b = [t for name, t in adapter.items() if "lora_B" in name]
    assert all(t.abs().sum() > 0 for t in lora_b)  # B starts at zero; one step moved it
    assert engine.sync_metrics["sync/num_tensors"] == len(adapter)

    folder = engine.save_lora_adapter(tmp_path / "adapter")
    base = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    loaded = PeftModel.from_pretrained(base, folder)
    state = loaded.state_dict()
    for name, tensor in adapter.items():
        key = name.replace(".lora_A.weight", ".lora_A.default.weight").replace(
            ".lora_B.weight", ".lora_B.default.weight"
        )
        assert torch.equal(state[key], tensor), name

    # Merged full weights (what the inference engine gets) equal peft's own merge, the torch
    # trainer's export, to float rounding; the HF folder holds exactly them.
    from agentscope_rft.trainers.checkpoint import merged_state_dict

    want = merged_state_dict(loaded)
    merged = engine.state_dict_for_sync(merged=True)
    assert set(merged) == set(want)
    for name, tensor in want.items():
        torch.testing.assert_close(merged[name], tensor, rtol=0, atol=1e-6, msg=name)
    from safetensors.torch import load_file

    initial = load_file(f"{tiny_model_path}/model.safetensors")
    lora_layer = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(merged[lora_layer], initial[lora_layer])  # the adapter is in
    reloaded = AutoModelForCausalLM.from_pretrained(engine.save_hf(tmp_path / "hf"))
    for name, tensor in reloaded.state_dict().items():
        assert torch.equal(tensor, merged[name]), name


@pytest.mark.slow
def test_ray_worker_group_matches_plain_torch(tiny_model_path: str, tmp_path) -> None:
    """verl's RayWorkerGroup of two CPU training actors (the separate-GPU / multi-node path)."""
    ray = pytest.importorskip("ray")
    from pathlib import Path

    import agentscope_rft
    from agentscope_rft.trainers.verl.ray_group import RayTrainingGroup

    # Actors import our package and this test's loss function by module name.
    paths = [str(Path(agentscope_rft.__file__).parents[1]), str(Path(__file__).parent)]
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        settings = VerlEngineSettings(
            model_path=tiny_model_path,
            micro_batch_size=1,
            lr=LR,
            weight_decay=WEIGHT_DECAY,
            max_grad_norm=MAX_GRAD_NORM,
        )
        group = RayTrainingGroup(
            settings,
            VerlLoss(ppo_clip_loss, weighting="tokens"),
            devices_per_node=2,
            worker_env={"PYTHONPATH": ":".join(paths), "OMP_NUM_THREADS": "1"},
        )
        samples, advantages = make_samples()
        batch = build_batch(
            samples, advantages, pad_token_id=group.pad_token_id, multiple_of=group.batch_multiple
        )
        metrics = [group.train_step(batch) for _ in range(2)]
        got = group.state_dict_for_sync()
        assert group.sync_metrics["sync/num_tensors"] == len(got)
    finally:
        ray.shutdown()
    losses, _, want = reference_steps(tiny_model_path, samples, advantages, 2, steps=2)
    for step, loss in zip(metrics, losses, strict=True):
        assert step["loss"] == pytest.approx(loss, rel=1e-5)
        assert step["pg_loss"] == pytest.approx(loss, rel=1e-5)
    _assert_weights_close(got, want)
