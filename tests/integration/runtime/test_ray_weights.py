"""Weights for engine replicas on other nodes: shared filesystem probe, object-store copies."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest

from agentscope_rft.runtime.ray.weights import (
    KEEP_VERSIONS,
    STAGING_PREFIX,
    WeightPlacement,
    node_of,
    remove_stale_staging,
)

ray = pytest.importorskip("ray")


def weights_folder(tmp_path, version: int):
    folder = tmp_path / f"weights-v{version}"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(bytes([version]) * 4096)
    (folder / "config.json").write_text(f'{{"v": {version}}}')
    return folder


def two_replicas() -> dict[str, str]:
    nodes = sorted(n["NodeID"] for n in ray.nodes() if n["Alive"])
    assert len(nodes) == 2
    return {"http://replica-a:8000": nodes[0], "http://replica-b:8000": nodes[1]}


@pytest.mark.slow
async def test_auto_finds_the_shared_filesystem_and_passes_the_folder(ray_driver, tmp_path, caplog):
    placement = WeightPlacement(two_replicas(), "auto", tmp_path)
    with caplog.at_level(logging.INFO, logger="agentscope_rft.runtime.ray.weights"):
        await placement.start()
    try:
        assert set(placement.routes.values()) == {"shared_fs"}  # both nodes are this machine
        [line] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("weights:")]
        assert "2 node(s)" in line and "shared filesystem" in line
        assert not list(tmp_path.glob(".shared-fs-probe-*"))  # the probe file is removed
        folder = weights_folder(tmp_path, 1)
        assert set((await placement.paths(folder, 1)).values()) == {folder}
    finally:
        placement.close()


@pytest.mark.slow
async def test_object_store_gives_every_node_its_own_copy(ray_driver, tmp_path, caplog):
    replicas = two_replicas()
    placement = WeightPlacement(replicas, "object_store", tmp_path)
    with caplog.at_level(logging.INFO, logger="agentscope_rft.runtime.ray.weights"):
        await placement.start()
    try:
        assert any("Ray object store" in r.getMessage() for r in caplog.records)
        seen = []
        for version in range(1, KEEP_VERSIONS + 2):
            folder = weights_folder(tmp_path, version)
            paths = await placement.paths(folder, version)
            assert set(paths) == set(replicas)
            assert len(set(paths.values())) == 2 and folder not in paths.values()
            for path in paths.values():
                assert (path / "model.safetensors").read_bytes() == bytes([version]) * 4096
                assert (path / "config.json").read_text() == f'{{"v": {version}}}'
            seen.append(paths)
        # Old versions are pruned on every node; the newest stay.
        assert all(not p.exists() for p in seen[0].values())
        assert all(p.exists() for p in seen[-1].values())
    finally:
        placement.close()
    # Closing removes every node's local copies (each is a model's size).
    assert all(not p.parent.exists() for paths in seen for p in paths.values())


def test_a_replica_url_maps_to_the_ray_node_at_its_address():
    nodes = [
        {"NodeID": "head", "NodeManagerAddress": "10.0.0.1", "Alive": True},
        {"NodeID": "gpu1", "NodeManagerAddress": "10.0.0.7", "Alive": True},
        {"NodeID": "gone", "NodeManagerAddress": "10.0.0.9", "Alive": False},
    ]
    assert node_of("http://10.0.0.7:8000", nodes, here="10.0.0.1") == "gpu1"
    assert node_of("http://127.0.0.1:8000", nodes, here="10.0.0.1") == "head"
    assert node_of("http://localhost:8000/v1", nodes, here="10.0.0.1") == "head"
    assert node_of("http://10.0.0.9:8000", nodes, here="10.0.0.1") is None  # dead node
    assert node_of("http://10.0.0.8:8000", nodes, here="10.0.0.1") is None  # outside the cluster


def test_staging_folders_of_dead_processes_are_removed_and_live_ones_kept(tmp_path):
    exited = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    dead = tmp_path / f"{STAGING_PREFIX}{int(exited.stdout)}-abc"
    live = tmp_path / f"{STAGING_PREFIX}{os.getpid()}-def"
    unrelated = tmp_path / f"{STAGING_PREFIX}notapid"
    for folder in (dead, live, unrelated):
        (folder / "v000001").mkdir(parents=True)
    assert remove_stale_staging(tmp_path) == [dead]
    assert not dead.exists() and live.exists() and unrelated.exists()
