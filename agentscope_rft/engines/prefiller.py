"""Prefill for the continuous batcher: prompts' KV from the prefix cache and the model.

A job's prompt starts from its longest cached prefix (`PrefixCache`) and prefills only the rest,
either in one padded batch through transformers' forward (`prefill.build_prefill`) or ragged
through the fused forward (`fused.FusedDecoder.prefill`). A prompt whose uncached part is longer
than `chunk_tokens` is prefilled in chunks, one per engine step (`start_chunking`,
`prefill_chunk`). Every prefilled prompt's KV goes into the prefix cache. The result, a
`Prefilled`, is what the batcher joins into its running batch.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from agentscope_rft.engines.fused import FusedDecoder, Segment
from agentscope_rft.engines.jobs import GenerationJob
from agentscope_rft.engines.kv_cache import BatchCache, GrowingLayer
from agentscope_rft.engines.prefill import (
    PrefillBatch,
    build_prefill,
    common_blocks,
    row_kv,
    token_columns,
)
from agentscope_rft.engines.prefix_cache import CachedBlock, PrefixCache
from agentscope_rft.engines.threads import ForwardRunner


@dataclass(eq=False)
class Prefilled:
    """Prefilled jobs, ready to join the running batch: their KV is either `kvs` (fused: one
    `[layers, 2, KVH, L, D]` per job) or rows of `cache` under `mask` (one row per job)."""

    jobs: list[GenerationJob]
    logits: torch.Tensor  # [J, V] at each prompt's last token
    last_positions: torch.Tensor  # [J] each prompt's last position
    kvs: list[torch.Tensor] | None = None
    cache: BatchCache | None = None
    mask: torch.Tensor | None = None  # [J, T]


@dataclass(eq=False)
class Chunking:
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


class Prefiller:
    """Prefills jobs' prompts for the batcher (engine thread only). `version` arguments are the
    policy version whose prefix-cache entries are read and written.

    Example:
        >>> prefiller = Prefiller(model, None, PrefixCache(), ForwardRunner(None),
        ...     stats=collections.Counter(), pad_id=0, chunk_tokens=None)  # doctest: +SKIP
        >>> prefilled = prefiller.prefill(jobs, version=0)  # doctest: +SKIP
    """

    def __init__(
        self,
        model: PreTrainedModel,
        fused: FusedDecoder | None,
        prefix_cache: PrefixCache | None,
        run: ForwardRunner,
        *,
        stats: collections.Counter[str],
        pad_id: int,
        chunk_tokens: int | None,
    ) -> None:
        self.model = model
        self.fused = fused
        self.prefix_cache = prefix_cache
        self.run = run
        self.stats = stats
        self.pad_id = pad_id
        self.device = next(model.parameters()).device
        self.num_layers = int(model.config.get_text_config().num_hidden_layers)
        if chunk_tokens is not None and prefix_cache is not None:  # chunks end on blocks
            size = prefix_cache.block_tokens
            chunk_tokens = max(size, chunk_tokens // size * size)
        self.chunk_tokens = chunk_tokens
        self.chunking: Chunking | None = None

    # ----------------------------------------------------------------- for admission
    def cached_tokens(self, job: GenerationJob, version: int) -> int:
        if self.prefix_cache is None:
            return 0
        return self.prefix_cache.peek(job.prompt_ids, version)

    def waits_for_sharer(
        self, job: GenerationJob, cached: int, admitted: Sequence[GenerationJob]
    ) -> bool:
        """Whether `job` shares uncached blocks with an admitted job (it then waits one step)."""
        if self.prefix_cache is None or self.prefix_cache.budget_bytes <= 0:
            return False
        size = self.prefix_cache.block_tokens
        limit = (len(job.prompt_ids) - 1) // size
        if cached // size >= limit:
            return False
        others = [a.prompt_ids for a in admitted]
        if self.chunking is not None:
            others.append(self.chunking.job.prompt_ids)
        return any(common_blocks(o, job.prompt_ids, size, limit) * size > cached for o in others)

    # ----------------------------------------------------------------- prefix cache
    def _cached_blocks(self, job: GenerationJob, version: int) -> list[CachedBlock]:
        """The cached blocks of the longest cached prefix of `job`'s prompt."""
        self.stats["prompt_tokens"] += len(job.prompt_ids)
        if self.prefix_cache is None:
            return []
        return self.prefix_cache.match(job.prompt_ids, version)

    def _past_kv(self, job: GenerationJob, version: int) -> torch.Tensor | None:
        """The cached KV of the longest cached prefix of `job`'s prompt (or None)."""
        blocks = self._cached_blocks(job, version)
        if not blocks:
            return None
        return torch.cat([block.kv for block in blocks], dim=3)

    def _segment(self, job: GenerationJob, version: int) -> Segment:
        """`job`'s whole prompt as a fused-prefill segment: a KV buffer for all of it, holding
        its longest cached prefix already."""
        assert self.fused is not None
        blocks = self._cached_blocks(job, version)
        kv = self.fused.new_kv(len(job.prompt_ids))
        start = sum(block.kv.shape[3] for block in blocks)
        if blocks:
            torch.cat([block.kv for block in blocks], dim=3, out=kv[:, :, :, :start])
        return Segment(job.prompt_ids[start:], start, kv)

    def _cache_kv(self, token_ids: list[int], kv: torch.Tensor, version: int) -> None:
        """Put `kv` (`[layers, 2, KVH, >= len(token_ids), D]`) of `token_ids` in the cache."""
        if self.prefix_cache is not None:
            self.prefix_cache.insert(token_ids, lambda start, end: kv[:, :, :, start:end], version)

    def cache_rows(
        self,
        token_ids: list[list[int]],
        cache: BatchCache,
        mask: torch.Tensor,
        version: int,
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
            self.prefix_cache.insert(ids, _KVReader(cache, row, columns), version)

    # ----------------------------------------------------------------- prefill
    def _forward(self, batch: PrefillBatch) -> torch.Tensor:
        out = self.run(
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

    def prefill(self, jobs: list[GenerationJob], version: int) -> Prefilled:
        """Prefill `jobs`' prompts in one batch."""
        if self.fused is not None:
            return self._prefill_ragged(jobs, version)
        past = [self._past_kv(job, version) for job in jobs]
        reused = [0 if kv is None else kv.shape[3] for kv in past]
        batch = build_prefill(
            [job.prompt_ids[n:] for job, n in zip(jobs, reused, strict=True)],
            past,
            self.num_layers,
            self.pad_id,
            self.device,
        )
        logits = self._forward(batch)
        self.stats["prefill_batches"] += 1
        mask = batch.attention_mask
        self.cache_rows([job.prompt_ids for job in jobs], batch.cache, mask, version)
        return Prefilled(jobs, logits, batch.position_ids[:, -1], cache=batch.cache, mask=mask)

    def _prefill_ragged(self, jobs: list[GenerationJob], version: int) -> Prefilled:
        """Prefill `jobs` with the fused forward: their new tokens in one unpadded batch."""
        assert self.fused is not None
        segments = [self._segment(job, version) for job in jobs]
        fused = self.fused
        tokens = sum(len(seg.token_ids) for seg in segments)
        logits = self.run(tokens, lambda: fused.prefill(segments))
        assert logits is not None
        self.stats["prefill_batches"] += 1
        self.stats["prefill_tokens"] += tokens
        for job, seg in zip(jobs, segments, strict=True):
            self._cache_kv(job.prompt_ids, seg.kv, version)
        return self._with_kv(jobs, [seg.kv for seg in segments], logits)

    def _with_kv(
        self, jobs: list[GenerationJob], kvs: list[torch.Tensor], logits: torch.Tensor
    ) -> Prefilled:
        lengths = torch.tensor([kv.shape[3] for kv in kvs], device=self.device)
        return Prefilled(jobs, logits, lengths - 1, kvs=kvs)

    # ----------------------------------------------------------------- chunked prefill
    def start_chunking(self, job: GenerationJob, version: int) -> None:
        """Make `job` the long prompt `prefill_chunk` prefills, from its cached prefix on."""
        if self.fused is not None:
            seg = self._segment(job, version)
            self.chunking = Chunking(job=job, cache=None, done=seg.start, kv=seg.kv)
            return
        past = self._past_kv(job, version)
        cache = BatchCache(self.num_layers)
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
        self.chunking = Chunking(job=job, cache=cache, done=done)

    def prefill_chunk(self, version: int) -> Prefilled | None:
        """Prefill the next chunk of the long prompt being chunked; the job, once complete."""
        state = self.chunking
        assert state is not None and self.chunk_tokens is not None
        if state.job.cancelled:
            self.chunking = None
            return None
        prompt = state.job.prompt_ids
        end = min(state.done + self.chunk_tokens, len(prompt))
        if state.kv is not None:
            assert self.fused is not None
            last = end == len(prompt)
            segment = Segment(prompt[state.done : end], state.done, state.kv, logits=last)
            fused = self.fused
            logits = self.run(end - state.done, lambda: fused.prefill([segment]))
            self.stats["prefill_chunks"] += 1
            self.stats["prefill_tokens"] += end - state.done
            state.done = end
            self._cache_kv(prompt[:end], state.kv, version)
            if not last:
                return None
            assert logits is not None
            self.chunking = None
            return self._with_kv([state.job], [state.kv], logits)
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
        self.cache_rows([prompt[:end]], state.cache, mask, version)
        if end < len(prompt):
            return None
        self.chunking = None
        return Prefilled([state.job], logits, positions[:, -1], cache=state.cache, mask=mask)
