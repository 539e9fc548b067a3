"""The gateway: an OpenAI-compatible chat endpoint that records exact tokens per rollout.

Routes:
    POST /rollouts/{rollout_id}/v1/chat/completions   attributed call (recorded)
    POST /v1/chat/completions                          unattributed call (not recorded)
    GET  /v1/models, /rollouts/{rollout_id}/v1/models
    GET  /rollouts/{rollout_id}                        the rollout's recorded calls (JSON)
    POST /rollouts/{rollout_id}/close                  end the rollout (see `close_rollout`)
    DELETE /rollouts/{rollout_id}                      drop its calls
    GET  /health
    GET  /metrics                                      Prometheus text (`?format=json`: JSON)

The rollout id lives in the URL path, so any OpenAI client in any process is attributed by its
`base_url` alone. The caller's agent name may come in the `X-Agent-Name` header.

Every request's engine stream runs in a task of its own, so a request can be aborted (its
generation stops at the engine) without cancelling the HTTP handler: the client then gets a proper
error instead of a dropped connection. A closed rollout's requests in flight are aborted and new
ones are refused with 410 (`rollout_closed`, marked not to be retried), whatever the app does with
cancellation.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import re
import time
import uuid
import zlib
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

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
    ReasoningDelta,
    forget_rollout,
)
from agentscope_rft.gateway.agent_name import AGENT_HEADER, decode_agent_name
from agentscope_rft.gateway.metrics import (
    PROMETHEUS_CONTENT_TYPE,
    Histogram,
    gateway_metrics,
    prometheus_text,
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
from agentscope_rft.gateway.runtime_state import apply_runtime_state
from agentscope_rft.types import JSON, Call

logger = logging.getLogger(__name__)

_ROLLOUT_ID = re.compile(r"^[A-Za-z0-9_.:\-]{1,200}$")


CLOSED_ROLLOUTS_KEPT = 100_000
"""Closed rollout ids remembered (so late calls are refused), oldest forgotten first."""


def closed_error(rollout_id: str, reason: str) -> RequestError:
    """The error a closed rollout's calls get: 410, and not worth retrying."""
    return RequestError(
        f"rollout {rollout_id!r} is closed ({reason}): its episode has ended, so no more model "
        "calls are accepted under its id",
        status=410,
        code="rollout_closed",
    )


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
    max_tokens_limit: int | None = None
    """Upper bound on `max_tokens` of attributed calls, also when the app sets none."""
    runtime_state: str = "keep"
    """What happens to the runtime-state reminders AgentScope injects into requests: `keep`,
    `freeze` or `drop` (see `gateway.runtime_state`), before rendering, so it is recorded."""
    created: int = field(default_factory=lambda: int(time.time()))
    counters: collections.Counter[str] = field(default_factory=collections.Counter)
    latencies: collections.deque[float] = field(
        default_factory=lambda: collections.deque(maxlen=4096)
    )
    latency: Histogram = field(default_factory=Histogram)
    exchanges: set[_Exchange] = field(default_factory=set)
    """Every request in flight (attributed or not), so shutdown can abort them."""
    by_rollout: dict[str, set[_Exchange]] = field(default_factory=dict)
    """Requests in flight per rollout, so an ended episode's calls can be aborted."""
    closed: collections.OrderedDict[str, str] = field(default_factory=collections.OrderedDict)
    """Closed rollout ids and why (`timeout`, `finished`, ...): their new calls are refused."""
    sealed: Mapping[str, str] = field(default_factory=dict)
    """Rollout ids closed for good, beyond `closed`'s bound, and why (`serve --record`: every
    episode written to its folder, which is written once)."""

    def close_rollout(self, rollout_id: str, reason: str) -> int:
        """Refuse the rollout's new calls and abort those in flight; returns how many."""
        self.closed[rollout_id] = reason
        self.closed.move_to_end(rollout_id)
        while len(self.closed) > CLOSED_ROLLOUTS_KEPT:
            self.closed.popitem(last=False)
        exchanges = list(self.by_rollout.get(rollout_id, ()))
        for exchange in exchanges:
            exchange.abort(closed_error(rollout_id, reason))
        self.counters["requests_aborted"] += len(exchanges)
        return len(exchanges)

    def reopen_rollout(self, rollout_id: str) -> None:
        """Accept calls under a closed rollout id again (an episode that reuses it)."""
        self.closed.pop(rollout_id, None)

    def abort_all(self, error: RequestError) -> int:
        """Abort every request in flight (shutdown); returns how many."""
        exchanges = list(self.exchanges)
        for exchange in exchanges:
            exchange.abort(error)
        self.counters["requests_aborted"] += len(exchanges)
        return len(exchanges)


