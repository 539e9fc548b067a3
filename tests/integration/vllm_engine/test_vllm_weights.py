"""Weight hot-swap: reload under concurrent calls, version bookkeeping, LoRA per version."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

from agentscope_rft.engines.base import ChatRequest, EngineError
from agentscope_rft.engines.vllm import VLLMEngine
from agentscope_rft.engines.vllm_weights import save_weights
from agentscope_rft.models import load_causal_lm
from agentscope_rft.types import SamplingParams

from ..engine_contract import choices_of, collect

pytestmark = [pytest.mark.vllm, pytest.mark.asyncio(loop_scope="session")]

FIXED = [{"role": "user", "content": "Write one sentence about the sea."}]
GREEDY = SamplingParams(temperature=0, max_tokens=16)


async def fixed_logprobs(engine: VLLMEngine) -> tuple[list[int], list[float], int]:
    [choice] = choices_of(await collect(engine, ChatRequest(messages=FIXED, sampling=GREEDY)))
    return choice.completion_ids, choice.logprobs, choice.policy_version


def perturbed_state_dict(path: Path) -> dict[str, torch.Tensor]:
    model = load_causal_lm(path, dtype=torch.float32)
    torch.manual_seed(0)
    state = model.state_dict()
    for name, tensor in state.items():
        if name.endswith("mlp.down_proj.weight"):
            tensor.add_(torch.randn_like(tensor) * 0.02)
    return state


def perturbed_folder(path: Path, dest: Path) -> Path:
    """The perturbed weights saved as a checkpoint folder (loading it starts the sync at once)."""
    dest.mkdir(parents=True)
    save_weights(perturbed_state_dict(path), dest)
    return dest


async def generated_tokens(engine: VLLMEngine) -> float:
    """The server's count of tokens generated so far (its Prometheus `/metrics`)."""
    response = await engine.replicas[0].http.get("/metrics")
    assert response.status_code == 200, response.text
    for line in response.text.splitlines():
        if line.startswith("vllm:generation_tokens_total"):
            return float(line.rsplit(" ", 1)[-1])
    raise AssertionError("vllm:generation_tokens_total is not in the server's /metrics")


async def prompt_scores(engine: VLLMEngine, prompt_ids: list[int], ids: list[int]) -> list[float]:
    """Log-probs the engine's current weights give `ids` after `prompt_ids` (teacher-forced)."""
    body = {
        "model": engine.model_name, "prompt": prompt_ids + ids, "max_tokens": 1,
        "temperature": 1.0, "prompt_logprobs": 0,
    }  # fmt: skip
    response = await engine.replicas[0].http.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    rows = response.json()["choices"][0]["prompt_logprobs"][len(prompt_ids) :]
    return [float(row[str(tid)]["logprob"]) for row, tid in zip(rows, ids, strict=True)]


@pytest.mark.parametrize("sync_mode", ["wait", "keep"])
async def test_reload_under_concurrent_calls(
    vllm_engine: VLLMEngine, smollm2_path: Path, sync_mode: str, tmp_path: Path
) -> None:
    """Every call records the version it was admitted under. In `wait` mode that policy sampled all
    of it; in `keep` mode a call frozen by the reload goes on with the new weights: its log-probs
    switch from the old to the new policy at one token, and `mixed_policy_calls` counts it."""
    vllm_engine.sync_mode = sync_mode  # type: ignore[assignment]
    base_version = vllm_engine.policy_version
    mixed_before = vllm_engine.mixed_policy_calls
    ids_before, lp_before, version = await fixed_logprobs(vllm_engine)
    assert version == base_version
    # Written before the calls start: writing 540 MB while they run could outlast them on a slow
    # machine, and the sync would then find nothing in flight.
    state = await asyncio.to_thread(perturbed_folder, smollm2_path, tmp_path / "perturbed")
    prompts: dict[int, list[int]] = {}

    async def call(i: int) -> tuple[int, int, list[int], list[float]]:
        messages = [{"role": "user", "content": f"Tell me a long story about the number {i}."}]
        prompts[i] = vllm_engine.renderer.render_ids(messages)
        request = ChatRequest(
            messages=messages,
            # Long enough to be generating when the sync starts, whatever the machine's load.
            sampling=SamplingParams(temperature=1.0, seed=i, max_tokens=160, ignore_eos=True),
            rollout_id=f"concurrent-{sync_mode}-{i}",
        )
        [choice] = choices_of(await collect(vllm_engine, request))
        assert len(choice.completion_ids) == len(choice.logprobs) == 160
        return i, choice.policy_version, choice.completion_ids, choice.logprobs

    try:
        generated = await generated_tokens(vllm_engine)
        calls = [asyncio.create_task(call(i)) for i in range(4)]
        # Sync once every call has sampled a few tokens with the old weights, however slow the
        # machine (a fixed sleep found calls still prefilling on a loaded one).
        deadline = asyncio.get_running_loop().time() + 120
        while await generated_tokens(vllm_engine) < generated + 4 * 8:
            assert asyncio.get_running_loop().time() < deadline, "the calls did not start"
            await asyncio.sleep(0.05)
        assert vllm_engine.metrics()["in_flight"] == 4  # all admitted, none finished
        seconds = await vllm_engine.load_weights(state, base_version + 1)
        late = [asyncio.create_task(call(i)) for i in range(4, 6)]
        results = await asyncio.gather(*calls, *late)
    finally:
        vllm_engine.sync_mode = "wait"
    assert seconds > 0
    assert vllm_engine.sync_seconds[-1] == seconds
    versions = {i: v for i, v, _, _ in results}
    assert [versions[i] for i in range(4)] == [base_version] * 4
    assert versions[4] == versions[5] == base_version + 1
    mixed = vllm_engine.mixed_policy_calls - mixed_before
    assert mixed == (4 if sync_mode == "keep" else 0)

    # Which weights sampled each token of the calls admitted before the sync.
    new_scores = [await prompt_scores(vllm_engine, prompts[i], ids) for i, _, ids, _ in results[:4]]
    _, lp_after, version = await fixed_logprobs(vllm_engine)
    assert version == base_version + 1
    assert max(abs(a - b) for a, b in zip(lp_before, lp_after, strict=False)) > 1e-3

    # Back to the original checkpoint folder: the original log-probs, as a newer version.
    await vllm_engine.load_weights(smollm2_path, base_version + 2)
    ids_back, lp_back, version = await fixed_logprobs(vllm_engine)
    assert version == base_version + 2
    assert ids_back == ids_before
    assert lp_back == pytest.approx(lp_before, abs=1e-4)
    old_scores = [await prompt_scores(vllm_engine, prompts[i], ids) for i, _, ids, _ in results[:4]]
    for (_, _, _, recorded), old, new in zip(results[:4], old_scores, new_scores, strict=True):
        by_old = [abs(r - o) < 1e-3 for r, o in zip(recorded, old, strict=True)]
        if sync_mode == "wait":
            assert all(by_old), "a call drained in wait mode was sampled by the old weights only"
            continue
        # keep: the old weights up to the sync, the new ones after it (where the two differ).
        switch = by_old.index(False)
        assert 0 < switch < len(recorded)
        differ = [k for k in range(switch, len(recorded)) if abs(old[k] - new[k]) > 1e-3]
        assert differ
        assert sum(abs(recorded[k] - new[k]) < 1e-3 for k in differ) >= 0.95 * len(differ)


