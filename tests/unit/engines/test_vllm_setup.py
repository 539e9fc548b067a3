"""Finding the vLLM interpreter, the server command line and replica choice (no server needed)."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

from agentscope_rft.engines import vllm_env
from agentscope_rft.engines.vllm import VLLMEngine
from agentscope_rft.engines.vllm_replicas import Replica
from agentscope_rft.engines.vllm_server import (
    TAIL_MARKER,
    VLLMServer,
    VLLMServerError,
    first_error,
    log_tail,
)


def test_find_vllm_python_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    configured = tmp_path / "a" / "python"
    from_env = tmp_path / "b" / "python"
    for path in (configured, from_env):
        path.parent.mkdir()
        path.touch()
    monkeypatch.setenv(vllm_env.ENV_VAR, str(from_env))
    assert vllm_env.find_vllm_python(configured) == configured
    assert vllm_env.find_vllm_python() == from_env
    monkeypatch.delenv(vllm_env.ENV_VAR)
    monkeypatch.setattr(vllm_env, "REPO_ROOT", tmp_path / "repo")
    with pytest.raises(vllm_env.VLLMNotFoundError, match=r"repo/\.venv-vllm/bin/python"):
        vllm_env.find_vllm_python()


def test_check_vllm_reports_an_interpreter_without_vllm() -> None:
    ok, reason = vllm_env.check_vllm(sys.executable)
    assert not ok
    assert "cannot import vLLM" in reason
    assert "install_vllm.sh" in reason


def test_server_command_has_the_flags_token_capture_needs(tiny_model_path: str) -> None:
    engine = VLLMEngine(
        tiny_model_path, served_model_name="tiny", enforce_eager=True, max_model_len=512,
        enable_lora=True, max_lora_rank=8, extra_args=["--max-num-seqs", "64"],
    )  # fmt: skip
    command = engine.server_command(Path("/venv/bin/python"), 8123)
    line = " ".join(command)
    assert command[:3] == ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    for flag in (
        "--served-model-name tiny", "--port 8123", "--logprobs-mode processed_logprobs",
        "--generation-config vllm", "--enable-auto-tool-choice", "--tool-call-parser hermes",
        "--max-model-len 512", "--enforce-eager", "--enable-lora", "--max-lora-rank 8",
    ):  # fmt: skip
        assert flag in line
    assert command[-2:] == ["--max-num-seqs", "64"]
    # response_format served as the embedded engine serves it (llguidance, compact JSON)
    at = command.index("--structured-outputs-config")
    assert json.loads(command[at + 1]) == {"backend": "guidance", "disable_any_whitespace": True}
    own = VLLMEngine(
        tiny_model_path, extra_args=["--structured-outputs-config", '{"backend": "xgrammar"}']
    ).server_command(Path("/venv/bin/python"), 8123)
    assert own.count("--structured-outputs-config") == 1
    env = engine.server_env()
    assert env["VLLM_SERVER_DEV_MODE"] == "1"
    assert env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "1"
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "2"


def test_rollouts_stick_to_a_replica_and_spread(tiny_model_path: str) -> None:
    engine = VLLMEngine(tiny_model_path, urls=["http://127.0.0.1:1", "http://127.0.0.1:2"])
    engine.pool.replicas = [
        Replica(VLLMServer(f"r{i}", url=f"http://x{i}"), 10.0) for i in range(2)
    ]
    picks = {f"rollout-{i}": engine.pool.pick(f"rollout-{i}") for i in range(40)}
    assert all(engine.pool.pick(rid) is replica for rid, replica in picks.items())
    assert {id(r) for r in picks.values()} == {id(r) for r in engine.replicas}
    engine.replicas[0].in_flight = 3
    assert engine.pool.pick(None) is engine.replicas[1]  # no rollout: the least busy replica


def test_log_tail_and_first_error(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    lines = [f"line {i}" for i in range(100)]
    lines[10] = "(Worker pid=1) ERROR [x.py:1] RuntimeError: Cannot find any model weights"
    lines[20] = "(APIServer) WARNING [y.py:2] fd limit errors like `OSError: [Errno 24]`"
    log.write_text("\n".join(lines))
    assert log_tail(log, lines=3).splitlines() == ["line 97", "line 98", "line 99"]
    assert first_error(log) == lines[10]
    assert log_tail(tmp_path / "missing.log") == ""


def test_vllm_cpu_serves_whole_prompts_per_step(tiny_model_path: str, tmp_path: Path) -> None:
    # An interpreter with vllm-cpu gets `--no-enable-chunked-prefill` (seeded requests split by
    # chunked prefill kill vllm-cpu 0.32's engine); one without it (a GPU build) keeps chunked
    # prefill, and flags of the user's own that set the split win.
    def interpreter(name: str, has_vllm_cpu: bool) -> Path:
        path = tmp_path / name
        path.write_text(f"#!/bin/sh\nexit {0 if has_vllm_cpu else 1}\n")
        path.chmod(0o755)
        return path

    cpu, gpu = interpreter("cpu-python", True), interpreter("gpu-python", False)

    def command(python: Path, *extra: str) -> list[str]:
        engine = VLLMEngine(tiny_model_path, served_model_name="t", extra_args=list(extra))
        return engine.server_command(python, 8123)

    assert "--no-enable-chunked-prefill" in command(cpu)
    assert "--no-enable-chunked-prefill" not in command(gpu)
    assert "--no-enable-chunked-prefill" not in command(Path(sys.executable))
    own = command(cpu, "--max-num-batched-tokens=512")
    assert "--no-enable-chunked-prefill" not in own and own[-1] == "--max-num-batched-tokens=512"
    assert "--no-enable-chunked-prefill" not in command(cpu, "--enable-chunked-prefill")


def test_first_error_reads_argparse_and_pydantic_reasons(tmp_path: Path) -> None:
    """vLLM rejects a flag with argparse and a value with pydantic (its reason on the next
    lines): the first error says what is wrong either way."""
    log = tmp_path / "vllm.log"
    log.write_text(
        "INFO starting\n [--enable-log-requests | --no-enable-log-requests]\n"
        "api_server.py: error: unrecognized arguments: --no-such-flag\n"
    )
    assert first_error(log) == "api_server.py: error: unrecognized arguments: --no-such-flag"
    log.write_text(
        "Traceback (most recent call last):\n"
        "pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig\n"
        "  Value error, User-specified max_model_len (100000) is greater than the derived "
        "max_model_len [type=value_error]\n"
        "    For further information visit https://errors.pydantic.dev\n"
    )
    assert first_error(log) == (
        "pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig | "
        "Value error, User-specified max_model_len (100000) is greater than the derived "
        "max_model_len [type=value_error]"
    )
    log.write_text("ValidationError: 2 validation errors for Cfg\nfield\n  Input should be int\n")
    assert first_error(log) == (
        "ValidationError: 2 validation errors for Cfg | field | Input should be int"
    )


def test_a_server_errors_summary_leaves_out_the_log_tail() -> None:
    error = VLLMServerError(f"replica-0 exited\nfirst error in the log: X{TAIL_MARKER}a.log ---\nY")
    assert error.summary == "replica-0 exited\nfirst error in the log: X"
    assert str(error).endswith("\nY")


async def test_a_dead_url_waits_engine_startup_timeout_and_says_what_to_fix(
    tiny_model_path: str, caplog: pytest.LogCaptureFixture
) -> None:
    """`engine.startup_timeout` applied to started servers only: a server of `urls` was waited
    for 60 s, and the error said to raise a setting that did not apply to it."""
    from agentscope_rft.engines.vllm_server import free_port

    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    engine = VLLMEngine(tiny_model_path, urls=[url], startup_timeout=1.0)
    with (
        caplog.at_level("INFO", logger="agentscope_rft.engines.vllm_server"),
        pytest.raises(VLLMServerError) as error,
    ):
        await asyncio.wait_for(engine.start(), timeout=30)
    assert str(error.value) == (
        f"vLLM server replica-0 at {url} was not healthy within 1 s (ConnectError); start that "
        "server, or fix engine.urls (engine.startup_timeout: how long to wait for it)"
    )
    assert f"{url} does not answer yet (ConnectError); waiting up to 1 s" in caplog.text
    assert engine.replicas == []


async def test_an_engine_leaves_no_empty_folder_or_sockets_behind(
    tiny_model_path: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An engine of `urls` (no server of its own) left an empty temporary folder at each start,
    and vLLM's ZMQ socket files stayed in the system temp folder after its servers ended."""
    import tempfile

    from agentscope_rft.engines.vllm_server import free_port

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    engine = VLLMEngine(tiny_model_path, urls=[url], startup_timeout=0.2)
    with pytest.raises(VLLMServerError):
        await asyncio.wait_for(engine.start(), timeout=30)
    assert list(tmp_path.iterdir()) == []

    env = engine.launch.environment(base={}, ipc_dir=tmp_path / "x" / "ipc")
    assert env["VLLM_RPC_BASE_PATH"] == str(tmp_path / "x" / "ipc")
    assert (tmp_path / "x" / "ipc").is_dir()  # vLLM does not create it


