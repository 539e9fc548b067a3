"""Helpers for testing agent apps and the training stack without a capable model.

`train_scripted_model` overfits a tiny model on given conversations so that greedy decoding
reproduces their assistant turns token for token. An AgentScope app whose episodes follow those
conversations then runs for real (tool calls included) on a model small enough for CI.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path

import torch

from agentscope_rft.chat.reasoning import (
    ReasoningParser,
    prompt_opens_thinking,
    resolve_reasoning_parser,
)
from agentscope_rft.chat.template import ChatFormatError, ChatRenderer, token_text
from agentscope_rft.engines.base import (
    ChatEvent,
    ChatRequest,
    ChoiceDone,
    ContentDelta,
    EngineError,
    GenerationOutput,
    PromptReady,
    ReasoningDelta,
)
from agentscope_rft.models import (
    build_once,
    build_tiny_model,
    cache_root,
    load_tokenizer,
    resolve_model,
)
from agentscope_rft.trainers.batch import trained_runs
from agentscope_rft.types import JSON, SamplingParams

logger = logging.getLogger(__name__)

_MIN_TOKEN_PROB = 0.98

Conversation = tuple[list[JSON], list[JSON] | None]
"""OpenAI-format messages (assistant turns included) and the tool schemas they were given."""


def reproduces(model: torch.nn.Module, ids: list[int], mask: list[int]) -> bool:
    """Whether greedy decoding regenerates every assistant span of `ids` exactly."""
    with torch.no_grad():
        for start, end in trained_runs(mask):
            prompt = torch.tensor([ids[:start]])
            out = model.generate(  # type: ignore[operator]
                prompt,
                attention_mask=torch.ones_like(prompt),
                max_new_tokens=end - start,
                do_sample=False,
            )
            if out[0, start:].tolist() != ids[start:end]:
                return False
    return True


def scripted_model(
    conversations: Sequence[Conversation],
    *,
    hidden_size: int = 128,
    num_layers: int = 2,
    max_steps: int = 1000,
    lr: float = 3e-3,
    seed: int = 0,
) -> Path:
    """`train_scripted_model`, cached by content in the cache folder (trained once per machine).

    Example:
        >>> path = scripted_model([(messages, tools)])  # doctest: +SKIP
    """
    # Keyed on what training sees (tokens and masks), not on incidental message fields.
    renderer = ChatRenderer(load_tokenizer(resolve_model("smollm2-135m-instruct")))
    encoded = [renderer.render_ids_with_mask(msgs, tools) for msgs, tools in conversations]
    settings = [hidden_size, num_layers, max_steps, lr, seed, _MIN_TOKEN_PROB]
    key = hashlib.sha256(json.dumps([encoded, settings]).encode())
    target = cache_root() / "scripted" / key.hexdigest()[:16]
    target.parent.mkdir(parents=True, exist_ok=True)

    def build(tmp: Path) -> None:
        train_scripted_model(
            conversations,
            tmp,
            hidden_size=hidden_size,
            num_layers=num_layers,
            max_steps=max_steps,
            lr=lr,
            seed=seed,
        )

    return build_once(target, build)


def train_scripted_model(
    conversations: Sequence[Conversation],
    out_dir: str | Path,
    *,
    hidden_size: int = 128,
    num_layers: int = 2,
    max_steps: int = 1000,
    lr: float = 3e-3,
    seed: int = 0,
) -> Path:
    """Train a tiny model until greedy decoding reproduces the conversations' assistant turns.

    Raises:
        RuntimeError: the model did not memorize the conversations within `max_steps`.

    Example:
        >>> path = train_scripted_model(  # doctest: +SKIP
        ...     [([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}],
        ...       None)], "/tmp/scripted")
    """
    from transformers import AutoModelForCausalLM

    out = build_tiny_model(out_dir, num_layers=num_layers, hidden_size=hidden_size, seed=seed)
    renderer = ChatRenderer(load_tokenizer(resolve_model("smollm2-135m-instruct")))
    encoded = [renderer.render_ids_with_mask(msgs, tools) for msgs, tools in conversations]
    torch.manual_seed(seed)
    rng = random.Random(seed)
    model = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    margins = dict.fromkeys(range(len(encoded)), 0.0)
    for step in range(max_steps):
        model.train()
        rng_index = rng.randrange(len(encoded))
        ids, mask = encoded[rng_index]
        # Logits only where a token is trained: the vocabulary projection dominates the cost.
        positions = torch.tensor([i - 1 for i, m in enumerate(mask) if m and i > 0])
        hidden = model.model(input_ids=torch.tensor([ids])).last_hidden_state[0]  # [T, H]
        logits = model.lm_head(hidden[positions])  # [M, V]
        targets = torch.tensor(ids)[positions + 1]
        token_logprobs = logits.log_softmax(-1).gather(-1, targets.unsqueeze(-1))  # [M, 1]
        loss = -token_logprobs.mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        margins[rng_index] = float(token_logprobs.min().exp())
        # Every target token must be clearly the argmax, so tiny numeric differences (batching,
        # padding) can never flip a greedy choice.
        if step % 25 == 24 and min(margins.values()) > _MIN_TOKEN_PROB:
            model.eval()
            if all(reproduces(model, ids, mask) for ids, mask in encoded):
                logger.info("scripted model memorized its conversations in %d steps", step + 1)
                model.save_pretrained(out)
                return out
    raise RuntimeError(
        f"the scripted model did not memorize the conversations in {max_steps} steps"
    )


class ScriptedEngine:
    """A fast engine stub for tests and gateway benchmarks: replies come from a function.

    Prompts are rendered with the real chat template (or `chat_template`) and replies tokenized
    with the real tokenizer, so recorded calls look like a real engine's; log-probs are a
    constant. Replies that think (`<think>...</think>`) are split as `reasoning_parser` says,
    as the real engines do.

    Example:
        >>> engine = ScriptedEngine(lambda messages, tools: "hello")  # doctest: +SKIP
    """

    def __init__(
        self,
        reply: Callable[[list[JSON], list[JSON] | None], str],
        *,
        model: str = "tiny-random",
        served_model_name: str = "scripted",
        logprob: float = -0.5,
        chat_template: str | None = None,
        reasoning_parser: ReasoningParser = "auto",
    ) -> None:
        from agentscope_rft.engines.chat import PromptBuilder

        self.tokenizer = load_tokenizer(resolve_model(model))
        self.renderer = ChatRenderer(self.tokenizer, chat_template)
        self.prompts = PromptBuilder(self.renderer)
        self.split_thinking = resolve_reasoning_parser(
            reasoning_parser, self.renderer.chat_template, self.tokenizer
        )
        self._reply = reply
        self._name = served_model_name
        self._version = 0
        self._logprob = logprob
        self.requests: list[ChatRequest] = []

    @property
    def model_name(self) -> str:
        return self._name

    @property
    def policy_version(self) -> int:
        return self._version

    @property
    def max_model_len(self) -> int:
        return 8192

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    def forget_rollout(self, rollout_id: str) -> None:
        """Drop the rollout's turns kept for prompt-token reuse (it is closed: no more calls)."""
        self.prompts.forget(rollout_id)

    def token_texts(self, token_ids: Sequence[int]) -> list[str]:
        return [token_text(self.tokenizer, t) for t in token_ids]

    def _complete(self, text: str, sampling: SamplingParams) -> GenerationOutput:
        ids = [*self.renderer.encode(text), self.renderer.end_of_turn_id]
        finish = "stop"
        if sampling.max_tokens is not None and len(ids) > sampling.max_tokens:
            ids, finish = ids[: sampling.max_tokens], "length"
        return GenerationOutput(ids, [self._logprob] * len(ids), finish, self._version)

    async def generate(
        self, prompt_ids: list[int], sampling: SamplingParams
    ) -> list[GenerationOutput]:
        return [self._complete("ok", sampling) for _ in range(sampling.n)]

    async def chat(self, request: ChatRequest) -> AsyncIterator[ChatEvent]:
        from agentscope_rft.engines.chat import assemble_choice

        self.requests.append(request)
        try:
            prompt_ids, reused = self.prompts.build(request)
        except ChatFormatError as exc:
            raise EngineError(str(exc), param=exc.param) from exc
        yield PromptReady(prompt_ids, reused)
        choices = []
        parse = bool(request.tools) and request.tool_choice != "none"
        opened = self.split_thinking and prompt_opens_thinking(self.tokenizer, prompt_ids)
        for index in range(request.sampling.n):
            output = self._complete(self._reply(request.messages, request.tools), request.sampling)
            choice = assemble_choice(
                index,
                output,
                self.tokenizer,
                {self.renderer.end_of_turn_id},
                parse,
                id_prefix=f"call_{request.request_id[-8:]}",
                parallel_tool_calls=request.parallel_tool_calls,
                split_thinking=self.split_thinking,
                thinking_opened=opened,
            )
            if request.stream and choice.reasoning:
                yield ReasoningDelta(index, choice.reasoning)
            if request.stream and choice.content:
                yield ContentDelta(index, choice.content)
            choices.append(choice)
            yield ChoiceDone(choice)
        self.prompts.remember(request, prompt_ids, choices)

    async def load_weights(self, weights: Mapping[str, torch.Tensor] | Path, version: int) -> float:
        self._version = version
        return 0.0