@dataclass(frozen=True)
class RolloutClosure:
    """What closing a rollout found: calls still in flight when it closed, and those aborted."""

    rollout_id: str
    late_calls: int
    """Requests in flight when the close began (the episode had already returned or timed out)."""
    aborted_calls: int
    """Of those (and any begun during the grace period), the ones still running at its end."""

    def to_dict(self) -> JSON:
        return {
            "rollout_id": self.rollout_id,
            "late_calls": self.late_calls,
            "aborted_calls": self.aborted_calls,
        }


async def close_rollout(
    state: GatewayState, rollout_id: str, *, reason: str, grace: float = 0.0
) -> RolloutClosure:
    """End a rollout: wait up to `grace` s for its calls in flight, abort the rest, refuse more.

    Aborted requests stop generating at the engine and end with a 410 error for their client;
    calls that finish within the grace period are recorded as usual. When this returns, no
    request of the rollout is running, so its recorded calls are final.

    Example:
        >>> closure = await close_rollout(state, "r1", reason="finished", grace=5)  # doctest: +SKIP
        >>> closure.late_calls, closure.aborted_calls  # doctest: +SKIP
        (1, 0)
    """
    late = state.recorder.in_flight(rollout_id)
    if late and grace > 0:
        await state.recorder.wait_idle(rollout_id, grace)
    aborted = state.close_rollout(rollout_id, reason)
    if aborted:
        # The handlers record their (failed) end on their next turn of the loop.
        await state.recorder.wait_idle(rollout_id, 5.0)
    if late or aborted:
        logger.debug(
            "rollout %s closed (%s): %d late, %d aborted", rollout_id, reason, late, aborted
        )
    # Its conversation is over: the engine's turns kept for its next call would only take memory
    # (up to 4,096 finished conversations, with every prompt's token ids).
    forget_rollout(state.engine, rollout_id)
    return RolloutClosure(rollout_id, late_calls=late, aborted_calls=aborted)


def constrained_training_call(rollout_id: str) -> RequestError:
    """Why an attributed call may not ask for structured output (see docs/gateway.md)."""
    return RequestError(
        f"response_format is not allowed on an attributed (training) call (rollout "
        f"{rollout_id!r}): the grammar mask changes the distribution the tokens are sampled "
        "from, which the trainer cannot reproduce. Drop response_format and parse the text "
        "(or use a tool call), or send calls that are not to be trained on, such as a judge's, "
        "to the unattributed route /v1/chat/completions",
        param="response_format",
        code="structured_output_in_training",
    )


def sampled_tool_choice(
    state: GatewayState, tool_choice: str | JSON | None, rollout_id: str | None
) -> str | JSON | None:
    """The `tool_choice` the engine samples with: on an attributed (training) call a forced one
    (`required`, or a named function) is sampled as `auto`, counted.

    Forcing a call constrains sampling (vLLM decodes it under a grammar), which the trainer
    cannot reproduce, as with `response_format`; unlike that, refusing the call would fail the
    episode, while AgentScope asks its model for a call it needs again (its structured output
    forces one only after `max_iters`). The embedded engine never constrains for `tool_choice`.
    """
    forced = tool_choice == "required" or isinstance(tool_choice, dict)
    if rollout_id is None or not forced:
        return tool_choice
    state.counters["tool_choice_forced"] += 1
    if state.counters["tool_choice_forced"] == 1:
        logger.info(
            "a training call forced tool_choice=%s: sampled as 'auto' (the trainer cannot "
            "reproduce a constrained distribution; counted in gateway_tool_choice_forced_total)",
            json.dumps(tool_choice)[:120],
        )
    return "auto"


