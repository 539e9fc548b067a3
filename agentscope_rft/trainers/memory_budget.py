"""Keep the torch trainer within a memory budget: micro-batch size and gradient checkpointing.

The trainer's memory is a fixed part (fp32 weights, gradients and AdamW's two moments of the
trained parameters, a frozen reference copy when the algorithm needs one) plus a part that grows
with the tokens of one forward/backward pass (the activations each decoder layer keeps for
backward). With `trainer.memory_budget_gib` set, every step picks the largest micro-batch whose
activations fit what the fixed part leaves, and turns gradient checkpointing on for that step only
when a single row would not fit otherwise. The per-token figure is derived from the model's
shapes (what a Llama/Qwen-style layer saves for backward) and checked against measured peaks in
`benchmarks/memory.py`.

The estimate leaves out what depends on the machine: the allocator's cached free blocks and
temporaries. So each step is measured (`StepMeter`: resident memory sampled on CPU, torch's
allocated peak on CUDA), the most a step exceeded its plan by is kept (`BudgetWatch`) and held
back from the budget in later plans (`plan_step(overshoot_bytes=...)`): the budget is kept as
measured, not only as estimated.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from agentscope_rft.rss import PhasePeaks
from agentscope_rft.trainers.logprobs import CHUNK_BYTES, KEEP_BYTES

if TYPE_CHECKING:
    from transformers import PreTrainedModel

logger = logging.getLogger(__name__)

GIB = 2**30
_SAFETY = 1.25
"""Allocator slack and short-lived temporaries on top of what a layer keeps for backward."""


class MemoryBudgetError(ValueError):
    """`trainer.memory_budget_gib` cannot hold even the smallest pass."""


@dataclass(frozen=True, slots=True)
class ModelFootprint:
    """What the budget needs to know about the trained model.

    Example:
        >>> fp = ModelFootprint(parameters=135_000_000, trainable=135_000_000, reference=False,
        ...     layers=30, hidden=576, intermediate=1536, kv_width=192, vocab=49152,
        ...     compute_bytes=2)
        >>> round(fp.fixed_bytes() / GIB, 2)
        2.01
    """

    parameters: int
    trainable: int
    reference: bool
    layers: int
    hidden: int
    intermediate: int
    kv_width: int
    """Key (= value) width of one token: kv heads x head dim."""
    vocab: int
    compute_bytes: int
    """2 under bf16 autocast, 4 in fp32."""
    optimizer_bytes: int = 8
    """AdamW state per trained parameter: two fp32 moments (8), or two bf16 moments (4)."""

    def fixed_bytes(self) -> int:
        """fp32 weights (+ a reference copy), gradients and AdamW moments of trained weights."""
        weights = 4 * self.parameters * (2 if self.reference else 1)
        return weights + 4 * self.trainable + self.optimizer_bytes * self.trainable

    def step_bytes(self) -> int:
        """What every step adds above the weights and optimizer state resident before it: the
        gradients (freed after it) and the output projection's workspace."""
        return 4 * self.trainable + self.workspace_bytes()

    def workspace_bytes(self) -> int:
        """A pass's memory whatever its size: the output projection's weight cast to the compute
        dtype (no copy in fp32), the fp32 gradient its backward accumulates and the chunks'
        [chunk, vocab] temporaries; under autocast, one linear layer's weight cast at a time too
        (`cast_linear`: the casts are not kept for backward). (The log-probs a small pass keeps
        grow with its tokens: `pass_bytes`.)"""
        weight = self.vocab * self.hidden
        if self.compute_bytes == 4:
            return 4 * weight + 3 * CHUNK_BYTES
        cast = (weight + self.hidden * self.intermediate) * self.compute_bytes
        return cast + 4 * weight + 3 * CHUNK_BYTES

    def kept_logprob_tokens(self) -> int:
        """The most tokens a pass may have and still keep its fp32 [tokens, vocab] log-probs for
        backward (`logprobs.KEEP_BYTES`); a larger pass recomputes them chunk by chunk."""
        return KEEP_BYTES // (4 * self.vocab)

    def pass_bytes(self, tokens: int, checkpointing: bool) -> float:
        """What a pass of `tokens` tokens adds above the fixed part and the workspace: the
        activations its layers keep, plus the log-probs it keeps when it is small enough.

        Example:
            >>> fp = ModelFootprint(135_000_000, 135_000_000, False, 30, 576, 1536, 192, 49152, 4)
            >>> kept = fp.kept_logprob_tokens()
            >>> fp.pass_bytes(kept, False) - fp.pass_bytes(kept + 1, False) > 0  # recomputed
            True
        """
        kept = 4 * self.vocab * tokens if tokens <= self.kept_logprob_tokens() else 0
        return tokens * self.activation_bytes_per_token(checkpointing) + kept

    def layer_bytes_per_token(self) -> int:
        """Tensors one decoder layer keeps for backward, per token: the fp32 residual stream and
        norms, q/k/v and the attention output, the MLP's gate, up, activation and product."""
        h, c = self.hidden, self.compute_bytes
        fp32 = 4 * 4 * h  # layer input, both norms' inputs and the residual after attention
        compute = c * (5 * h + 2 * self.kv_width + 4 * self.intermediate)
        return fp32 + compute

    def prefix_kv_bytes(self, prefix_tokens: int) -> int:
        """Keys and values of a shared prefix that one row of a pass holds (the prefix's cache is
        concatenated with the row's own keys and values in every layer, and kept for backward)."""
        return 2 * self.kv_width * prefix_tokens * self.compute_bytes * self.layers

    def activation_bytes_per_token(self, checkpointing: bool) -> float:
        """Activations of one trained token for the whole model (checkpointing: each layer's
        input only, plus one layer recomputed at a time, counted per token)."""
        if checkpointing:
            per_token = 4 * self.hidden * self.layers + self.layer_bytes_per_token()
        else:
            per_token = self.layer_bytes_per_token() * self.layers
        return per_token * _SAFETY


