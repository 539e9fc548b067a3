"""The vLLM engine's replicas: routing calls to them, and the gate a weight sync closes.

Each rollout sticks to one replica (a stable hash of its id) so its prefix cache is reused;
calls without a rollout go to the least busy replica. A weight sync closes the gate for new
calls and drains the calls in flight (`sync_mode="wait"`) or freezes them (`"keep"`) while the
servers are paused.
"""

from __future__ import annotations

import asyncio
import contextlib
import zlib
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, Literal

import httpx

from agentscope_rft.engines import vllm_wire as wire
from agentscope_rft.engines.base import EngineError
from agentscope_rft.engines.vllm_server import VLLMServer, VLLMServerError

SyncMode = Literal["wait", "keep"]


class Replica:
    """One server and the HTTP client that calls it."""

    def __init__(self, server: VLLMServer, request_timeout: float) -> None:
        self.server = server
        self.in_flight = 0
        self.http = httpx.AsyncClient(
            base_url=server.url, timeout=httpx.Timeout(request_timeout, connect=10.0)
        )


class ReplicaPool:
    """The engine's replicas (none until started), the calls in flight and the sync gate.

    Example:
        >>> pool = ReplicaPool()
        >>> pool.replicas = [Replica(VLLMServer("r0", url="http://127.0.0.1:8000"), 60.0)]
        >>> pool.pick("rollout-1") is pool.replicas[0]
        True
    """

    def __init__(self) -> None:
        self.replicas: list[Replica] = []
        self._max_model_len = 0  # the served model's, once discovered
        self.in_flight = 0
        self.reloads = 0  # full-weight reloads: a call in flight across one is mixed-policy
        self.mixed_policy_calls = 0
        """Calls in flight across a full-weight reload in `keep` mode: sampled partly by the old
        weights and partly by the new ones (recorded with the version they were admitted under)."""
        self._gate = asyncio.Event()
        self._gate.set()
        self._idle = asyncio.Event()
        self._idle.set()
        self._sync_lock = asyncio.Lock()

    @property
    def max_model_len(self) -> int:
        if not self.replicas:
            raise EngineError("the engine is not started (await engine.start())", status=503)
        return self._max_model_len

    def pick(self, rollout_id: str | None) -> Replica:
        """The replica of `rollout_id` (by a stable hash), or the least busy one."""
        if not self.replicas:
            raise EngineError("the engine is not started (await engine.start())", status=503)
        if rollout_id is not None:
            return self.replicas[zlib.crc32(rollout_id.encode()) % len(self.replicas)]
        return min(self.replicas, key=lambda r: r.in_flight)

    @contextlib.asynccontextmanager
    async def admitted(self, replica: Replica) -> AsyncIterator[None]:
        """Admit one call past the sync gate (read the policy version inside, at once).

        The version is the one current at admission: in `keep` mode a call that a reload
        interrupts records it although its later tokens come from the new weights (its log-probs
        are those of the weights that sampled each token); `mixed_policy_calls` counts them.
        """
        while not self._gate.is_set():
            await self._gate.wait()
        self.in_flight += 1
        replica.in_flight += 1
        self._idle.clear()
        reloads = self.reloads
        try:
            yield
        finally:
            if self.reloads != reloads:  # only possible in keep mode: wait mode drains first
                self.mixed_policy_calls += 1
            self.in_flight -= 1
            replica.in_flight -= 1
            if self.in_flight == 0:
                self._idle.set()

    @contextlib.asynccontextmanager
    async def paused(self, sync_mode: SyncMode, *, pause_servers: bool) -> AsyncIterator[None]:
        """Hold new calls at the gate; drain (wait) or freeze (keep) the ones in flight. With
        `pause_servers` the full weights change inside: the servers pause, and after it reset
        their prefix caches and resume."""
        async with self._sync_lock:
            self._gate.clear()
            try:
                if sync_mode == "wait":
                    await self._idle.wait()
                if pause_servers:
                    await self.on_all("/pause", params={"mode": sync_mode})
                    self.reloads += 1  # full weights change under any call frozen in flight
                try:
                    yield
                finally:
                    if pause_servers:
                        await self.on_all(
                            "/reset_prefix_cache",
                            # Frozen calls are preempted and recompute their KV on the new weights.
                            params={"reset_running_requests": str(sync_mode == "keep").lower()},
                        )
                        await self.on_all("/resume")
            finally:
                self._gate.set()

    async def post(
        self,
        replica: Replica,
        path: str,
        body: Any = None,
        params: Mapping[str, str] | None = None,
    ) -> Any:
        await replica.server.ready()
        try:
            response = await replica.http.post(path, json=body, params=params)
        except httpx.TransportError as exc:
            timeout = replica.http.timeout.read
            raise await replica.server.request_failed(exc, timeout) from exc
        if response.status_code >= 400:
            raise wire.api_error(response, replica.server.describe())
        if "json" not in response.headers.get("content-type", ""):
            return response.text  # e.g. /v1/load_lora_adapter answers in plain text
        return response.json()

    async def on_all(
        self, path: str, body: Any = None, params: Mapping[str, str] | None = None
    ) -> list[Any]:
        return list(
            await asyncio.gather(*(self.post(r, path, body, params) for r in self.replicas))
        )

    async def discover_max_model_len(self, model_name: str) -> None:
        """Read `max_model_len` from the first replica, which must serve `model_name`."""
        replica = self.replicas[0]
        response = await replica.http.get("/v1/models")
        if response.status_code != 200:
            raise wire.api_error(response, replica.server.describe())
        served = {m["id"]: m for m in response.json().get("data", [])}
        if model_name not in served:
            raise VLLMServerError(
                f"{replica.server.describe()} does not serve {model_name!r} (it serves "
                f"{sorted(served)}): the engine asks for model.name_or_path; start that server "
                f"with --served-model-name {model_name} (with the same weights), or fix "
                "engine.urls"
            )
        self._max_model_len = int(served[model_name].get("max_model_len") or 0)

    def failures(self) -> Sequence[str]:
        """Why each replica gone for good (crashed past its restarts) is gone."""
        return [r.server.failure for r in self.replicas if r.server.failure is not None]

    async def close(self) -> None:
        """Stop the servers (managed ones end) and close the clients."""
        replicas, self.replicas = self.replicas, []
        for replica in replicas:
            await replica.server.stop()
            await replica.http.aclose()
