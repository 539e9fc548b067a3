"""The gateway: an OpenAI-compatible chat endpoint that records exact tokens per rollout.

Routes:
    POST /rollouts/{rollout_id}/v1/chat/completions   attributed call (recorded)
    POST /v1/chat/completions                          unattributed call (not recorded)
    GET  /v1/models, /rollouts/{rollout_id}/v1/models
    GET  /rollouts/{rollout_id}                        the rollout's recorded calls (JSON)
    DELETE /rollouts/{rollout_id}                      drop them
    GET  /health, GET /metrics

The rollout id lives in the URL path, so any OpenAI client in any process is attributed by its
`base_url` alone. The caller's agent name may come in the `X-Agent-Name` header.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import re
import time
import uuid
import zlib
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field
from typing import Any, cast

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from agentscope_rft.engines.base import (
    ChatEvent,
    ChatRequest,
    ChoiceDone,
    ChoiceResult,
    ContentDelta,
    ContextWindowError,
    Engine,
    EngineError,
    PromptReady,
)
from agentscope_rft.gateway.protocol import (
    ChatCompletionRequest,
    ChunkWriter,
    RequestError,
    completion_body,
    logprobs_content,
    models_body,
    parse_request,
    usage,
)
from agentscope_rft.gateway.recorder import CallRecorder
from agentscope_rft.types import JSON, Call

logger = logging.getLogger(__name__)

AGENT_HEADER = "x-agent-name"
_ROLLOUT_ID = re.compile(r"^[A-Za-z0-9_.:\-]{1,200}$")


@dataclass
class GatewayState:
    """What the routes share. `sampling_overrides` apply to attributed (training) calls only."""

    engine: Engine
    recorder: CallRecorder
    api_key: str | None = None
    model_aliases: set[str] = field(default_factory=set)
    sampling_defaults: JSON = field(default_factory=dict)
    sampling_overrides: dict[str, JSON] = field(default_factory=dict)
    """Forced sampling for attributed calls, by rollout-id prefix (longest match; "" default)."""
    seed_base: int | None = None
    """When set, attributed calls without a seed get one derived from it, the rollout id and the
    call's number within the rollout (reproducible exploration)."""
    created: int = field(default_factory=lambda: int(time.time()))
    counters: collections.Counter[str] = field(default_factory=collections.Counter)
    latencies: collections.deque[float] = field(
        default_factory=lambda: collections.deque(maxlen=4096)
    )
    active: dict[str, set[asyncio.Task[Any]]] = field(default_factory=dict)
    """Request-handling tasks per rollout, so an abandoned episode's calls can be aborted."""

    def abort_rollout(self, rollout_id: str) -> int:
        """Cancel the rollout's requests in flight (their generation stops); returns how many."""
        tasks = self.active.pop(rollout_id, set())
        for task in tasks:
            task.cancel()
        return len(tasks)


def _overrides_for(state: GatewayState, rollout_id: str | None) -> JSON | None:
    if rollout_id is None:
        return None
    prefixes = [p for p in state.sampling_overrides if rollout_id.startswith(p)]
    overrides = dict(state.sampling_overrides[max(prefixes, key=len)]) if prefixes else {}
    if state.seed_base is not None and "seed" not in overrides:
        number = state.recorder.started(rollout_id)
        overrides["seed_default"] = zlib.crc32(f"{state.seed_base}:{rollout_id}:{number}".encode())
    return overrides


def _error_response(error: RequestError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status)


def _check_auth(state: GatewayState, request: Request) -> None:
    if state.api_key is None:
        return
    header = request.headers.get("authorization", "")
    if header != f"Bearer {state.api_key}":
        raise RequestError(
            "missing or invalid API key: send 'Authorization: Bearer <key>'",
            status=401,
            kind="authentication_error",
            code="invalid_api_key",
        )


def _check_rollout_id(rollout_id: str) -> None:
    if not _ROLLOUT_ID.match(rollout_id):
        raise RequestError(
            f"invalid rollout id {rollout_id!r}: use 1-200 of [A-Za-z0-9_.:-]",
            status=400,
            param="rollout_id",
        )


def _client_logprobs(engine: Engine, choice: ChoiceResult, wanted: bool) -> JSON | None:
    if not wanted:
        return None
    texts = engine.token_texts(choice.completion_ids)
    top_texts = None
    if choice.top_logprobs is not None:
        top_texts = [engine.token_texts([tid for tid, _ in row]) for row in choice.top_logprobs]
    return logprobs_content(choice, texts, top_texts)


