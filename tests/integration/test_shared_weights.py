"""The embedded engine beside the trainer's weights: computing with them in place
(`engine.share_trainer_weights`: the same results as its own copy, one copy less, and no request
runs while the trainer writes), or freeing its own copy while the trainer steps and retaking it
from the trainer's weights after (`engine.free_weights_while_training`)."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest
import torch

from agentscope_rft.engines import embedded
from agentscope_rft.engines.base import EngineError
from agentscope_rft.engines.embedded import EmbeddedEngine
from agentscope_rft.engines.packed import packed_weight
from agentscope_rft.models import load_causal_lm
from agentscope_rft.runtime.local import train
from agentscope_rft.types import SamplingParams

from .test_deterministic import repeated_metrics
from .test_train_loop import final_weights, toy_config

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
PROMPT = list(range(100, 140))


@pytest.fixture(autouse=True)
def _torch_settings_restored():
    yield
    torch.use_deterministic_algorithms(False)  # run.deterministic switches it on process-wide


def engine_for(path: str, dtype: str = "float32") -> EmbeddedEngine:
    return EmbeddedEngine(path, dtype=dtype, device="cpu", max_batch_size=4)


def nudge(model: torch.nn.Module, seed: int) -> None:
    """What an optimizer step does to the weights: write every one in place."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=generator))


async def test_a_shared_engine_answers_with_the_weights_the_trainer_writes(tiny_model_path):
    trainer_model = load_causal_lm(tiny_model_path, dtype=torch.float32)
    weights = {k: v.detach() for k, v in trainer_model.state_dict().items()}
    shared, own = engine_for(tiny_model_path), engine_for(tiny_model_path)
    await shared.start()
    await own.start()
    try:
        freed = await shared.share_weights(weights)
        params = dict(shared.batcher.model.named_parameters())
        assert freed == sum(p.numel() * 4 for p in params.values())
        assert all(p.data_ptr() == weights[n].data_ptr() for n, p in params.items())
        [a] = await shared.generate(PROMPT, GREEDY)
        [b] = await own.generate(PROMPT, GREEDY)
        assert a.completion_ids == b.completion_ids and a.logprobs == b.logprobs

        # The "trainer" writes its weights in place while the engine is held, then syncs.
        async with shared.idle_for_training():
            with torch.no_grad():
                for p in trainer_model.parameters():
                    p.add_(0.05 * torch.randn_like(p))
        await shared.load_weights(weights, version=1)  # copies nothing: they are its own
        await own.load_weights({k: v.clone() for k, v in weights.items()}, version=1)
        [a] = await shared.generate(PROMPT, GREEDY)
        [b] = await own.generate(PROMPT, GREEDY)
        assert a.policy_version == b.policy_version == 1
        assert a.completion_ids == b.completion_ids and a.logprobs == b.logprobs
    finally:
        await shared.close()
        await own.close()


async def test_requests_wait_while_the_trainer_holds_a_shared_engine(tiny_model_path):
    trainer_model = load_causal_lm(tiny_model_path, dtype=torch.float32)
    engine = engine_for(tiny_model_path)
    await engine.start()
    try:
        await engine.share_weights(dict(trainer_model.state_dict()))
        async with engine.idle_for_training():
            request = asyncio.create_task(engine.generate(PROMPT, GREEDY))
            await asyncio.sleep(0.3)
            assert not request.done()  # parked: no forward on weights being written
            assert engine.batcher.num_running == 0
            fused = engine.batcher.fused
            assert fused is not None and fused.layers == []  # its weight copies freed meanwhile
        [out] = await asyncio.wait_for(request, timeout=120)
        assert len(out.completion_ids) == GREEDY.max_tokens
        assert len(fused.layers) == len(trainer_model.model.layers)  # retaken after the hold
    finally:
        await engine.close()


