"""A two-node Ray cluster on loopback for the runtime tests, stopped (no orphan raylet) after."""

from __future__ import annotations

import os

import psutil
import pytest

ray = pytest.importorskip("ray")


def _raylets() -> set[int]:
    found = set()
    for proc in psutil.process_iter(["name", "cmdline"]):
        try:
            if "raylet" in (proc.info["name"] or "") or any(
                "raylet" in part for part in (proc.info["cmdline"] or [])[:1]
            ):
                found.add(proc.pid)
        except psutil.Error:
            continue
    return found


@pytest.fixture(scope="package")
def ray_cluster():
    """Head + one worker node (one CPU each), both on this machine; yields the GCS address."""
    from ray.cluster_utils import Cluster

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # Ray kills workers when the node is above 95% memory; on a shared CI box that is other
    # jobs' memory, and it would turn into extra runner deaths the tests do not expect.
    os.environ.setdefault("RAY_memory_monitor_refresh_ms", "0")
    # Like `ray start --head` on a machine that has a token (Ray 2.60 writes ~/.ray/auth_token for
    # the first local cluster): token auth on. A process that started its own local cluster has
    # token mode switched on for good, so it could not use a cluster without auth afterwards.
    from ray._private.authentication.authentication_token_setup import (
        enable_token_auth_by_default,
        ensure_token_if_auth_enabled,
    )

    enable_token_auth_by_default()  # RAY_AUTH_MODE=token unless it is set
    ensure_token_if_auth_enabled(create_token_if_missing=True)
    before = _raylets()
    cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False}
    )
    cluster.add_node(num_cpus=1)
    started = _raylets() - before
    try:
        yield cluster.address
    finally:
        if ray.is_initialized():
            ray.shutdown()
        cluster.shutdown()
        left = {pid for pid in started if psutil.pid_exists(pid)}
        left = {p for p in left if psutil.Process(p).status() != psutil.STATUS_ZOMBIE}
        assert not left, f"raylets left running after the cluster stopped: {left}"


@pytest.fixture
def ray_driver(ray_cluster):
    """This process connected to the test cluster as a driver (disconnected after)."""
    ray.init(address=ray_cluster, log_to_driver=False)
    yield ray_cluster
    ray.shutdown()
