"""Running the gateway: in-process on the caller's event loop, or standalone (`serve`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Iterator

import uvicorn

from agentscope_rft.engines.base import Engine
from agentscope_rft.gateway.app import GatewayState, create_app
from agentscope_rft.gateway.recorder import CallRecorder
from agentscope_rft.types import JSON

logger = logging.getLogger(__name__)


class _EmbeddedServer(uvicorn.Server):
    """A uvicorn server that leaves signal handling to the host program."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class Gateway:
    """The trainable endpoint: an engine behind an OpenAI-compatible HTTP server on loopback.

    Example:
        >>> gateway = Gateway(engine)  # doctest: +SKIP
        >>> await gateway.start()  # doctest: +SKIP
        >>> gateway.rollout_base_url("r1")  # doctest: +SKIP
        'http://127.0.0.1:40123/rollouts/r1/v1'
    """

    def __init__(
        self,
        engine: Engine,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        api_key: str | None = None,
        generate_api_key: bool = False,
        recorder: CallRecorder | None = None,
        model_aliases: set[str] | None = None,
        sampling_defaults: JSON | None = None,
        sampling_overrides: dict[str, JSON] | None = None,
        seed_base: int | None = None,
        log_level: str = "warning",
    ) -> None:
        self.engine = engine
        self.recorder = recorder or CallRecorder()
        self.api_key = api_key or (secrets.token_urlsafe(24) if generate_api_key else None)
        self.state = GatewayState(
            engine=engine,
            recorder=self.recorder,
            api_key=self.api_key,
            model_aliases=model_aliases or set(),
            sampling_defaults=sampling_defaults or {},
            sampling_overrides=sampling_overrides or {},
            seed_base=seed_base,
        )
        self.app = create_app(self.state)
        self._host = host
        self._port = port
        self._log_level = log_level
        self._server: _EmbeddedServer | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def port(self) -> int:
        return self._port

    @property
    def base_url(self) -> str:
        """The OpenAI base URL for unattributed calls."""
        return f"http://{self._host}:{self._port}/v1"

    def rollout_base_url(self, rollout_id: str) -> str:
        """The OpenAI base URL whose calls are recorded under `rollout_id`."""
        return f"http://{self._host}:{self._port}/rollouts/{rollout_id}/v1"

    async def abort_rollout(self, rollout_id: str) -> int:
        """Stop generating for a rollout's requests in flight (e.g. its episode timed out)."""
        aborted = self.state.abort_rollout(rollout_id)
        if aborted:
            await asyncio.sleep(0)  # let the cancelled handlers unwind
        return aborted

    async def start(self) -> None:
        """Start serving on the running event loop (binds 127.0.0.1 by default)."""
        if self._server is not None:
            return
        if self._host not in ("127.0.0.1", "localhost", "::1") and self.api_key is None:
            logger.warning(
                "the gateway listens on %s without an API key; anyone who can reach it can "
                "use the policy",
                self._host,
            )
        config = uvicorn.Config(
            self.app,
            host=self._host,
            port=self._port,
            log_level=self._log_level,
            access_log=False,
            lifespan="off",
            timeout_keep_alive=30,
        )
        self._server = _EmbeddedServer(config)
        self._task = asyncio.create_task(self._server.serve(), name="gateway")
        while not self._server.started:
            if self._task.done():
                self._task.result()  # re-raises the start-up error (e.g. port in use)
                raise RuntimeError("the gateway stopped during start-up")
            await asyncio.sleep(0.01)
        sockets = [s for server in self._server.servers for s in server.sockets]
        self._port = sockets[0].getsockname()[1]
        logger.info("gateway listening on http://%s:%d", self._host, self._port)

    async def stop(self) -> None:
        if self._server is None or self._task is None:
            return
        self._server.should_exit = True
        try:
            await asyncio.wait_for(self._task, timeout=10)
        except TimeoutError:
            self._server.force_exit = True
            await self._task
        self._server = None
        self._task = None

    async def __aenter__(self) -> Gateway:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
