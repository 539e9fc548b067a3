"""The weights the vLLM engine's replicas serve, and syncing new ones to them.

`ServedWeights.sync` is the building block: close the gate for new calls, drain or freeze the
calls in flight, pause the servers, apply, reset prefix caches, resume and set the version. A
full reload writes a state dict as safetensors (or takes a checkpoint folder) and has every
replica reload it (`/collective_rpc reload_weights`); a LoRA adapter is loaded by name
(`<model_name>-lora-v<version>`) without pausing. A replica restarted by its supervisor gets the
current weights and adapters again (`reapply`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentscope_rft.engines import vllm_wire as wire
from agentscope_rft.engines.base import EngineError
from agentscope_rft.engines.vllm_replicas import ReplicaPool, SyncMode
from agentscope_rft.engines.vllm_server import VLLMServer

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

WeightPaths = Callable[[Path, int], Awaitable[Mapping[str, Path]]]
"""Where each replica (by URL) reads a weights folder of a version."""


def save_weights(weights: Mapping[str, torch.Tensor], folder: Path) -> None:
    """Write a state dict as `folder/model.safetensors`, the layout the servers reload from.

    Tied weights (one storage under two names) are copied: safetensors refuses shared storage.

    Example:
        >>> save_weights(model.state_dict(), Path("weights-v3"))  # doctest: +SKIP
    """
    from safetensors.torch import save_file

    tensors: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for name, tensor in weights.items():
        tensor = tensor.detach().to("cpu").contiguous()
        if tensor.data_ptr() in seen:
            tensor = tensor.clone()
        seen.add(tensor.data_ptr())
        tensors[name] = tensor
    save_file(tensors, str(folder / "model.safetensors"))


class ServedWeights:
    """The policy version and model name calls use, and the syncs that change them.

    Example:
        >>> weights = ServedWeights(ReplicaPool(), "my-model", max_loras=2)
        >>> weights.version, weights.active_model
        (0, 'my-model')
    """

    def __init__(self, pool: ReplicaPool, model_name: str, *, max_loras: int) -> None:
        self.pool = pool
        self.model_name = model_name
        self.max_loras = max_loras
        self.version = 0
        self.active_model = model_name
        """The model name calls are sent with: the base model, or the latest LoRA adapter."""
        self.sync_seconds: list[float] = []
        """Seconds of every weight sync (reload or LoRA), pause included, in order."""
        self.weights_path: Path | None = None
        self.replica_weights: dict[str, Path] = {}  # replica URL -> its copy of the weights
        self._owned: list[Path] = []
        self._loras: list[tuple[str, dict[str, Path]]] = []  # name, replica URL -> its folder

    async def sync(
        self,
        version: int,
        apply: Callable[[], Awaitable[None]],
        sync_mode: SyncMode,
        *,
        pause_servers: bool = True,
    ) -> float:
        """Gate new calls, drain or freeze calls in flight (`sync_mode`), pause the servers,
        `await apply()`, reset prefix caches, resume, set `version`; the seconds it took."""
        started = time.perf_counter()
        async with self.pool.paused(sync_mode, pause_servers=pause_servers):
            await apply()
            self.version = version
        elapsed = time.perf_counter() - started
        self.sync_seconds.append(elapsed)
        return elapsed

    async def load_full(
        self,
        weights: Mapping[str, torch.Tensor] | Path,
        version: int,
        sync_mode: SyncMode,
        *,
        root: Path | None,
        weight_paths: WeightPaths | None,
    ) -> float:
        """Reload full weights (a state dict, written under `root`, or a checkpoint folder) on
        every replica as `version`; the seconds it took, the writing included."""
        started = time.perf_counter()
        folder = await asyncio.to_thread(self._folder, weights, version, root)
        # Replicas on other machines may read a copy of the folder (see runtime/ray/weights.py).
        paths = await weight_paths(folder, version) if weight_paths else {}
        pool = self.pool
        where = {r.server.url: paths.get(r.server.url, folder) for r in pool.replicas}

        async def reload() -> None:
            await asyncio.gather(
                *(
                    pool.post(
                        replica,
                        "/collective_rpc",
                        {
                            "method": "reload_weights",
                            "kwargs": {"weights_path": str(where[replica.server.url])},
                        },
                    )
                    for replica in pool.replicas
                )
            )
            self.weights_path = folder
            self.replica_weights = where
            self.active_model = self.model_name  # full weights replace any adapter

        await self.sync(version, reload, sync_mode)
        self.drop_old(keep=folder)
        elapsed = time.perf_counter() - started
        self.sync_seconds[-1] = elapsed
        logger.info("vLLM weights v%d loaded from %s in %.2f s", version, folder, elapsed)
        return elapsed

    def _folder(
        self, weights: Mapping[str, torch.Tensor] | Path, version: int, root: Path | None
    ) -> Path:
        if isinstance(weights, Path):
            if not any(weights.glob("*.safetensors")):
                raise EngineError(f"no *.safetensors files in {weights}", status=404)
            return weights.resolve()
        assert root is not None, "the engine is not started"
        folder = Path(tempfile.mkdtemp(prefix=f"weights-v{version}-", dir=root))
        save_weights(weights, folder)
        self._owned.append(folder)
        return folder

    def drop_old(self, keep: Path | None) -> None:
        """Delete the folders of written state dicts, but `keep`."""
        for folder in [f for f in self._owned if f != keep]:
            shutil.rmtree(folder, ignore_errors=True)
            self._owned.remove(folder)

    async def load_lora(
        self,
        adapter: Path,
        version: int,
        sync_mode: SyncMode,
        *,
        weight_paths: WeightPaths | None,
    ) -> float:
        """Load a LoRA adapter folder as `version`, served as `<model_name>-lora-v<version>`;
        the seconds it took."""
        name = f"{self.model_name}-lora-v{version}"
        path = adapter.resolve()
        # Replicas on other machines may read a copy of the folder (see runtime/ray/weights.py).
        paths = await weight_paths(path, version) if weight_paths else {}
        pool = self.pool
        where = {r.server.url: paths.get(r.server.url, path) for r in pool.replicas}

        async def load() -> None:
            await asyncio.gather(
                *(
                    pool.post(
                        r,
                        "/v1/load_lora_adapter",
                        {"lora_name": name, "lora_path": str(where[r.server.url])},
                    )
                    for r in pool.replicas
                )
            )
            self._loras.append((name, where))
            self.active_model = name

        # No server pause: calls in flight keep their adapter; the gate orders the switch.
        elapsed = await self.sync(version, load, sync_mode, pause_servers=False)
        for old, _ in self._loras[: -self.max_loras]:
            with contextlib.suppress(EngineError):
                await pool.on_all("/v1/unload_lora_adapter", {"lora_name": old})
        del self._loras[: -self.max_loras]
        logger.info("vLLM LoRA adapter %s loaded from %s in %.2f s", name, adapter, elapsed)
        return elapsed

    async def reapply(self, server: VLLMServer) -> None:
        """After a restart the server has the base weights: load the current ones again."""
        replica = next(r for r in self.pool.replicas if r.server is server)

        async def post(path: str, body: Any) -> None:
            response = await replica.http.post(path, json=body)
            if response.status_code >= 400:
                raise wire.api_error(response, server.describe())

        if self.weights_path is not None:
            path = self.replica_weights.get(server.url, self.weights_path)
            await post(
                "/collective_rpc",
                {"method": "reload_weights", "kwargs": {"weights_path": str(path)}},
            )
        for name, paths in self._loras:
            lora_path = str(paths[server.url])
            await post("/v1/load_lora_adapter", {"lora_name": name, "lora_path": lora_path})
        logger.info("%s restarted with policy version %d", server.describe(), self.version)
