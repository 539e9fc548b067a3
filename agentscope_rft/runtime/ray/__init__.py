"""The Ray runtime: one Ray cluster runs the job; episodes run in isolated runner processes.

The run's process (the Ray driver) keeps the gateway, the buffer, the trainer's driver and an
embedded engine; vLLM replicas run under host actors on the cluster's nodes (`engines.py`), a
multi-rank verl trainer places its ranks in the same cluster, and `runtime.runners` runner actors,
spread over the nodes, run the user's workflow against the gateway by URL. See
docs/multi-machine.md.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentscope_rft.explorer.runner import ModelSettings
from agentscope_rft.runtime.ray.cluster import (
    RayCluster,
    RayClusterError,
    hosts_replicas,
    replica_gpus,
    resource_needs,
)
from agentscope_rft.runtime.ray.pool import RayRunnerPool, RunnerStartError
from agentscope_rft.runtime.ray.process import RunnerSpec
from agentscope_rft.runtime.ray.weights import WeightPlacement, node_of

if TYPE_CHECKING:
    from agentscope_rft.config import RunConfig

logger = logging.getLogger(__name__)

__all__ = ["RayCluster", "RayClusterError", "RayRunnerPool", "RayRuntime", "RunnerStartError"]

PACKAGE_ROOT = str(Path(__file__).resolve().parents[3])


def portable_spec(spec: str | None, working_dir: str | None) -> str | None:
    """A `file.py:fn` spec the runners can resolve: absolute, or relative to `working_dir`."""
    if spec is None or ":" not in spec:
        return spec
    target, _, attr = spec.rpartition(":")
    if not (target.endswith(".py") or "/" in target):
        return spec  # `package.module:fn` imports the same everywhere
    path = Path(target).expanduser().resolve()
    if working_dir is not None:
        root = Path(working_dir).expanduser().resolve()
        if path.is_relative_to(root):
            return f"{path.relative_to(root)}:{attr}"
    return f"{path}:{attr}"


class RayRuntime:
    """Joins (or starts) the cluster and checks it can hold the run, before any work.

    Example:
        >>> runtime = RayRuntime(config)  # doctest: +SKIP
        >>> pool = await runtime.episode_runner(config, model, port)  # doctest: +SKIP
        >>> runtime.close()  # doctest: +SKIP
    """

    def __init__(self, config: RunConfig) -> None:
        import ray

        self.config = config.runtime
        self.cluster = RayCluster.connect(self.config)
        try:
            gpus = ray.cluster_resources().get("GPU", 0.0)
            self.cluster.check(resource_needs(self.config, config.trainer, config.engine, gpus))
            self._replica_nodes = self.cluster.node_ids(self.config.replica_nodes)
        except RayClusterError:
            self.cluster.close()
            raise
        self._replica_gpus = replica_gpus(self.config, config.engine, gpus)
        self._hosts_replicas = hosts_replicas(config.engine)
        self._hosts: Any = None
        self._placement: WeightPlacement | None = None

    def host_engine(self, engine: Any) -> None:
        """Have a vLLM engine start its replicas under host actors on the cluster (call before
        `engine.start()`); other engines stay in this process."""
        if not self._hosts_replicas or not getattr(engine, "manages_servers", False):
            return
        from agentscope_rft.runtime.ray.engines import RayReplicaHosts

        self._hosts = RayReplicaHosts(
            cpus=self.config.replica_cpus,
            gpus=self._replica_gpus,
            nodes=self._replica_nodes,
            runtime_env={"env_vars": {"PYTHONPATH": self._python_path()}},
        )
        engine.replica_hosts = self._hosts

    @staticmethod
    def _python_path() -> str:
        paths = [PACKAGE_ROOT, os.getcwd(), os.environ.get("PYTHONPATH", "")]
        return os.pathsep.join(p for p in paths if p)

    def _runtime_env(self) -> dict[str, Any]:
        env = {
            "PYTHONPATH": self._python_path(),
            "TOKENIZERS_PARALLELISM": "false",
            **self.config.env,
        }
        runtime_env: dict[str, Any] = {"env_vars": env}
        if self.config.working_dir is not None:
            runtime_env["working_dir"] = self.config.working_dir
        return runtime_env

    async def episode_runner(
        self, config: RunConfig, model: ModelSettings, gateway_port: int
    ) -> RayRunnerPool:
        """Start the runner pool that runs `config.workflow` against the gateway."""
        working_dir = self.config.working_dir
        spec = RunnerSpec(
            workflow=portable_spec(config.workflow, working_dir) or "",
            judge=portable_spec(config.judge, working_dir),
            model=model,
            cwd=None if working_dir else os.getcwd(),
            sys_path=[] if working_dir else [os.getcwd()],
        )
        url = self.cluster.gateway_url(config.gateway.host, gateway_port)
        pool = RayRunnerPool(spec, self.config, url, runtime_env=self._runtime_env())
        await pool.start()
        return pool

    async def place_weights(self, engine: Any, run_dir: Path) -> None:
        """Route new weights to the engine's replicas on the cluster's nodes (shared filesystem or
        object store); one log line says which."""
        import ray

        replicas = getattr(engine, "replicas", None)
        if not replicas:
            logger.info(
                "weights: the %s runs in this process; new weights are copied in memory",
                type(engine).__name__,
            )
            return
        here = ray.util.get_node_ip_address()
        nodes = self.cluster.nodes()
        placed: dict[str, str] = {}
        hosted = self._hosts.node_ids if self._hosts is not None else {}
        for url in (replica.server.url for replica in replicas):
            node = hosted.get(url) or node_of(url, nodes, here)
            if node is None:
                logger.warning(
                    "weights: vLLM replica %s is on no node of the Ray cluster: it must see this "
                    "run's weight folders on a shared filesystem",
                    url,
                )
            else:
                placed[url] = node
        if placed:
            probe_dir = getattr(engine, "weights_dir", None) or run_dir
            self._placement = WeightPlacement(placed, self.config.weights, Path(probe_dir))
            await self._placement.start()
            engine.weight_paths = self._placement.paths

    def close(self) -> None:
        if self._placement is not None:
            self._placement.close()
        if self._hosts is not None:
            self._hosts.close()
        self.cluster.close()
