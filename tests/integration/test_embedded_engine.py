"""The embedded engine on a tiny real model: batching correctness, sampling, weight hot-swap."""

import asyncio
import os
import subprocess
import sys

import pytest
import torch

from agentscope_rft.engines.base import ContextWindowError
from agentscope_rft.engines.embedded import EmbeddedEngine
from agentscope_rft.models import load_causal_lm
from agentscope_rft.types import SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=12)


@pytest.fixture
async def engine(tiny_model_path):
    engine = EmbeddedEngine(tiny_model_path, dtype="float32", device="cpu", max_batch_size=8)
    await engine.start()
    yield engine
    await engine.close()


def _reference_greedy(model, prompt, steps):
    """Plain unbatched greedy decoding with full recomputation (no cache, no padding)."""
    ids = list(prompt)
    out, logprobs = [], []
    with torch.no_grad():
        for _ in range(steps):
            logits = model(torch.tensor([ids])).logits[0, -1].float()
            token = int(logits.argmax())
            out.append(token)
            logprobs.append(float(logits.log_softmax(-1)[token]))
            ids.append(token)
    return out, logprobs


async def test_concurrent_requests_match_unbatched_decoding(engine, tiny_model_path):
    # Prompts of different lengths arrive staggered, so rows join a running batch (left padding,
    # cache merging) and leave it; every result must equal plain unbatched decoding. Prompt i is
    # sent after 2i decode steps, while the first (24+ tokens, no early stop) still runs: the
    # overlap does not depend on how fast this machine decodes.
    prompts = [list(range(100, 100 + n)) for n in (3, 17, 8, 30, 1, 12)]
    assert engine.fused_decode  # decode steps run the fused forward (engines/fused.py)
    start = engine.batcher.stats["decode_steps"]

    async def delayed(i, prompt):
        async with asyncio.timeout(60):
            while engine.batcher.stats["decode_steps"] < start + 2 * i:
                await asyncio.sleep(0.001)
        params = SamplingParams(temperature=0.0, max_tokens=24 + i, ignore_eos=True)
        return await engine.generate(prompt, params)

    outs = await asyncio.gather(*[delayed(i, p) for i, p in enumerate(prompts)])
    model = load_causal_lm(tiny_model_path, dtype=torch.float32)
    for i, (prompt, [out]) in enumerate(zip(prompts, outs, strict=True)):
        ref_ids, ref_lp = _reference_greedy(model, prompt, len(out.completion_ids))
        assert out.completion_ids == ref_ids, f"prompt {i}"
        assert out.logprobs == pytest.approx(ref_lp, abs=1e-4)
        assert out.finish_reason == "length"
    assert engine.batcher.stats["decode_tokens"] > engine.batcher.stats["decode_steps"]


async def test_answered_rows_leave_at_once_without_changing_results(engine, tiny_model_path):
    # Rows finish one after another while another request joins: an answered row leaves the
    # batch before its answer goes out (the last running rows move into its place), and no
    # row's results change with the moves.
    prompts = [list(range(200 + 7 * i, 205 + 9 * i)) for i in range(8)]
    lengths = [3 + 4 * i for i in range(8)]
    batcher = engine.batcher
    lingered, sizes = [], []

    async def watch():
        while True:
            # The batcher thread may be mid-retire while this looks; what must never be seen
            # is a row whose answer already went out (answers resolve on this loop, after
            # the batch dropped their rows).
            rows = list(batcher.batch.rows)
            lingered.append(sum(row.retired and row.job.done.done() for row in rows))
            sizes.append(len(rows))
            await asyncio.sleep(0.001)

    async def late(prompt):
        start = batcher.stats["decode_steps"]
        while batcher.stats["decode_steps"] < start + 9:
            await asyncio.sleep(0.001)
        return await engine.generate(prompt, SamplingParams(temperature=0.0, max_tokens=10))

    watcher = asyncio.create_task(watch())
    outs = await asyncio.gather(
        *[
            engine.generate(p, SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True))
            for p, n in zip(prompts, lengths, strict=True)
        ],
        late([7, 8, 9, 10]),
    )
    watcher.cancel()
    assert max(lingered) == 0 and batcher.num_running == 0 and not batcher.batch.rows
    assert len(set(sizes)) > 3  # the batch shrank step by step (and grew once)
    model = load_causal_lm(tiny_model_path, dtype=torch.float32)
    for prompt, [out] in zip([*prompts, [7, 8, 9, 10]], outs, strict=True):
        ref_ids, ref_lp = _reference_greedy(model, prompt, len(out.completion_ids))
        assert out.completion_ids == ref_ids
        assert out.logprobs == pytest.approx(ref_lp, abs=1e-4)
    assert [len(o[0].completion_ids) for o in outs[:8]] == lengths


