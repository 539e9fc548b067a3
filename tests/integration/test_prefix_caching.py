"""Prefix caching in the embedded engine on a tiny real model: same results as without it.

fp32: greedy tokens identical and log-probs within 1e-5 of the uncached engine (the differences
are float rounding of different matmul shapes, ~1e-6: the uncached engine itself differs by as
much between a prompt run alone and in a batch). bf16: log-probs within 0.05.
"""

import asyncio

import pytest
import torch

from agentscope_rft.engines.embedded import EmbeddedEngine
from agentscope_rft.models import load_causal_lm
from agentscope_rft.types import SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
SHARED = list(range(200, 253))  # 53 tokens: 6 whole blocks of 8 and a partial one


def make(path, *, caching=True, dtype="float32", **kwargs) -> EmbeddedEngine:
    options = {"prefix_block_tokens": 8, "prefill_chunk_tokens": 64, **kwargs}
    return EmbeddedEngine(path, dtype=dtype, device="cpu", prefix_caching=caching, **options)


async def agent_workload(engine: EmbeddedEngine) -> list:
    """Episodes sharing a system prompt, each with a second call that continues the first,
    then a long prompt (chunked) while short ones decode."""
    prompts = [SHARED + [300 + i] * (i + 1) for i in range(6)]
    first = await asyncio.gather(*[engine.generate(p, GREEDY) for p in prompts])
    follow = [
        p + out.completion_ids + [400, 401, 402] for p, [out] in zip(prompts, first, strict=True)
    ]
    second = await asyncio.gather(*[engine.generate(p, GREEDY) for p in follow])
    long_prompt = list(range(500, 730))
    third = await asyncio.gather(
        engine.generate(long_prompt, GREEDY),
        *[engine.generate([*SHARED, 900 + i], GREEDY) for i in range(3)],
    )
    return [out for outs in (*first, *second, *third) for out in outs]


@pytest.mark.parametrize(("dtype", "tolerance"), [("float32", 1e-5), ("bfloat16", 0.05)])
async def test_cached_results_equal_uncached(tiny_model_path, dtype, tolerance):
    results = {}
    for caching in (False, True):
        engine = make(tiny_model_path, caching=caching, dtype=dtype)
        await engine.start()
        try:
            results[caching] = await agent_workload(engine)
            metrics = engine.metrics()
        finally:
            await engine.close()
    for plain, cached in zip(results[False], results[True], strict=True):
        assert cached.completion_ids == plain.completion_ids
        assert cached.logprobs == pytest.approx(plain.logprobs, abs=tolerance)
    # The cache did the work: most prompt tokens were reused, not recomputed.
    assert metrics["prefix_cache/hit_rate"] > 0.5
    assert metrics["prefill_tokens"] < 0.5 * metrics["prompt_tokens"]
    assert metrics["prefill_chunks"] >= 4  # 230 tokens in chunks of 64


async def test_next_call_of_an_episode_reuses_prompt_and_completion(tiny_model_path):
    engine = make(tiny_model_path)
    await engine.start()
    try:
        [out] = await engine.generate(SHARED, GREEDY)
        before = engine.metrics()
        follow = SHARED + out.completion_ids + [400, 401]
        await engine.generate(follow, GREEDY)
        after = engine.metrics()
    finally:
        await engine.close()
    # Everything but the last sampled token (never fed) is cached, in whole blocks of 8.
    reusable = (len(SHARED) + len(out.completion_ids) - 1) // 8 * 8
    assert after["prefix_cache/hit_tokens"] - before["prefix_cache/hit_tokens"] == reusable
    assert after["prefill_tokens"] - before["prefill_tokens"] == len(follow) - reusable


async def test_tiny_budget_evicts_and_stays_correct(tiny_model_path):
    # Each 8-token block of this model is 2 layers x K,V x 4 heads x 8 x 16 dims x 4 bytes.
    model = load_causal_lm(tiny_model_path, dtype=torch.float32)
    text = model.config.get_text_config()
    heads = text.num_key_value_heads
    dim = text.hidden_size // text.num_attention_heads
    block = text.num_hidden_layers * 2 * heads * 8 * dim * 4
    results = {}
    for caching in (False, True):
        engine = make(tiny_model_path, caching=caching, prefix_cache_gib=3 * block / 2**30)
        await engine.start()
        try:
            results[caching] = await agent_workload(engine)
            metrics = engine.metrics()
        finally:
            await engine.close()
    for plain, cached in zip(results[False], results[True], strict=True):
        assert cached.completion_ids == plain.completion_ids
        assert cached.logprobs == pytest.approx(plain.logprobs, abs=1e-5)
    assert metrics["prefix_cache/evicted_blocks"] > 10
    assert metrics["prefix_cache/cached_tokens"] <= 3 * 8
    assert metrics["prefix_cache/hit_tokens"] > 0