async def test_wait_mode_finishes_in_flight_calls_on_old_weights(
    vllm_engine: VLLMEngine, smollm2_path: Path
) -> None:
    """In wait mode a call in flight during the sync is sampled entirely by the old policy."""
    version = vllm_engine.policy_version
    request = ChatRequest(messages=FIXED, sampling=SamplingParams(temperature=0, max_tokens=64))
    [reference] = choices_of(await collect(vllm_engine, request))
    in_flight = asyncio.create_task(collect(vllm_engine, request))
    await asyncio.sleep(0.5)
    state = await asyncio.to_thread(perturbed_state_dict, smollm2_path)
    await vllm_engine.load_weights(state, version + 1)
    [during] = choices_of(await in_flight)
    assert during.policy_version == version
    assert during.completion_ids == reference.completion_ids
    assert during.logprobs == pytest.approx(reference.logprobs, abs=1e-4)
    await vllm_engine.load_weights(smollm2_path, version + 2)


async def test_bad_checkpoint_folder_is_a_clear_error(
    vllm_engine: VLLMEngine, tmp_path: Path
) -> None:
    version = vllm_engine.policy_version
    with pytest.raises(EngineError, match=r"no \*\.safetensors files"):
        await vllm_engine.load_weights(tmp_path, version + 1)
    assert vllm_engine.policy_version == version


def make_lora_adapter(base: Path, out: Path) -> Path:
    from peft import LoraConfig, get_peft_model

    model = load_causal_lm(base, dtype=torch.float32)
    torch.manual_seed(0)
    config = LoraConfig(
        r=8, lora_alpha=32, target_modules=["q_proj", "v_proj"], init_lora_weights=False
    )
    peft_model = get_peft_model(model, config)
    peft_model.save_pretrained(str(out))
    return out


async def test_lora_adapter_switches_outputs_for_its_name_only(
    vllm_engine: VLLMEngine, smollm2_path: Path, tmp_path: Path
) -> None:
    adapter = await asyncio.to_thread(make_lora_adapter, smollm2_path, tmp_path / "adapter")
    prompt = vllm_engine.renderer.render_ids(FIXED)
    base_ids, base_lp, _ = await fixed_logprobs(vllm_engine)
    version = vllm_engine.policy_version + 1
    seconds = await vllm_engine.load_lora(adapter, version)
    assert seconds > 0
    adapter_name = vllm_engine.active_model
    assert adapter_name == f"{vllm_engine.model_name}-lora-v{version}"

    # The engine's calls now go to the adapter and record its version.
    _, lp, recorded = await fixed_logprobs(vllm_engine)
    assert recorded == version
    assert lp != pytest.approx(base_lp, abs=1e-3)

    # On the server, only the adapter's name serves the adapter; the base name is unchanged.
    replica = vllm_engine.replicas[0]
    outputs = {}
    for name in (vllm_engine.model_name, adapter_name):
        body = {
            "model": name, "prompt": prompt, "max_tokens": 16, "temperature": 0, "logprobs": 0,
            "return_token_ids": True,
        }  # fmt: skip
        response = await replica.http.post("/v1/completions", json=body)
        assert response.status_code == 200, response.text
        outputs[name] = response.json()["choices"][0]["logprobs"]["token_logprobs"]
    assert outputs[vllm_engine.model_name] == pytest.approx(base_lp, abs=1e-4)
    assert outputs[adapter_name] == pytest.approx(lp, abs=1e-4)

    # Loading full weights makes the base model the policy again.
    await vllm_engine.load_weights(smollm2_path, version + 1)
    assert vllm_engine.active_model == vllm_engine.model_name
    ids_back, lp_back, _ = await fixed_logprobs(vllm_engine)
    assert ids_back == base_ids
    assert lp_back == pytest.approx(base_lp, abs=1e-4)