async def test_rows_join_a_cache_that_grew_while_decoding(engine, tiny_model_path):
    # A long generation outgrows the cache's spare columns mid-decode (the buffers grow inside
    # a forward); then short requests join those buffers and leave, and another long one joins
    # after them. Every result equals plain unbatched decoding.
    batcher = engine.batcher

    async def after(steps, prompt, n):
        start = batcher.stats["decode_steps"]
        while batcher.stats["decode_steps"] < start + steps:
            await asyncio.sleep(0.001)
        params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
        return prompt, await engine.generate(prompt, params)

    runs = await asyncio.gather(
        after(0, [11, 12, 13], 90),
        after(75, [21, 22, 23, 24, 25], 6),
        after(78, [31, 32], 4),
        after(85, [41, 42, 43, 44], 30),
    )
    model = load_causal_lm(tiny_model_path, dtype=torch.float32)
    for prompt, [out] in runs:
        ref_ids, ref_lp = _reference_greedy(model, prompt, len(out.completion_ids))
        assert out.completion_ids == ref_ids
        assert out.logprobs == pytest.approx(ref_lp, abs=1e-4)
    assert batcher.num_running == 0


async def test_requests_are_batched_together(engine):
    before = engine.batcher.stats["decode_steps"]
    outs = await asyncio.gather(
        *[engine.generate([5, 6, 7, i], SamplingParams(max_tokens=10, seed=i)) for i in range(8)]
    )
    steps = engine.batcher.stats["decode_steps"] - before
    tokens = sum(len(o[0].completion_ids) for o in outs)
    assert steps < tokens / 3  # one step serves many sequences


async def test_seed_n_and_max_tokens(engine):
    params = SamplingParams(temperature=1.0, max_tokens=8, seed=42, n=3)
    first = await engine.generate([1, 2, 3], params)
    second = await engine.generate([1, 2, 3], params)
    assert [o.completion_ids for o in first] == [o.completion_ids for o in second]
    assert len({tuple(o.completion_ids) for o in first}) > 1  # choices differ
    assert all(len(o.completion_ids) <= 8 for o in first)
    assert all(lp <= 0 for o in first for lp in o.logprobs)


async def test_stop_string_ends_generation(engine):
    [free] = await engine.generate([9, 9, 9], GREEDY)
    text = engine.tokenizer.decode(free.completion_ids)
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    if not stop.strip():
        pytest.skip("the tiny model produced whitespace here")
    [stopped] = await engine.generate(
        [9, 9, 9], SamplingParams(temperature=0.0, max_tokens=12, stop=(stop,))
    )
    assert stopped.stop_string == stop
    assert len(stopped.completion_ids) < len(free.completion_ids)


async def test_context_window_is_enforced(tiny_model_path):
    engine = EmbeddedEngine(tiny_model_path, dtype="float32", device="cpu", max_model_len=32)
    await engine.start()
    try:
        with pytest.raises(ContextWindowError, match="longer than the context window of 32"):
            await engine.generate(list(range(40)), GREEDY)
        [out] = await engine.generate(list(range(28)), SamplingParams(max_tokens=100))
        assert len(out.completion_ids) <= 4 and out.finish_reason in ("length", "stop")
    finally:
        await engine.close()


async def test_weight_swap_under_load(engine, tiny_model_path):
    """In-flight requests finish on the old weights; later ones carry the new version."""
    prompt = [11, 12, 13]
    [before] = await engine.generate(prompt, GREEDY)
    model = load_causal_lm(tiny_model_path, dtype=torch.float32)
    new_state = {k: v + 0.05 * torch.randn_like(v) for k, v in model.state_dict().items()}

    in_flight = [
        asyncio.create_task(engine.generate([20 + i], SamplingParams(max_tokens=40, seed=i)))
        for i in range(6)
    ]
    await asyncio.sleep(0.05)
    swap = asyncio.create_task(engine.load_weights(new_state, version=1))
    await asyncio.sleep(0)
    later = asyncio.create_task(engine.generate(prompt, GREEDY))
    results = await asyncio.gather(*in_flight)
    seconds = await swap
    [after] = await later

    assert all(out.policy_version == 0 and len(out.completion_ids) > 0 for [out] in results)
    assert after.policy_version == 1 and engine.policy_version == 1
    assert seconds >= 0
    assert after.logprobs != pytest.approx(before.logprobs, abs=1e-6)
    model.load_state_dict(new_state)
    ref_ids, ref_lp = _reference_greedy(model, prompt, len(after.completion_ids))
    assert after.completion_ids == ref_ids
    assert after.logprobs == pytest.approx(ref_lp, abs=1e-4)


