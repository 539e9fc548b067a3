"""The vLLM engine's calls: token ids to `/v1/completions`, or messages to vLLM's own chat.

With the engine's rendering (`chat_rendering="engine"`) prompts are rendered by the project's
chat layer, exactly as the embedded engine does (reusing the token ids an episode's earlier calls
sampled), sent as token ids to `/v1/completions`, and Hermes tool calls are parsed here. With
`chat_rendering="vllm"` messages go to `/v1/chat/completions`: vLLM renders them with the model's
template and parses tool calls with its `--tool-call-parser`; prompt ids come back with the
response. Either way vLLM is called non-streamed with `return_token_ids` and log-probs, and
streamed clients get the final content as one delta.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Sequence

from transformers import PreTrainedTokenizerBase

from agentscope_rft.chat.reasoning import prompt_opens_thinking, split_reasoning
from agentscope_rft.chat.template import (
    ChatFormatError,
    ChatRenderer,
    normalize_messages,
    normalize_tools,
)
from agentscope_rft.engines import vllm_wire as wire
from agentscope_rft.engines.base import (
    ChatEvent,
    ChatRequest,
    ChoiceDone,
    ChoiceResult,
    ContentDelta,
    ContextWindowError,
    EngineError,
    GenerationOutput,
    PromptReady,
    ReasoningDelta,
    completion_room,
)
from agentscope_rft.engines.chat import PromptBuilder, assemble_choice
from agentscope_rft.engines.vllm_replicas import ReplicaPool
from agentscope_rft.engines.vllm_weights import ServedWeights
from agentscope_rft.types import JSON, SamplingParams


class VLLMCalls:
    """Generation and chat calls to the replicas, recorded with the policy version current at
    admission.

    Example:
        >>> outputs = await calls.complete([1, 2, 3], SamplingParams(), None)  # doctest: +SKIP
    """

    def __init__(
        self,
        pool: ReplicaPool,
        weights: ServedWeights,
        tokenizer: PreTrainedTokenizerBase,
        renderer: ChatRenderer,
        prompts: PromptBuilder,
        split_thinking: bool = False,
    ) -> None:
        self.pool = pool
        self.weights = weights
        self.tokenizer = tokenizer
        self.renderer = renderer
        self.prompts = prompts
        self.split_thinking = split_thinking
        """Split `<think>...</think>` off replies (`engine.reasoning_parser`)."""
        self.stop_ids = {int(tokenizer.eos_token_id), renderer.end_of_turn_id}

    def decode(self, token_ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        text = self.tokenizer.decode(
            list(token_ids),
            skip_special_tokens=skip_special_tokens,
            clean_up_tokenization_spaces=False,
        )
        assert isinstance(text, str)
        return text

    async def complete(
        self,
        prompt_ids: list[int],
        sampling: SamplingParams,
        rollout_id: str | None,
        response_format: JSON | None = None,
    ) -> list[GenerationOutput]:
        """`prompt_ids` completed by the rollout's replica (`/v1/completions`)."""
        pool = self.pool
        max_tokens = completion_room(len(prompt_ids), pool.max_model_len, sampling.max_tokens)
        replica = pool.pick(rollout_id)
        async with pool.admitted(replica):
            version, model = self.weights.version, self.weights.active_model
            body = self.stop_at_turn_end(
                wire.completions_body(model, prompt_ids, sampling, max_tokens), sampling
            )
            if response_format is not None:
                body["response_format"] = response_format
            data = await pool.post(replica, "/v1/completions", body)
        choices = sorted(data["choices"], key=lambda c: c.get("index", 0))
        return [wire.parse_completion(c, sampling.top_logprobs, version) for c in choices]

    async def chat(self, request: ChatRequest) -> AsyncIterator[ChatEvent]:
        """A chat call rendered by the engine's chat layer (Hermes tool calls parsed here)."""
        try:
            prompt_ids, reused = self.prompts.build(request)
        except ChatFormatError as exc:
            raise EngineError(str(exc), param=exc.param) from exc
        completion_room(len(prompt_ids), self.pool.max_model_len, request.sampling.max_tokens)
        yield PromptReady(prompt_ids=prompt_ids, reused_tokens=reused)
        outputs = await self.complete(
            prompt_ids, request.sampling, request.rollout_id, request.response_format
        )
        parse_tools = bool(request.tools) and request.tool_choice != "none"
        opened = self.split_thinking and prompt_opens_thinking(self.tokenizer, prompt_ids)
        choices = [
            assemble_choice(
                index, output, self.tokenizer, self.stop_ids, parse_tools,
                id_prefix=f"call_{request.request_id or uuid.uuid4().hex[:8]}",
                parallel_tool_calls=request.parallel_tool_calls,
                split_thinking=self.split_thinking, thinking_opened=opened,
            )
            for index, output in enumerate(outputs)
        ]  # fmt: skip
        for choice in choices:
            if request.stream and choice.reasoning:
                yield ReasoningDelta(index=choice.index, text=choice.reasoning)
            if request.stream and choice.content:
                yield ContentDelta(index=choice.index, text=choice.content)
            yield ChoiceDone(choice)
        self.prompts.remember(request, prompt_ids, choices)

    def stop_at_turn_end(self, body: JSON, sampling: SamplingParams) -> JSON:
        """`body` stopping at the chat template's end of turn where the model's eos differs (a
        base model's tokenizer with a ChatML template: eos <|endoftext|>, turns <|im_end|>),
        as the embedded engine does; not with `ignore_eos`, which ignores both there."""
        if self.renderer.end_of_turn_id != self.tokenizer.eos_token_id and not sampling.ignore_eos:
            body["stop_token_ids"] = [self.renderer.end_of_turn_id]
        return body

    async def chat_vllm(self, request: ChatRequest) -> AsyncIterator[ChatEvent]:
        """A chat call rendered by vLLM (`/v1/chat/completions`, its tool-call parser)."""
        try:  # the same validation (and error messages) as the engine's own rendering
            normalize_messages(request.messages)
            normalize_tools(request.tools)
        except ChatFormatError as exc:
            raise EngineError(str(exc), param=exc.param) from exc
        sampling = request.sampling
        pool = self.pool
        replica = pool.pick(request.rollout_id)
        max_tokens = min(sampling.max_tokens or pool.max_model_len, pool.max_model_len)
        async with pool.admitted(replica):
            version, model = self.weights.version, self.weights.active_model
            body = self.stop_at_turn_end(
                wire.chat_body(
                    model,
                    request.messages,
                    request.tools,
                    request.tool_choice,
                    sampling,
                    max_tokens,
                    request.parallel_tool_calls,
                ),
                sampling,
            )
            if request.response_format is not None:
                body["response_format"] = request.response_format
            if request.chat_template_kwargs:
                body["chat_template_kwargs"] = request.chat_template_kwargs
            try:
                data = await pool.post(replica, "/v1/chat/completions", body)
            except ContextWindowError as exc:
                # vLLM renders the prompt here, so only its refusal tells how long it is; a
                # max_tokens past the window is an upper bound, as on the engine's own rendering
                room = wire.room_left(str(exc), pool.max_model_len)
                if room is None or room >= max_tokens:
                    raise
                body["max_tokens"] = room
                data = await pool.post(replica, "/v1/chat/completions", body)
        prompt_ids = [int(t) for t in data.get("prompt_token_ids") or []]
        yield PromptReady(prompt_ids=prompt_ids)
        for raw in sorted(data["choices"], key=lambda c: c.get("index", 0)):
            ids, logprobs, top, content, tool_calls = wire.parse_chat_choice(
                raw, sampling.top_logprobs
            )
            reasoning, content = self._vllm_reasoning(raw, content, prompt_ids)
            text_ids = ids[:-1] if ids and ids[-1] in self.stop_ids else ids
            text = self.decode(text_ids)
            stop = wire.stop_string(raw)
            if stop is not None and stop in text:
                text = text[: text.find(stop)]
            choice = ChoiceResult(
                index=int(raw.get("index", 0)),
                completion_ids=ids,
                logprobs=logprobs,
                finish_reason=wire.finish_reason(raw),
                policy_version=version,
                text=text,
                content=content if content or not tool_calls else None,
                reasoning=reasoning,
                tool_calls=tool_calls,
                top_logprobs=top,
            )
            if request.stream and choice.reasoning:
                yield ReasoningDelta(index=choice.index, text=choice.reasoning)
            if request.stream and choice.content:
                yield ContentDelta(index=choice.index, text=choice.content)
            yield ChoiceDone(choice)

    def _vllm_reasoning(
        self, raw: JSON, content: str | None, prompt_ids: list[int]
    ) -> tuple[str | None, str | None]:
        """(reasoning, content) of a choice of vLLM's chat: vLLM's own split when it ran with
        `--reasoning-parser` (`engine.extra_args`), else ours of its content."""
        message = raw.get("message") or {}
        for key in ("reasoning_content", "reasoning"):
            if isinstance(message.get(key), str):
                return message[key], content
        if not self.split_thinking or content is None:
            return None, content
        split = split_reasoning(content, prompt_opens_thinking(self.tokenizer, prompt_ids))
        return split.reasoning, split.answer
