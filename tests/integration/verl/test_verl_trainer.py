"""`VerlTrainer` against `TorchTrainer`: the same batch, config and seed give the same step.

Both trainers run in this process on CPU, fp32 (verl: FSDP2 over gloo, one rank). Measured on
the tiny model (lr 1e-2, two steps): losses, grad norms and every metric agree to <= 3e-6
absolute (loss ~2e-7 relative on the first update, drifting to ~5e-6 after 7 updates; the grad
norm of the 4th update, with KL, entropy and recomputed log-probs, 1.1e-5 relative since the
torch trainer's log-probs are chunked); advantage metrics are bit-equal (computed by the same
code). The weight updates differ by 7e-6 of their norm after 2 Adam steps (2.5e-5 after 8), at
most 2.5e-5 in one element (0.13% of the largest element update; 0.45% after 8 steps). Asserted:
metrics within 3e-5 relative or 1e-5 absolute (whichever is larger: some are small differences,
e.g. `ppo_kl`); weights within 1e-4 of the update's norm, and each element within 1e-2 of the
largest element update.
The residue is packed (verl) vs padded (torch) attention and a full-vocabulary vs trained-rows
projection summing in another order; Adam amplifies it where a gradient element is near its eps
(1e-8), since it divides each element by its own magnitude.
"""

from __future__ import annotations

import dataclasses
import logging

import pytest
import torch

pytest.importorskip("verl", reason="verl is not installed (pip install 'agentscope-rft[verl]')")

from verl_reference import TRAINER_LR, TRAINER_SETTINGS, grpo_samples, run_steps

from agentscope_rft.algorithms import AlgorithmConfig
from agentscope_rft.config import TorchTrainerConfig, VerlTrainerConfig
from agentscope_rft.trainers.torch_trainer import TorchTrainer
from agentscope_rft.trainers.verl.placement import VerlConfigError
from agentscope_rft.trainers.verl.trainer import VerlTrainer

METRIC_RTOL = 3e-5
UPDATE_RTOL = 1e-4  # of the update's norm
ELEMENT_RTOL = 1e-2  # of the largest element update


def _trainers(model: str, algorithm: AlgorithmConfig, **shared: object):
    settings = {**TRAINER_SETTINGS, **shared}
    torch_trainer = TorchTrainer(
        model,
        TorchTrainerConfig(device="cpu", micro_batch_tokens=48, **settings),
        algorithm,
        total_steps=4,
    )
    verl_trainer = VerlTrainer(
        model,
        VerlTrainerConfig(device="cpu", micro_batch_size=2, **settings),
        algorithm,
        total_steps=4,
    )
    return torch_trainer, verl_trainer


# Timings, and what only one trainer does (the torch trainer's shared-prefix and group-prefix
# passes).
TIMINGS = {
    "time/train",
    "tokens_per_s",
    "perf/mfu",
    "train/shared_prefix_tokens",
    "train/group_prefix_tokens",
}


def _assert_same_steps(got: list[dict], want: list[dict]) -> None:
    for g, w in zip(got, want, strict=True):
        assert set(g) - TIMINGS == set(w) - TIMINGS
        for key in set(w) - TIMINGS:
            assert g[key] == pytest.approx(w[key], rel=METRIC_RTOL, abs=1e-5), key


Weights = dict[str, torch.Tensor]


def _assert_same_weights(got: Weights, want: Weights, start: Weights) -> None:
    assert set(got) == set(want) == set(start)
    worst = max((got[k] - want[k]).abs().max().item() for k in want)
    largest = max((want[k] - start[k]).abs().max().item() for k in want)
    assert largest >= TRAINER_LR  # real updates (Adam moves an element by ~lr): not vacuous
    assert worst <= ELEMENT_RTOL * largest, f"max weight difference {worst:.3g} ({largest=:.3g})"
    gap = sum(float(((got[k] - want[k]) ** 2).sum()) for k in want) ** 0.5
    update = sum(float(((want[k] - start[k]) ** 2).sum()) for k in want) ** 0.5
    assert gap <= UPDATE_RTOL * update, f"update differs by {gap / update:.3g} of its norm"


