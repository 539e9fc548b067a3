"""Training AgentScope apps in place: model calls inside a rollout go to the gateway.

Three patches, installed once and idempotent, make this work without edits to agent code:

- `OpenAIChatModel.client` becomes a data descriptor. Outside a rollout it returns the model's own
  client, untouched. Inside a rollout scope (a ContextVar set by the explorer around an episode)
  it returns a client bound to that rollout's gateway URL, whatever base URL, API key, model name
  or streaming setting the app configured. ContextVars are per asyncio task, so many concurrent
  rollouts in one event loop never see each other's client. The model handed to the workflow
  stays bound to its rollout wherever it is called from (a thread, another event loop).
- `Agent.reply` and `Agent.reply_stream` (and their overrides in an app's own `Agent` subclasses)
  set the current agent's name while they run, so every call is tagged with the AgentScope agent
  that made it (header `X-Agent-Name`); multi-agent episodes then yield one trajectory per agent.
- Calls an AgentScope component makes for an agent that are not its turns (helper calls) are
  tagged `<name>/<kind>` (`explorer.agents.HELPER_KINDS`), so they train only when asked
  (`explorer.agents.helpers`): `Agent.compress_context` (`compress`), the long-term memory
  middlewares' lookups and write-backs (`memory`), `ModelRouterMiddleware`'s classifier
  (`router`) and `RAGMiddleware`'s reranking (`rerank`).
- Any other AgentScope chat model (`DeepSeekChatModel`, `DashScopeChatModel`, ...) called in an
  episode is logged once per class: its calls go to its own provider and are not trained.
  An `OpenAIChatModel` marked with `own_provider` does the same (a fixed classifier or reranker).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import logging
import weakref
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
import openai
from agentscope.agent import Agent
from agentscope.credential import OpenAICredential
from agentscope.middleware import (
    AgenticMemoryMiddleware,
    Mem0Middleware,
    ModelRouterMiddleware,
    ReMeMiddleware,
)
from agentscope.middleware import _rag as rag_middleware
from agentscope.model import ChatModelBase, OpenAIChatModel
from pydantic import SecretStr

from agentscope_rft.explorer.agents import helper_name, split_helper
from agentscope_rft.gateway.agent_name import AGENT_HEADER, encode_agent_name
from agentscope_rft.types import StepReward, StepState

logger = logging.getLogger(__name__)

_OWN_CLIENT = "_agentscope_rft_own_client"
_BOUND_SCOPE = "_agentscope_rft_scope"
_OWN_PROVIDER = "_agentscope_rft_own_provider"


@dataclass(frozen=True)
class _SeenAgent:
    agent: weakref.ReferenceType[Agent]
    system_prompt: str


@dataclass
class RolloutScope:
    """Where the current episode's model calls go, and what it has emitted."""

    rollout_id: str
    base_url: str
    """The rollout's OpenAI base URL on the gateway (`.../rollouts/<id>/v1`)."""
    api_key: str
    step_rewards: list[StepReward] = field(default_factory=list)
    step_states: list[StepState] = field(default_factory=list)
    calls_made: dict[str | None, int] = field(default_factory=dict)
    """Answered model calls so far, per agent name (for `emit_reward` without a step)."""
    last_agent: str | None = None
    """The agent whose call was answered last."""
    agents: dict[str, _SeenAgent] = field(default_factory=dict)
    """The first agent object that replied under each name (see `_note_agent`)."""
    http_client: httpx.AsyncClient | None = None
    """A connection pool to share; it belongs to the event loop the scope is created on."""
    _clients: dict[str | None, openai.AsyncOpenAI] = field(default_factory=dict)
    _pool_loop: asyncio.AbstractEventLoop | None = field(default=None, init=False)
    _foreign_clients: weakref.WeakKeyDictionary[
        asyncio.AbstractEventLoop, dict[str | None, openai.AsyncOpenAI]
    ] = field(default_factory=weakref.WeakKeyDictionary, init=False)

    def __post_init__(self) -> None:
        try:
            self._pool_loop = asyncio.get_running_loop()
        except RuntimeError:
            self._pool_loop = None

    def client_for(self, agent_name: str | None) -> openai.AsyncOpenAI:
        """The client for `agent_name`'s calls, on the calling event loop.

        An app that runs agent code on an event loop of its own (`asyncio.run` in a thread) gets
        clients with their own connections there: a connection of the shared pool is bound to
        the loop that opened it, and one opened on a loop that has since closed breaks the pool.
        """
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        clients, pool = self._clients, self.http_client
        if loop is not None and self._pool_loop is not None and loop is not self._pool_loop:
            clients, pool = self._foreign_clients.setdefault(loop, {}), None
        client = clients.get(agent_name)
        if client is None:
            headers = {AGENT_HEADER: encode_agent_name(agent_name)} if agent_name else {}
            client = _CountingClient(
                self,
                agent_name,
                api_key=self.api_key,
                base_url=self.base_url,
                default_headers=headers,
                max_retries=0,  # the app's model retries; a retry here would double-record
                timeout=httpx.Timeout(3600.0, connect=60.0),  # loopback, maybe a busy loop
                http_client=pool,
            )
            clients[agent_name] = client
        return client

    async def aclose(self) -> None:
        """Close the episode's clients (those that own their connection pool; a shared
        `http_client` belongs to whoever passed it in)."""
        clients, self._clients = list(self._clients.values()), {}
        if self.http_client is None:
            for client in clients:
                await client.close()


