"""The engine contract shared by the embedded (transformers) and vLLM engines.

An engine serves one policy. The gateway talks to it at the chat level (`chat` yields events:
content deltas while generating, then one `ChoiceDone` per choice with the exact sampled token ids
and log-probs); trainers and tools can also use the token level (`generate`). `load_weights`
swaps in new weights and bumps `policy_version`; every finished choice carries the version that
produced it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from agentscope_rft.types import JSON, SamplingParams, ToolCall

if TYPE_CHECKING:
    import torch


class EngineError(Exception):
    """A request the engine cannot serve. `status` is the HTTP status the gateway returns."""

    def __init__(self, message: str, *, status: int = 400, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.param = param


class ContextWindowError(EngineError):
    """The prompt does not fit the model's context window."""


def completion_room(prompt_len: int, max_model_len: int, max_tokens: int | None) -> int:
    """How many tokens a request may sample after its prompt: `max_tokens` (or all the room
    left), cut to the context window (the gateway counts the cut, see `note_context_cap`).

    Raises:
        ContextWindowError: the prompt fills the window.

    Example:
        >>> completion_room(100, 512, 1000)
        412
    """
    room = max_model_len - prompt_len
    if room < 1:
        raise ContextWindowError(
            f"the conversation is {prompt_len} tokens, longer than the context window "
            f"of {max_model_len} tokens; shorten the messages",
            param="messages",
        )
    return min(max_tokens or room, room)


@dataclass(slots=True)
class GenerationOutput:
    """One sampled continuation of a prompt."""

    completion_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    """`stop` (end-of-sequence token or stop string) or `length` (max_tokens / context window)."""
    policy_version: int
    top_logprobs: list[list[tuple[int, float]]] | None = None
    stop_string: str | None = None
    """The stop string that ended generation (its tokens are in `completion_ids`)."""


@dataclass(slots=True)
class ChatRequest:
    """A validated chat request as the gateway hands it to an engine."""

    messages: list[JSON]
    sampling: SamplingParams
    tools: list[JSON] | None = None
    tool_choice: str | JSON | None = None
    rollout_id: str | None = None
    agent_name: str | None = None
    request_id: str = ""
    stream: bool = False
    """Whether the caller wants `ContentDelta` events (they cost a decode per token)."""
    response_format: JSON | None = None
    """OpenAI `response_format` (`json_object` / `json_schema`), already checked with
    `engines.structured.grammar_for`; None: unconstrained."""
    parallel_tool_calls: bool = True
    """False: a reply hands back its first tool call only (as OpenAI and vLLM do); the sampled
    tokens, all calls included, are what is recorded and what the next prompt continues."""
    chat_template_kwargs: JSON | None = None
    """More variables for the chat template (vLLM's extension; Qwen3: `enable_thinking`)."""


@dataclass(slots=True)
class ChoiceResult:
    index: int
    completion_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    """OpenAI finish reason: `stop`, `length` or `tool_calls`."""
    policy_version: int
    text: str
    """The generated text (without the end-of-sequence token and stop string)."""
    content: str | None
    reasoning: str | None = None
    """The thinking split off the text (`engine.reasoning_parser`); None: none."""
    tool_calls: list[ToolCall] = field(default_factory=list)
    top_logprobs: list[list[tuple[int, float]]] | None = None


@dataclass(slots=True)
class PromptReady:
    """First event of a chat: the exact prompt token ids."""

    prompt_ids: list[int]
    reused_tokens: int = 0


@dataclass(slots=True)
class ContentDelta:
    """Content text that is final and may be streamed to the client now."""

    index: int
    text: str


@dataclass(slots=True)
class ReasoningDelta:
    """Thinking text (`engine.reasoning_parser`) that is final and may be streamed now."""

    index: int
    text: str


@dataclass(slots=True)
class ChoiceDone:
    choice: ChoiceResult


ChatEvent = PromptReady | ContentDelta | ReasoningDelta | ChoiceDone


@runtime_checkable
class Engine(Protocol):
    """What the gateway, explorer and weight sync need from an inference engine.

    Example:
        >>> async for event in engine.chat(request):  # doctest: +SKIP
        ...     if isinstance(event, ChoiceDone):
        ...         print(event.choice.completion_ids)
    """

    @property
    def model_name(self) -> str: ...

    @property
    def policy_version(self) -> int: ...

    @property
    def max_model_len(self) -> int: ...

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    def token_texts(self, token_ids: Sequence[int]) -> list[str]:
        """The text of each token on its own (for OpenAI `logprobs` content)."""
        ...

    def chat(self, request: ChatRequest) -> AsyncIterator[ChatEvent]:
        """The request's events. Abort contract: cancelling the task that iterates them (or
        closing the iterator) stops generating for this request, so the engine goes idle; the
        gateway aborts a closed rollout's calls this way."""
        ...

    async def generate(
        self, prompt_ids: list[int], sampling: SamplingParams
    ) -> list[GenerationOutput]: ...

    async def load_weights(self, weights: Mapping[str, torch.Tensor] | Path, version: int) -> float:
        """Swap in new weights (a state dict, or a checkpoint folder) as `version`.

        Requests in flight finish on the old weights; later ones use the new. Returns the seconds
        the swap took (the pause included).
        """
        ...


def check_engine(engine: Engine) -> None:
    """Raise the engine's error when it reports it can no longer serve the run (an engine with a
    `check()` method: vLLM's, when a replica crashed past `engine.max_restarts`); else nothing.

    Example:
        >>> check_engine(object())  # an engine that never fails for good
    """
    check = getattr(engine, "check", None)
    if check is not None:
        check()


def forget_rollout(engine: Engine, rollout_id: str) -> None:
    """Let the engine drop what it keeps for a rollout's later calls (the sampled tokens a
    continuing conversation reuses: `chat.PromptBuilder`), once the rollout is closed.

    Example:
        >>> forget_rollout(object(), "r1")  # an engine that keeps nothing per rollout
    """
    forget = getattr(engine, "forget_rollout", None)
    if forget is not None:
        forget(rollout_id)


def engine_metrics(engine: Engine) -> dict[str, float]:
    """The engine's own counters (prefix cache hit rate, syncs, ...) under `engine/`, if any.

    Example:
        >>> engine_metrics(object())  # an engine without counters
        {}
    """
    metrics = getattr(engine, "metrics", None)
    if metrics is None:
        return {}
    return {f"engine/{key}": float(value) for key, value in metrics().items()}
