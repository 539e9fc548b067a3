"""The embedded engine: a transformers model on CPU or one CUDA device, no server process.

Concurrent requests are batched together (`ContinuousBatcher`); the chat layer renders prompts
(reusing sampled tokens across a rollout's calls) and parses Hermes tool calls. Weights swap
in-process between batches.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path

import torch
from llguidance import LLMatcher
from transformers import PreTrainedModel

from agentscope_rft.chat.reasoning import (
    ReasoningParser,
    prompt_opens_thinking,
    resolve_reasoning_parser,
)
from agentscope_rft.chat.template import ChatFormatError, ChatRenderer, token_text
from agentscope_rft.engines.attention import use_decode_attention
from agentscope_rft.engines.base import (
    ChatEvent,
    ChatRequest,
    ChoiceDone,
    ChoiceResult,
    ContentDelta,
    EngineError,
    GenerationOutput,
    PromptReady,
    ReasoningDelta,
    completion_room,
)
from agentscope_rft.engines.batcher import ContinuousBatcher
from agentscope_rft.engines.chat import PromptBuilder, TextStream, assemble_choice
from agentscope_rft.engines.cpu_dtype import pick_dtype
from agentscope_rft.engines.fused import FusedDecoder, fused_decode_unsupported
from agentscope_rft.engines.jobs import GenerationJob, WeightSwap, resolve
from agentscope_rft.engines.packed import pack_linear_weights, packing_unsupported, repack
from agentscope_rft.engines.prefix_cache import PrefixCache
from agentscope_rft.engines.structured import GrammarMask, grammar_for
from agentscope_rft.engines.threads import ThreadPolicy, confine_main_thread, in_own_thread
from agentscope_rft.engines.weights import copy_weights, free_weights, share_weights
from agentscope_rft.models import load_causal_lm, load_tokenizer, resolve_model
from agentscope_rft.types import JSON, SamplingParams

logger = logging.getLogger(__name__)


def pick_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def pick_threads(num_threads: int | None, device: torch.device) -> ThreadPolicy | None:
    """The engine thread's CPU threads: `num_threads` always if set; by default measured per
    forward size between all cores but one and all cores (see `threads.py`)."""
    if device.type != "cpu":
        return None
    if num_threads is not None:
        return ThreadPolicy(num_threads, num_threads)
    high = max(1, torch.get_num_threads())
    low = max(1, min(high, (os.cpu_count() or 1) - 1))
    logger.info("engine threads auto: %d or %d per forward size, by measured time", low, high)
    return ThreadPolicy(low, high)


def prefix_cache_unsupported(model: PreTrainedModel) -> str | None:
    """Why cached prefix KV would be wrong for `model` (None: it is exact).

    Blocks hold the KV of every layer for positions 0..n; a sliding-window or linear-attention
    layer keeps other state, so only all-full-attention models qualify.
    """
    config = model.config.get_text_config()
    layer_types = getattr(config, "layer_types", None) or []
    other = sorted({t for t in layer_types if t != "full_attention"})
    if other:
        return f"the model has {', '.join(other)} layers (only full attention is cached)"
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        return "the model uses sliding-window attention"
    return None


def available_memory(device: torch.device) -> int | None:
    """Bytes free for new allocations on `device` (None when it cannot be told)."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def prefix_cache_budget(device: torch.device, share: float = 1 / 8, most: int = 2**30) -> int:
    """The prefix cache's size when not configured: `share` of the free memory, at most `most`.

    Example:
        >>> 0 < prefix_cache_budget(torch.device("cpu")) <= 2**30
        True
    """
    free = available_memory(device)
    size = most if free is None else min(most, int(free * share))
    logger.info(
        "engine.prefix_cache_gib: %.2f GiB (1/8 of %s free, at most 1 GiB)",
        size / 2**30,
        f"{free / 2**30:.1f} GiB" if free is not None else "unknown",
    )
    return size


def load_weights_dir(path: Path) -> dict[str, torch.Tensor]:
    """All tensors of the safetensors files in an HF checkpoint folder."""
    from safetensors.torch import load_file

    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise EngineError(f"no *.safetensors files in {path}", status=404)
    state: dict[str, torch.Tensor] = {}
    for file in files:
        state.update(load_file(str(file)))
    return state