def _calls(
    chat: ChatRequest,
    body: ChatCompletionRequest,
    prompt: PromptReady,
    choices: list[ChoiceResult],
    started: float,
) -> list[Call]:
    now = time.time()
    return [
        Call(
            call_id=f"{chat.request_id}-{choice.index}",
            request_id=chat.request_id,
            rollout_id=chat.rollout_id,
            agent_name=chat.agent_name,
            messages=chat.messages,
            tools=chat.tools,
            prompt_ids=prompt.prompt_ids,
            completion_ids=choice.completion_ids,
            logprobs=choice.logprobs,
            finish_reason=choice.finish_reason,
            policy_version=choice.policy_version,
            content=choice.content,
            tool_calls=choice.tool_calls,
            choice_index=choice.index,
            temperature=chat.sampling.temperature,
            top_p=chat.sampling.top_p,
            top_k=chat.sampling.top_k,
            model=body.model,
            started_at=started,
            finished_at=now,
            prompt_reused_tokens=prompt.reused_tokens,
        )
        for choice in choices
    ]


class _Exchange:
    """One chat request in flight: engine events in, response out, calls recorded at the end."""

    def __init__(self, state: GatewayState, body: ChatCompletionRequest, chat: ChatRequest) -> None:
        self.state = state
        self.body = body
        self.chat = chat
        self.started = time.time()
        self.prompt: PromptReady | None = None
        self.choices: list[ChoiceResult] = []
        self.events = cast(AsyncGenerator[ChatEvent, None], state.engine.chat(chat))
        self._task = asyncio.current_task()
        if chat.rollout_id is not None:
            state.recorder.begin(chat.rollout_id)
            if self._task is not None:
                state.active.setdefault(chat.rollout_id, set()).add(self._task)
        self._closed = False

    async def next_event(self) -> ChatEvent | None:
        try:
            event = await anext(self.events)
        except StopAsyncIteration:
            return None
        except EngineError as exc:
            overflow = isinstance(exc, ContextWindowError)
            if overflow and self.chat.rollout_id is not None:
                # The episode outgrew the context window: the explorer keeps it as truncated data.
                self.state.recorder.note_overflow(self.chat.rollout_id, str(exc))
            code = "context_length_exceeded" if overflow else None  # OpenAI's code for it
            raise RequestError(str(exc), status=exc.status, param=exc.param, code=code) from exc
        if isinstance(event, PromptReady):
            self.prompt = event
        elif isinstance(event, ChoiceDone):
            self.choices.append(event.choice)
        return event

    def finish(self, ok: bool) -> None:
        if self._closed:
            return
        self._closed = True
        state = self.state
        calls: list[Call] = []
        if ok and self.prompt is not None and len(self.choices) == self.chat.sampling.n:
            calls = _calls(self.chat, self.body, self.prompt, self.choices, self.started)
            state.counters["completion_tokens"] += sum(len(c.completion_ids) for c in self.choices)
            state.counters["prompt_tokens"] += len(self.prompt.prompt_ids)
        state.counters["requests_ok" if ok else "requests_failed"] += 1
        state.latencies.append(time.time() - self.started)
        if self.chat.rollout_id is not None:
            state.recorder.end(self.chat.rollout_id, calls)
            tasks = state.active.get(self.chat.rollout_id)
            if tasks is not None:
                tasks.discard(self._task)
                if not tasks:
                    del state.active[self.chat.rollout_id]

    async def aclose(self) -> None:
        await self.events.aclose()


async def _complete(exchange: _Exchange) -> JSONResponse:
    ok = False
    try:
        while await exchange.next_event() is not None:
            pass
        ok = True
    finally:
        exchange.finish(ok)
        await exchange.aclose()
    assert exchange.prompt is not None
    body = exchange.body
    engine = exchange.state.engine
    choices = sorted(exchange.choices, key=lambda c: c.index)
    logprobs = [_client_logprobs(engine, c, body.logprobs) for c in choices]
    return JSONResponse(
        completion_body(
            exchange.chat.request_id,
            body.model,
            exchange.prompt.prompt_ids,
            choices,
            logprobs,
            body.return_token_ids,
        )
    )


