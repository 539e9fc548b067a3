"""Running the gateway: in-process on the caller's event loop, or standalone (`serve`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import socket
import time
from collections.abc import Iterator

import uvicorn

from agentscope_rft.engines.base import Engine
from agentscope_rft.gateway.app import GatewayState, RolloutClosure, close_rollout, create_app
from agentscope_rft.gateway.protocol import RequestError
from agentscope_rft.gateway.recorder import CallRecorder
from agentscope_rft.gateway.runtime_state import RUNTIME_STATE_MODES
from agentscope_rft.types import JSON

logger = logging.getLogger(__name__)

STOP_TIMEOUT = 5.0
"""Seconds `Gateway.stop` waits for connections to close before forcing the server down."""


class _EmbeddedServer(uvicorn.Server):
    """A uvicorn server that leaves signal handling to the host program."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        # uvicorn calls sys.exit when it cannot bind; a SystemExit escaping a task stops the
        # event loop with a traceback, so it becomes the OSError behind it.
        try:
            await super().serve(sockets)
        except SystemExit as exc:
            cause = exc.__context__
            raise OSError(str(cause) if cause else f"the server exited ({exc.code})") from cause


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
        max_tokens_limit: int | None = None,
        runtime_state: str = "keep",
        log_level: str = "warning",
    ) -> None:
        if runtime_state not in RUNTIME_STATE_MODES:
            raise ValueError(
                f"runtime_state must be one of {', '.join(RUNTIME_STATE_MODES)}, got "
                f"{runtime_state!r}"
            )
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
            max_tokens_limit=max_tokens_limit,
            runtime_state=runtime_state,
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

    async def close_rollout(
        self, rollout_id: str, *, reason: str = "closed", grace: float = 0.0
    ) -> RolloutClosure:
        """End a rollout: its calls in flight get `grace` s, then are aborted at the engine; new
        calls under its id are refused (410). Also `POST /rollouts/{id}/close` over HTTP.

        Example:
            >>> closure = await gateway.close_rollout("r1", reason="timeout")  # doctest: +SKIP
        """
        return await close_rollout(self.state, rollout_id, reason=reason, grace=grace)

    def reopen_rollout(self, rollout_id: str) -> None:
        """Accept calls under `rollout_id` again (a new episode reusing a closed id)."""
        self.state.reopen_rollout(rollout_id)

    def restart_call_numbers(self) -> None:
        """Derive the seeds of replayed rollout ids as a fresh gateway would (a rollback)."""
        self.state.recorder.restart_call_numbers()

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
            timeout_graceful_shutdown=max(1, int(STOP_TIMEOUT) - 1),
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

    async def stop(self, timeout: float = STOP_TIMEOUT) -> float:
        """Stop serving within about `timeout` s; never raises. Returns the seconds it took.

        Requests in flight are aborted first (their clients get a 503), so connections close
        promptly; a server that still has not exited is forced, then cancelled.
        """
        server, task = self._server, self._task
        if server is None or task is None:
            return 0.0
        self._server = self._task = None
        started = time.perf_counter()
        self.state.abort_all(
            RequestError("the gateway is shutting down", status=503, code="shutting_down")
        )
        server.should_exit = True
        try:
            done, _ = await asyncio.wait({task}, timeout=timeout)
            if not done:
                logger.warning("the gateway did not stop within %.0fs; forcing it", timeout)
                server.force_exit = True
                done, _ = await asyncio.wait({task}, timeout=1.0)
            if not done:
                task.cancel()
                await asyncio.wait({task}, timeout=1.0)
        except asyncio.CancelledError:  # our caller is cancelled: still do not leave it running
            server.force_exit = True
            task.cancel()
            raise
        if task.done() and not task.cancelled() and task.exception() is not None:
            logger.warning("the gateway server ended with an error: %r", task.exception())
        return time.perf_counter() - started

    async def __aenter__(self) -> Gateway:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