def count_lenient(
    state: GatewayState, counter: str, message: str, level: int = logging.WARNING
) -> None:
    """Count (and log the first of) a request that vLLM refuses but the gateway serves: refusing
    it would fail an episode, which teaches the model nothing."""
    state.counters[counter] += 1
    if state.counters[counter] == 1:
        logger.log(level, "%s (counted in gateway_%s_total; logged once)", message, counter)


def check_top_logprobs(state: GatewayState, body: ChatCompletionRequest, attributed: bool) -> None:
    """`top_logprobs` without `logprobs: true`: a 400 as in OpenAI and vLLM, except on a training
    call, where it is served without log-probs (as asked), counted and logged once."""
    if not body.top_logprobs or body.logprobs:
        return
    if not attributed:
        raise RequestError(
            "top_logprobs needs logprobs: true (as in OpenAI and vLLM): set logprobs to true to "
            "get log-probs, or drop top_logprobs",
            param="top_logprobs",
        )
    count_lenient(
        state,
        "top_logprobs_without_logprobs",
        "a training call set top_logprobs without logprobs: true (OpenAI and vLLM answer 400); "
        "served without log-probs; set logprobs: true to get them",
    )


def note_context_cap(state: GatewayState, chat: ChatRequest, prompt_len: int) -> None:
    """A call whose `max_tokens` reaches past the context window is cut to the room left (it
    is an upper bound), counted and logged once. vLLM answers 400 instead; that would fail an
    episode, or a judge at `base_url: policy` whose transcript is long, for nothing."""
    max_tokens = chat.sampling.max_tokens
    window = state.engine.max_model_len
    if max_tokens is None or prompt_len + max_tokens <= window:
        return
    count_lenient(
        state,
        "max_tokens_capped",
        f"a call's completion limit ({max_tokens}: its max_tokens, or on a training call "
        f"explorer.max_tokens_per_call) reaches past the context window ({prompt_len} prompt "
        f"tokens of {window}): it samples at most {window - prompt_len}, finish_reason 'length' "
        "at the end of the window (vLLM answers 400)",
        logging.INFO,
    )


def _overrides_for(state: GatewayState, rollout_id: str | None) -> JSON | None:
    if rollout_id is None:
        return None
    prefixes = [p for p in state.sampling_overrides if rollout_id.startswith(p)]
    overrides = dict(state.sampling_overrides[max(prefixes, key=len)]) if prefixes else {}
    if state.max_tokens_limit is not None:
        overrides["max_tokens_limit"] = state.max_tokens_limit
    if state.seed_base is not None and "seed" not in overrides:
        number = state.recorder.started(rollout_id)
        overrides["seed_default"] = zlib.crc32(f"{state.seed_base}:{rollout_id}:{number}".encode())
    return overrides


def _error_response(error: RequestError) -> JSONResponse:
    # OpenAI clients retry 409/5xx unless told not to; a closed rollout stays closed.
    headers = {"x-should-retry": "false"} if error.code == "rollout_closed" else None
    return JSONResponse(error.body(), status_code=error.status, headers=headers)


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
            reasoning=choice.reasoning,
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


_Item = ChatEvent | BaseException | None