async def _stream(exchange: _Exchange, first: ChatEvent | None) -> AsyncIterator[str]:
    body = exchange.body
    writer = ChunkWriter(exchange.chat.request_id, body.model)
    engine = exchange.state.engine
    ok = False
    try:
        for index in range(exchange.chat.sampling.n):
            yield writer.role(index)
        event = first
        while event is not None:
            if isinstance(event, ContentDelta):
                yield writer.content(event.index, event.text)
            elif isinstance(event, ChoiceDone):
                choice = event.choice
                logprobs = _client_logprobs(engine, choice, body.logprobs)
                yield writer.finish(choice, logprobs, body.return_token_ids)
            try:
                event = await exchange.next_event()
            except RequestError as exc:
                yield writer.error(exc)
                return
        ok = True
        if body.stream_options is not None and body.stream_options.include_usage:
            assert exchange.prompt is not None
            yield writer.usage(
                usage(len(exchange.prompt.prompt_ids), exchange.choices),
                exchange.prompt.prompt_ids if body.return_token_ids else None,
            )
        yield writer.done()
    finally:
        exchange.finish(ok)
        await exchange.aclose()


def create_app(state: GatewayState) -> FastAPI:
    """Build the FastAPI app around an engine and a recorder.

    Example:
        >>> app = create_app(GatewayState(engine=engine, recorder=CallRecorder()))  # doctest: +SKIP
    """
    app = FastAPI(title="agentscope-rft gateway", docs_url=None, redoc_url=None)
    app.state.gateway = state

    @app.exception_handler(RequestError)
    async def _request_error(_: Request, exc: RequestError) -> JSONResponse:
        return _error_response(exc)

    async def chat_completions(request: Request, rollout_id: str | None) -> Response:
        _check_auth(state, request)
        if rollout_id is not None:
            _check_rollout_id(rollout_id)
        body = parse_request(await request.body())
        served = state.model_aliases | {state.engine.model_name}
        if rollout_id is None and body.model not in served:
            raise RequestError(
                f"the model {body.model!r} does not exist; this server serves {sorted(served)}",
                status=404,
                param="model",
                code="model_not_found",
            )
        overrides = _overrides_for(state, rollout_id)
        chat = ChatRequest(
            messages=body.messages,
            sampling=body.sampling(state.sampling_defaults, overrides),
            tools=body.tools,
            tool_choice=body.tool_choice,
            rollout_id=rollout_id,
            agent_name=request.headers.get(AGENT_HEADER),
            request_id=f"chatcmpl-{uuid.uuid4().hex}",
            stream=body.stream,
        )
        exchange = _Exchange(state, body, chat)
        if not body.stream:
            return await _complete(exchange)
        # Pull the first event before answering 200, so request errors are proper 4xx.
        try:
            first = await exchange.next_event()
        except BaseException:
            exchange.finish(False)
            await exchange.aclose()
            raise
        return StreamingResponse(
            _stream(exchange, first),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache"},
        )

    @app.post("/v1/chat/completions")
    async def chat_unattributed(request: Request) -> Response:
        return await chat_completions(request, None)

    @app.post("/rollouts/{rollout_id}/v1/chat/completions")
    async def chat_attributed(rollout_id: str, request: Request) -> Response:
        return await chat_completions(request, rollout_id)

    @app.get("/v1/models")
    async def models(request: Request) -> JSONResponse:
        _check_auth(state, request)
        return JSONResponse(models_body(state.engine.model_name, state.created))

    @app.get("/rollouts/{rollout_id}/v1/models")
    async def rollout_models(rollout_id: str, request: Request) -> JSONResponse:
        return await models(request)

    @app.get("/rollouts/{rollout_id}")
    async def rollout_calls(rollout_id: str, request: Request) -> JSONResponse:
        _check_auth(state, request)
        _check_rollout_id(rollout_id)
        calls = state.recorder.calls(rollout_id)
        return JSONResponse(
            {
                "rollout_id": rollout_id,
                "in_flight": state.recorder.in_flight(rollout_id),
                "calls": [c.to_dict() for c in calls],
            }
        )

    @app.delete("/rollouts/{rollout_id}")
    async def drop_rollout(rollout_id: str, request: Request) -> JSONResponse:
        _check_auth(state, request)
        state.recorder.discard(rollout_id)
        return JSONResponse({"rollout_id": rollout_id, "deleted": True})

    @app.get("/health")
    async def health() -> JSONResponse:
        return JSONResponse(
            {
                "status": "ok",
                "model": state.engine.model_name,
                "policy_version": state.engine.policy_version,
            }
        )

    @app.get("/metrics")
    async def metrics(request: Request) -> JSONResponse:
        _check_auth(state, request)
        latencies = sorted(state.latencies)
        p50 = latencies[len(latencies) // 2] if latencies else None
        return JSONResponse(
            {
                **state.counters,
                "latency_p50_s": p50,
                "policy_version": state.engine.policy_version,
                "recorded_calls": state.recorder.total_calls,
            }
        )

    return app