@dataclass(frozen=True, slots=True)
class StepPlan:
    """How one training step keeps to the budget."""

    micro_batch_tokens: int
    checkpointing: bool
    keep_logprobs: bool = True
    """A pass small enough (`logprobs.KEEP_BYTES`) may keep its fp32 log-probs for backward;
    False: every pass recomputes them (one more output-projection matmul per chunk)."""
    recompute_prefix: bool = False
    """The shared prefix runs without a graph before the passes (only its keys and values stay,
    with their gradients) and again with one after them, for its backward: its activations are
    not alive during the passes, so a tight budget fits more rows per pass, for one more forward
    over the prefix per update."""
    base_bytes: float = field(default=0.0, compare=False)
    """What the plan expects every step to add above the weights and optimizer state resident
    before it, whatever its passes: gradients, the workspace and what the shared prefix keeps
    alive across the passes (0 for a plan not made under a budget)."""
    bytes_per_token: float = field(default=0.0, compare=False)
    """What it expects a pass to add per token (its activations, and the prefix's keys and values
    each row holds)."""
    kept_bytes_per_token: float = field(default=0.0, compare=False)
    """Log-prob bytes per token a pass of at most `kept_up_to` tokens keeps for backward."""
    kept_up_to: int = field(default=0, compare=False)

    def expected_bytes(self, tokens: int) -> float:
        """What a step whose largest pass has `tokens` tokens should add at its peak."""
        kept = self.kept_bytes_per_token * tokens if tokens <= self.kept_up_to else 0.0
        return self.base_bytes + tokens * self.bytes_per_token + kept

    @property
    def planned_bytes(self) -> float:
        """`expected_bytes` of a pass as large as the plan allows."""
        return self.expected_bytes(self.micro_batch_tokens)