def _stamp(weights: Mapping[str, torch.Tensor]) -> tuple[tuple[str, int, int], ...] | None:
    """Which tensors `weights` are and how often each was written in place (a tensor's version
    counter, shared with the parameter it was detached from): equal stamps, equal weights. None
    for tensors without a version counter (made under `torch.inference_mode`)."""
    try:
        return tuple((name, t.data_ptr(), t._version) for name, t in weights.items())
    except RuntimeError:
        return None


class EmbeddedEngine:
    """Serves a local HF causal LM with continuous batching.

    Example:
        >>> engine = EmbeddedEngine("smollm2-135m-instruct")  # doctest: +SKIP
        >>> await engine.start()  # doctest: +SKIP
        >>> outs = await engine.generate([1, 2, 3], SamplingParams(max_tokens=8))  # doctest: +SKIP
    """

    def __init__(
        self,
        model: str | Path = "smollm2-135m-instruct",
        *,
        served_model_name: str | None = None,
        dtype: str = "auto",
        device: str = "auto",
        max_batch_size: int = 32,
        max_prefill_tokens: int = 8192,
        max_model_len: int | None = None,
        chat_template: str | None = None,
        reuse_prompt_tokens: bool = True,
        reasoning_parser: ReasoningParser = "auto",
        seed: int = 0,
        prefix_caching: bool = True,
        prefix_cache_gib: float | None = None,
        prefix_block_tokens: int = 16,
        prefill_chunk_tokens: int | None = 512,
        num_threads: int | None = None,
        fused_decode: bool = True,
        free_weights_while_training: bool = True,
    ) -> None:
        self.model_path = resolve_model(model)
        self._model_name = served_model_name or str(model)
        self._dtype_name = dtype
        self._device = pick_device(device)
        self._max_batch_size = max_batch_size
        self._max_prefill_tokens = max_prefill_tokens
        self._max_model_len_override = max_model_len
        self._seed = seed
        self._prefix_caching = prefix_caching
        self._prefix_cache_bytes = (
            int(prefix_cache_gib * 2**30) if prefix_cache_gib is not None else None
        )
        self._prefix_block_tokens = prefix_block_tokens
        self._prefill_chunk_tokens = prefill_chunk_tokens
        self._num_threads = num_threads
        self._fused_decode = fused_decode
        self._free_weights_while_training = free_weights_while_training
        self._refilled: tuple[tuple[str, int, int], ...] | None = None  # see idle_for_training
        self.tokenizer = load_tokenizer(self.model_path)
        self.renderer = ChatRenderer(self.tokenizer, chat_template)
        self.prompts = PromptBuilder(self.renderer, reuse=reuse_prompt_tokens)
        self.split_thinking = resolve_reasoning_parser(
            reasoning_parser, self.renderer.chat_template, self.tokenizer
        )
        self._batcher: ContinuousBatcher | None = None
        self.dtype: torch.dtype | None = None
        self.packed_layers = 0  # linear layers with oneDNN-packed weights (see packed.py)
        self.fused_decode = False  # decode steps run `FusedDecoder` (see fused.py)
        self.shared_weight_bytes = 0  # of the trainer's weights it computes with (share_weights)
        self._grammar_lock = asyncio.Lock()

    # ------------------------------------------------------------------ lifecycle
    @property
    def model_name(self) -> str:
        return self._model_name

    @property
    def policy_version(self) -> int:
        return self._running().policy_version

    @property
    def max_model_len(self) -> int:
        return self._running().max_model_len

    @property
    def batcher(self) -> ContinuousBatcher:
        return self._running()

    def _running(self) -> ContinuousBatcher:
        if self._batcher is None:
            raise EngineError("the engine is not started (await engine.start())", status=503)
        return self._batcher

    async def start(self) -> None:
        if self._batcher is not None:
            return
        threads = pick_threads(self._num_threads, self._device)
        if threads is not None and threads.high > 1:
            confine_main_thread()  # the engine thread's team is to be the only one (threads.py)
        self.dtype = await in_own_thread(pick_dtype, self._dtype_name, self._device)
        model = await in_own_thread(
            load_causal_lm, self.model_path, dtype=self.dtype, device=str(self._device)
        )
        if self._device.type == "cpu" and model.config._attn_implementation == "sdpa":
            use_decode_attention(model)  # CPU SDPA copies the whole KV cache every decode step
        self.packed_layers = 0
        if self._device.type == "cpu":
            unpacked = packing_unsupported(model)
            if unpacked:
                logger.info("engine linear weights not packed: %s", unpacked)
            else:
                self.packed_layers = pack_linear_weights(model)
        fused = None
        if self._fused_decode:
            reason = fused_decode_unsupported(model)
            if reason:
                logger.info("engine fused decode off: %s", reason)
            else:
                fused = FusedDecoder(model)
                # Every prefill and decode step runs fused: the fused groups' layers need no
                # packed copies of their own (SmolLM2-135M in bf16: 139 MB, and their repacking
                # after each weight swap).
                self.packed_layers -= fused.drop_module_packs()
        self.fused_decode = fused is not None
        limit = int(getattr(model.config.get_text_config(), "max_position_embeddings", 4096))
        max_len = min(self._max_model_len_override or limit, limit)
        prefix_cache = None
        if self._prefix_caching:
            reason = prefix_cache_unsupported(model)
            if reason:
                logger.info("engine prefix caching off: %s", reason)
            else:
                if self._prefix_cache_bytes is None:
                    self._prefix_cache_bytes = prefix_cache_budget(self._device)
                prefix_cache = PrefixCache(self._prefix_block_tokens, self._prefix_cache_bytes)
        self._batcher = ContinuousBatcher(
            model,
            self.tokenizer,
            max_batch_size=self._max_batch_size,
            max_prefill_tokens=self._max_prefill_tokens,
            max_model_len=max_len,
            seed=self._seed,
            prefix_cache=prefix_cache,
            prefill_chunk_tokens=self._prefill_chunk_tokens,
            threads=threads,
            fused=fused,
        )
        # The chat template's end of turn stops a reply even where the model's eos differs
        # (a base model's tokenizer with a ChatML template: eos <|endoftext|>, turns <|im_end|>).
        self._batcher.stop_token_ids.add(self.renderer.end_of_turn_id)
        self._batcher.start()
        logger.info(
            "embedded engine ready: %s on %s (%s), max_model_len %d, max batch %d, prefix cache %s"
            ", %d linear layers packed, fused decode %s",
            self.model_path.name,
            self._device,
            str(self.dtype).removeprefix("torch."),
            max_len,
            self._max_batch_size,
            f"{(self._prefix_cache_bytes or 0) / 2**30:.2g} GiB"
            if prefix_cache is not None
            else "off",
            self.packed_layers,
            "on" if self.fused_decode else "off",
        )

    async def close(self) -> None:
        if self._batcher is not None:
            await asyncio.to_thread(self._batcher.stop)
            self._batcher = None

    def forget_rollout(self, rollout_id: str) -> None:
        """Drop the rollout's turns kept for prompt-token reuse (it is closed: no more calls)."""
        self.prompts.forget(rollout_id)

    def metrics(self) -> dict[str, float]:
        """Engine counters for monitoring, the prefix cache's (hit rate, evictions) included."""
        return self._running().metrics()

    def token_texts(self, token_ids: Sequence[int]) -> list[str]:
        return [token_text(self.tokenizer, tid) for tid in token_ids]

    # ------------------------------------------------------------------ generation
    def _job(self, prompt_ids: list[int], sampling: SamplingParams) -> GenerationJob:
        batcher = self._running()
        room = completion_room(len(prompt_ids), batcher.max_model_len, sampling.max_tokens)
        loop = asyncio.get_running_loop()
        return GenerationJob(
            prompt_ids=prompt_ids,
            sampling=sampling,
            max_new_tokens=room,
            loop=loop,
            done=loop.create_future(),
        )

    async def generate(
        self, prompt_ids: list[int], sampling: SamplingParams
    ) -> list[GenerationOutput]:
        job = self._job(prompt_ids, sampling)
        self._running().submit(job)
        try:
            return await job.done
        finally:
            job.cancelled = True

    async def _matchers(self, response_format: JSON | None, n: int) -> list[LLMatcher] | None:
        """One grammar matcher per choice for `response_format` (None: unconstrained). The
        first builds the batcher's token masks (about a second: it indexes the vocabulary);
        both run off the event loop."""
        try:
            grammar = grammar_for(response_format)
        except ValueError as exc:
            raise EngineError(str(exc), param="response_format") from exc
        if grammar is None:
            return None
        batcher = self._running()
        if batcher.grammar_mask is None:
            async with self._grammar_lock:
                if batcher.grammar_mask is None:
                    vocab = max(len(self.tokenizer), batcher.vocab_size)
                    batcher.grammar_mask = await asyncio.to_thread(
                        GrammarMask, self.tokenizer, vocab, sorted(batcher.stop_token_ids)
                    )
        masks = batcher.grammar_mask
        try:
            return await asyncio.to_thread(lambda: [masks.matcher(grammar) for _ in range(n)])
        except ValueError as exc:
            raise EngineError(f"response_format: {exc}", param="response_format") from exc

    async def chat(self, request: ChatRequest) -> AsyncIterator[ChatEvent]:
        try:
            prompt_ids, reused = self.prompts.build(request)
        except ChatFormatError as exc:
            raise EngineError(str(exc), param=exc.param) from exc
        job = self._job(prompt_ids, request.sampling)
        job.matchers = await self._matchers(request.response_format, request.sampling.n)
        yield PromptReady(prompt_ids=prompt_ids, reused_tokens=reused)

        parse_tools = bool(request.tools) and request.tool_choice != "none"
        split = self.split_thinking
        opened = split and prompt_opens_thinking(self.tokenizer, prompt_ids)
        batcher = self._running()
        streams: list[TextStream] = []
        deltas: asyncio.Queue[tuple[int, int] | None] = asyncio.Queue()
        if request.stream:
            streams = [
                TextStream(
                    self.tokenizer,
                    request.sampling.stop,
                    parse_tools,
                    split_thinking=split,
                    thinking_opened=opened,
                )
                for _ in range(request.sampling.n)
            ]
            job.on_token = lambda index, token: deltas.put_nowait((index, token))
            # Resolved after every token callback ran (same FIFO), so None arrives last.
            job.done.add_done_callback(lambda _: deltas.put_nowait(None))
        batcher.submit(job)
        try:
            while request.stream and (item := await deltas.get()) is not None:
                index, token = item
                text = streams[index].push(token)
                if reasoning := streams[index].take_reasoning():
                    yield ReasoningDelta(index=index, text=reasoning)
                if text:
                    yield ContentDelta(index=index, text=text)
            outputs = await job.done
        finally:
            job.cancelled = True
        choices: list[ChoiceResult] = []
        for index, output in enumerate(outputs):
            choice = assemble_choice(
                index,
                output,
                self.tokenizer,
                batcher.stop_token_ids,
                parse_tools,
                id_prefix=f"call_{request.request_id or uuid.uuid4().hex[:8]}",
                parallel_tool_calls=request.parallel_tool_calls,
                split_thinking=split,
                thinking_opened=opened,
            )
            choices.append(choice)
            if streams:
                rest = streams[index].finish(choice.text)
                if reasoning := streams[index].take_reasoning():
                    yield ReasoningDelta(index=index, text=reasoning)
                if rest:
                    yield ContentDelta(index=index, text=rest)
            yield ChoiceDone(choice)
        self.prompts.remember(request, prompt_ids, choices)

    # ------------------------------------------------------------------ weights
    async def release_caches(self) -> None:
        """Free the prefix cache and the idle batch cache.

        Before a synchronous training step: the cached KV belongs to the weights the step is about
        to replace (the weight swap would drop it anyway), and the step needs the memory. Waits
        for running requests to finish, like a weight swap.
        """
        batcher = self._running()
        await self._between_steps(batcher.drop_idle_cache)  # (it clears the prefix cache too)

    async def share_weights(self, weights: Mapping[str, torch.Tensor]) -> int:
        """Compute with `weights` in place from now on (the trainer's live tensors, same device
        and dtype) and free the engine's own copy; returns the bytes shared. Whoever writes them
        holds the engine meanwhile (`idle_for_training`); `load_weights` of these same tensors then
        copies nothing and retakes the derived copies (packed, fused)."""
        batcher = self._running()
        shared: list[int] = []
        await self._between_steps(lambda: shared.append(share_weights(batcher.model, weights)))
        self.shared_weight_bytes = shared[0]
        return shared[0]

    @contextlib.asynccontextmanager
    async def idle_for_training(
        self, refill: Callable[[], Mapping[str, torch.Tensor]] | None = None
    ) -> AsyncIterator[None]:
        """Around a synchronous trainer step: the prefix and batch caches are freed (their KV
        belongs to the weights the step replaces, and the step needs the memory).

        When the engine shares the trainer's weights its thread waits until the step is over, so
        no request reads weights the optimizer is writing (requests queue meanwhile); its fused
        weight copies are freed for the step too and retaken from the new weights after it.
        When it keeps its own copy and `refill` gives the trainer's weights (and
        `free_weights_while_training` is on), that copy and every copy derived from it are freed
        for the step and taken from `refill()` after it (vLLM's sleep at level 2, in process):
        the weight sync that follows finds them current and copies nothing."""
        if self.shared_weight_bytes:
            async with self._parked(None):
                yield
        elif refill is not None and self._free_weights_while_training:
            async with self._parked(refill):
                yield
        else:
            await self.release_caches()
            yield

    @contextlib.asynccontextmanager
    async def _parked(
        self, refill: Callable[[], Mapping[str, torch.Tensor]] | None
    ) -> AsyncIterator[None]:
        """Hold the engine thread (no request runs) with its caches and derived weight copies
        freed until the block ends, then retake them from the weights it shares; with `refill`,
        its own weights are freed too and taken from `refill()` instead."""
        batcher = self._running()
        loop = asyncio.get_running_loop()
        parked: asyncio.Future[float] = loop.create_future()
        release = threading.Event()

        def park() -> None:  # in the engine thread, between steps, no row running
            batcher.drop_idle_cache()
            if batcher.fused is not None:
                batcher.fused.release()  # its q/k/v and gate/up copies: retaken below
            if refill is not None:
                free_weights(batcher.model)
            loop.call_soon_threadsafe(resolve, parked, 0.0)
            try:
                release.wait()
            finally:
                if refill is None:
                    repack(batcher.model)  # derived copies of the weights as the trainer left them
                else:
                    self._refill(refill)

        done = self._between_steps(park)
        try:
            await asyncio.wait({parked, done}, return_when=asyncio.FIRST_COMPLETED)
            if not parked.done():
                done.result()  # the engine stopped before it parked: its error
            yield
        finally:
            release.set()
            with contextlib.suppress(EngineError):  # stopped meanwhile: its next call says so
                await done

    def _refill(self, refill: Callable[[], Mapping[str, torch.Tensor]]) -> None:
        """Take the weights freed for a trainer step from the trainer (engine thread, parked).
        On failure the weights stay freed (requests fail) and the sync that follows the step
        copies them in, or raises what is wrong."""
        try:
            weights = refill()
            copy_weights(self._running().model, weights)
        except Exception:
            logger.exception("engine: the weights freed for the trainer step were not retaken")
            return
        self._refilled = _stamp(weights)

    async def load_weights(self, weights: Mapping[str, torch.Tensor] | Path, version: int) -> float:
        batcher = self._running()
        state = load_weights_dir(weights) if isinstance(weights, Path) else weights
        refilled, self._refilled = self._refilled, None
        if refilled is not None and not isinstance(weights, Path) and _stamp(state) == refilled:
            # taken from these very tensors after the step, unchanged since: only the version
            return await self._between_steps(lambda: None, version)
        return await self._between_steps(lambda: copy_weights(batcher.model, state), version)

    def _between_steps(
        self, apply: Callable[[], None], version: int | None = None
    ) -> asyncio.Future[float]:
        """Have the engine thread run `apply` between two steps with no row running (a weight
        swap: the prefix cache is cleared after it and the policy version set to `version`, by
        default unchanged); the future resolves with the seconds it waited and took."""
        batcher = self._running()
        loop = asyncio.get_running_loop()
        swap = WeightSwap(
            apply=apply,
            version=batcher.policy_version if version is None else version,
            loop=loop,
            done=loop.create_future(),
            requested_at=time.perf_counter(),
        )
        batcher.request_swap(swap)
        return swap.done
