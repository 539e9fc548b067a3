"""Per-row logits processing and sampling for a batch of sequences with different settings.

Log-probs are those of the distribution actually sampled from: after temperature, top-k and top-p
(a token outside the kept set has probability 0). Greedy rows (temperature 0) report the log-probs
of the unscaled model distribution.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy
import torch

from agentscope_rft.types import SamplingParams


@dataclass(slots=True)
class SampledTokens:
    token_ids: list[int]
    logprobs: list[float]
    top_logprobs: list[list[tuple[int, float]] | None]


def _apply_top_k(logits: torch.Tensor, top_k: torch.Tensor, k_max: int) -> torch.Tensor:
    # logits: [B, V]; top_k: [B] (V means "off"); k_max: the largest of top_k, at most V
    vocab = logits.shape[-1]
    values = torch.topk(logits, k_max, dim=-1).values  # [B, k_max]
    kth = values.gather(-1, (top_k.clamp(max=k_max) - 1).unsqueeze(-1))  # [B, 1]
    off = top_k >= vocab
    kth = torch.where(off.unsqueeze(-1), torch.full_like(kth, -float("inf")), kth)
    return logits.masked_fill(logits < kth, -float("inf"))


def _apply_top_p(logits: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    # logits: [B, V]; top_p: [B]. Keep the smallest set of tokens whose mass reaches top_p.
    sorted_logits, sorted_idx = torch.sort(logits, dim=-1, descending=True)  # [B, V]
    sorted_probs = sorted_logits.softmax(dim=-1)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs  # [B, V]
    remove_sorted = mass_before >= top_p.unsqueeze(-1)
    remove_sorted[:, 0] = False
    remove = torch.zeros_like(remove_sorted).scatter(-1, sorted_idx, remove_sorted)
    return logits.masked_fill(remove, -float("inf"))


def sample_next(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    generators: Sequence[torch.Generator | None],
) -> SampledTokens:
    """Sample one token per row of `logits` ([B, V], float32) with that row's settings.

    Example:
        >>> out = sample_next(torch.tensor([[0.0, 5.0]]), [SamplingParams(temperature=0)], [None])
        >>> out.token_ids
        [1]
    """
    batch = logits.shape[0]
    logits = logits.float()
    device = logits.device  # the settings go where the logits are (a GPU engine's are on CUDA)
    vocab = logits.shape[-1]
    # Which steps apply is decided from the settings on the host, so an engine on a GPU never
    # waits for the device to learn it; values are compared as the float32 the kernels use.
    temperatures = [p.temperature if p.temperature > 0 else 1.0 for p in params]
    top_ks = [p.top_k if p.top_k > 0 else vocab for p in params]
    top_ps = [float(numpy.float32(p.top_p)) for p in params]
    sampling = [p.temperature != 0.0 for p in params]
    scaled = logits
    if any(numpy.float32(t) != 1.0 for t in temperatures):
        temperature = torch.tensor(temperatures, device=device)
        scaled = logits / temperature.unsqueeze(-1)  # [B, V]
    if any(s and k < vocab for s, k in zip(sampling, top_ks, strict=True)):
        top_k = [k if s else vocab for s, k in zip(sampling, top_ks, strict=True)]
        scaled = _apply_top_k(scaled, torch.tensor(top_k, device=device), min(max(top_k), vocab))
    if any(s and p < 1.0 for s, p in zip(sampling, top_ps, strict=True)):
        top_p = [p if s else 1.0 for s, p in zip(sampling, top_ps, strict=True)]
        scaled = _apply_top_p(scaled, torch.tensor(top_p, device=device))
    # One log-softmax serves both kinds of row: greedy rows were divided by exactly 1.0 and skip
    # top-k/top-p, so theirs is the unscaled model distribution.
    logprobs_all = scaled.log_softmax(dim=-1)  # [B, V]

    # Sampling rows: inverse-CDF with one uniform draw from each row's generator (a seeded row
    # repeats whatever runs beside it); vectorized, where per-row multinomial cost ~1.4 ms a row.
    sampled_rows = [row for row in range(batch) if params[row].temperature != 0.0]
    greedy_rows = [row for row in range(batch) if params[row].temperature == 0.0]
    token_ids = [0] * batch
    if greedy_rows:
        picked = (
            logits
            if len(greedy_rows) == batch
            else logits[torch.tensor(greedy_rows, device=device)]
        )
        for row, token in zip(greedy_rows, picked.argmax(dim=-1).tolist(), strict=True):
            token_ids[row] = token
    if sampled_rows:
        rows = logprobs_all
        if len(sampled_rows) < batch:
            rows = logprobs_all[torch.tensor(sampled_rows, device=device)]
        cdf = rows.exp().cumsum(dim=-1)  # [S, V]
        # The generators stay on the CPU (a seed draws the same stream on any device).
        uniform = torch.cat([torch.rand(1, generator=generators[row]) for row in sampled_rows])
        uniform = uniform.to(device)
        # Right-side search: a token of probability 0 (a flat step of the CDF) is never picked.
        drawn = torch.searchsorted(cdf, (uniform * cdf[:, -1]).unsqueeze(-1), right=True)
        for row, token in zip(
            sampled_rows, drawn.squeeze(-1).clamp(max=vocab - 1).tolist(), strict=True
        ):
            token_ids[row] = token
    chosen = torch.tensor(token_ids, device=device)
    logprobs = logprobs_all.gather(-1, chosen.unsqueeze(-1)).squeeze(-1).tolist()

    top: list[list[tuple[int, float]] | None] = [None] * batch
    want_top = [p.top_logprobs for p in params]
    if any(want_top):
        k = max(want_top)
        values, indices = torch.topk(logprobs_all, k, dim=-1)
        for row in range(batch):
            if want_top[row]:
                top[row] = list(
                    zip(
                        indices[row, : want_top[row]].tolist(),
                        values[row, : want_top[row]].tolist(),
                        strict=True,
                    )
                )
    return SampledTokens(token_ids=token_ids, logprobs=logprobs, top_logprobs=top)
