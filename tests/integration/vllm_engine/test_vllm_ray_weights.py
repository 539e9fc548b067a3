"""A vLLM replica reloads weights staged through Ray's object store (no shared filesystem)."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from agentscope_rft.engines.vllm import VLLMEngine
from agentscope_rft.runtime.ray.weights import WeightPlacement

from .test_vllm_weights import GREEDY, fixed_logprobs, perturbed_state_dict

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.asyncio(loop_scope="session")]
ray = pytest.importorskip("ray")


async def test_a_replica_reloads_the_object_store_copy(
    vllm_engine: VLLMEngine, smollm2_path: Path
) -> None:
    assert GREEDY.temperature == 0
    ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)
    url = vllm_engine.replicas[0].server.url
    placement = WeightPlacement(
        {url: ray.get_runtime_context().get_node_id()},
        "object_store",
        vllm_engine.weights_dir or smollm2_path,
    )
    hidden: list[tuple[Path, Path]] = []

    async def staged_only(folder: Path, version: int) -> dict[str, Path]:
        paths = await placement.paths(folder, version)
        # As on a machine without a shared filesystem: the original folder is not there.
        hidden.append((folder, folder.with_name(folder.name + ".hidden")))
        shutil.move(*hidden[-1])
        return dict(paths)

    try:
        await placement.start()
        _, before, _ = await fixed_logprobs(vllm_engine)
        vllm_engine.weight_paths = staged_only
        version = vllm_engine.policy_version + 1
        state = await asyncio.to_thread(perturbed_state_dict, smollm2_path)
        await vllm_engine.load_weights(state, version)
        for original, moved in hidden:
            shutil.move(moved, original)
        _, after, served = await fixed_logprobs(vllm_engine)
        assert served == version and after != before  # the staged copy was loaded
        [(original, _)] = hidden
        staged = (await placement.paths(original, version))[url]
        assert staged != original and sorted(p.name for p in staged.iterdir()) == sorted(
            p.name for p in original.iterdir()
        )
    finally:
        vllm_engine.weight_paths = None
        await vllm_engine.load_weights(smollm2_path, vllm_engine.policy_version + 1)
        placement.close()
        ray.shutdown()
