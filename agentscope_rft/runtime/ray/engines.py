"""vLLM replicas on the run's Ray cluster: one small host actor per replica, its server a child.

With `runtime: ray` and `engine.type: vllm` (no `engine.urls`), each replica's server process is
started by a `ReplicaHost` actor on a node with the resources it asks (`runtime.replica_gpus`,
`runtime.replica_cpus`, or the node `runtime.replica_nodes` pins it to), with the same launch
settings as a local replica (`VLLMLaunch`). The server listens on the node's address, so the run's
`VLLMEngine` talks to it by URL exactly as to a local replica, and its supervision (crash reports,
restarts that re-apply the current weights, the log tail in errors) is the same code: only the
process operations (start, exit code, end, log) go through the actor (`HostedProcess`).

The server dies with its host: a watcher process ends the server's process group when the actor's
process is gone (the run stopped it, or Ray killed it because the run's process died).
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agentscope_rft.engines.vllm_launch import VLLMLaunch
from agentscope_rft.engines.vllm_server import (
    LocalProcess,
    OnRestart,
    VLLMServer,
    VLLMServerError,
    first_error,
    free_port,
    log_tail,
)

logger = logging.getLogger(__name__)

HOST_START_TIMEOUT_S = 300.0


class ReplicaHost:
    """The Ray actor of one vLLM replica: starts its server on this node, watches it, ends it.

    Example:
        >>> host = ray.remote(ReplicaHost).options(num_gpus=1).remote()  # doctest: +SKIP
        >>> info = ray.get(host.prepare.remote(launch, "replica-0", None, "logs"))  # doctest: +SKIP
        >>> ray.get(host.spawn.remote("starting replica-0"))  # the server's pid  # doctest: +SKIP
    """

    def __init__(self) -> None:
        self.workdir = Path(tempfile.mkdtemp(prefix="agentscope-rft-vllm-host-"))
        self.process: LocalProcess | None = None

    async def prepare(
        self, launch: VLLMLaunch, name: str, port: int | None, log_dir: str | None
    ) -> dict[str, Any]:
        """Check this node can run the replica and fix its address; returns where it will be."""
        import ray

        from agentscope_rft.engines.vllm_env import VLLMNotFoundError, find_vllm_python

        ip = ray.util.get_node_ip_address()
        try:
            python = find_vllm_python(launch.python)
        except VLLMNotFoundError as exc:
            raise VLLMNotFoundError(f"on node {ip}: {exc}") from None
        if not Path(launch.model_path).exists():
            raise FileNotFoundError(
                f"the model {launch.model_path} is not on node {ip}: vLLM replicas load it from "
                "the same path on their node (a shared filesystem, or a copy at that path), or pin "
                "them to nodes that have it (runtime.replica_nodes)"
            )
        port = port or free_port(ip)
        # The run's log folder when this node sees it (same machine, shared filesystem).
        logs = Path(log_dir) if log_dir and Path(log_dir).is_dir() else self.workdir
        log_path = logs / f"vllm-{name}.log"
        command = launch.command(python, ip, port, self.workdir)
        env = launch.environment(ipc_dir=self.workdir / "ipc")
        self.process = LocalProcess(command, env, log_path, guarded=True)
        return {
            "url": f"http://{ip}:{port}",
            "ip": ip,
            "node_id": ray.get_runtime_context().get_node_id(),
            "host_pid": os.getpid(),
            "log": str(log_path),
        }

    async def spawn(self, header: str) -> int:
        """Start the server process (a child of this actor's process); returns its pid."""
        assert self.process is not None, "prepare() first"
        return self.process.start(header)

    async def wait_exit(self) -> int | None:
        """Return the server's exit code once it has exited (long poll); None when it was ended
        by `terminate()` meanwhile (nobody waits for that answer)."""
        assert self.process is not None
        pid = self.process.pid
        while self.process.pid == pid and pid is not None:
            code = self.process.exited()
            if code is not None:
                return code
            await asyncio.sleep(0.2)
        return None

    async def terminate(self) -> None:
        """End the server's process group (SIGTERM, then SIGKILL)."""
        if self.process is not None:
            await asyncio.to_thread(self.process.kill_group)

    async def log_report(self, lines: int) -> tuple[str, str | None]:
        path = self.process.log_path if self.process else None
        return log_tail(path, lines), first_error(path)

    async def close(self) -> None:
        """End the server and remove this host's files (before the actor is killed)."""
        await self.terminate()
        shutil.rmtree(self.workdir, ignore_errors=True)


def _actor_gone() -> tuple[type[BaseException], ...]:
    from ray import exceptions as ex

    return (ex.RayActorError, ex.WorkerCrashedError, ex.NodeDiedError)


class HostedProcess:
    """The run's handle on a server process that a `ReplicaHost` actor started on its node."""

    def __init__(self, actor: Any, info: Mapping[str, Any]) -> None:
        self.actor = actor
        self.info = dict(info)
        self._pid: int | None = None
        self._exit: int | None = None
        self._waiter: asyncio.Task[None] | None = None

    @property
    def pid(self) -> int | None:
        return self._pid

    @property
    def log_path(self) -> Path | None:
        return Path(self.info["log"])

    @property
    def host_pid(self) -> int:
        """The pid of the host actor's process (the server's parent), on its node."""
        return int(self.info["host_pid"])

    def where(self) -> str:
        return f"{self.info['log']} on {self.info['ip']}"

    async def spawn(self, header: str) -> None:
        try:
            self._pid = await self.actor.spawn.remote(header)
            self._exit = None  # (a host that is gone leaves the last exit code standing)
        except _actor_gone() as exc:
            raise VLLMServerError(
                f"the host actor of the vLLM replica on {self.info['ip']} is gone (killed, or its "
                f"node left the cluster): {type(exc).__name__}"
            ) from exc
        self._waiter = asyncio.create_task(self._wait_exit())

    async def _wait_exit(self) -> None:
        try:
            self._exit = await self.actor.wait_exit.remote()
        except _actor_gone():
            logger.error("the Ray actor hosting vLLM server %s died", self.info["url"])
            self._exit = -9  # its server went with it

    def exited(self) -> int | None:
        return self._exit

    async def terminate(self) -> None:
        if self._waiter is not None:
            self._waiter.cancel()
            self._waiter = None
        try:
            await self.actor.terminate.remote()
        except _actor_gone():
            pass  # the actor, and with it its server, is gone already
        self._pid = None

    async def log_report(self, lines: int) -> tuple[str, str | None]:
        report: tuple[str, str | None] = await self.actor.log_report.remote(lines)
        return report


class RayReplicaHosts:
    """Starts the vLLM replicas of a `VLLMEngine` under host actors on the Ray cluster.

    Set as `engine.replica_hosts` before `engine.start()`; `close()` ends the actors (their
    servers with them) after `engine.close()`.

    Example:
        >>> hosts = RayReplicaHosts(cpus=1, gpus=1, nodes=[], runtime_env={})  # doctest: +SKIP
        >>> engine.replica_hosts = hosts  # doctest: +SKIP
        >>> await engine.start()  # servers run on the cluster's nodes  # doctest: +SKIP
    """

    def __init__(
        self,
        *,
        cpus: float,
        gpus: float,
        nodes: Sequence[str],
        runtime_env: dict[str, Any] | None = None,
        start_timeout: float = HOST_START_TIMEOUT_S,
    ) -> None:
        self.cpus = cpus
        self.gpus = gpus
        self.nodes = list(nodes)
        """Node ids, one per pinned replica (cycling); empty: anywhere."""
        self.runtime_env = runtime_env or {}
        self.start_timeout = start_timeout
        self.actors: list[Any] = []
        self.node_ids: dict[str, str] = {}
        """Each replica's URL -> the Ray node it runs on."""

    def _host(self, index: int) -> Any:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        options: dict[str, Any] = {
            "num_cpus": self.cpus,
            "num_gpus": self.gpus,
            "runtime_env": self.runtime_env or None,
        }
        if self.nodes:
            node = self.nodes[index % len(self.nodes)]
            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node, soft=False)
        return ray.remote(ReplicaHost).options(**options).remote()

    async def servers(
        self,
        launch: VLLMLaunch,
        count: int,
        *,
        log_dir: Path,
        port: int | None,
        startup_timeout: float,
        max_restarts: int,
        on_restart: OnRestart,
    ) -> list[VLLMServer]:
        """Place `count` host actors and return their (not yet started) servers."""
        log_dir.mkdir(parents=True, exist_ok=True)
        actors = [self._host(i) for i in range(count)]
        self.actors.extend(actors)
        names = [f"replica-{i}" for i in range(count)]
        prepared = [
            a.prepare.remote(launch, n, port + i if port else None, str(log_dir))
            for i, (a, n) in enumerate(zip(actors, names, strict=True))
        ]
        try:
            infos = await asyncio.wait_for(asyncio.gather(*prepared), self.start_timeout)
        except TimeoutError as exc:
            raise VLLMServerError(
                f"the Ray actors hosting {count} vLLM replica(s) were not placed within "
                f"{self.start_timeout:.0f}s: no node has {self.cpus:g} CPU(s) and {self.gpus:g} "
                "GPU(s) free for each (runtime.replica_cpus / runtime.replica_gpus"
                + (f", pinned to nodes {self.nodes}" if self.nodes else "")
                + "); lower them or add nodes"
            ) from exc
        except Exception as exc:
            cause = getattr(exc, "cause", None) or exc
            raise VLLMServerError(f"a vLLM replica cannot start on its Ray node: {cause}") from exc
        servers = []
        for name, actor, info in zip(names, actors, infos, strict=True):
            self.node_ids[info["url"]] = info["node_id"]
            servers.append(
                VLLMServer(
                    name,
                    url=info["url"],
                    process=HostedProcess(actor, info),
                    startup_timeout=startup_timeout,
                    max_restarts=max_restarts,
                    on_restart=on_restart,
                )
            )
        logger.info(
            "vLLM replicas run under Ray actors: %s",
            ", ".join(f"{i['url']} (node {i['node_id'][:8]})" for i in infos),
        )
        return servers

    def close(self) -> None:
        """Kill the host actors (a server still running goes with its host)."""
        import ray

        try:  # normally the engine has stopped the servers already: this only removes files
            ray.get([actor.close.remote() for actor in self.actors], timeout=30)
        except Exception:
            logger.debug("a vLLM host actor did not close cleanly")
        for actor in self.actors:
            try:
                ray.kill(actor)
            except Exception:
                logger.debug("vLLM host actor already gone")
        self.actors.clear()