def test_a_replica_gone_for_good_fails_the_engines_check(tiny_model_path: str) -> None:
    # Rollouts are routed to replicas by id: a dead one would fail its share of every step.
    engine = VLLMEngine(tiny_model_path, urls=["http://127.0.0.1:1", "http://127.0.0.1:2"])
    engine.pool.replicas = [
        Replica(VLLMServer(f"r{i}", url=f"http://x{i}"), 10.0) for i in range(2)
    ]
    engine.check()  # both serving
    engine.replicas[1].server._failure = (
        "vLLM server r1 crashed (exit code -9) and was not restarted: max_restarts=3 reached"
        f"{TAIL_MARKER}r1.log ---\nlast lines"
    )
    with pytest.raises(VLLMServerError) as err:
        engine.check()
    summary = err.value.summary
    assert summary.startswith("1 of 2 vLLM replica(s) gone for good")
    assert "max_restarts=3 reached" in summary and "--resume" in summary
    assert "last lines" not in summary


async def test_vllm_rendering_takes_max_tokens_past_the_window_as_an_upper_bound(
    tiny_model_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # With chat_rendering: vllm only vLLM knows the prompt's length; it refuses a max_tokens
    # past the window (a 400 the engine read as a prompt over the window: a truncated episode).
    from agentscope_rft.engines.base import ChatRequest, ChoiceDone, ContextWindowError
    from agentscope_rft.types import SamplingParams

    engine = VLLMEngine(tiny_model_path, urls=["http://127.0.0.1:1"], chat_rendering="vllm")
    engine.pool.replicas = [Replica(VLLMServer("r0", url="http://x0"), 10.0)]
    engine.pool._max_model_len = 128
    sent: list[int] = []

    async def post(replica, path, body=None, params=None):
        sent.append(body["max_tokens"])
        prompt_len = 100 if body["messages"][0]["content"] == "fits" else 200
        if prompt_len >= 128 or body["max_tokens"] > 128 - prompt_len:
            raise ContextWindowError(
                f"'max_tokens' or 'max_completion_tokens' is too large: {body['max_tokens']}. "
                f"This model's maximum context length is 128 tokens and your request has "
                f"{prompt_len} input tokens ({body['max_tokens']} > 128 - {prompt_len}).",
                status=400,
                param="messages",
            )
        return {
            "prompt_token_ids": list(range(prompt_len)),
            "choices": [
                {
                    "index": 0,
                    "token_ids": [5, 6],
                    "logprobs": {
                        "content": [
                            {"token": "token_id:5", "logprob": -0.5},
                            {"token": "token_id:6", "logprob": -0.25},
                        ]
                    },
                    "message": {"role": "assistant", "content": "ab"},
                    "finish_reason": "length",
                }
            ],
        }

    monkeypatch.setattr(engine.pool, "post", post)

    def request(content: str, max_tokens: int | None) -> ChatRequest:
        return ChatRequest(
            messages=[{"role": "user", "content": content}],
            sampling=SamplingParams(max_tokens=max_tokens),
        )

    events = [e async for e in engine.chat(request("fits", 64))]
    [done] = [e for e in events if isinstance(e, ChoiceDone)]
    assert done.choice.completion_ids == [5, 6] and sent == [64, 28]
    sent.clear()
    events = [e async for e in engine.chat(request("fits", None))]  # no max_tokens: the room
    assert sent == [128, 28]
    sent.clear()
    with pytest.raises(ContextWindowError):  # a prompt over the window stays an error
        _ = [e async for e in engine.chat(request("too long", 8))]
    assert sent == [8]


async def _fake_http_server(routes: dict[str, tuple[int, str]]) -> tuple[asyncio.Server, str]:
    """A server answering GET <path> with (status, JSON body) from `routes`, 404 otherwise."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = await reader.readuntil(b"\r\n\r\n")
        path = request.split(b" ")[1].decode()
        status, body = routes.get(path, (404, '{"detail": "Not Found"}'))
        writer.write(
            f"HTTP/1.1 {status} X\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n{body}".encode()
        )
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("127.0.0.1:8000", "is not an http(s) URL (http://host:port); fix engine.urls"),
        ("ftp://127.0.0.1:8000", "is not an http(s) URL (http://host:port); fix engine.urls"),
        (
            "http://127.0.0.1:8000/v1/",
            "ends with /v1: name the server itself (http://127.0.0.1:8000)",
        ),
        (
            "http://no-such-host.invalid:8000",
            "the host name 'no-such-host.invalid' does not resolve",
        ),
    ],
)
async def test_a_url_no_wait_can_reach_fails_at_once(
    tiny_model_path: str, url: str, expected: str
) -> None:
    """A URL that is not http(s), or whose host does not resolve, waited the whole
    `startup_timeout` (600 s by default) before failing."""
    engine = VLLMEngine(tiny_model_path, urls=[url], startup_timeout=600.0)
    with pytest.raises(VLLMServerError) as error:
        await asyncio.wait_for(engine.start(), timeout=20)
    assert expected in str(error.value)


async def test_an_endpoint_that_is_not_an_openai_server_fails_at_once(
    tiny_model_path: str,
) -> None:
    """Another web server at the URL (404 on /health and /v1/models) was polled until
    `startup_timeout`."""
    server, url = await _fake_http_server({"/": (200, "{}")})
    engine = VLLMEngine(tiny_model_path, urls=[url], startup_timeout=600.0)
    async with server:
        with pytest.raises(VLLMServerError) as error:
            await asyncio.wait_for(engine.start(), timeout=20)
    assert str(error.value) == (
        f"vLLM server replica-0 at {url} answers, but is not an OpenAI-compatible server (GET "
        "/health: 404, GET /v1/models: 404); fix engine.urls (the address of a `vllm serve` server)"
    )


async def test_a_server_of_another_model_is_named_with_the_fix(tiny_model_path: str) -> None:
    models = json.dumps({"data": [{"id": "other-model", "max_model_len": 128}]})
    routes = {"/health": (200, "{}"), "/v1/models": (200, models)}

    server, url = await _fake_http_server(routes)
    engine = VLLMEngine(tiny_model_path, urls=[url], startup_timeout=600.0)
    engine.pool.replicas = [Replica(VLLMServer("replica-0", url=url), 10.0)]
    async with server:
        with pytest.raises(VLLMServerError) as error:
            await asyncio.wait_for(
                engine.pool.discover_max_model_len(engine.model_name), timeout=20
            )
    assert f"does not serve {tiny_model_path!r} (it serves ['other-model'])" in str(error.value)
    assert f"--served-model-name {tiny_model_path}" in str(error.value)


async def test_a_server_that_is_starting_is_awaited_with_progress(
    tiny_model_path: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A refused connection (the server is starting) and a 503 are waited for, with a log line
    every PROGRESS_EVERY seconds; nothing said so after the first line."""
    from agentscope_rft.engines import vllm_server

    monkeypatch.setattr(vllm_server, "PROGRESS_EVERY", 0.6)
    url = f"http://127.0.0.1:{vllm_server.free_port()}"  # nothing listens there
    engine = VLLMEngine(tiny_model_path, urls=[url], startup_timeout=2.0)
    with (
        caplog.at_level("INFO", logger="agentscope_rft.engines.vllm_server"),
        pytest.raises(VLLMServerError, match="was not healthy within 2 s"),
    ):
        await asyncio.wait_for(engine.start(), timeout=30)
    assert f"still waiting for vLLM server replica-0 at {url} (ConnectError): 1 of 2 s" in (
        caplog.text
    )

    server, url = await _fake_http_server({"/health": (503, "{}")})
    engine = VLLMEngine(tiny_model_path, urls=[url], startup_timeout=1.0)
    async with server:
        with pytest.raises(VLLMServerError, match=r"within 1 s \(/health answered 503\)"):
            await asyncio.wait_for(engine.start(), timeout=30)


async def test_a_server_behind_an_api_key_is_named_as_such(tiny_model_path: str) -> None:
    """`vllm serve --api-key`: /health answers 200, /v1/* 401; the error blamed the model or
    the vLLM build ("failed its first generation")."""
    routes = {"/health": (200, "{}"), "/v1/models": (401, '{"error": "Unauthorized"}')}
    server, url = await _fake_http_server(routes)
    engine = VLLMEngine(tiny_model_path, urls=[url], startup_timeout=600.0)
    async with server:
        with pytest.raises(VLLMServerError) as error:
            await asyncio.wait_for(engine.start(), timeout=20)
    assert str(error.value) == (
        f"vLLM server replica-0 at {url} refuses requests without an API key (GET /v1/models: "
        "401); engine.urls sends none: start that server without --api-key (bind it to a private "
        "interface instead)"
    )


def test_preflight_refuses_a_url_no_wait_can_reach() -> None:
    """An unresolvable host in engine.urls was found only after the trainer and tokenizer had
    loaded (and, before that, only after `startup_timeout`)."""
    from agentscope_rft.config import ConfigError
    from agentscope_rft.engines.config import VLLMEngineConfig
    from agentscope_rft.runtime.preflight import _check_engine

    engine = VLLMEngineConfig(urls=["http://127.0.0.1:1", "http://no-such-host.invalid:8000"])
    with pytest.raises(ConfigError) as error:
        _check_engine(engine, on_ray=False)
    said = str(error.value)  # the resolver's words between the parentheses vary by system
    assert said.startswith("engine.urls: the host name 'no-such-host.invalid' does not resolve (")
    assert said.endswith("); fix engine.urls")
    _check_engine(VLLMEngineConfig(urls=["http://127.0.0.1:1"]), on_ray=False)  # may be starting


@pytest.mark.parametrize("kind", ["drops", "is silent"])
async def test_a_url_server_that_stops_answering_mid_run_is_named_with_the_fix(kind: str) -> None:
    """A server of `engine.urls` that dropped each connection, or held it without a word,
    failed a call with `did not answer: ReadError: ` (an empty reason, no timeout named, no
    fix): the run starts no such server and restarts none."""
    import socket
    import threading

    from agentscope_rft.engines.vllm_replicas import ReplicaPool

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            if kind == "drops":
                conn.close()
            else:
                held.append(conn)

    threading.Thread(target=accept, daemon=True).start()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    server = VLLMServer("replica-0", url=url)
    server._ready.set()  # (it served until now)
    replica = Replica(server, request_timeout=0.5)
    try:
        with pytest.raises(VLLMServerError) as error:
            await ReplicaPool().post(replica, "/v1/completions", {"prompt": [1]})
    finally:
        await replica.http.aclose()
        listener.close()
        for conn in held:
            conn.close()
    message = str(error.value)
    assert message.startswith(f"vLLM server replica-0 at {url} did not answer: ")
    if kind == "is silent":
        assert "no reply within engine.request_timeout=0.5 s (ReadTimeout)" in message
    assert "check that it still runs" in message and "--resume" in message
    assert ": ;" not in message and not message.endswith(": ")
