"""Every algorithm trains a few steps through the real torch trainer; SFT/DPO through the loop."""

import dataclasses
import json
import math
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


def test_a_lora_checkpoint_of_a_tied_model_writes_the_embedding_once(tiny_model_path, tmp_path):
    """The merged lm_head (a copy equal to the embedding) was written too: the embedding's size
    again on disk, in every checkpoint and export."""
    from safetensors import safe_open

    from agentscope_rft.models import load_causal_lm

    config = TorchTrainerConfig(lr=1e-2, dtype="float32", lora={"rank": 4, "alpha": 8})
    trainer = TorchTrainer(tiny_model_path, config, AlgorithmConfig(), total_steps=2, seed=0)
    trainer.step(rl_samples(int(trainer.model.config.vocab_size)), 0)
    trainer.export_hf(tmp_path / "model")
    with safe_open(str(tmp_path / "model" / "model.safetensors"), "pt") as saved:
        keys = set(saved.keys())
    assert "lm_head.weight" not in keys and "model.embed_tokens.weight" in keys
    exported = load_causal_lm(tmp_path / "model", dtype=torch.float32)
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        torch.testing.assert_close(
            exported(ids).logits, trainer.model(ids).logits, atol=1e-5, rtol=1e-5
        )


def offline_config(tiny_model_path, run_dir, fmt, batch_size, steps, *extra):
    file = "sft_tiny.jsonl" if fmt == "sft" else "dpo_tiny.jsonl"
    return load_config(
        None,
        [
            f"model.name_or_path={tiny_model_path}",
            "run.mode=offline",
            f"offline.format={fmt}",
            f"offline.path={DATA / file}",
            f"offline.batch_size={batch_size}",
            f"algorithm.objective={fmt}",
            "trainer.lr=1e-3",
            "trainer.dtype=float32",
            f"run.steps={steps}",
            f"run.dir={run_dir}",
            "run.name=offline",
            "monitor.tensorboard=false",
            *extra,
        ],
    )