async def test_weight_swap_clears_the_cache(tiny_model_path):
    engine = make(tiny_model_path)
    await engine.start()
    try:
        prompt = [*SHARED, 7, 7]
        await engine.generate(prompt, GREEDY)
        assert engine.metrics()["prefix_cache/cached_tokens"] > 0
        model = load_causal_lm(tiny_model_path, dtype=torch.float32)
        new_state = {k: v + 0.05 * torch.randn_like(v) for k, v in model.state_dict().items()}
        await engine.load_weights(new_state, version=1)
        metrics = engine.metrics()
        assert metrics["prefix_cache/cached_tokens"] == 0 and metrics["prefix_cache/clears"] == 1
        hits = metrics["prefix_cache/hit_tokens"]
        [after] = await engine.generate(prompt, GREEDY)
        assert engine.metrics()["prefix_cache/hit_tokens"] == hits  # nothing old was reused
    finally:
        await engine.close()
    # The result is the new model's, computed from scratch.
    uncached = make(tiny_model_path, caching=False)
    await uncached.start()
    try:
        await uncached.load_weights(new_state, version=1)
        [reference] = await uncached.generate(prompt, GREEDY)
    finally:
        await uncached.close()
    assert after.policy_version == 1
    assert after.completion_ids == reference.completion_ids
    assert after.logprobs == pytest.approx(reference.logprobs, abs=1e-5)


async def test_concurrent_requests_sharing_a_prefix_continue_independently(tiny_model_path):
    engine = make(tiny_model_path)
    await engine.start()
    try:
        sampled = [SamplingParams(temperature=1.0, max_tokens=12, seed=s) for s in range(6)]
        together = await asyncio.gather(*[engine.generate(SHARED, p) for p in sampled])
        alone = [await engine.generate(SHARED, p) for p in sampled]
        [[n_way_a, n_way_b]] = [
            await engine.generate(SHARED, SamplingParams(temperature=1.0, max_tokens=12, n=2))
        ]
        metrics = engine.metrics()
    finally:
        await engine.close()
    ids = [out.completion_ids for [out] in together]
    assert len(set(map(tuple, ids))) == len(ids)  # one continuation each, none shared
    assert ids == [out.completion_ids for [out] in alone]
    for [a], [b] in zip(together, alone, strict=True):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
    assert n_way_a.completion_ids != n_way_b.completion_ids
    # The six concurrent requests computed the shared blocks once (the others waited a step).
    assert metrics["prefix_cache/hit_tokens"] >= 5 * (len(SHARED) - 1) // 8 * 8


async def test_long_prompt_is_prefilled_in_chunks_between_decode_steps(tiny_model_path):
    engine = make(tiny_model_path, prefill_chunk_tokens=64)
    await engine.start()
    try:
        batcher = engine.batcher
        chunks_seen: list[int] = []
        running = engine._job([5, 6, 7], SamplingParams(max_tokens=60, ignore_eos=True, seed=1))
        running.on_token = lambda index, token: chunks_seen.append(batcher.stats["prefill_chunks"])
        batcher.submit(running)
        async with asyncio.timeout(120):
            while len(chunks_seen) < 3:
                await asyncio.sleep(0.001)
        [long_out] = await engine.generate(list(range(600, 900)), GREEDY)
        await running.done
    finally:
        await engine.close()
    # 300 tokens in chunks of 64 = 5 chunks, and the running request got tokens in between
    # (a callback runs on the loop a little after its token, so it may see a later count).
    assert batcher.stats["prefill_chunks"] == 5
    assert sum(1 <= seen <= 4 for seen in chunks_seen) >= 3
    reference = make(tiny_model_path, caching=False, prefill_chunk_tokens=None)
    await reference.start()
    try:
        [expected] = await reference.generate(list(range(600, 900)), GREEDY)
    finally:
        await reference.close()
    assert long_out.completion_ids == expected.completion_ids
    assert long_out.logprobs == pytest.approx(expected.logprobs, abs=1e-5)
