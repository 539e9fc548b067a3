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

This module is the thread's loop: admission, decoding, sampling and retiring rows. Prefill
(prefix-cache reuse, chunking) is `prefiller.py`; the running rows and their KV cache are
`running_batch.py`; the jobs and weight swaps callers hand in are `jobs.py`.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Sequence

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from agentscope_rft.engines.base import EngineError, GenerationOutput
from agentscope_rft.engines.fused import FusedDecoder
from agentscope_rft.engines.jobs import GenerationJob, WeightSwap, reject, resolve
from agentscope_rft.engines.prefiller import Prefilled, Prefiller
from agentscope_rft.engines.prefix_cache import PrefixCache
from agentscope_rft.engines.running_batch import Row, RunningBatch
from agentscope_rft.engines.sampling import sample_next
from agentscope_rft.engines.structured import GrammarMask
from agentscope_rft.engines.threads import ForwardRunner, ThreadPolicy

logger = logging.getLogger(__name__)


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
        self._run_forward = ForwardRunner(threads)
        self.device = next(model.parameters()).device
        self.max_batch_size = max_batch_size
        self.max_prefill_tokens = max_prefill_tokens
        self.max_model_len = max_model_len
        self.stop_token_ids = _stop_token_ids(model, tokenizer)
        self._tokenizer = tokenizer
        self.vocab_size = int(model.config.get_text_config().vocab_size)
        self._rng = torch.Generator().manual_seed(seed)
        self.policy_version = 0
        self.prefix_cache = prefix_cache
        self.stats = collections.Counter[str]()
        self.prefiller = Prefiller(
            model,
            fused,
            prefix_cache,
            self._run_forward,
            stats=self.stats,
            pad_id=int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0),
            chunk_tokens=prefill_chunk_tokens,
        )

        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._waiting: collections.deque[GenerationJob] = collections.deque()
        self._swaps: collections.deque[WeightSwap] = collections.deque()
        self._thread: threading.Thread | None = None
        self._stopping = False

        self.batch = RunningBatch(self.prefiller.num_layers, max_batch_size, self.device)
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

    def request_swap(self, swap: WeightSwap) -> None:
        with self._lock:
            self._swaps.append(swap)
        self._wake.set()

    @property
    def num_running(self) -> int:
        return len(self.batch.rows)  # answered rows leave the batch before their answers go out

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
                swap.loop.call_soon_threadsafe(reject, swap.done, stopped)

    def _serve(self) -> None:
        while not self._stopping:
            admitted: list[GenerationJob] = []
            try:
                self._maybe_swap()
                admitted = self._admit()
                if admitted:
                    self._prefill(admitted)
                chunked = self.prefiller.chunking is not None
                if chunked:
                    self._prefill_chunk()
                if self.batch.rows:
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
        self.batch.new_cache()

    def _maybe_swap(self) -> None:
        with self._lock:
            if not self._swaps or self.batch.rows or self.prefiller.chunking is not None:
                return
            swap = self._swaps.popleft()
        try:
            swap.apply()
            self.policy_version = swap.version
            if self.prefix_cache is not None:
                self.prefix_cache.clear()  # KV of the old weights must never be reused
            elapsed = time.perf_counter() - swap.requested_at
            swap.loop.call_soon_threadsafe(resolve, swap.done, elapsed)
        except Exception as exc:
            swap.loop.call_soon_threadsafe(reject, swap.done, exc)

    def _admit(self) -> list[GenerationJob]:
        admitted: list[GenerationJob] = []
        skipped: list[GenerationJob] = []
        prefiller = self.prefiller
        with self._lock:
            if self._swaps:  # drain first: no new work until pending weights are in
                return admitted
            budget_rows = self.max_batch_size - self.num_running
            if prefiller.chunking is not None:
                budget_rows -= prefiller.chunking.job.sampling.n
            longest = new_total = 0
            while self._waiting:
                job = self._waiting[0]
                if job.cancelled:
                    self._waiting.popleft()
                    continue
                rows = job.sampling.n
                if rows > budget_rows and (admitted or self.batch.rows or prefiller.chunking):
                    break
                cached = prefiller.cached_tokens(job, self.policy_version)
                new = len(job.prompt_ids) - cached
                chunk = prefiller.chunk_tokens
                if prefiller.waits_for_sharer(job, cached, admitted) or (
                    chunk is not None and new > chunk and prefiller.chunking is not None
                ):
                    skipped.append(self._waiting.popleft())
                    continue
                if chunk is not None and new > chunk:
                    prefiller.start_chunking(self._waiting.popleft(), self.policy_version)
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

    def _prefill(self, jobs: list[GenerationJob]) -> None:
        self._join(self.prefiller.prefill(jobs, self.policy_version))

    def _prefill_chunk(self) -> None:
        """Prefill the next chunk of the long prompt being chunked; join it when complete."""
        prefilled = self.prefiller.prefill_chunk(self.policy_version)
        if prefilled is not None:
            self._join(prefilled)

    def _join(self, prefilled: Prefilled) -> None:
        """Add prefilled jobs to the running batch, one row per choice, and sample."""
        expand = []
        rows: list[Row] = []
        for j, job in enumerate(prefilled.jobs):
            job.outputs = [None] * job.sampling.n
            for index in range(job.sampling.n):
                expand.append(j)
                generator = None
                if job.sampling.seed is not None:
                    # Modulo 2**64: torch takes 64-bit seeds (a negative one as its 2**64 + s).
                    seed = (job.sampling.seed * 1_000_003 + index) % 2**64
                    generator = torch.Generator().manual_seed(seed)
                rows.append(
                    Row(
                        job=job,
                        index=index,
                        generator=generator or self._rng,
                        policy_version=self.policy_version,
                        matcher=job.matchers[index] if job.matchers else None,
                    )
                )
        expand_t = torch.tensor(expand, device=self.device)
        batch = self.batch
        if prefilled.kvs is not None:  # copied once, straight into the running cache
            kvs = prefilled.kvs
            # Requests still waiting will join soon (GRPO groups come in waves): room for them
            # now saves growing the cache again.
            coming = min(
                self.max_batch_size, len(batch.rows) + len(prefilled.jobs) + len(self._waiting)
            )
            mask = batch.cache.append_rows([kvs[j] for j in expand], coming)
        else:
            assert prefilled.cache is not None and prefilled.mask is not None
            mask = batch.merge(prefilled.cache, prefilled.mask, expand)
        row_ids = batch.add(rows, mask, prefilled.last_positions[expand_t] + 1)
        self._accept(prefilled.logits[expand_t], row_ids)

    def _decode_step(self) -> None:
        batch = self.batch
        size = len(batch.rows)
        past = batch.mask.shape[1]
        batch.mask = torch.cat([batch.mask, batch.mask.new_ones(size, 1)], dim=1)
        fused = self.fused
        if fused is not None:
            logits = self._run_forward(
                size, lambda: fused.step(batch.next_ids, batch.positions, batch.mask, batch.cache)
            )
        else:
            out = self._run_forward(
                size,
                lambda: self.model(
                    input_ids=batch.next_ids.unsqueeze(1),
                    attention_mask=batch.mask,
                    position_ids=batch.positions.unsqueeze(1),
                    past_key_values=batch.cache,
                    use_cache=True,
                    cache_position=torch.tensor([past], device=self.device),
                ),
            )
            logits = out.logits[:, -1, :]
        batch.positions = batch.positions + 1
        self.stats["decode_steps"] += 1
        self.stats["decode_tokens"] += size
        self._accept(logits.float(), list(range(size)))

    def _accept(self, logits: torch.Tensor, row_ids: list[int]) -> None:
        """Sample a token for each of `row_ids` and retire rows that finished."""
        batch = self.batch
        rows = [batch.rows[r] for r in row_ids]
        constrained = [(k, row.matcher) for k, row in enumerate(rows) if row.matcher is not None]
        if constrained:
            assert self.grammar_mask is not None
            logits = self.grammar_mask.apply(logits, constrained)
            self.stats["constrained_tokens"] += len(constrained)
        sampled = sample_next(logits, [r.job.sampling for r in rows], [r.generator for r in rows])
        # One write of the rows' next tokens and one read of their positions for the whole batch
        # (row by row, an engine on a GPU would wait for the device twice per row).
        ids = torch.tensor(row_ids, dtype=torch.long, device=self.device)
        batch.next_ids[ids] = torch.tensor(sampled.token_ids, dtype=torch.long, device=self.device)
        positions = batch.positions[ids].tolist()
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

    def _check_finished(self, row: Row, total_len: int) -> None:
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
        batch = self.batch
        # The KV of prompt + completion (all but the last sampled token, never fed) is cached,
        # so the episode's next call (this sequence + a tool result) prefills only its new part.
        done_rows = [r for r in finished if batch.rows[r].policy_version == self.policy_version]
        self.prefiller.cache_rows(
            [batch.rows[r].job.prompt_ids + batch.rows[r].out_ids[:-1] for r in done_rows],
            batch.cache,
            batch.mask,
            self.policy_version,
            done_rows,
        )
        answered: list[GenerationJob] = []
        for row_id in finished:
            row = batch.rows[row_id]
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
        batch.compact()  # moves only as many rows as leave
        # Answers go out last: a caller woken by one sees the batch already without its rows.
        for job in answered:
            outputs = [o for o in job.outputs if o is not None]
            job.loop.call_soon_threadsafe(resolve, job.done, outputs)

    def _fail_all(self, exc: BaseException, admitted: Sequence[GenerationJob] = ()) -> None:
        chunking = self.prefiller.chunking
        with self._lock:
            jobs = {id(j): j for j in admitted}
            jobs.update({id(r.job): r.job for r in self.batch.rows})
            jobs.update({id(j): j for j in self._waiting})
            if chunking is not None:
                jobs[id(chunking.job)] = chunking.job
            self._waiting.clear()
        for job in jobs.values():
            if not job.done.done():
                job.loop.call_soon_threadsafe(reject, job.done, exc)
        self.prefiller.chunking = None
        self.batch.clear()


def _stop_token_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> set[int]:
    ids: set[int] = set()
    for source in (model.generation_config.eos_token_id, tokenizer.eos_token_id):
        if isinstance(source, int):
            ids.add(source)
        elif isinstance(source, list):
            ids.update(int(i) for i in source)
    return ids