class _Exchange:
    """One chat request in flight: engine events in, response out, calls recorded at the end.

    The engine's event stream runs in its own task (`_pump`) feeding a queue; `abort` cancels
    that task, which stops generation at the engine, and hands the handler an error to answer
    with. The handler itself is never cancelled, so its client always gets a response.
    """

    def __init__(self, state: GatewayState, body: ChatCompletionRequest, chat: ChatRequest) -> None:
        self.state = state
        self.body = body
        self.chat = chat
        self.started = time.time()
        self.prompt: PromptReady | None = None
        self.choices: list[ChoiceResult] = []
        self._queue: asyncio.Queue[_Item] = asyncio.Queue()
        self._abort_error: RequestError | None = None
        self._closed = False
        state.exchanges.add(self)
        if chat.rollout_id is not None:
            state.recorder.begin(chat.rollout_id)
            state.by_rollout.setdefault(chat.rollout_id, set()).add(self)
        self._pump = asyncio.create_task(self._run(), name=f"engine-{chat.request_id}")

    async def _run(self) -> None:
        events = cast(AsyncGenerator[ChatEvent, None], self.state.engine.chat(self.chat))
        item: _Item = None
        try:
            async for event in events:
                self._queue.put_nowait(event)
        except asyncio.CancelledError:
            item = self._abort_error or RequestError("the request was aborted", status=503)
            raise
        except EngineError as exc:
            overflow = isinstance(exc, ContextWindowError)
            if overflow and self.chat.rollout_id is not None:
                # The episode outgrew the context window: the explorer keeps it as truncated data.
                self.state.recorder.note_overflow(self.chat.rollout_id, str(exc))
            code = "context_length_exceeded" if overflow else None  # OpenAI's code for it
            item = RequestError(str(exc), status=exc.status, param=exc.param, code=code)
        except Exception as exc:  # handed to the handler, which fails the request with it
            item = exc
        finally:
            self._queue.put_nowait(item)
            await events.aclose()

    def abort(self, error: RequestError) -> None:
        """Stop generating; the handler answers `error` (or ends its stream with it)."""
        if not self._pump.done():
            self._abort_error = error
            self._pump.cancel()

    async def next_event(self) -> ChatEvent | None:
        item = await self._queue.get()
        if item is None:
            return None
        if isinstance(item, BaseException):
            raise item
        if isinstance(item, PromptReady):
            self.prompt = item
            note_context_cap(self.state, self.chat, len(item.prompt_ids))
        elif isinstance(item, ChoiceDone):
            self.choices.append(item.choice)
        return item

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
        state.latency.observe(state.latencies[-1])
        state.exchanges.discard(self)
        rollout_id = self.chat.rollout_id
        if rollout_id is not None:
            mine = state.by_rollout.get(rollout_id)
            if mine is not None:
                mine.discard(self)
                if not mine:
                    del state.by_rollout[rollout_id]
            state.recorder.end(rollout_id, calls)

    async def aclose(self) -> None:
        """Stop the engine stream if it still runs (client gone, or a failure) and wait for it."""
        if not self._pump.done():
            self._pump.cancel()
        await asyncio.wait({self._pump})