class _ThreadKiller(BaseException):
    """Not an Exception: what the engine thread's per-step handler does not catch."""


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
async def test_engine_thread_death_fails_waiting_requests_instead_of_hanging(engine):
    from agentscope_rft.engines.base import EngineError

    def die() -> None:
        raise _ThreadKiller("simulated fatal error in the engine thread")

    engine.batcher._decode_step = die  # type: ignore[method-assign]
    with pytest.raises(EngineError, match="engine stopped"):
        await asyncio.wait_for(engine.generate([5, 6, 7], GREEDY), timeout=30)
    with pytest.raises(EngineError, match="shutting down"):
        await engine.generate([5, 6, 7], GREEDY)


_ONE_TEAM = """
import asyncio, os, sys, threading, time
import torch
from agentscope_rft.engines.embedded import EmbeddedEngine
from agentscope_rft.types import SamplingParams

def native_threads():  # OS threads Python did not start: OpenMP's workers among them
    return len(os.listdir("/proc/self/task")) - len(threading.enumerate())

def warm():  # torch starts a helper thread once per process, the first time a team forms
    torch.set_num_threads(2)
    torch.ones(1 << 22).add_(1.0)

async def main():
    high = torch.get_num_threads()
    helper = threading.Thread(target=warm)
    helper.start()
    helper.join()
    time.sleep(0.2)
    before = native_threads()
    engine = EmbeddedEngine(sys.argv[1], dtype="float32", device="cpu")
    await engine.start()
    sampling = SamplingParams(temperature=1.0, max_tokens=8)
    for _ in range(3):  # prefills and decode steps, both thread counts tried
        await asyncio.gather(*(engine.generate(list(range(100, 400)), sampling) for _ in range(4)))
    torch.ones(1 << 22).add_(1.0)  # torch work of the app in the event loop's thread
    deadline = time.monotonic() + 5  # threads that ended take their teams' workers along
    while native_threads() - before > high - 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    print(native_threads() - before, high, torch.get_num_threads())
    await engine.close()

asyncio.run(main())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts OS threads in /proc")
def test_the_engine_threads_openmp_team_is_the_only_one_that_lasts(tiny_model_path, tmp_path):
    # libgomp stops spinning its idle teams once the process has more OpenMP threads than CPUs,
    # and the engine's small decode ops then wait for sleeping threads (`engines/threads.py`).
    # A fresh process: loading, the dtype probe and the app's own torch work add no team.
    script = tmp_path / "one_team.py"
    script.write_text(_ONE_TEAM)
    env = {**os.environ, "OMP_NUM_THREADS": "2", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run(
        [sys.executable, str(script), tiny_model_path],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    added, high, main_threads = map(int, done.stdout.split()[-3:])
    assert high == 2 and main_threads == 1
    assert added <= high - 1  # the engine thread's team: itself and high - 1 workers


async def test_a_failed_prefill_fails_its_requests_instead_of_hanging(engine):
    prefill = engine.batcher._prefill
    calls = 0

    def fail_once(jobs) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("simulated failure in prefill")
        prefill(jobs)

    engine.batcher._prefill = fail_once  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="simulated failure"):
        await asyncio.wait_for(engine.generate([5, 6, 7], GREEDY), timeout=30)
    [after] = await asyncio.wait_for(engine.generate([5, 6, 7], GREEDY), timeout=30)
    assert len(after.completion_ids) == GREEDY.max_tokens  # the engine still serves


async def test_replies_stop_at_the_templates_end_of_turn_when_eos_differs(
    tiny_model_path, tmp_path
):
    """A base model's tokenizer (eos <|endoftext|>) with a ChatML template: <|im_end|> ends a
    reply too (it ran on to the token cap, past the turn's end)."""
    import json
    import shutil

    folder = tmp_path / "base-eos"
    shutil.copytree(tiny_model_path, folder)
    config_file = folder / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config["eos_token"] = "<|endoftext|>"
    config_file.write_text(json.dumps(config))
    for name in ("config.json", "generation_config.json"):
        model_config = json.loads((folder / name).read_text())
        model_config["eos_token_id"] = 0  # <|endoftext|>
        (folder / name).write_text(json.dumps(model_config))
    engine = EmbeddedEngine(folder, dtype="float32", device="cpu")
    await engine.start()
    try:
        tokenizer = engine.tokenizer
        assert tokenizer.eos_token == "<|endoftext|>"
        assert engine.batcher.model.generation_config.eos_token_id == 0
        assert tokenizer.convert_tokens_to_ids("<|im_end|>") in engine.batcher.stop_token_ids
    finally:
        await engine.close()