class _CountingClient(openai.AsyncOpenAI):
    """The rollout's client; counts calls per agent so rewards can attach to the latest one."""

    def __init__(self, scope: RolloutScope, agent_name: str | None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._scope = scope
        self._agent = agent_name

    async def post(self, *args: Any, **kwargs: Any) -> Any:
        response = await super().post(*args, **kwargs)
        # Counted once answered: a failed attempt that the app retries is not a recorded call.
        counts = self._scope.calls_made
        counts[self._agent] = counts.get(self._agent, 0) + 1
        if split_helper(self._agent)[1] is None:  # a reward is for the agent's turns
            self._scope.last_agent = self._agent
        return response


_SCOPE: contextvars.ContextVar[RolloutScope | None] = contextvars.ContextVar(
    "agentscope_rft_rollout", default=None
)
_AGENT: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "agentscope_rft_agent", default=None
)


def current_scope() -> RolloutScope | None:
    """The rollout the calling code runs in, if any."""
    return _SCOPE.get()


def current_agent() -> str | None:
    """The AgentScope agent whose reply is running, if any."""
    return _AGENT.get()


@contextmanager
def rollout_scope(scope: RolloutScope | None) -> Iterator[None]:
    """Run the enclosed code inside (or, with None, outside) a rollout."""
    install()
    token = _SCOPE.set(scope)
    try:
        yield
    finally:
        _SCOPE.reset(token)


class _RedirectedClient:
    """Data descriptor replacing `OpenAIChatModel.client`."""

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return self
        state = obj.__dict__
        # The model handed to a workflow belongs to its rollout even where the context does not
        # say so (a thread the app started without copying its context).
        scope = _SCOPE.get() or state.get(_BOUND_SCOPE)
        if scope is not None and not state.get(_OWN_PROVIDER):
            return scope.client_for(_AGENT.get())
        return state[_OWN_CLIENT] if _OWN_CLIENT in state else state.get("client")

    def __set__(self, obj: Any, value: Any) -> None:
        obj.__dict__[_OWN_CLIENT] = value


_WARNED_NAMES: set[str] = set()


def _note_agent(agent: Agent) -> None:
    """Warn (once per name) when distinct agents with different system prompts share a name in
    one episode: their calls are recorded as one agent's and train as one role.

    An app that builds a new agent object each turn with the same system prompt is one agent and
    stays quiet; so does an agent whose own prompt the app changes between replies.
    """
    scope = _SCOPE.get()
    prompt = getattr(agent, "_system_prompt", None)
    name = getattr(agent, "name", None)
    if scope is None or not isinstance(prompt, str) or not isinstance(name, str):
        return
    first = scope.agents.setdefault(name, _SeenAgent(weakref.ref(agent), prompt))
    if first.system_prompt == prompt or first.agent() is agent or name in _WARNED_NAMES:
        return
    _WARNED_NAMES.add(name)
    logger.warning(
        "two different agents named %r replied in one episode, with different system prompts "
        "(%r and %r): agents that share a name train as one agent (one trajectory, one advantage "
        "group, one role). Give each its own `name=`; if this is one agent rebuilt with a new "
        "system prompt each turn, it is meant to train as one and this warning can be ignored",
        name,
        _preview(first.system_prompt),
        _preview(prompt),
    )


def _preview(text: str, limit: int = 60) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _wrap_reply(original: Any) -> Any:
    @functools.wraps(original)
    async def reply(self: Agent, *args: Any, **kwargs: Any) -> Any:
        _note_agent(self)
        token = _AGENT.set(_replying_as(self))
        try:
            return await original(self, *args, **kwargs)
        finally:
            _AGENT.reset(token)

    reply.__agentscope_rft_wrapped__ = True  # type: ignore[attr-defined]
    return reply