async def test_weights_that_do_not_match_are_refused_and_nothing_changes(tiny_model_path):
    engine = engine_for(tiny_model_path)
    await engine.start()
    try:
        bf16 = load_causal_lm(tiny_model_path, dtype=torch.bfloat16).state_dict()
        with pytest.raises(EngineError, match=r"cannot share these weights: .*bfloat16"):
            await engine.share_weights(bf16)
        fp32 = load_causal_lm(tiny_model_path, dtype=torch.float32).state_dict()
        del fp32["model.norm.weight"]
        with pytest.raises(EngineError, match=r"model.norm.weight: .* vs missing"):
            await engine.share_weights(fp32)
        assert engine.shared_weight_bytes == 0
        [out] = await engine.generate(PROMPT, GREEDY)  # still serving its own copy
        assert len(out.completion_ids) == GREEDY.max_tokens
    finally:
        await engine.close()


async def deterministic_runs(model: str, tasks, tmp_path, ways: dict[str, str]):
    """Three `run.deterministic` steps of the toy run for each named setting; the metrics that
    repeat, per name (each run in `tmp_path / name`)."""
    runs = {}
    for name, setting in ways.items():
        run_dir = tmp_path / name
        config = toy_config(
            model, tasks, run_dir, "run.steps=3", "run.deterministic=true", *setting.split()
        )
        await train(config, run_dir)
        runs[name] = repeated_metrics(run_dir)
    return runs


async def test_a_run_sharing_weights_repeats_a_run_with_a_copy(
    tiny_model_path, toy_tasks, tmp_path, caplog
):
    caplog.set_level(logging.INFO, logger="agentscope_rft.runtime.memory")
    runs = await deterministic_runs(
        tiny_model_path,
        toy_tasks,
        tmp_path,
        {
            "share-True": "engine.share_trainer_weights=true",
            "share-False": "engine.share_trainer_weights=false",
        },
    )
    runs = {True: runs["share-True"], False: runs["share-False"]}
    said = caplog.text
    assert "engine computes with the trainer's weights in place" in said
    assert "engine keeps its own copy of the weights: engine.share_trainer_weights is off" in said
    assert len(runs[True]) == 3 and runs[True] == runs[False]  # same episodes, losses, rewards
    a, b = final_weights(tmp_path / "share-True", 3), final_weights(tmp_path / "share-False", 3)
    assert all(torch.equal(a[name], b[name]) for name in a)


async def test_an_engine_with_its_own_copy_frees_it_while_the_trainer_steps(
    tiny_model_path, monkeypatch
):
    trainer_model = load_causal_lm(tiny_model_path, dtype=torch.float32)
    weights = {k: v.detach() for k, v in trainer_model.state_dict().items()}
    freeing, reference = (engine_for(tiny_model_path, "bfloat16") for _ in range(2))
    await freeing.start()
    await reference.start()
    model = freeing.batcher.model
    copies: list[int] = []  # weight copies into `freeing`'s model
    real_copy = embedded.copy_weights
    monkeypatch.setattr(
        embedded,
        "copy_weights",
        lambda into, w: (copies.extend([1] if into is model else []), real_copy(into, w)),
    )
    try:
        shapes = {n: p.shape for n, p in model.named_parameters()}
        async with freeing.idle_for_training(refill=lambda: weights):
            request = asyncio.create_task(freeing.generate(PROMPT, GREEDY))
            assert all(p.numel() == 0 for p in model.parameters())  # its copy freed
            assert all(
                packed_weight(m) is None or packed_weight(m).numel() == 0 for m in model.modules()
            )
            fused = freeing.batcher.fused
            assert fused is None or fused.layers == []
            nudge(trainer_model, seed=1)  # the trainer's step
            await asyncio.sleep(0.2)
            assert not request.done()  # held: nothing computes on freed weights
        assert {n: p.shape for n, p in model.named_parameters()} == shapes
        assert copies == [1]  # retaken from the trainer's new weights after the step
        await freeing.load_weights(weights, version=1)  # the sync: already current
        assert copies == [1]
        await reference.load_weights({k: v.clone() for k, v in weights.items()}, version=1)
        [a], [b] = await asyncio.gather(
            freeing.generate(PROMPT, GREEDY), reference.generate(PROMPT, GREEDY)
        )
        assert a.policy_version == b.policy_version == 1
        assert a.completion_ids == b.completion_ids and a.logprobs == b.logprobs
        [queued] = await asyncio.wait_for(request, timeout=120)  # the request held meanwhile
        assert queued.completion_ids == a.completion_ids

        # Weights written after they were retaken are copied at the sync.
        async with freeing.idle_for_training(refill=lambda: weights):
            nudge(trainer_model, seed=2)
        nudge(trainer_model, seed=3)
        await freeing.load_weights(weights, version=2)
        assert copies == [1, 1, 1]
        await reference.load_weights({k: v.clone() for k, v in weights.items()}, version=2)
        [a], [b] = await asyncio.gather(
            freeing.generate(PROMPT, GREEDY), reference.generate(PROMPT, GREEDY)
        )
        assert a.completion_ids == b.completion_ids and a.logprobs == b.logprobs
    finally:
        await freeing.close()
        await reference.close()


