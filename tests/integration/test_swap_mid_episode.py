"""An episode whose two model calls straddle a weight swap (as in `one_step_off` / `async`).

The swap is forced between the calls from inside the episode itself (no timing): each call keeps
the version and the log-probs of the weights that sampled it, the sample is as old as its oldest
call (for the staleness bound), and the trainer that produced the new weights (full or LoRA,
merged for the engine) computes the same log-probs as the engine recorded under them.
"""

import pytest
import torch
from agentscope.agent import Agent, InjectionConfig
from agentscope.message import UserMsg

import agentscope_rft
from agentscope_rft.algorithms import AlgorithmConfig
from agentscope_rft.buffer import BufferTimeout, MemoryBuffer
from agentscope_rft.config import TorchTrainerConfig
from agentscope_rft.engines.embedded import EmbeddedEngine
from agentscope_rft.explorer.explorer import EpisodeSettings, Explorer
from agentscope_rft.explorer.tasks import load_tasks
from agentscope_rft.gateway.server import Gateway
from agentscope_rft.trainers.torch_trainer import TorchTrainer
from agentscope_rft.types import Call, Sample


def _call_sample(call: Call, reward: float, version: int) -> Sample:
    """One call alone as a training sample explored by `version`."""
    ids = [*call.prompt_ids, *call.completion_ids]
    prompt = len(call.prompt_ids)
    return Sample(
        token_ids=ids,
        loss_mask=[0] * prompt + [1] * len(call.completion_ids),
        logprobs=[0.0] * prompt + list(call.logprobs),
        reward=reward,
        rollout_id=f"{call.request_id}-{reward}",
        task_id="t",
        group_id="parity",
        policy_version=version,
        sample_id=f"{call.request_id}-{reward}",
    )


def _warm_up_samples(vocab: int) -> list[Sample]:
    gen = torch.Generator().manual_seed(1)
    out = []
    for e in range(4):
        ids = torch.randint(100, vocab, (14,), generator=gen).tolist()
        out.append(
            Sample(
                token_ids=ids,
                loss_mask=[0] * 4 + [1] * 10,
                logprobs=[0.0] * 4 + [-3.0] * 10,
                reward=float(e % 2),
                rollout_id=f"w{e}",
                task_id="w",
                group_id="w",
                sample_id=f"w{e}",
            )
        )
    return out


@pytest.mark.parametrize("lora", [None, {"rank": 4, "alpha": 8}], ids=["full", "lora"])
async def test_an_episode_straddling_a_weight_swap(tiny_model_path, lora):
    trainer = TorchTrainer(
        tiny_model_path,
        TorchTrainerConfig(lr=5e-2, dtype="float32", old_logprobs="recompute", lora=lora),
        AlgorithmConfig(),
        total_steps=3,
        seed=0,
    )
    engine = EmbeddedEngine(
        tiny_model_path, dtype="float32", device="cpu", max_model_len=512, served_model_name="t"
    )
    await engine.start()
    gateway = Gateway(engine, sampling_overrides={"": {"temperature": 0.0}})
    await gateway.start()

    async def app(task, model):
        agent = Agent(
            name="solver",
            system_prompt="Solve it.",
            model=model,
            injection_config=InjectionConfig(inject_runtime_state=False),
        )
        await agent.reply(UserMsg(name="user", content=task["q"]))
        # The trainer finishes step 0 and its weights reach the engine between the two calls.
        trainer.step(_warm_up_samples(int(trainer.model.config.vocab_size)), 0)
        await engine.load_weights(trainer.state_dict_for_sync(), version=1)
        await agent.reply(UserMsg(name="user", content="Try again."))
        return 1.0

    explorer = Explorer(agentscope_rft.workflow(app), gateway, EpisodeSettings(max_tokens=6))
    try:
        result = await explorer.explore(
            load_tasks([{"id": "x", "q": "1+1?"}]), group_size=1, batch_id="b"
        )
    finally:
        await explorer.close()
        await gateway.stop()
        await engine.close()

    [rollout] = result.rollouts
    assert rollout.ok, rollout.error
    first, second = sorted(rollout.calls, key=lambda c: c.started_at)
    assert (first.policy_version, second.policy_version) == (0, 1)
    assert first.completion_ids and second.completion_ids

    # Every trained token keeps the log-prob its own call recorded (the ratio's denominator),
    # and a sample is as old as its oldest call.
    pairs = [zip(s.logprobs, s.loss_mask, strict=True) for s in result.samples]
    recorded = [lp for pair in pairs for lp, m in pair if m]
    assert recorded == [*first.logprobs, *second.logprobs]
    assert min(s.policy_version for s in result.samples) == 0
    assert [s.num_calls for s in result.samples] in ([2], [1, 1])
    if len(result.samples) == 2:
        assert [s.policy_version for s in result.samples] == [0, 1]

    # Staleness counts the oldest call: at step 2 with max_staleness 1 (versions >= 1) the
    # episode's group is dropped, though its last call ran on version 1.
    buffer = MemoryBuffer()
    await buffer.put(result.samples)
    with pytest.raises(BufferTimeout):
        await buffer.get(1, step=2, min_policy_version=1, timeout=0)
    assert (await buffer.stats())["dropped_groups"] == 1

    # The trainer (now version 1) computes the engine's log-probs of the call made after the
    # swap; those of the call before it belong to version 0 and differ.
    after = trainer.step([_call_sample(second, r, 1) for r in (0.0, 1.0)], 1)
    assert after["train/rollout_trainer_logprob_diff"] < 1e-4
    assert after["train/stale_samples"] == 0.0
    # (labelled as explored by version 2, the trainer's now: the gap shows)
    before = trainer.step([_call_sample(first, r, 2) for r in (0.0, 1.0)], 2)
    assert before["train/rollout_trainer_logprob_diff"] > 1e-3