def room_above_fixed(
    footprint: ModelFootprint, budget_gib: float, overshoot_bytes: float = 0
) -> float:
    """Bytes of `budget_gib` left for passes above the fixed part and the workspace.

    Raises:
        MemoryBudgetError: the fixed part alone exceeds the budget (naming the fixes).

    Example:
        >>> fp = ModelFootprint(135_000_000, 135_000_000, False, 30, 576, 1536, 192, 49152, 2)
        >>> round(room_above_fixed(fp, 3.5) / GIB, 2)
        1.14
    """
    fixed = footprint.fixed_bytes() + footprint.workspace_bytes()
    left = budget_gib * GIB - fixed - overshoot_bytes
    if left <= 0:
        measured = (
            f" and {overshoot_bytes / GIB:.2f} GiB that earlier steps measured above their plans"
            if overshoot_bytes
            else ""
        )
        raise MemoryBudgetError(
            f"trainer.memory_budget_gib={budget_gib:g} is below the trainer's fixed footprint "
            f"({fixed / GIB:.2f} GiB: fp32 weights, gradients and AdamW moments of "
            f"{footprint.trainable / 1e6:.0f}M trained parameters, plus the output projection's "
            f"workspace{measured}); raise the budget, keep AdamW's moments in bf16 "
            "(trainer.optimizer_state_dtype: bfloat16), or train LoRA adapters (trainer.lora)"
        )
    return left


def plan_step(
    footprint: ModelFootprint,
    budget_gib: float,
    configured_tokens: int,
    longest_row: int,
    reserved_tokens: int = 0,
    extra_bytes_per_token: float = 0.0,
    overshoot_bytes: float = 0.0,
) -> StepPlan:
    """The micro-batch size (padded tokens, at most `configured_tokens`) and checkpointing choice
    that keep a step within `budget_gib`, given the step's longest row (tokens per pass) and
    `reserved_tokens` whose activations stay alive across the passes (a shared prefix, unless
    the plan recomputes it after them: `StepPlan.recompute_prefix`), plus
    `extra_bytes_per_token` (the prefix's keys and values each row holds, spread over its tokens),
    and `overshoot_bytes` held back (what earlier steps measured above their plans).

    Raises:
        MemoryBudgetError: the fixed part alone exceeds the budget, or one row does not fit even
            with gradient checkpointing.

    Example:
        >>> fp = ModelFootprint(135_000_000, 135_000_000, False, 30, 576, 1536, 192, 49152, 2)
        >>> plan = plan_step(fp, budget_gib=3.5, configured_tokens=2048, longest_row=200)
        >>> plan.micro_batch_tokens, plan.checkpointing, plan.keep_logprobs, plan.recompute_prefix
        (960, False, True, False)
    """
    fixed = footprint.fixed_bytes() + footprint.workspace_bytes()
    left = room_above_fixed(footprint, budget_gib, overshoot_bytes)
    # Fastest first: no checkpointing with small passes keeping their log-probs, then without
    # keeping them (a recompute of the output projection), then checkpointing. Within each, the
    # shared prefix keeps its graph across the passes unless recomputing it after them (its
    # activations then live only while no pass does) fits more tokens per pass.
    leaves = 2 * footprint.prefix_kv_bytes(reserved_tokens)  # its keys/values and their grads
    prefix_pass = reserved_tokens * footprint.activation_bytes_per_token(False)  # its recompute
    for checkpointing, keep in ((False, True), (False, False), (True, False)):
        activations = footprint.activation_bytes_per_token(checkpointing)
        per_token = activations + extra_bytes_per_token
        tokens = _fitting(footprint, left - reserved_tokens * activations, per_token, keep)
        recompute = False
        if reserved_tokens and tokens < configured_tokens and prefix_pass + leaves <= left:
            alternative = _fitting(footprint, left - leaves, per_token, keep)
            if alternative > tokens:
                tokens, recompute = alternative, True
        if tokens >= longest_row:  # (rounded down to 64 tokens where the longest row still fits)
            rounded = tokens - tokens % 64
            size = min(configured_tokens, max(rounded, longest_row))
            alive = leaves if recompute else reserved_tokens * activations
            return StepPlan(
                size,
                checkpointing,
                keep,
                recompute,
                base_bytes=footprint.step_bytes() + alive,
                bytes_per_token=per_token,
                kept_bytes_per_token=4 * footprint.vocab if keep else 0,
                kept_up_to=footprint.kept_logprob_tokens(),
            )
    need = fixed + (longest_row + reserved_tokens) * footprint.activation_bytes_per_token(True)
    raise MemoryBudgetError(
        f"a {longest_row}-token sample needs ~{need / GIB:.2f} GiB even with gradient "
        f"checkpointing, more than trainer.memory_budget_gib={budget_gib:g}; raise the budget, "
        "shorten samples (explorer sampling.max_tokens, trainer.max_seq_len), or use trainer.lora"
    )


