"""Continuous batching for a transformers causal LM on one device.

One background thread owns the model. Requests from any event loop queue up; between decode steps
the thread admits waiting requests (one batched, left-padded prefill; `n` choices share it), merges
them into the running batch, and drops rows that finished. Weight swaps wait for the running batch
to drain, so every sequence is sampled from one policy version.

With a `PrefixCache`, a request attaches to the longest cached run of its prompt's token blocks
and prefills only the rest; the KV of every prefilled prompt and of every finished sequence
(prompt + completion) goes into the cache, so the next call of an agent episode (the same prefix
plus a tool result) and every episode sharing a system prompt reuse it. Waiting requests that
share an uncached prefix with one being admitted wait one step and then hit the cache. A prompt
whose uncached part is longer than `prefill_chunk_tokens` is prefilled in chunks, one per step,
between decode steps of the running batch.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch
from llguidance import LLMatcher
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from agentscope_rft.engines.base import EngineError, GenerationOutput
from agentscope_rft.engines.fused import FusedDecoder, Segment
from agentscope_rft.engines.kv_cache import (
    BatchCache,
    GrowingLayer,
    left_pad_mask,
    right_pad_mask,
)
from agentscope_rft.engines.prefill import (
    PrefillBatch,
    build_prefill,
    common_blocks,
    row_kv,
    token_columns,
)
from agentscope_rft.engines.prefix_cache import CachedBlock, PrefixCache
from agentscope_rft.engines.sampling import sample_next
from agentscope_rft.engines.structured import GrammarMask
from agentscope_rft.engines.threads import ThreadPolicy
from agentscope_rft.types import SamplingParams

logger = logging.getLogger(__name__)
_TRIM_COLUMNS = 64  # leading all-padding columns worth a copy of the cache to drop
_T = TypeVar("_T")

TokenCallback = Callable[[int, int], None]
"""Called from the engine thread with (choice index, token id) for streamed requests."""


@dataclass(eq=False)
class GenerationJob:
    """A queued request; results arrive on `done` (resolved on the caller's loop)."""

    prompt_ids: list[int]
    sampling: SamplingParams
    max_new_tokens: int
    loop: asyncio.AbstractEventLoop
    done: asyncio.Future[list[GenerationOutput]]
    on_token: TokenCallback | None = None
    matchers: list[LLMatcher] | None = None
    """One fresh grammar matcher per choice (`structured.GrammarMask.matcher`): the choices
    must follow the grammar."""
    outputs: list[GenerationOutput | None] = field(default_factory=list)
    cancelled: bool = False


@dataclass(eq=False)
class _Row:
    job: GenerationJob
    index: int
    generator: torch.Generator | None
    policy_version: int
    out_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top: list[list[tuple[int, float]]] | None = None
    finish_reason: str | None = None
    stop_string: str | None = None
    matcher: LLMatcher | None = None  # a constrained row's place in its grammar
    retired: bool = False  # answered; `_compact` removes its batch row before the answer goes out


@dataclass(eq=False)
class _Chunking:
    """A long prompt being prefilled one chunk per engine step."""

    job: GenerationJob
    cache: BatchCache | None  # one row: the KV of prompt_ids[:done] (transformers' forward)
    done: int
    kv: torch.Tensor | None = None  # fused prefill: [layers, 2, KVH, len(prompt_ids), D]


@dataclass(slots=True)
class _KVReader:
    """Reads positions [start, end) of one batch row's KV (for `PrefixCache.insert`)."""

    cache: BatchCache
    row: int
    columns: torch.Tensor  # the row's token columns, in position order

    def __call__(self, start: int, end: int) -> torch.Tensor:
        return row_kv(self.cache, self.row, self.columns[start:end])


@dataclass(eq=False)
class _WeightSwap:
    apply: Callable[[], None]
    version: int
    loop: asyncio.AbstractEventLoop
    done: asyncio.Future[float]
    requested_at: float


class ContinuousBatcher:
    """Serves generation jobs from a model in a background thread.

    Example:
        >>> batcher = ContinuousBatcher(model, tokenizer, max_batch_size=32)  # doctest: +SKIP
        >>> batcher.start()  # doctest: +SKIP
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        max_batch_size: int = 32,
        max_prefill_tokens: int = 8192,
        max_model_len: int,
        seed: int = 0,
        prefix_cache: PrefixCache | None = None,
        prefill_chunk_tokens: int | None = None,
        threads: ThreadPolicy | None = None,
        fused: FusedDecoder | None = None,
    ) -> None:
        self.model = model
        self.fused = fused
        self.threads = threads  # CPU threads per forward (None: leave torch's setting)
        self._threads_now = 0
        self.device = next(model.parameters()).device
        self.max_batch_size = max_batch_size
        self.max_prefill_tokens = max_prefill_tokens
        self.max_model_len = max_model_len
        self.stop_token_ids = _stop_token_ids(model, tokenizer)
        self.pad_id = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0)
        self._tokenizer = tokenizer
        self._num_layers = int(model.config.get_text_config().num_hidden_layers)
        self.vocab_size = int(model.config.get_text_config().vocab_size)
        self._rng = torch.Generator().manual_seed(seed)
        self.policy_version = 0
        self.prefix_cache = prefix_cache
        chunk = prefill_chunk_tokens
        if chunk is not None and prefix_cache is not None:  # chunks end on block boundaries
            size = prefix_cache.block_tokens
            chunk = max(size, chunk // size * size)
        self.prefill_chunk_tokens = chunk

        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._waiting: collections.deque[GenerationJob] = collections.deque()
        self._swaps: collections.deque[_WeightSwap] = collections.deque()
        self._thread: threading.Thread | None = None
        self._stopping = False

        self._rows: list[_Row] = []
        self._chunking: _Chunking | None = None
        self._cache = BatchCache(self._num_layers, max_batch_size)
        self._mask = torch.zeros(0, 0, dtype=torch.long, device=self.device)
        self._next_ids = torch.zeros(0, dtype=torch.long, device=self.device)
        self._positions = torch.zeros(0, dtype=torch.long, device=self.device)
        self.stats = collections.Counter[str]()
        self.grammar_mask: GrammarMask | None = None
        """Set (by the engine) before the first job with matchers is submitted."""

    # ----------------------------------------------------------------- public (any thread)
    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="embedded-engine", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stopping = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None

    def submit(self, job: GenerationJob) -> None:
        if self._stopping:
            raise EngineError("the engine is shutting down", status=503)
        with self._lock:
            self._waiting.append(job)
        self._wake.set()

    def request_swap(self, swap: _WeightSwap) -> None:
        with self._lock:
            self._swaps.append(swap)
        self._wake.set()

    @property
    def num_running(self) -> int:
        return len(self._rows)  # answered rows leave the batch before their answers go out

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    def metrics(self) -> dict[str, float]:
        """Counters: prompt tokens, prefilled tokens, decode steps and the prefix cache's."""
        out = {
            "policy_version": float(self.policy_version),
            "running": float(self.num_running),
            "waiting": float(len(self._waiting)),
            "prompt_tokens": float(self.stats["prompt_tokens"]),
            "prefill_tokens": float(self.stats["prefill_tokens"]),
            "prefill_chunks": float(self.stats["prefill_chunks"]),
            "decode_steps": float(self.stats["decode_steps"]),
            "decode_tokens": float(self.stats["decode_tokens"]),
            "constrained_tokens": float(self.stats["constrained_tokens"]),
        }
        if self.prefix_cache is not None:
            out.update(self.prefix_cache.metrics())
        if self.threads is not None:
            out.update(self.threads.summary())
        return out

    # ----------------------------------------------------------------- engine thread
    def _compute(self, tokens: int, forward: Callable[[], _T]) -> _T:
        """Run `forward` (over `tokens` tokens or rows) with the threads the policy picks, and
        tell it how long that took. Thread counts set here hold for this thread only."""
        policy = self.threads
        if policy is None:
            return forward()
        threads = policy.choose(tokens)
        if threads != self._threads_now:
            torch.set_num_threads(threads)
            self._threads_now = threads
        start = time.perf_counter()
        out = forward()
        policy.record(tokens, threads, time.perf_counter() - start)
        return out

    def _run(self) -> None:
        torch.set_grad_enabled(False)
        try:
            # All of the engine's tensors are inference tensors, made and updated in here (the
            # cache's buffers persist and grow inside forwards, so this must hold everywhere).
            with torch.inference_mode():
                self._serve()
        finally:  # whatever ends the thread (even a BaseException), nobody waits forever
            self._stopping = True
            stopped = EngineError("the engine stopped", status=503)
            self._fail_all(stopped)
            with self._lock:
                swaps, self._swaps = list(self._swaps), collections.deque()
            for swap in swaps:
                swap.loop.call_soon_threadsafe(_reject, swap.done, stopped)

    def _serve(self) -> None:
        while not self._stopping:
            admitted: list[GenerationJob] = []
            try:
                self._maybe_swap()
                admitted = self._admit()
                if admitted:
                    self._prefill(admitted)
                chunked = self._chunking is not None
                if chunked:
                    self._prefill_chunk()
                if self._rows:
                    self._decode_step()
                elif not admitted and not chunked:
                    self._wake.wait(timeout=0.5)
                    self._wake.clear()
            except Exception as exc:  # a failed forward must not kill the engine thread
                logger.exception("engine step failed; failing the running requests")
                # Admitted jobs left the queue but may not have rows yet: fail them too.
                self._fail_all(exc, admitted)

    def drop_idle_cache(self) -> None:
        """Free the batch cache's buffers (engine thread, no rows running: inside a swap)."""
        self._cache = BatchCache(self._num_layers, self.max_batch_size)

    def _maybe_swap(self) -> None:
        with self._lock:
            if not self._swaps or self._rows or self._chunking is not None:
                return
            swap = self._swaps.popleft()
        try:
            swap.apply()
            self.policy_version = swap.version
            if self.prefix_cache is not None:
                self.prefix_cache.clear()  # KV of the old weights must never be reused
            elapsed = time.perf_counter() - swap.requested_at
            swap.loop.call_soon_threadsafe(_resolve, swap.done, elapsed)
        except Exception as exc:
            swap.loop.call_soon_threadsafe(_reject, swap.done, exc)

    def _cached_tokens(self, job: GenerationJob) -> int:
        if self.prefix_cache is None:
            return 0
        return self.prefix_cache.peek(job.prompt_ids, self.policy_version)

    def _waits_for_sharer(self, job: GenerationJob, cached: int, admitted: list[Any]) -> bool:
        """Whether `job` shares uncached blocks with an admitted job (it then waits one step)."""
        if self.prefix_cache is None or self.prefix_cache.budget_bytes <= 0:
            return False
        size = self.prefix_cache.block_tokens
        limit = (len(job.prompt_ids) - 1) // size
        if cached // size >= limit:
            return False
        others = [a.prompt_ids for a in admitted]
        if self._chunking is not None:
            others.append(self._chunking.job.prompt_ids)
        return any(common_blocks(o, job.prompt_ids, size, limit) * size > cached for o in others)

    def _admit(self) -> list[GenerationJob]:
        admitted: list[GenerationJob] = []
        skipped: list[GenerationJob] = []
        with self._lock:
            if self._swaps:  # drain first: no new work until pending weights are in
                return admitted
            budget_rows = self.max_batch_size - self.num_running
            if self._chunking is not None:
                budget_rows -= self._chunking.job.sampling.n
            longest = new_total = 0
            while self._waiting:
                job = self._waiting[0]
                if job.cancelled:
                    self._waiting.popleft()
                    continue
                rows = job.sampling.n
                if rows > budget_rows and (admitted or self._rows or self._chunking):
                    break
                cached = self._cached_tokens(job)
                new = len(job.prompt_ids) - cached
                chunk = self.prefill_chunk_tokens
                if self._waits_for_sharer(job, cached, admitted) or (
                    chunk is not None and new > chunk and self._chunking is not None
                ):
                    skipped.append(self._waiting.popleft())
                    continue
                if chunk is not None and new > chunk:
                    self._chunking = self._start_chunking(self._waiting.popleft())
                    budget_rows -= rows
                    continue
                longest_if = max(longest, new)
                # Padded prefill computes every row at the longest row's length; the fused
                # (ragged) prefill computes real tokens only.
                cost = new_total + new if self.fused else longest_if * (len(admitted) + 1)
                if admitted and cost > self.max_prefill_tokens:
                    break
                new_total += new
                admitted.append(self._waiting.popleft())
                budget_rows -= rows
                longest = longest_if
            self._waiting.extendleft(reversed(skipped))
        return admitted

    def _cached_blocks(self, job: GenerationJob) -> list[CachedBlock]:
        """The cached blocks of the longest cached prefix of `job`'s prompt."""
        self.stats["prompt_tokens"] += len(job.prompt_ids)
        if self.prefix_cache is None:
            return []
        return self.prefix_cache.match(job.prompt_ids, self.policy_version)

    def _past_kv(self, job: GenerationJob) -> torch.Tensor | None:
        """The cached KV of the longest cached prefix of `job`'s prompt (or None)."""
        blocks = self._cached_blocks(job)
        if not blocks:
            return None
        return torch.cat([block.kv for block in blocks], dim=3)

    def _segment(self, job: GenerationJob) -> Segment:
        """`job`'s whole prompt as a fused-prefill segment: a KV buffer for all of it, holding
        its longest cached prefix already."""
        assert self.fused is not None
        blocks = self._cached_blocks(job)
        kv = self.fused.new_kv(len(job.prompt_ids))
        start = sum(block.kv.shape[3] for block in blocks)
        if blocks:
            torch.cat([block.kv for block in blocks], dim=3, out=kv[:, :, :, :start])
        return Segment(job.prompt_ids[start:], start, kv)

    def _cache_kv(self, token_ids: list[int], kv: torch.Tensor) -> None:
        """Put `kv` (`[layers, 2, KVH, >= len(token_ids), D]`) of `token_ids` in the cache."""
        if self.prefix_cache is not None:
            self.prefix_cache.insert(
                token_ids, lambda start, end: kv[:, :, :, start:end], self.policy_version
            )

    def _forward(self, batch: PrefillBatch) -> torch.Tensor:
        out = self._compute(
            batch.input_ids.numel(),
            lambda: self.model(
                input_ids=batch.input_ids,
                attention_mask=batch.attention_mask,
                position_ids=batch.position_ids,
                past_key_values=batch.cache,
                use_cache=True,
                logits_to_keep=1,
            ),
        )
        self.stats["prefill_tokens"] += int(batch.attention_mask[:, batch.past_len :].sum())
        return out.logits[:, -1, :].float()  # [J, V]

    def _cache_rows(
        self,
        token_ids: list[list[int]],
        cache: BatchCache,
        mask: torch.Tensor,
        rows: list[int] | None = None,
    ) -> None:
        """Put the KV of each `token_ids[k]` (batch row `rows[k]`, default k) in the cache."""
        if self.prefix_cache is None:
            return
        for k, ids in enumerate(token_ids):
            row = k if rows is None else rows[k]
            columns = token_columns(mask[row])
            if len(columns) < len(ids):  # cannot happen; never cache KV we cannot place
                continue
            self.prefix_cache.insert(ids, _KVReader(cache, row, columns), self.policy_version)

    def _prefill(self, jobs: list[GenerationJob]) -> None:
        if self.fused is not None:
            self._prefill_ragged(jobs)
            return
        past = [self._past_kv(job) for job in jobs]
        reused = [0 if kv is None else kv.shape[3] for kv in past]
        batch = build_prefill(
            [job.prompt_ids[n:] for job, n in zip(jobs, reused, strict=True)],
            past,
            self._num_layers,
            self.pad_id,
            self.device,
        )
        logits = self._forward(batch)
        self.stats["prefill_batches"] += 1
        self._cache_rows([job.prompt_ids for job in jobs], batch.cache, batch.attention_mask)
        self._join(
            jobs,
            lambda expand: self._merge(batch.cache, batch.attention_mask, expand),
            batch.position_ids[:, -1],
            logits,
        )

    def _prefill_ragged(self, jobs: list[GenerationJob]) -> None:
        """Prefill `jobs` with the fused forward: their new tokens in one unpadded batch."""
        assert self.fused is not None
        segments = [self._segment(job) for job in jobs]
        fused = self.fused
        tokens = sum(len(seg.token_ids) for seg in segments)
        logits = self._compute(tokens, lambda: fused.prefill(segments))
        assert logits is not None
        self.stats["prefill_batches"] += 1
        self.stats["prefill_tokens"] += tokens
        for job, seg in zip(jobs, segments, strict=True):
            self._cache_kv(job.prompt_ids, seg.kv)
        self._join_kv(jobs, [seg.kv for seg in segments], logits)

    def _join_kv(
        self, jobs: list[GenerationJob], kvs: list[torch.Tensor], logits: torch.Tensor
    ) -> None:
        """`_join` for jobs whose prompt KV is in `kvs` (one `[layers, 2, KVH, L, D]` each):
        copied once, straight into the running cache."""
        lengths = torch.tensor([kv.shape[3] for kv in kvs], device=self.device)
        # Requests still waiting will join soon (GRPO groups come in waves): room for them now
        # saves growing the cache again.
        coming = min(self.max_batch_size, len(self._rows) + len(jobs) + len(self._waiting))
        self._join(
            jobs,
            lambda expand: self._cache.append_rows([kvs[j] for j in expand], coming),
            lengths - 1,
            logits,
        )

    def _start_chunking(self, job: GenerationJob) -> _Chunking:
        if self.fused is not None:
            seg = self._segment(job)
            return _Chunking(job=job, cache=None, done=seg.start, kv=seg.kv)
        past = self._past_kv(job)
        cache = BatchCache(self._num_layers)
        done = 0
        if past is not None:
            done = past.shape[3]
            for layer, layer_cache in enumerate(cache.layers):
                assert isinstance(layer_cache, GrowingLayer)
                layer_cache.assign(
                    past[layer, 0][None].to(self.device),
                    past[layer, 1][None].to(self.device),
                    spare=len(job.prompt_ids) - done,
                )
        return _Chunking(job=job, cache=cache, done=done)

    def _prefill_chunk(self) -> None:
        """Prefill the next chunk of the long prompt being chunked; join it when complete."""
        state = self._chunking
        assert state is not None and self.prefill_chunk_tokens is not None
        if state.job.cancelled:
            self._chunking = None
            return
        prompt = state.job.prompt_ids
        end = min(state.done + self.prefill_chunk_tokens, len(prompt))
        if state.kv is not None:
            assert self.fused is not None
            last = end == len(prompt)
            segment = Segment(prompt[state.done : end], state.done, state.kv, logits=last)
            fused = self.fused
            logits = self._compute(end - state.done, lambda: fused.prefill([segment]))
            self.stats["prefill_chunks"] += 1
            self.stats["prefill_tokens"] += end - state.done
            state.done = end
            self._cache_kv(prompt[:end], state.kv)
            if last:
                assert logits is not None
                self._chunking = None
                self._join_kv([state.job], [state.kv], logits)
            return
        assert state.cache is not None
        mask = torch.ones(1, end, dtype=torch.long, device=self.device)
        positions = torch.arange(state.done, end, device=self.device)[None]
        batch = PrefillBatch(
            input_ids=torch.tensor([prompt[state.done : end]], device=self.device),
            attention_mask=mask,
            position_ids=positions,
            cache=state.cache,
            past_len=state.done,
        )
        logits = self._forward(batch)
        self.stats["prefill_chunks"] += 1
        state.done = end
        self._cache_rows([prompt[:end]], state.cache, mask)
        if end == len(prompt):
            self._chunking = None
            cache = state.cache
            self._join(
                [state.job],
                lambda expand: self._merge(cache, mask, expand),
                positions[:, -1],
                logits,
            )

    def _join(
        self,
        jobs: list[GenerationJob],
        append: Callable[[list[int]], torch.Tensor],
        last_positions: torch.Tensor,
        logits: torch.Tensor,
    ) -> None:
        """Add prefilled `jobs` to the running batch, one row per choice, and sample.

        `append(expand)` adds the KV of rows `jobs[expand[0]], jobs[expand[1]], ...` to the
        running cache and returns their attention mask (each row's tokens right-aligned)."""
        expand = []
        rows: list[_Row] = []
        for j, job in enumerate(jobs):
            job.outputs = [None] * job.sampling.n
            for index in range(job.sampling.n):
                expand.append(j)
                generator = None
                if job.sampling.seed is not None:
                    # Modulo 2**64: torch takes 64-bit seeds (a negative one as its 2**64 + s).
                    seed = (job.sampling.seed * 1_000_003 + index) % 2**64
                    generator = torch.Generator().manual_seed(seed)
                rows.append(
                    _Row(
                        job=job,
                        index=index,
                        generator=generator or self._rng,
                        policy_version=self.policy_version,
                        matcher=job.matchers[index] if job.matchers else None,
                    )
                )
        expand_t = torch.tensor(expand, device=self.device)
        mask = append(expand)
        if self._rows:  # the running rows keep their columns (see `BatchCache.merge`)
            length = max(mask.shape[1], self._mask.shape[1])
            self._mask = torch.cat(
                [right_pad_mask(self._mask, length), left_pad_mask(mask, length)]
            )
        else:
            self._mask = mask
        self._positions = torch.cat([self._positions, last_positions[expand_t] + 1])
        self._next_ids = torch.cat(
            [self._next_ids, torch.zeros(len(rows), dtype=torch.long, device=self.device)]
        )
        start = len(self._rows)
        self._rows.extend(rows)
        self._accept(logits[expand_t], list(range(start, start + len(rows))))

    def _merge(self, cache: BatchCache, mask: torch.Tensor, expand: list[int]) -> torch.Tensor:
        """Append rows `expand` of a prefilled `cache` (its `mask`) to the running cache."""
        if len(expand) != mask.shape[0]:
            cache.select_rows(torch.tensor(expand, device=self.device))
        self._cache.merge(cache)
        return mask[torch.tensor(expand, device=self.device)]

    def _decode_step(self) -> None:
        batch = len(self._rows)
        past = self._mask.shape[1]
        self._mask = torch.cat([self._mask, self._mask.new_ones(batch, 1)], dim=1)
        fused = self.fused
        if fused is not None:
            logits = self._compute(
                batch, lambda: fused.step(self._next_ids, self._positions, self._mask, self._cache)
            )
        else:
            out = self._compute(
                batch,
                lambda: self.model(
                    input_ids=self._next_ids.unsqueeze(1),
                    attention_mask=self._mask,
                    position_ids=self._positions.unsqueeze(1),
                    past_key_values=self._cache,
                    use_cache=True,
                    cache_position=torch.tensor([past], device=self.device),
                ),
            )
            logits = out.logits[:, -1, :]
        self._positions = self._positions + 1
        self.stats["decode_steps"] += 1
        self.stats["decode_tokens"] += batch
        self._accept(logits.float(), list(range(batch)))

    def _accept(self, logits: torch.Tensor, row_ids: list[int]) -> None:
        """Sample a token for each of `row_ids` and retire rows that finished."""
        rows = [self._rows[r] for r in row_ids]
        constrained = [(k, row.matcher) for k, row in enumerate(rows) if row.matcher is not None]
        if constrained:
            assert self.grammar_mask is not None
            logits = self.grammar_mask.apply(logits, constrained)
            self.stats["constrained_tokens"] += len(constrained)
        sampled = sample_next(logits, [r.job.sampling for r in rows], [r.generator for r in rows])
        # One write of the rows' next tokens and one read of their positions for the whole batch
        # (row by row, an engine on a GPU would wait for the device twice per row).
        ids = torch.tensor(row_ids, dtype=torch.long, device=self.device)
        self._next_ids[ids] = torch.tensor(sampled.token_ids, dtype=torch.long, device=self.device)
        positions = self._positions[ids].tolist()
        finished = []
        for k, (row_id, row) in enumerate(zip(row_ids, rows, strict=True)):
            token = sampled.token_ids[k]
            if row.matcher is not None and not row.matcher.consume_token(token):
                # The mask allowed only what the matcher accepts; end rather than go off-grammar.
                logger.error("grammar rejected a masked token: %s", row.matcher.get_error())
                row.finish_reason = "stop"
            row.out_ids.append(token)
            row.logprobs.append(sampled.logprobs[k])
            if row.job.sampling.top_logprobs:
                row.top = row.top or []
                row.top.append(sampled.top_logprobs[k] or [])
            if row.job.on_token is not None and not row.job.cancelled:
                row.job.loop.call_soon_threadsafe(row.job.on_token, row.index, token)
            self._check_finished(row, total_len=positions[k] + 1)
            if row.finish_reason is not None or row.job.cancelled:
                finished.append(row_id)
        if finished:
            self._retire(finished)

    def _check_finished(self, row: _Row, total_len: int) -> None:
        if row.finish_reason is not None:
            return
        token = row.out_ids[-1]
        if token in self.stop_token_ids and not row.job.sampling.ignore_eos:
            row.finish_reason = "stop"
            return
        stops = row.job.sampling.stop
        if stops:
            window = max(len(s) for s in stops) + 8
            tail = self._tokenizer.decode(row.out_ids[-window:], skip_special_tokens=False)
            for stop in stops:
                if stop in tail:
                    row.finish_reason = "stop"
                    row.stop_string = stop
                    return
        if len(row.out_ids) >= row.job.max_new_tokens or total_len >= self.max_model_len:
            row.finish_reason = "length"

    def _retire(self, finished: list[int]) -> None:
        # The KV of prompt + completion (all but the last sampled token, never fed) is cached,
        # so the episode's next call (this sequence + a tool result) prefills only its new part.
        done_rows = [r for r in finished if self._rows[r].policy_version == self.policy_version]
        self._cache_rows(
            [self._rows[r].job.prompt_ids + self._rows[r].out_ids[:-1] for r in done_rows],
            self._cache,
            self._mask,
            done_rows,
        )
        answered: list[GenerationJob] = []
        for row_id in finished:
            row = self._rows[row_id]
            job = row.job
            job.outputs[row.index] = GenerationOutput(
                completion_ids=row.out_ids,
                logprobs=row.logprobs,
                finish_reason=row.finish_reason or "length",
                policy_version=row.policy_version,
                top_logprobs=row.top,
                stop_string=row.stop_string,
            )
            if all(o is not None for o in job.outputs) and not job.done.done():
                answered.append(job)
            row.retired = True
        self._compact()  # moves only as many rows as leave
        # Answers go out last: a caller woken by one sees the batch already without its rows.
        for job in answered:
            outputs = [o for o in job.outputs if o is not None]
            job.loop.call_soon_threadsafe(_resolve, job.done, outputs)

    def _compact(self) -> None:
        """Drop the answered rows from the batch and its cache (the last running rows move
        into their places; the rows' order changes, nothing else)."""
        holes = [i for i, row in enumerate(self._rows) if row.retired]
        if not holes:
            return
        order = self._cache.remove_rows(holes)
        self._rows = [self._rows[i] for i in order]
        order_t = torch.tensor(order, dtype=torch.long, device=self.device)
        mask = self._mask[order_t]
        self._next_ids = self._next_ids[order_t]
        self._positions = self._positions[order_t]
        # Columns that are padding in every remaining row can go; that copies the cache, so
        # only once they are a quarter of it (masked padding costs attention reads meanwhile).
        used = mask.any(dim=0).nonzero()
        drop_front = int(used[0]) if len(used) else mask.shape[1]
        if order and drop_front >= max(_TRIM_COLUMNS, mask.shape[1] // 4):
            self._cache.drop_front(drop_front)
            mask = mask[:, drop_front:]
        self._mask = mask if order else mask[:, :0]

    def _fail_all(self, exc: BaseException, admitted: Sequence[GenerationJob] = ()) -> None:
        with self._lock:
            jobs = {id(j): j for j in admitted}
            jobs.update({id(r.job): r.job for r in self._rows})
            jobs.update({id(j): j for j in self._waiting})
            if self._chunking is not None:
                jobs[id(self._chunking.job)] = self._chunking.job
            self._waiting.clear()
        for job in jobs.values():
            if not job.done.done():
                job.loop.call_soon_threadsafe(_reject, job.done, exc)
        self._rows = []
        self._chunking = None
        self._cache = BatchCache(self._num_layers, self.max_batch_size)
        self._mask = self._mask[:0, :0]
        self._next_ids = self._next_ids[:0]
        self._positions = self._positions[:0]


def _resolve(future: asyncio.Future[Any], value: Any) -> None:
    if not future.done():
        future.set_result(value)


def _reject(future: asyncio.Future[Any], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)


def _stop_token_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> set[int]:
    ids: set[int] = set()
    for source in (model.generation_config.eos_token_id, tokenizer.eos_token_id):
        if isinstance(source, int):
            ids.add(source)
        elif isinstance(source, list):
            ids.update(int(i) for i in source)
    return ids
