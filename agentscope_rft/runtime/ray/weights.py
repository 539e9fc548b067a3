"""New weights for engine replicas on other machines: shared filesystem or Ray's object store.

A vLLM replica reloads weights from a folder path on its own machine. When that machine sees the
folder the trainer's side wrote (a shared filesystem: NFS, a cluster volume), the path is passed
as is. When it does not, the folder's files travel through Ray's object store (put once, pulled
by every node that needs them) to a stager actor pinned to that node, which writes a node-local
copy whose path is passed instead. `runtime.weights: auto` probes every engine node once at start
(a token file written here, read there) and says what it found in one log line.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import shutil
import socket
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from agentscope_rft.runtime.processes import alive

logger = logging.getLogger(__name__)

Route = Literal["shared_fs", "object_store"]
KEEP_VERSIONS = 2
STAGING_PREFIX = "agentscope-rft-weights-"


def remove_stale_staging(parent: Path) -> list[Path]:
    """Remove the staging folders of stagers whose process is gone (killed before `close`).

    A stager's folder is named after its process id; folders of live processes are kept.
    """
    removed = []
    for folder in parent.glob(f"{STAGING_PREFIX}*-*"):
        pid = folder.name[len(STAGING_PREFIX) :].split("-", 1)[0]
        if not pid.isdigit() or alive(int(pid)):
            continue
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(folder)
    return removed


class WeightStager:
    """One per engine node (a Ray actor pinned there): sees shared paths, writes local copies.

    Each copy is a model's size, so the stager removes its folder on `close`, and on start the
    folders of stagers killed before theirs (a crashed run would otherwise fill the disk).
    """

    def __init__(self, root: str | None = None) -> None:
        if root is None:
            parent = Path(tempfile.gettempdir())
            for folder in remove_stale_staging(parent):
                logger.info("weights: removed %s, left by a stager that is gone", folder)
            root = tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}{os.getpid()}-", dir=parent)
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def close(self) -> None:
        """Remove every local copy this stager wrote."""
        shutil.rmtree(self.root, ignore_errors=True)

    def sees(self, path: str, token: str) -> bool:
        """Whether `path` exists here with `token` in it (a shared filesystem)."""
        try:
            return Path(path).read_text() == token
        except OSError:
            return False

    def write(self, version: int, files: Mapping[str, bytes]) -> str:
        """Write one weights version into a node-local folder; returns its path."""
        folder = self.root / f"v{version:06d}"
        partial = self.root / f".v{version:06d}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir()
        for name, data in files.items():
            (partial / name).write_bytes(data)
        shutil.rmtree(folder, ignore_errors=True)
        partial.rename(folder)
        for old in sorted(self.root.glob("v*"))[:-KEEP_VERSIONS]:
            shutil.rmtree(old, ignore_errors=True)
        return str(folder)


def node_of(url: str, nodes: Sequence[Mapping[str, Any]], here: str) -> str | None:
    """The Ray node id whose address serves `url` (loopback: this process's node); None: the
    server runs outside the cluster."""
    host = urlsplit(url).hostname or "127.0.0.1"
    try:
        address = socket.gethostbyname(host)
    except OSError:
        return None
    if address.startswith("127.") or host == "localhost":
        address = here
    for node in nodes:
        if node.get("Alive") and node.get("NodeManagerAddress") == address:
            return str(node["NodeID"])
    return None


class WeightPlacement:
    """Routes each weights folder to every engine replica by shared path or object store.

    Example:
        >>> replicas = {"http://10.0.0.7:8000": node_id}  # doctest: +SKIP
        >>> placement = WeightPlacement(replicas, "auto", weights_dir)  # doctest: +SKIP
        >>> await placement.start()  # logs which route each node takes  # doctest: +SKIP
        >>> paths = await placement.paths(Path("weights-v3"), 3)  # doctest: +SKIP
    """

    def __init__(self, replica_nodes: Mapping[str, str], mode: str, probe_dir: Path) -> None:
        self.replica_nodes = dict(replica_nodes)
        self.mode = mode
        self.probe_dir = probe_dir
        self.routes: dict[str, Route] = {}
        self._stagers: dict[str, Any] = {}

    async def start(self) -> None:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        stager_class = ray.remote(WeightStager)
        for node in sorted(set(self.replica_nodes.values())):
            self._stagers[node] = stager_class.options(
                num_cpus=0,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node, soft=False),
            ).remote()
        token = secrets.token_hex(16)
        self.probe_dir.mkdir(parents=True, exist_ok=True)
        probe = self.probe_dir / f".shared-fs-probe-{token[:8]}"
        probe.write_text(token)
        try:
            for node, stager in self._stagers.items():
                if self.mode in ("shared_fs", "object_store"):
                    self.routes[node] = self.mode  # type: ignore[assignment]
                else:
                    sees = await stager.sees.remote(str(probe), token)
                    self.routes[node] = "shared_fs" if sees else "object_store"
        finally:
            probe.unlink(missing_ok=True)
        by_route = {
            r: [n[:8] for n, v in self.routes.items() if v == r] for r in set(self.routes.values())
        }
        logger.info(
            "weights: engine replicas on %d node(s) get new weights through %s",
            len(self._stagers),
            "; ".join(
                f"{'the shared filesystem' if r == 'shared_fs' else 'Ray object store'} "
                f"(nodes {', '.join(nodes)})"
                for r, nodes in sorted(by_route.items())
            )
            + f" (runtime.weights: {self.mode})",
        )

    async def paths(self, folder: Path, version: int) -> dict[str, Path]:
        """Each replica URL -> the path of `folder`'s weights on that replica's machine."""
        import ray

        local: dict[str, Path] = {}
        staged_nodes = [n for n, r in self.routes.items() if r == "object_store"]
        if staged_nodes:
            files = await asyncio.to_thread(
                lambda: {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}
            )
            ref = ray.put(files)
            written = await asyncio.gather(
                *(self._stagers[n].write.remote(version, ref) for n in staged_nodes)
            )
            local = {n: Path(p) for n, p in zip(staged_nodes, written, strict=True)}
        return {url: local.get(node, folder) for url, node in self.replica_nodes.items()}

    def close(self) -> None:
        import ray

        try:  # the local copies go first: a killed actor cannot remove them
            ray.get([stager.close.remote() for stager in self._stagers.values()], timeout=60)
        except Exception:
            logger.warning("weights: a stager did not remove its local copies", exc_info=True)
        for stager in self._stagers.values():
            try:
                ray.kill(stager)
            except Exception:
                logger.debug("weights stager already gone")
        self._stagers.clear()