async def test_weights_not_retaken_after_the_step_come_back_at_the_sync(tiny_model_path, caplog):
    trainer_model = load_causal_lm(tiny_model_path, dtype=torch.float32)
    weights = {k: v.detach() for k, v in trainer_model.state_dict().items()}
    engine = engine_for(tiny_model_path, "bfloat16")
    await engine.start()

    def broken() -> dict[str, torch.Tensor]:
        raise RuntimeError("the trainer's weights are gone")

    try:
        [before] = await engine.generate(PROMPT, GREEDY)
        async with engine.idle_for_training(refill=broken):
            pass
        assert "weights freed for the trainer step were not retaken" in caplog.text
        assert all(p.numel() == 0 for p in engine.batcher.model.parameters())
        await engine.load_weights(weights, version=1)  # the sync gives them back
        [after] = await engine.generate(PROMPT, GREEDY)
        assert after.completion_ids == before.completion_ids
        assert after.logprobs == before.logprobs
    finally:
        await engine.close()


async def test_a_run_freeing_the_engines_copy_repeats_a_run_keeping_it(
    tiny_model_path, toy_tasks, tmp_path
):
    own_copy = "engine.dtype=bfloat16"  # its own copy beside the trainer's fp32 weights
    runs = await deterministic_runs(
        tiny_model_path,
        toy_tasks,
        tmp_path,
        {
            "free-True": f"{own_copy} engine.free_weights_while_training=true",
            "free-False": f"{own_copy} engine.free_weights_while_training=false",
        },
    )
    runs = {True: runs["free-True"], False: runs["free-False"]}
    assert len(runs[True]) == 3 and runs[True] == runs[False]  # same episodes, losses, rewards
    rows = [json.loads(line) for line in (tmp_path / "free-True" / "metrics.jsonl").open()]
    for row in rows:  # where each phase of the step peaked
        for phase in ("explore", "train", "sync"):
            assert 0 < row[f"memory/{phase}_peak_gib"] < 64
        assert row["memory/rss_gib"] <= row["memory/train_peak_gib"] + 0.5


def test_only_weights_read_without_a_copy_are_retaken_after_the_step(tiny_model_path, tmp_path):
    from agentscope_rft.algorithms import AlgorithmConfig
    from agentscope_rft.runtime.memory import live_trainer_weights
    from agentscope_rft.trainers.torch_trainer import TorchTrainer

    config = toy_config(tiny_model_path, tmp_path / "t", tmp_path / "run")
    trainer = TorchTrainer(tiny_model_path, config.trainer, AlgorithmConfig(), total_steps=1)
    read = live_trainer_weights(config, trainer)
    assert read is not None
    params = dict(trainer.model.named_parameters())
    assert all(t.data_ptr() == params[n].data_ptr() for n, t in read().items() if n in params)
    lora = toy_config(tiny_model_path, tmp_path / "t", tmp_path / "run", "trainer.lora.rank=4")
    assert live_trainer_weights(lora, trainer) is None  # merged copies: the engine keeps its own
    assert live_trainer_weights(config, object()) is None  # (verl: gathered copies)