def metric_rows(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def nll_of_sft_file(model_path: str) -> float:
    """Token-mean NLL of the assistant turns of sft_tiny.jsonl, computed here from the logits."""
    from agentscope_rft.buffer.offline import load_sft_samples
    from agentscope_rft.chat.template import ChatRenderer
    from agentscope_rft.models import load_causal_lm, load_tokenizer

    model = load_causal_lm(model_path, dtype=torch.float32)
    samples = load_sft_samples(DATA / "sft_tiny.jsonl", ChatRenderer(load_tokenizer(model_path)))
    total, tokens = 0.0, 0
    with torch.no_grad():
        for sample in samples:
            ids = torch.tensor([list(sample.token_ids)])
            logprobs = torch.log_softmax(model(ids).logits[0, :-1].float(), dim=-1)
            picked = logprobs.gather(1, ids[0, 1:, None])[:, 0]
            mask = torch.tensor(list(sample.loss_mask[1:]), dtype=torch.bool)
            total -= float(picked[mask].sum())
            tokens += int(mask.sum())
    return total / tokens


async def test_offline_sft_loss_is_the_data_nll_and_falls(tiny_model_path, tmp_path):
    # The whole file (4 conversations) in every batch: step 0's loss is the initial model's NLL.
    config = offline_config(tiny_model_path, tmp_path / "run", "sft", 4, 4)
    last = await train(config, tmp_path / "run")
    losses = [r["sft/loss"] for r in metric_rows(tmp_path / "run") if "sft/loss" in r]
    assert len(losses) == 4
    assert losses[0] == pytest.approx(nll_of_sft_file(tiny_model_path), rel=1e-4)
    assert losses == sorted(losses, reverse=True) and losses[-1] < losses[0] - 0.3, losses
    # The exported model is the trained one: its NLL on the data is below the start.
    exported = tmp_path / "run" / "checkpoints" / "step-000004" / "model"
    assert nll_of_sft_file(str(exported)) < losses[-1]
    assert last["train/samples"] == 4


async def test_offline_dpo_starts_at_ln2_and_learns_the_preference(tiny_model_path, tmp_path):
    config = offline_config(tiny_model_path, tmp_path / "run", "dpo", 3, 4)
    last = await train(config, tmp_path / "run")
    rows = [r for r in metric_rows(tmp_path / "run") if "dpo/loss" in r]
    assert len(rows) == 4
    # Policy == reference at step 0: every margin is 0, so the loss is -log(sigmoid(0)) = ln 2.
    assert rows[0]["dpo/loss"] == pytest.approx(math.log(2), abs=1e-5)
    assert rows[0]["dpo/margin"] == pytest.approx(0.0, abs=1e-5)
    assert rows[-1]["dpo/loss"] < math.log(2) - 0.05
    assert rows[-1]["dpo/margin"] > 0.1 and rows[-1]["dpo/accuracy"] == 1.0
    assert last["train/samples"] == 6  # three pairs


class RecordingTrainer:
    """A real trainer that also records the sample ids of every step it trains."""

    def __init__(self, trainer, log: list[tuple[int, list[str]]]) -> None:
        self._trainer = trainer
        self._log = log

    def step(self, samples, step):
        self._log.append((step, sorted(s.sample_id for s in samples)))
        return self._trainer.step(samples, step)

    def __getattr__(self, name):
        return getattr(self._trainer, name)


@pytest.mark.parametrize("fmt", ["sft", "dpo"])
async def test_offline_resume_continues_with_the_next_batch(
    tiny_model_path, tmp_path, monitor_trainers, fmt
):
    """Stopped after 2 of 5 steps and resumed, a run trains the batches an unbroken run trains."""
    whole = offline_config(tiny_model_path, tmp_path / "whole", fmt, 1, 5)
    await train(whole, tmp_path / "whole")
    expected = list(monitor_trainers)
    monitor_trainers.clear()

    part = offline_config(tiny_model_path, tmp_path / "part", fmt, 1, 2, "run.checkpoint_every=1")
    await train(part, tmp_path / "part")
    resumed = offline_config(tiny_model_path, tmp_path / "part", fmt, 1, 5)
    await train(resumed, tmp_path / "part", resume=True)
    assert [step for step, _ in monitor_trainers] == [0, 1, 2, 3, 4]
    assert monitor_trainers == expected
    # The batches are not all the same, so the comparison above can tell them apart.
    assert len({tuple(ids) for _, ids in expected}) > 1
    losses = [r for r in metric_rows(tmp_path / "part") if f"{fmt}/loss" in r]
    assert [r["step"] for r in losses] == [0, 1, 2, 3, 4]


@pytest.fixture
def monitor_trainers(monkeypatch):
    """Wraps every trainer the local runtime builds so the test sees what each step trained."""
    import agentscope_rft.runtime.training as local

    log: list[tuple[int, list[str]]] = []
    build = local.build_trainer

    def recording(*args, **kwargs):
        return RecordingTrainer(build(*args, **kwargs), log)

    monkeypatch.setattr(local, "build_trainer", recording)
    return log


def test_a_step_trains_with_the_trainers_threads_in_any_worker_thread(tiny_model_path):
    # torch's thread count is per thread and new threads inherit the last one set: a worker
    # started after the embedded engine's thread set 1 thread would train single-threaded.
    import threading
    from concurrent.futures import ThreadPoolExecutor

    trainer = TorchTrainer(
        tiny_model_path, TorchTrainerConfig(dtype="float32"), AlgorithmConfig(), total_steps=1
    )
    if trainer.num_threads < 2:
        pytest.skip("needs a machine where torch uses 2+ threads")
    engine = threading.Thread(target=torch.set_num_threads, args=(1,))
    engine.start()
    engine.join()
    seen: list[int] = []
    trainer._step = lambda samples, step: seen.append(torch.get_num_threads()) or {}  # type: ignore[method-assign]
    with ThreadPoolExecutor(1) as pool:
        assert pool.submit(torch.get_num_threads).result() == 1  # the inherited count
        pool.submit(trainer.step, rl_samples(int(trainer.model.config.vocab_size)), 0).result()
    assert seen == [trainer.num_threads]


def test_a_checkpoint_keeps_its_moments_and_position_and_the_config_its_settings(
    tiny_model_path, tmp_path
):
    """A resume with `--set trainer.lr=...` (or a fork) trains at the new settings; the same
    config resumes with every optimizer value the checkpoint had."""
    kept = dict(lr=1e-2, dtype="float32", lr_schedule="linear", warmup_steps=1, weight_decay=0.1)
    trainer = TorchTrainer(
        tiny_model_path, TorchTrainerConfig(**kept), AlgorithmConfig(), total_steps=4, seed=0
    )
    vocab = int(trainer.model.config.vocab_size)
    for step in range(2):
        trainer.step(rl_samples(vocab), step)
    trainer.save(tmp_path / "ckpt")  # (as a run saves a checkpoint: state, then the model)
    trainer.export_hf(tmp_path / "ckpt" / "model")
    saved = [dict(g, params=None) for g in trainer.optimizer.param_groups]

    same = TorchTrainer(
        tiny_model_path, TorchTrainerConfig(**kept), AlgorithmConfig(), total_steps=4, seed=0
    )
    same.load(tmp_path / "ckpt")
    assert [dict(g, params=None) for g in same.optimizer.param_groups] == saved
    assert same.scheduler.last_epoch == trainer.scheduler.last_epoch == 2

    changed = {**kept, "lr": 1e-3, "lr_schedule": "constant", "weight_decay": 0.0}
    other = TorchTrainer(
        tiny_model_path, TorchTrainerConfig(**changed), AlgorithmConfig(), total_steps=4, seed=0
    )
    other.load(tmp_path / "ckpt")
    group = other.optimizer.param_groups[0]
    assert group["lr"] == 1e-3 and group["initial_lr"] == 1e-3 and group["weight_decay"] == 0.0
    assert other.scheduler.last_epoch == 2 and other.scheduler.get_last_lr()[0] == 1e-3
    moments = trainer.optimizer.state_dict()["state"]
    for key, value in other.optimizer.state_dict()["state"].items():
        torch.testing.assert_close(value["exp_avg"], moments[key]["exp_avg"], rtol=0, atol=0)
    other.step(rl_samples(vocab), 2)
    assert other.scheduler.get_last_lr()[0] == 1e-3  # constant: the checkpoint's linear decay gone


@pytest.mark.parametrize("lora", [None, {"rank": 4, "alpha": 8}])
def test_bf16_step_with_recast_weights_equals_plain_autocast(tiny_model_path, monkeypatch, lora):
    # The trainer's linear layers keep no bf16 copy of their weights for backward
    # (`cast_linear`): the same step, to the last bit, as plain autocast, with LoRA too.
    import agentscope_rft.trainers.torch_trainer as module

    def step() -> tuple[int, float, dict[str, torch.Tensor]]:
        config = TorchTrainerConfig(lr=1e-2, dtype="bfloat16", lora=lora)
        trainer = TorchTrainer(tiny_model_path, config, AlgorithmConfig(), total_steps=2, seed=0)
        layers = [m for m in trainer.model.modules() if type(m) is torch.nn.Linear]
        recast_layers = sum("forward" in vars(m) for m in layers)  # (their own forward)
        metrics = trainer.step(rl_samples(int(trainer._base().config.vocab_size)), 0)
        return recast_layers, metrics["loss"], trainer.state_dict_for_sync()

    layers, recast_loss, recast = step()
    assert layers > 0
    monkeypatch.setattr(module, "recast_linear_layers", lambda model: 0)
    layers, plain_loss, plain = step()
    assert layers == 0
    assert recast_loss == plain_loss
    assert all(torch.equal(recast[k], plain[k]) for k in plain)


def test_mini_batches_keep_dpo_pairs_together_and_skip_rows_without_trained_tokens():
    from agentscope_rft.trainers.batch import build_batch
    from agentscope_rft.trainers.common import mini_batch_rows

    def sample(i: int, kind: str = "rl", pair: str | None = None, trained: bool = True) -> Sample:
        return Sample(
            token_ids=[5, 6, 7, 8],
            loss_mask=[0, 0, 1, 1] if trained else [0, 0, 0, 0],
            logprobs=[0.0, 0.0, -1.0, -1.0] if trained else [0.0] * 4,
            reward=0.0,
            rollout_id=f"r{i}",
            task_id="t",
            kind=kind,
            pair_id=pair,
            sample_id=f"s{i}",
        )

    pairs = [
        sample(2 * p + k, "dpo_chosen" if k == 0 else "dpo_rejected", f"p{p}")
        for p in range(4)
        for k in range(2)
    ]
    for seed in range(5):
        torch.manual_seed(seed)
        parts = mini_batch_rows(build_batch(pairs, 0), 3)
        assert sorted(len(part) for part in parts) == [2, 2, 4]
        assert sorted(row for part in parts for row in part) == list(range(8))
        for part in parts:
            assert {row // 2 for row in part} == {row // 2 for row in part if row % 2}

    rl = [sample(i, trained=i % 3 != 0) for i in range(6)]  # rows 0 and 3 train nothing
    parts = mini_batch_rows(build_batch(rl, 0), 8)
    assert sorted(len(part) for part in parts) == [1, 1, 1, 1]
    assert sorted(row for part in parts for row in part) == [1, 2, 4, 5]


def test_several_mini_batches_train_dpo_pairs_and_rows_without_trained_tokens(tiny_model_path):
    from agentscope_rft.buffer.offline import load_dpo_samples
    from agentscope_rft.chat.template import ChatRenderer
    from agentscope_rft.models import load_tokenizer

    config = TorchTrainerConfig(lr=1e-3, dtype="float32", mini_batches=2)
    dpo = TorchTrainer(
        tiny_model_path, config, AlgorithmConfig(objective="dpo"), total_steps=1, seed=0
    )
    renderer = ChatRenderer(load_tokenizer(tiny_model_path))
    pairs = load_dpo_samples(DATA / "dpo_tiny.jsonl", renderer)
    metrics = dpo.step(pairs, 0)  # 3 pairs: 2 in one part, 1 in the other
    assert dpo.optimizer_steps == 2
    assert 0.6 < metrics["dpo/loss"] <= math.log(2) + 1e-6  # ln 2 at first, then below
    assert metrics["grad_norm"] > 0

    # 5 of the 9 samples have no trained token (an empty completion): 4 parts would leave one
    # with nothing to train
    samples = rl_samples(49152)
    for i in range(5):
        n = len(samples[i].token_ids)
        samples[i] = dataclasses.replace(
            samples[i], loss_mask=[0] * n, token_rewards=None, logprobs=[0.0] * n
        )
    config = TorchTrainerConfig(lr=1e-3, dtype="float32", mini_batches=4)
    rl = TorchTrainer(tiny_model_path, config, AlgorithmConfig(), total_steps=1, seed=0)
    metrics = rl.step(samples, 0)
    assert rl.optimizer_steps == 4 and math.isfinite(metrics["loss"])


@pytest.mark.parametrize("bad", [float("-inf"), float("nan")])
@pytest.mark.parametrize(
    "algorithm", [{}, {"tis": {"cap": 2.0}}, {"policy_loss": "gspo"}, {"policy_loss": "cispo"}]
)
def test_a_non_finite_engine_logprob_leaves_its_token_untrained(tiny_model_path, bad, algorithm):
    def step(samples: list[Sample]) -> tuple[dict[str, float], dict[str, torch.Tensor]]:
        trainer = TorchTrainer(
            tiny_model_path,
            TorchTrainerConfig(lr=1e-3, dtype="float32"),
            AlgorithmConfig.model_validate(algorithm),
            total_steps=1,
            seed=0,
        )
        torch.manual_seed(0)
        metrics = trainer.step(samples, 0)
        return metrics, trainer.model.state_dict()

    samples = rl_samples(49152)
    logprobs, mask = list(samples[0].logprobs), list(samples[0].loss_mask)
    logprobs[-1] = bad
    broken = [dataclasses.replace(samples[0], logprobs=logprobs), *samples[1:]]
    metrics, weights = step(broken)
    assert math.isfinite(metrics["loss"]) and math.isfinite(metrics["grad_norm"])
    assert metrics["train/nonfinite_logprob_tokens"] == 1.0
    # the same as the token never having been trained
    mask[-1], logprobs[-1] = 0, 0.0
    clean = [dataclasses.replace(samples[0], logprobs=logprobs, loss_mask=mask), *samples[1:]]
    expected_metrics, expected = step(clean)
    assert metrics["loss"] == pytest.approx(expected_metrics["loss"], rel=1e-6)
    for name, value in expected.items():
        torch.testing.assert_close(weights[name], value, rtol=0, atol=0)


def _step_gradients(
    model_path: str, algorithm: dict, micro_batch_tokens: int
) -> dict[str, torch.Tensor]:
    """The gradients of one step's (only) optimizer update, taken just before AdamW steps."""
    trainer = TorchTrainer(
        model_path,
        TorchTrainerConfig(
            lr=1e-3, dtype="float32", grad_clip=None, micro_batch_tokens=micro_batch_tokens
        ),
        AlgorithmConfig.model_validate(algorithm),
        total_steps=1,
        seed=0,
    )
    grads: dict[str, torch.Tensor] = {}
    optimizer_step = trainer.optimizer.step

    def capture(*args, **kwargs):
        for name, param in trainer.model.named_parameters():
            grads[name] = param.grad.clone()
        if trainer.value_head is not None:
            grads["value_head"] = trainer.value_head.weight.grad.clone()
        return optimizer_step(*args, **kwargs)

    trainer.optimizer.step = capture
    trainer.step(rl_samples(49152), 0)
    return grads


@pytest.mark.parametrize(
    "name", ["grpo", "gspo", "ppo_critic", "dual_clip_tis_kl_entropy", "reinforce_pp"]
)
def test_micro_batches_accumulate_the_gradient_of_one_pass(tiny_model_path, name):
    # 16-token passes (below every sample's length: one sample each) vs the whole batch at once
    whole = _step_gradients(tiny_model_path, ALGORITHMS[name], 100_000)
    split = _step_gradients(tiny_model_path, ALGORITHMS[name], 16)
    for key, grad in whole.items():
        scale = float(grad.abs().max())
        assert scale > 0, key
        torch.testing.assert_close(split[key], grad, rtol=0, atol=1e-5 * scale)