def _fitting(footprint: ModelFootprint, room: float, per_token: float, keep: bool) -> int:
    """Tokens a pass may have in `room` bytes at `per_token` bytes each; `keep`: every pass up to
    that size must also fit its kept log-probs where it is small enough to keep them
    (4 x vocab bytes a token; a larger pass recomputes them)."""
    tokens = int(room // per_token)
    if keep:
        small = int(room // (per_token + 4 * footprint.vocab))
        tokens = tokens if small >= footprint.kept_logprob_tokens() else small
    return tokens


def footprint_of(
    model: PreTrainedModel,
    trainable: int,
    reference: bool,
    compute_bytes: int,
    optimizer_bytes: int = 8,
) -> ModelFootprint:
    """The footprint of a loaded HF causal LM (the base model under any peft wrapper)."""
    text = model.config.get_text_config()
    hidden = int(text.hidden_size)
    heads = int(text.num_attention_heads)
    head_dim = int(getattr(text, "head_dim", None) or hidden // heads)
    kv_heads = int(getattr(text, "num_key_value_heads", None) or heads)
    return ModelFootprint(
        parameters=sum(p.numel() for p in model.parameters()),
        trainable=trainable,
        reference=reference,
        layers=int(text.num_hidden_layers),
        hidden=hidden,
        intermediate=int(getattr(text, "intermediate_size", None) or 4 * hidden),
        kv_width=kv_heads * head_dim,
        vocab=int(text.vocab_size),
        compute_bytes=compute_bytes,
        optimizer_bytes=optimizer_bytes,
    )


@dataclass(slots=True)
class BudgetWatch:
    """What the trainer's steps measured against their plans: `overshoot_bytes` is the most any
    measured step exceeded its plan by (0 until one did), held back from the budget in every later
    plan. A step's measurement is the peak it added above what was resident when it began.

    Example:
        >>> watch = BudgetWatch()
        >>> watch.observe(planned=1.0 * GIB, measured=1.3 * GIB)
        True
        >>> round(watch.overshoot_bytes / GIB, 2), watch.observe(GIB, 1.1 * GIB)
        (0.3, False)
    """

    overshoot_bytes: float = 0.0

    def observe(self, planned: float, measured: float) -> bool:
        """Record one step; returns whether the overshoot grew (later plans change)."""
        over = measured - planned
        if over <= self.overshoot_bytes:
            return False
        self.overshoot_bytes = over
        return True


class StepMeter:
    """What one trainer step adds to memory above what was resident when it began: on CUDA
    torch's peak of allocated memory; on CPU the process's resident memory, sampled every 10 ms by
    a thread (so an allocator's cached free blocks count, as they do for the machine). None where
    neither can be read.

    Example:
        >>> meter = StepMeter(torch.device("cpu"))
        >>> meter.start()
        >>> block = bytearray(32 * 2**20)
        >>> added = meter.stop()
        >>> added is None or added >= 0
        True
        >>> meter.close()
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self._peaks = None if self.cuda else PhasePeaks(interval=0.01).start()
        self._base: float | None = None

    def start(self) -> None:
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
            self._base = float(torch.cuda.memory_allocated(self.device))
        elif self._peaks is not None and self._peaks.available:
            self._peaks.take()  # a new phase: its peak counts from now
            now = self._peaks.now()
            self._base = None if now is None else now * GIB

    def so_far(self) -> float | None:
        """Bytes the step has added at its peak until now (None: not measurable here)."""
        if self._base is None:
            return None
        if self.cuda:
            return float(torch.cuda.max_memory_allocated(self.device)) - self._base
        assert self._peaks is not None
        peak = self._peaks.peek()
        return None if peak is None else max(0.0, peak * GIB - self._base)

    def stop(self) -> float | None:
        """Bytes the step added at its peak above its start (None: not measurable here); the
        next `start` begins a new measurement."""
        added = self.so_far()
        self._base = None
        return added

    def close(self) -> None:
        if self._peaks is not None:
            self._peaks.stop()