def test_grpo_steps_equal_the_torch_trainer(tiny_model_path: str) -> None:
    samples = grpo_samples()
    torch_trainer, verl_trainer = _trainers(tiny_model_path, AlgorithmConfig())
    before = verl_trainer.state_dict_for_sync()
    start = {k: v.clone() for k, v in torch_trainer.state_dict_for_sync().items()}
    assert all(torch.equal(before[k], start[k]) for k in start)
    got, want = run_steps(verl_trainer, samples, 2), run_steps(torch_trainer, samples, 2)
    _assert_same_steps(got, want)
    after = verl_trainer.state_dict_for_sync()
    _assert_same_weights(after, torch_trainer.state_dict_for_sync(), start)
    assert all(not torch.equal(after[k], before[k]) for k in after)  # a GRPO step moves all
    assert got[0]["train/zero_variance_groups"] == 0 and got[0]["loss"] != 0


def test_kl_entropy_mini_batches_and_recompute_equal_the_torch_trainer(
    tiny_model_path: str,
) -> None:
    """A reference engine (KL in the loss), entropy bonus, seq-mean aggregation, per-rollout
    weights, two mini-batches x two epochs, recomputed old log-probs, cosine LR decay."""
    algorithm = AlgorithmConfig.model_validate(
        {
            "kl": {"coef": 0.05},
            "entropy_coef": 0.01,
            "loss_agg": "seq-mean-token-mean",
            "normalize_per_rollout": True,
        }
    )
    torch_trainer, verl_trainer = _trainers(
        tiny_model_path,
        algorithm,
        mini_batches=2,
        epochs=2,
        old_logprobs="recompute",
        lr_schedule="cosine",
        warmup_steps=1,
    )
    samples = grpo_samples()
    start = {k: v.clone() for k, v in torch_trainer.state_dict_for_sync().items()}
    got, want = run_steps(verl_trainer, samples, 2), run_steps(torch_trainer, samples, 2)
    _assert_same_steps(got, want)
    assert got[-1]["kl/mean"] > 0 and "actor/kl_loss" in got[-1]
    after = verl_trainer.state_dict_for_sync()
    _assert_same_weights(after, torch_trainer.state_dict_for_sync(), start)


@pytest.mark.parametrize("objective", ["sft", "sft_rl_mix"])
def test_sft_objectives_equal_the_torch_trainer(tiny_model_path: str, objective: str) -> None:
    """Demonstrations (kind `sft`) alone, and mixed with RL samples (CHORD)."""
    samples = [
        dataclasses.replace(s, kind="sft") if objective == "sft" or i % 4 == 3 else s
        for i, s in enumerate(grpo_samples())
    ]
    algorithm = AlgorithmConfig.model_validate({"objective": objective})
    torch_trainer, verl_trainer = _trainers(tiny_model_path, algorithm)
    start = {k: v.clone() for k, v in torch_trainer.state_dict_for_sync().items()}
    got, want = run_steps(verl_trainer, samples, 2), run_steps(torch_trainer, samples, 2)
    _assert_same_steps(got, want)
    assert got[0]["sft/loss"] > 0
    after = verl_trainer.state_dict_for_sync()
    _assert_same_weights(after, torch_trainer.state_dict_for_sync(), start)


def _without_timings(metrics: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in metrics.items() if k not in TIMINGS}


def test_save_and_load_resume_exactly_and_export_hf(tiny_model_path: str, tmp_path) -> None:
    from transformers import AutoModelForCausalLM

    config = VerlTrainerConfig(
        device="cpu",
        micro_batch_size=2,
        mini_batches=2,
        lr_schedule="linear",
        warmup_steps=1,
        **TRAINER_SETTINGS,
    )
    samples = grpo_samples()
    first = VerlTrainer(tiny_model_path, config, AlgorithmConfig(), total_steps=3)
    first.step(samples, 0)
    first.save(tmp_path / "ckpt")
    want_metrics = first.step(samples, 1)  # the permutation comes from the saved RNG state
    want = first.state_dict_for_sync()
    first.close()

    second = VerlTrainer(tiny_model_path, config, AlgorithmConfig(), total_steps=3, seed=7)
    with pytest.raises(ValueError, match="not a verl trainer checkpoint"):
        second.load(tmp_path)
    second.load(tmp_path / "ckpt")
    got_metrics = second.step(samples, 1)
    got = second.state_dict_for_sync()
    assert _without_timings(got_metrics) == _without_timings(want_metrics)
    assert all(torch.equal(got[k], want[k]) for k in want)

    second.export_hf(tmp_path / "hf")
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32)
    for name, tensor in reloaded.state_dict().items():
        assert torch.equal(tensor, got[name]), name
    assert (tmp_path / "hf" / "tokenizer.json").is_file()
    second.close()