def _wrap_reply_stream(original: Any) -> Any:
    @functools.wraps(original)
    async def reply_stream(self: Agent, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        _note_agent(self)
        stream = original(self, *args, **kwargs)
        try:
            while True:
                # Set around each step only, so the caller's context is never left changed.
                token = _AGENT.set(_replying_as(self))
                try:
                    item = await anext(stream)
                except StopAsyncIteration:
                    return
                finally:
                    _AGENT.reset(token)
                yield item
        finally:
            await stream.aclose()

    reply_stream.__agentscope_rft_wrapped__ = True  # type: ignore[attr-defined]
    return reply_stream


def _replying_as(agent: Agent) -> str:
    """The name an agent's reply tags its calls with: its own, or, for an agent run inside a
    helper call (a memory backend's own agent), that helper call's."""
    current = _AGENT.get()
    return current if current is not None and split_helper(current)[1] else agent.name


def _wrap_helper(original: Any, kind: str) -> Any:
    """Tag the calls `original` (an AgentScope component's coroutine function) makes as the
    current agent's helper calls of `kind` (`<agent>/<kind>`): trained only when asked
    (`explorer.agents.helpers`). A helper call inside another keeps the outer one's tag."""

    @functools.wraps(original)
    async def helper(*args: Any, **kwargs: Any) -> Any:
        current = _AGENT.get()
        if split_helper(current)[1] is not None:
            return await original(*args, **kwargs)
        token = _AGENT.set(helper_name(current, kind))
        try:
            return await original(*args, **kwargs)
        finally:
            _AGENT.reset(token)

    helper.__agentscope_rft_wrapped__ = True  # type: ignore[attr-defined]
    return helper


def _wrap_compress(original: Any) -> Any:
    """Tag an agent's `compress_context` calls (its summary of older context) `<name>/compress`
    (set from the agent itself: it may be called outside its reply)."""

    @functools.wraps(original)
    async def compress_context(self: Agent, *args: Any, **kwargs: Any) -> Any:
        token = _AGENT.set(helper_name(self.name, "compress"))
        try:
            return await original(self, *args, **kwargs)
        finally:
            _AGENT.reset(token)

    compress_context.__agentscope_rft_wrapped__ = True  # type: ignore[attr-defined]
    return compress_context


_HELPERS: list[tuple[Any, str, str]] = [
    (AgenticMemoryMiddleware, "_retrieve_relevant_files", "memory"),
    (Mem0Middleware, "_async_search", "memory"),
    (Mem0Middleware, "_async_add", "memory"),
    (ReMeMiddleware, "_run_job", "memory"),
    (ModelRouterMiddleware, "_route", "router"),
    (rag_middleware, "_rerank_results", "rerank"),
]
"""The AgentScope functions whose model calls are helper calls: (owner, attribute, kind)."""


def _tag_helpers() -> None:
    """Wrap the functions of `_HELPERS` (once); one AgentScope no longer has is skipped."""
    for owner, attribute, kind in _HELPERS:
        original = getattr(owner, attribute, None)
        if inspect.iscoroutinefunction(original) and not getattr(
            original, "__agentscope_rft_wrapped__", False
        ):
            setattr(owner, attribute, _wrap_helper(original, kind))


_WARNED_MODELS: set[type] = set()


def _note_unredirected(model: ChatModelBase) -> None:
    """Say once per model class that an episode's call by it is not trained (nor redirected)."""
    kind = type(model)
    if isinstance(model, OpenAIChatModel) or _SCOPE.get() is None or kind in _WARNED_MODELS:
        return
    _WARNED_MODELS.add(kind)
    logger.warning(
        "an episode called a %s (model %r): only AgentScope OpenAIChatModel calls go to the "
        "trainable endpoint, so this one goes to its own provider and is not trained. To train "
        "it, give its agent the workflow's `model` argument or an OpenAIChatModel (any base URL: "
        "it is redirected); a model meant to stay untrained (a user simulator) can stay as it is",
        kind.__name__,
        getattr(model, "model", None),
    )


def _wrap_model_method(original: Any) -> Any:
    @functools.wraps(original)
    async def method(self: ChatModelBase, *args: Any, **kwargs: Any) -> Any:
        _note_unredirected(self)
        return await original(self, *args, **kwargs)

    method.__agentscope_rft_wrapped__ = True  # type: ignore[attr-defined]
    return method


def install() -> None:
    """Install the redirect and agent tagging (idempotent)."""
    if not isinstance(OpenAIChatModel.__dict__.get("client"), _RedirectedClient):
        OpenAIChatModel.client = _RedirectedClient()  # type: ignore[assignment]
    for name in ("__call__", "generate_structured_output"):
        original = getattr(ChatModelBase, name)
        if not getattr(original, "__agentscope_rft_wrapped__", False):
            setattr(ChatModelBase, name, _wrap_model_method(original))
    _tag_helpers()
    hook = Agent.__dict__.get("__init_subclass__")
    # (a classmethod does not show its function's attributes before Python 3.12: look inside)
    if not getattr(getattr(hook, "__func__", hook), "__agentscope_rft_wrapped__", False):
        # An app's own agent class may override `reply` without calling `Agent.reply` (it calls
        # its model itself): tag those too, in classes defined before now and after.
        pending = [Agent]
        while pending:
            cls = pending.pop()
            _tag_replies(cls)
            pending.extend(cls.__subclasses__())
        Agent.__init_subclass__ = _tagging_init_subclass(hook)  # type: ignore[method-assign]


def _tag_replies(cls: type[Agent]) -> None:
    """Wrap the `reply`, `reply_stream` and `compress_context` that `cls` itself defines
    (once)."""
    own = cls.__dict__
    reply, stream = own.get("reply"), own.get("reply_stream")
    if inspect.iscoroutinefunction(reply) and not getattr(reply, "__agentscope_rft_wrapped__", 0):
        cls.reply = _wrap_reply(reply)  # type: ignore[method-assign]
    if inspect.isasyncgenfunction(stream) and not getattr(stream, "__agentscope_rft_wrapped__", 0):
        cls.reply_stream = _wrap_reply_stream(stream)  # type: ignore[method-assign]
    compress = own.get("compress_context")
    if inspect.iscoroutinefunction(compress) and not getattr(
        compress, "__agentscope_rft_wrapped__", 0
    ):
        cls.compress_context = _wrap_compress(compress)  # type: ignore[method-assign]


def _tagging_init_subclass(original: Any) -> Any:
    def init_subclass(cls: type[Agent], **kwargs: Any) -> None:
        if original is not None:
            original.__func__(cls, **kwargs)
        else:
            super(Agent, cls).__init_subclass__(**kwargs)
        _tag_replies(cls)

    init_subclass.__agentscope_rft_wrapped__ = True  # type: ignore[attr-defined]
    return classmethod(init_subclass)


def own_provider(model: OpenAIChatModel) -> OpenAIChatModel:
    """Keep `model` talking to its own provider inside episodes: its calls are not redirected to
    the policy, not recorded and not trained (a fixed judge, classifier or reranker that an
    AgentScope component calls for an agent). Returns `model`.

    Example:
        >>> router = ModelRouterMiddleware(own_provider(gpt4o_mini), candidates)  # doctest: +SKIP
    """
    if not isinstance(model, OpenAIChatModel):
        raise TypeError(
            f"own_provider takes an AgentScope OpenAIChatModel, got {type(model).__name__}: "
            "other chat models are never redirected, so they need no marking"
        )
    if _BOUND_SCOPE in model.__dict__:
        raise ValueError(
            "own_provider was given the episode's `model`, whose provider is the policy: build "
            "an OpenAIChatModel of your own (its base URL, key and model name) for calls that "
            "should not reach the policy"
        )
    model.__dict__[_OWN_PROVIDER] = True
    return model


def rollout_model(
    scope: RolloutScope,
    model_name: str,
    *,
    stream: bool = False,
    parameters: OpenAIChatModel.Parameters | None = None,
) -> OpenAIChatModel:
    """The AgentScope model handed to a workflow: bound to the rollout's gateway URL.

    Example:
        >>> model = rollout_model(scope, "policy")  # doctest: +SKIP
        >>> agent = Agent(name="a", system_prompt="...", model=model)  # doctest: +SKIP
    """
    install()
    # The model's own client is only used outside the rollout's scope; without a pool to share
    # it would build its own (an SSL context: ~25 ms on the event loop, for every episode).
    client_kwargs = {"http_client": scope.http_client} if scope.http_client is not None else None
    model = OpenAIChatModel(
        credential=OpenAICredential(api_key=SecretStr(scope.api_key), base_url=scope.base_url),
        model=model_name,
        stream=stream,
        parameters=parameters,
        max_retries=2,
        client_kwargs=client_kwargs,
    )
    model.__dict__[_BOUND_SCOPE] = scope
    return model