async def _abort_when_gone(request: Request, exchange: _Exchange) -> None:
    """Abort the exchange when its client disconnects (a client timeout, a killed app), so the
    engine stops generating what nobody will read, as vLLM does; a stream notices by itself."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    exchange.state.counters["requests_disconnected"] += 1
    exchange.abort(RequestError("the client disconnected", status=499, code="client_disconnected"))


async def _complete(exchange: _Exchange, request: Request) -> JSONResponse:
    ok = False
    watcher = asyncio.create_task(_abort_when_gone(request, exchange))
    try:
        while await exchange.next_event() is not None:
            pass
        ok = True
    finally:
        watcher.cancel()
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
            elif isinstance(event, ReasoningDelta):
                yield writer.reasoning(event.index, event.text)
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


def _close_options(raw: bytes) -> dict[str, Any]:
    try:
        data = json.loads(raw) if raw.strip() else {}
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RequestError(f"the request body is not valid JSON: {exc}") from exc
    if not isinstance(data, dict) or set(data) - {"reason", "grace"}:
        raise RequestError('the body must be {"reason": str, "grace": seconds} (both optional)')
    reason, grace = data.get("reason", "closed"), data.get("grace", 0.0)
    if not isinstance(reason, str) or not isinstance(grace, int | float) or not 0 <= grace <= 600:
        raise RequestError("`reason` must be a string and `grace` a number of seconds in [0, 600]")
    return {"reason": reason, "grace": float(grace)}


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

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # Unknown routes and methods answer in the OpenAI error shape too.
        message = f"{request.method} {request.url.path}: {exc.detail}"
        if exc.status_code == 404:
            message += "; routes: /v1/chat/completions, /rollouts/{rollout_id}/v1/chat/completions"
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return _error_response(RequestError(message, status=exc.status_code, kind=kind))

    async def chat_completions(request: Request, rollout_id: str | None) -> Response:
        _check_auth(state, request)
        if rollout_id is not None:
            _check_rollout_id(rollout_id)
            reason = state.closed.get(rollout_id) or state.sealed.get(rollout_id)
            if reason is not None:
                state.counters["requests_refused_closed"] += 1
                raise closed_error(rollout_id, reason)
        body = parse_request(await request.body())
        served = state.model_aliases | {state.engine.model_name}
        if rollout_id is None and body.model not in served:
            raise RequestError(
                f"the model {body.model!r} does not exist; this server serves {sorted(served)}",
                status=404,
                param="model",
                code="model_not_found",
            )
        if rollout_id is not None and body.constraint is not None:
            raise constrained_training_call(rollout_id)
        check_top_logprobs(state, body, attributed=rollout_id is not None)
        overrides = _overrides_for(state, rollout_id)
        messages = body.messages
        if state.runtime_state != "keep":
            messages, rewritten = apply_runtime_state(messages, state.runtime_state)
            state.counters[f"runtime_state_{state.runtime_state}"] += rewritten
        chat = ChatRequest(
            messages=messages,
            sampling=body.sampling(state.sampling_defaults, overrides),
            tools=body.tools,
            tool_choice=sampled_tool_choice(state, body.tool_choice, rollout_id),
            rollout_id=rollout_id,
            agent_name=decode_agent_name(request.headers.get(AGENT_HEADER)),
            request_id=f"chatcmpl-{uuid.uuid4().hex}",
            stream=body.stream,
            response_format=body.constraint,
            parallel_tool_calls=body.parallel_tool_calls is not False,
            chat_template_kwargs=body.chat_template_kwargs,
        )
        exchange = _Exchange(state, body, chat)
        if not body.stream:
            return await _complete(exchange, request)
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

    @app.post("/rollouts/{rollout_id}/close")
    async def close(rollout_id: str, request: Request) -> JSONResponse:
        """Body (optional): `{"reason": "finished", "grace": 5.0}`; returns a RolloutClosure."""
        _check_auth(state, request)
        _check_rollout_id(rollout_id)
        options = _close_options(await request.body())
        closure = await close_rollout(state, rollout_id, **options)
        return JSONResponse(closure.to_dict())

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
    async def metrics(request: Request, format: str = "prometheus") -> Response:
        _check_auth(state, request)
        engine_metrics = getattr(state.engine, "metrics", None)
        engine = engine_metrics() if callable(engine_metrics) else {}
        recorder = state.recorder.stats()
        if format == "json":
            latencies = sorted(state.latencies)
            p50 = latencies[len(latencies) // 2] if latencies else None
            return JSONResponse(
                {
                    **state.counters,
                    "latency_p50_s": p50,
                    "policy_version": state.engine.policy_version,
                    "recorded_calls": state.recorder.total_calls,
                    **recorder,
                    **{f"engine_{k}": v for k, v in engine.items()},
                }
            )
        if format != "prometheus":
            raise RequestError(
                f"unknown metrics format {format!r}: use `prometheus` (default) or `json`",
                param="format",
            )
        families = gateway_metrics(
            state.counters,
            recorder,
            engine,
            state.engine.policy_version,
            state.recorder.total_calls,
        )
        return Response(
            prometheus_text(families, state.latency), media_type=PROMETHEUS_CONTENT_TYPE
        )

    return app