def test_lora_step_syncs_merged_weights_and_saves_the_adapter(
    tiny_model_path: str, tmp_path
) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    lora = {"rank": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}
    config = VerlTrainerConfig(device="cpu", lora=lora, **TRAINER_SETTINGS)
    # KL to the reference = the policy with its adapter disabled (no second engine)
    algorithm = AlgorithmConfig.model_validate({"kl": {"coef": 0.05}})
    trainer = VerlTrainer(tiny_model_path, config, algorithm, total_steps=2)
    before = trainer.state_dict_for_sync()
    metrics = trainer.step(grpo_samples(), 0)
    assert metrics["loss"] != 0 and metrics["grad_norm"] > 0
    assert metrics["actor/kl_loss"] == pytest.approx(0.0, abs=1e-6)  # B = 0: policy = reference
    after = trainer.state_dict_for_sync()
    changed = {k for k in after if not torch.equal(after[k], before[k])}
    assert changed and all(".q_proj." in k or ".v_proj." in k for k in changed)

    trainer.save(tmp_path / "ckpt")
    base = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    merged = PeftModel.from_pretrained(base, tmp_path / "ckpt" / "adapter").merge_and_unload()
    for name, tensor in merged.state_dict().items():
        torch.testing.assert_close(after[name], tensor, rtol=0, atol=1e-6, msg=name)
    trainer.close()


@pytest.mark.slow
def test_two_ray_ranks_equal_the_torch_trainer(tiny_model_path: str) -> None:
    """`n_gpus_per_node: 2` on CPU: two Ray actors (a local Ray started and stopped by the
    trainer), each with a reference engine; the batch is sharded over both ranks."""
    ray = pytest.importorskip("ray")
    algorithm = AlgorithmConfig.model_validate({"kl": {"coef": 0.05}})
    torch_trainer = TorchTrainer(
        tiny_model_path,
        TorchTrainerConfig(device="cpu", **TRAINER_SETTINGS),
        algorithm,
        total_steps=2,
    )
    config = VerlTrainerConfig(
        device="cpu", n_gpus_per_node=2, micro_batch_size=2, ray={"num_cpus": 2}, **TRAINER_SETTINGS
    )
    too_many = config.model_copy(update={"n_gpus_per_node": 4})
    with pytest.raises(VerlConfigError, match=r"needs 4 CPUs in the Ray cluster .* it has 2"):
        VerlTrainer(tiny_model_path, too_many, algorithm, total_steps=2)
    assert not ray.is_initialized()  # the Ray it started is stopped again
    verl_trainer = VerlTrainer(tiny_model_path, config, algorithm, total_steps=2)
    try:
        samples = grpo_samples()
        start = {k: v.clone() for k, v in torch_trainer.state_dict_for_sync().items()}
        got, want = run_steps(verl_trainer, samples, 2), run_steps(torch_trainer, samples, 2)
        _assert_same_steps(got, want)
        after = verl_trainer.state_dict_for_sync()
        _assert_same_weights(after, torch_trainer.state_dict_for_sync(), start)
    finally:
        verl_trainer.close()
    assert not ray.is_initialized()


def test_batches_are_padded_or_trimmed_to_the_micro_batch(
    tiny_model_path: str, caplog: pytest.LogCaptureFixture
) -> None:
    samples = grpo_samples()  # 8 samples, micro-batches of 3
    for padding, message in (
        ("pad", "padded with 1 fully-masked samples to 9"),
        ("trim", "mini-batch of 8 samples trimmed by 2 to 6"),
    ):
        config = VerlTrainerConfig(
            device="cpu", micro_batch_size=3, batch_padding=padding, **TRAINER_SETTINGS
        )
        trainer = VerlTrainer(tiny_model_path, config, AlgorithmConfig(), total_steps=1)
        with caplog.at_level(logging.INFO, logger="agentscope_rft.trainers.verl"):
            metrics = trainer.step(samples, 0)
        assert message in caplog.text
        assert metrics["grad_norm"] > 0
