"""Continuous batching for a transformers causal LM on one device.

One background thread owns the model. Requests from any event loop queue up; between decode steps
the thread admits waiting requests (one batched, left-padded prefill; `n` choices share it), merges
them into the running batch, and drops rows that finished. Weight swaps wait for the running batch
to drain, so every sequence is sampled from one policy version.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from agentscope_rft.engines.base import EngineError, GenerationOutput
from agentscope_rft.engines.kv_cache import BatchCache, left_pad_mask
from agentscope_rft.engines.sampling import sample_next
from agentscope_rft.types import SamplingParams

logger = logging.getLogger(__name__)

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
    ) -> None:
        self.model = model
        self.device = next(model.parameters()).device
        self.max_batch_size = max_batch_size
        self.max_prefill_tokens = max_prefill_tokens
        self.max_model_len = max_model_len
        self.stop_token_ids = _stop_token_ids(model, tokenizer)
        self.pad_id = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0)
        self._tokenizer = tokenizer
        self._num_layers = int(model.config.get_text_config().num_hidden_layers)
        self._rng = torch.Generator().manual_seed(seed)
        self.policy_version = 0

        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._waiting: collections.deque[GenerationJob] = collections.deque()
        self._swaps: collections.deque[_WeightSwap] = collections.deque()
        self._thread: threading.Thread | None = None
        self._stopping = False

        self._rows: list[_Row] = []
        self._cache = BatchCache(self._num_layers)
        self._mask = torch.zeros(0, 0, dtype=torch.long, device=self.device)
        self._next_ids = torch.zeros(0, dtype=torch.long, device=self.device)
        self._positions = torch.zeros(0, dtype=torch.long, device=self.device)
        self.stats = collections.Counter[str]()

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
        return len(self._rows)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    # ----------------------------------------------------------------- engine thread
    def _run(self) -> None:
        torch.set_grad_enabled(False)
        while not self._stopping:
            try:
                self._maybe_swap()
                admitted = self._admit()
                if admitted:
                    self._prefill(admitted)
                if self._rows:
                    self._decode_step()
                elif not admitted:
                    self._wake.wait(timeout=0.5)
                    self._wake.clear()
            except Exception as exc:  # a failed forward must not kill the engine thread
                logger.exception("engine step failed; failing the running requests")
                self._fail_all(exc)
        self._fail_all(EngineError("the engine stopped", status=503))

    def _maybe_swap(self) -> None:
        with self._lock:
            if not self._swaps or self._rows:
                return
            swap = self._swaps.popleft()
        try:
            swap.apply()
            self.policy_version = swap.version
            elapsed = time.perf_counter() - swap.requested_at
            swap.loop.call_soon_threadsafe(_resolve, swap.done, elapsed)
        except Exception as exc:
            swap.loop.call_soon_threadsafe(_reject, swap.done, exc)

    def _admit(self) -> list[GenerationJob]:
        admitted: list[GenerationJob] = []
        with self._lock:
            if self._swaps:  # drain first: no new work until pending weights are in
                return admitted
            budget_rows = self.max_batch_size - len(self._rows)
            longest = 0
            while self._waiting:
                job = self._waiting[0]
                if job.cancelled:
                    self._waiting.popleft()
                    continue
                rows = job.sampling.n
                longest_if = max(longest, len(job.prompt_ids))
                padded_tokens = longest_if * (len(admitted) + 1)
                if admitted and (rows > budget_rows or padded_tokens > self.max_prefill_tokens):
                    break
                if not admitted and rows > budget_rows and self._rows:
                    break
                admitted.append(self._waiting.popleft())
                budget_rows -= rows
                longest = longest_if
        return admitted

    def _prefill(self, jobs: list[GenerationJob]) -> None:
        longest = max(len(j.prompt_ids) for j in jobs)
        ids = torch.full((len(jobs), longest), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(jobs), longest), dtype=torch.long)
        for i, job in enumerate(jobs):
            ids[i, longest - len(job.prompt_ids) :] = torch.tensor(job.prompt_ids)
            mask[i, longest - len(job.prompt_ids) :] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
        cache = BatchCache(self._num_layers)
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        logits = out.logits[:, -1, :].float()  # [J, V]
        self.stats["prefill_tokens"] += int(mask.sum())
        self.stats["prefill_batches"] += 1

        # Expand to one row per choice: choices of a job share its prefill.
        expand = []
        rows: list[_Row] = []
        for j, job in enumerate(jobs):
            job.outputs = [None] * job.sampling.n
            for index in range(job.sampling.n):
                expand.append(j)
                generator = None
                if job.sampling.seed is not None:
                    generator = torch.Generator().manual_seed(job.sampling.seed * 1_000_003 + index)
                rows.append(
                    _Row(
                        job=job,
                        index=index,
                        generator=generator or self._rng,
                        policy_version=self.policy_version,
                    )
                )
        expand_t = torch.tensor(expand, device=self.device)
        if len(expand) != len(jobs):
            cache.select_rows(expand_t)
        cache_len = cache.get_seq_length()
        if self._rows:
            length = max(cache_len, self._mask.shape[1])
            self._mask = torch.cat(
                [left_pad_mask(self._mask, length), left_pad_mask(mask[expand_t], length)]
            )
        else:
            self._mask = mask[expand_t]
        self._cache.merge(cache)
        self._positions = torch.cat([self._positions, positions[expand_t, -1] + 1])
        self._next_ids = torch.cat(
            [self._next_ids, torch.zeros(len(rows), dtype=torch.long, device=self.device)]
        )
        start = len(self._rows)
        self._rows.extend(rows)
        self._accept(logits[expand_t], list(range(start, start + len(rows))))

    def _decode_step(self) -> None:
        batch = len(self._rows)
        past = self._mask.shape[1]
        self._mask = torch.cat([self._mask, self._mask.new_ones(batch, 1)], dim=1)
        out = self.model(
            input_ids=self._next_ids.unsqueeze(1),
            attention_mask=self._mask,
            position_ids=self._positions.unsqueeze(1),
            past_key_values=self._cache,
            use_cache=True,
            cache_position=torch.tensor([past], device=self.device),
        )
        self._positions = self._positions + 1
        self.stats["decode_steps"] += 1
        self.stats["decode_tokens"] += batch
        self._accept(out.logits[:, -1, :].float(), list(range(batch)))

    def _accept(self, logits: torch.Tensor, row_ids: list[int]) -> None:
        """Sample a token for each of `row_ids` and retire rows that finished."""
        rows = [self._rows[r] for r in row_ids]
        sampled = sample_next(logits, [r.job.sampling for r in rows], [r.generator for r in rows])
        finished = []
        for k, (row_id, row) in enumerate(zip(row_ids, rows, strict=True)):
            token = sampled.token_ids[k]
            row.out_ids.append(token)
            row.logprobs.append(sampled.logprobs[k])
            if row.job.sampling.top_logprobs:
                row.top = row.top or []
                row.top.append(sampled.top_logprobs[k] or [])
            self._next_ids[row_id] = token
            if row.job.on_token is not None and not row.job.cancelled:
                row.job.loop.call_soon_threadsafe(row.job.on_token, row.index, token)
            self._check_finished(row, total_len=int(self._positions[row_id]) + 1)
            if row.finish_reason is not None or row.job.cancelled:
                finished.append(row_id)
        if finished:
            self._retire(finished)

    def _check_finished(self, row: _Row, total_len: int) -> None:
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
        gone = set(finished)
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
                outputs = [o for o in job.outputs if o is not None]
                job.loop.call_soon_threadsafe(_resolve, job.done, outputs)
        keep = [i for i in range(len(self._rows)) if i not in gone]
        self._rows = [self._rows[i] for i in keep]
        if not keep:
            self._cache = BatchCache(self._num_layers)
            self._mask = self._mask[:0, :0]
            self._next_ids = self._next_ids[:0]
            self._positions = self._positions[:0]
            return
        keep_t = torch.tensor(keep, device=self.device)
        mask = self._mask[keep_t]
        # Columns that are padding in every remaining row can go.
        used = mask.any(dim=0).nonzero()
        drop_front = int(used[0]) if len(used) else 0
        self._cache.select_rows(keep_t, drop_front)
        self._mask = mask[:, drop_front:]
        self._next_ids = self._next_ids[keep_t]
        self._positions = self._positions[keep_t]

    def _fail_all(self, exc: BaseException) -> None:
        with self._lock:
            jobs = {id(r.job): r.job for r in self._rows}
            jobs.update({id(j): j for j in self._waiting})
            self._waiting.clear()
        for job in jobs.values():
            if not job.done.done():
                job.loop.call_soon_threadsafe(_reject, job.done, exc)
        self._rows = []
        self._cache = BatchCache(self._num_layers)
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


def copy_weights(model: PreTrainedModel, weights: Mapping[str, torch.Tensor]) -> None:
    """Copy `weights` into `model` in place (dtype/device converted); all names must match."""
    own = model.state_dict()
    missing = [name for name in own if name not in weights]
    tied_ok = {"lm_head.weight"} if model.config.get_text_config().tie_word_embeddings else set()
    missing = [m for m in missing if m not in tied_ok]
    unexpected = [name for name in weights if name not in own]
    if missing or unexpected:
        raise EngineError(
            f"weights do not match the engine's model: missing {missing[:5]}, "
            f"unexpected {unexpected[:5]}",
            status=409,
        )
    with torch.no_grad():
        for name, tensor in own.items():
            if name in weights:
                tensor.copy_(weights[name].to(device=tensor.device, dtype=tensor.dtype))
