"""A decode step for Llama-family models without transformers' module machinery (CPU).

At agent batch sizes a decode step of a small model is hundreds of tiny ops, and on CPU the
Python around them (module calls, keyword plumbing, mask building, cache bookkeeping, once per
layer) costs as much as the arithmetic. `FusedDecoder.step` runs the same arithmetic as the
transformers forward of a Llama, Mistral, Qwen2 or Qwen3 model, for one new token per row:

- q, k and v come from one matmul against their concatenated weights, gate and up from another;
  with bf16/fp16 on CPU these are oneDNN-packed (`packed.py`);
- rotary embedding is applied to q and k heads together; the attention mask (padding + the
  cache's spare columns) is built once per step, not once per layer;
- attention groups the query heads of each KV head and reads the cache's buffers in place (as
  `attention.py` does), so nothing is copied per layer.

Every elementwise op is the one transformers runs, in the same order and dtype. A self-check at
start (`fusion_changes_results`) confirms that the fused matmuls give exactly the separate ones'
results on this CPU; where they do not, q/k/v and gate/up are multiplied separately.

`FusedDecoder.prefill` computes the prompts admitted together as one ragged batch: their new
tokens (after any cached prefix) go through the linear layers as one unpadded `[tokens, hidden]`
matrix, and attention runs per prompt, its new tokens against its own past and themselves
(PyTorch SDPA, bottom-right causal). transformers' batched prefill pads every prompt to the
longest; with agent prompts that share cached prefixes and differ in a few dozen new tokens that
padding was ~40% of the compute, and building the padded past KV cost as much again. Each
prompt's KV is written straight into one buffer of its own, which the prefix cache and the
running batch take. In bf16 the logits and KV are bit-identical to the transformers forward of
the prompt alone, whatever else is in the batch (fp32: within matmul rounding).

The fused weights are copies: `refresh` retakes them after every weight swap (`packed.repack`
calls it), so a step never uses an older policy's weights.

Example:
    >>> decoder = FusedDecoder(model)  # doctest: +SKIP
    >>> logits = decoder.step(token_ids, positions, mask, cache)  # doctest: +SKIP
    >>> kv = decoder.new_kv(len(prompt))  # doctest: +SKIP
    >>> first_logits = decoder.prefill([Segment(prompt, 0, kv)])  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F
from transformers import PreTrainedModel

from agentscope_rft.engines.attention import grouped_decode
from agentscope_rft.engines.kv_cache import BatchCache, GrowingLayer
from agentscope_rft.engines.packed import (
    PACKED_DTYPES,
    linear,
    on_repack,
    pack,
    packed_weight,
    packing_fails,
    unpack,
)

SUPPORTED_TYPES = ("llama", "mistral", "qwen2", "qwen3")


def fused_decode_unsupported(model: PreTrainedModel) -> str | None:
    """Why `model` cannot use `FusedDecoder` (None: it can)."""
    config = model.config
    kind = getattr(config, "model_type", None)
    if kind not in SUPPORTED_TYPES:
        return f"model type {kind!r} (fused decode supports {', '.join(SUPPORTED_TYPES)})"
    if getattr(config, "hidden_act", None) != "silu":
        return f"activation {config.hidden_act!r} (fused decode supports silu)"
    layer_types = getattr(config, "layer_types", None) or []
    sliding = getattr(config, "sliding_window", None) and (
        kind == "mistral" or getattr(config, "use_sliding_window", False)
    )
    if sliding or any(t != "full_attention" for t in layer_types):
        return "sliding-window attention"
    body = getattr(model, "model", None)
    if body is None or not hasattr(body, "layers") or not hasattr(body, "rotary_emb"):
        return "not a standard decoder layout (model.model.layers, model.model.rotary_emb)"
    if not isinstance(model.get_output_embeddings(), nn.Linear):
        return "the output layer is not a plain linear layer"
    for layer in body.layers:
        attn, mlp = layer.self_attn, layer.mlp
        linears = (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj)
        if not all(
            type(m) is nn.Linear for m in (*linears, mlp.gate_proj, mlp.up_proj, mlp.down_proj)
        ):
            return "adapted linear layers (LoRA or quantized)"
    if next(model.parameters()).device.type != "cpu":
        return "not on CPU (fused decode is for CPU)"
    return None


@dataclass
class _Linear:
    """One matmul: a packed weight (bf16/fp16) or a plain one, and a bias."""

    weight: torch.Tensor
    bias: torch.Tensor | None
    packed: bool

    @classmethod
    def of(cls, modules: list[nn.Linear], use_packing: bool) -> _Linear:
        weights = [m.weight.detach() for m in modules]
        weight = torch.cat(weights) if len(weights) > 1 else weights[0]
        biases = [m.bias for m in modules]
        bias = None
        if any(b is not None for b in biases):
            bias = torch.cat(
                [
                    b.detach() if b is not None else m.weight.new_zeros(m.out_features)
                    for b, m in zip(biases, modules, strict=True)
                ]
            )
        if use_packing:
            shared = packed_weight(modules[0]) if len(modules) == 1 else None
            return cls(shared if shared is not None else pack(weight), bias, True)
        return cls(weight, bias, False)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed:
            return linear(x, self.weight, self.bias)
        return F.linear(x, self.weight, self.bias)


@dataclass
class _Layer:
    qkv: list[_Linear]  # one fused matmul, or q, k, v
    gate_up: list[_Linear]  # one fused matmul, or gate, up
    o: _Linear
    down: _Linear
    norm_in: tuple[torch.Tensor, float]  # RMSNorm weight (the model's parameter) and eps
    norm_post: tuple[torch.Tensor, float]
    qk_norm_weight: torch.Tensor | None  # Qwen3: per-head norm weights of q heads then k heads
    qk_norm_eps: float


class FusedDecoder:
    """The decode step of a supported model (see `fused_decode_unsupported`)."""

    def __init__(self, model: PreTrainedModel) -> None:
        reason = fused_decode_unsupported(model)
        if reason:
            raise ValueError(f"fused decode is not available for this model: {reason}")
        self.model = model
        config = model.config
        self.heads = int(config.num_attention_heads)
        self.kv_heads = int(getattr(config, "num_key_value_heads", None) or self.heads)
        self.head_dim = int(
            getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        )
        self.scale = float(model.model.layers[0].self_attn.scaling)
        weight = next(model.parameters())
        dtype = weight.dtype
        # Folds rotate_half's sign into the sin (see `_rotary`): -1 on the first half.
        self.rotary_sign = torch.ones(self.head_dim, dtype=dtype, device=weight.device)
        self.rotary_sign[: self.head_dim // 2] = -1
        self.use_packing = dtype in PACKED_DTYPES and packing_fails(dtype) is None
        self.fuse = not fusion_changes_results(dtype, self.use_packing)
        self.layers: list[_Layer] = []
        self.refresh()
        on_repack(model, self.refresh)

    def drop_module_packs(self) -> int:
        """Free the packed copies of the linear layers this decoder runs fused (q/k/v and
        gate/up, whose concatenations it packs itself); returns how many were dropped.

        Only for an engine that runs every prefill and decode through this decoder: the
        model's own forward then multiplies those layers unpacked (the same results, slower).
        """
        if not (self.fuse and self.use_packing):
            return 0  # unfused groups use the modules' own packed copies
        dropped = 0
        for layer in self.model.model.layers:
            attn, mlp = layer.self_attn, layer.mlp
            for module in (attn.q_proj, attn.k_proj, attn.v_proj, mlp.gate_proj, mlp.up_proj):
                dropped += unpack(module)
        return dropped

    def release(self) -> None:
        """Free the fused weight copies until the next `refresh` (no decode may run meanwhile:
        the engine is parked while a trainer that shares its weights steps)."""
        self.layers = []

    def refresh(self) -> None:
        """Retake the fused weights from the model's current parameters."""
        with torch.no_grad():
            self.layers = [self._layer(layer) for layer in self.model.model.layers]

    def _layer(self, layer: Any) -> _Layer:  # a transformers decoder layer
        attn, mlp = layer.self_attn, layer.mlp

        def group(modules: list[nn.Linear]) -> list[_Linear]:
            if self.fuse:
                return [_Linear.of(modules, self.use_packing)]
            return [_Linear.of([m], self.use_packing) for m in modules]

        qk_norm = None
        eps = 0.0
        if getattr(attn, "q_norm", None) is not None:
            qk_norm = torch.cat(
                [
                    attn.q_norm.weight.detach().expand(self.heads, self.head_dim),
                    attn.k_norm.weight.detach().expand(self.kv_heads, self.head_dim),
                ]
            )
            eps = float(attn.q_norm.variance_epsilon)
        return _Layer(
            qkv=group([attn.q_proj, attn.k_proj, attn.v_proj]),
            gate_up=group([mlp.gate_proj, mlp.up_proj]),
            o=_Linear.of([attn.o_proj], self.use_packing),
            down=_Linear.of([mlp.down_proj], self.use_packing),
            norm_in=_norm(layer.input_layernorm),
            norm_post=_norm(layer.post_attention_layernorm),
            qk_norm_weight=qk_norm,
            qk_norm_eps=eps,
        )

    def _rotary(
        self, hidden: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The rotary cos and sign-folded sin for `positions` ([N]), `[N, 1, D]` each: with
        `rolled = x.roll(D / 2)`, `x * cos + rolled * sin` is transformers' `x * cos +
        rotate_half(x) * sin` bit for bit (negating the sin's first half instead of x's second
        half is exact) in one op instead of four."""
        cos, sin = self.model.model.rotary_emb(hidden[None], positions[None])
        return cos[0, :, None], (sin * self.rotary_sign)[0, :, None]

    def _qkv(
        self, layer: _Layer, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The q and k heads of `hidden` ([N, hidden]) with q/k norm (where the model has it)
        and rotary embedding (`cos`, `sin` from `_rotary`), `[N, H + KVH, D]`, and the v heads,
        `[N, KVH, D]`."""
        rows = hidden.shape[0]
        heads, kv_heads, dim = self.heads, self.kv_heads, self.head_dim
        q_size, kv_size = heads * dim, kv_heads * dim
        x = _rms_norm(hidden, *layer.norm_in)
        if len(layer.qkv) == 1:
            qkv = layer.qkv[0](x)
            qk = qkv[:, : q_size + kv_size].view(rows, heads + kv_heads, dim)
            value = qkv[:, q_size + kv_size :]
        else:
            q, k, value = (lin(x) for lin in layer.qkv)
            qk = torch.cat([q, k], dim=-1).view(rows, heads + kv_heads, dim)
        if layer.qk_norm_weight is not None:
            qk = _rms_norm(qk, layer.qk_norm_weight, layer.qk_norm_eps)
        return (qk * cos) + (qk.roll(dim // 2, -1) * sin), value.view(rows, kv_heads, dim)

    @staticmethod
    def _mlp(layer: _Layer, hidden: torch.Tensor) -> torch.Tensor:
        """`hidden` after the layer's MLP block (norm, gate/up, SiLU, down, residual)."""
        x = _rms_norm(hidden, *layer.norm_post)
        if len(layer.gate_up) == 1:
            gate, up = layer.gate_up[0](x).chunk(2, dim=-1)
        else:
            gate, up = (lin(x) for lin in layer.gate_up)
        return hidden + layer.down(F.silu(gate) * up)

    @torch.inference_mode()
    def step(
        self,
        token_ids: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor,
        cache: BatchCache,
    ) -> torch.Tensor:
        """Logits [B, V] of one new token per row.

        `token_ids` and `positions` are [B]; `mask` [B, T+1] marks the cache's T columns and
        the new token's (1 = attend); the new tokens' KV is appended to `cache`.
        """
        batch = token_ids.shape[0]
        heads, dim = self.heads, self.head_dim
        body = self.model.model
        hidden = body.embed_tokens(token_ids)  # [B, H]
        cos, sin = self._rotary(hidden, positions)  # [B, 1, D]
        cache.reserve(1)
        first = cache.layers[0]
        assert isinstance(first, GrowingLayer)
        capacity = first.capacity
        # Additive mask over the buffers' whole time axis: padding and spare columns are -inf.
        scores_mask = torch.full((batch, capacity), float("-inf"))
        scores_mask[:, : mask.shape[1]].masked_fill_(mask.bool(), 0.0)
        scores_mask = scores_mask.view(batch, 1, 1, capacity)
        for layer, cache_layer in zip(self.layers, cache.layers, strict=True):
            assert isinstance(cache_layer, GrowingLayer)
            qk, value = self._qkv(layer, hidden, cos, sin)
            query = qk[:, :heads]  # [B, H, D]
            key = qk[:, heads:].unsqueeze(2)  # [B, KVH, 1, D]
            cache_layer.update(key, value.unsqueeze(2))
            keys, values = cache_layer.buffers()  # [B, KVH, C, D]
            attended = grouped_decode(query, keys, values, scores_mask, self.scale)
            hidden = hidden + layer.o(attended.reshape(batch, heads * dim))
            hidden = self._mlp(layer, hidden)
        hidden = body.norm(hidden)
        return self.model.get_output_embeddings()(hidden).float()

    @torch.inference_mode()
    def prefill(self, segments: Sequence[Segment]) -> torch.Tensor | None:
        """Compute the KV of every segment's new tokens, all segments in one ragged batch.

        The new tokens of all segments go through the linear layers as one `[tokens, hidden]`
        matrix (no padding); attention runs per segment, its new tokens against its own past and
        themselves (causal). Each segment's KV is written into its `kv` at columns
        `[start, start + len(token_ids))`. Returns the logits [S', V] of the last new token of
        each segment with `logits=True`, in order (None if there are none).
        """
        heads, kv_heads, dim = self.heads, self.kv_heads, self.head_dim
        body = self.model.model
        device = body.embed_tokens.weight.device
        bounds, positions, offset = [], [], 0
        for seg in segments:
            n = len(seg.token_ids)
            if n == 0 or seg.kv.shape[3] < seg.start + n:
                raise ValueError("a prefill segment needs new tokens and room for their KV")
            bounds.append((offset, offset + n))
            positions.append(torch.arange(seg.start, seg.start + n))
            offset += n
        ids = torch.tensor([t for seg in segments for t in seg.token_ids], device=device)
        hidden = body.embed_tokens(ids)  # [N, H]
        cos, sin = self._rotary(hidden, torch.cat(positions).to(device))  # [N, 1, D]
        masks = [
            torch.ones(e - s, seg.start + e - s, dtype=torch.bool, device=device).tril(seg.start)
            for seg, (s, e) in zip(segments, bounds, strict=True)
        ]
        total = offset
        q_size = heads * dim
        attended = hidden.new_empty(total, q_size)
        for index, layer in enumerate(self.layers):
            qk, value = self._qkv(layer, hidden, cos, sin)
            for seg, (s, e), mask in zip(segments, bounds, masks, strict=True):
                end = seg.start + e - s
                keys, values = seg.kv[index, 0], seg.kv[index, 1]  # [KVH, T, D]
                keys[:, seg.start : end].copy_(qk[s:e, heads:].transpose(0, 1))
                values[:, seg.start : end].copy_(value[s:e].transpose(0, 1))
                out = F.scaled_dot_product_attention(
                    qk[s:e, :heads].transpose(0, 1)[None],
                    keys[None, :, :end],
                    values[None, :, :end],
                    attn_mask=mask,
                    scale=self.scale,
                    enable_gqa=heads != kv_heads,
                )  # [1, H, n, D]
                attended[s:e] = out[0].transpose(0, 1).reshape(e - s, q_size)
            hidden = hidden + layer.o(attended)
            hidden = self._mlp(layer, hidden)
        last = [e - 1 for seg, (_, e) in zip(segments, bounds, strict=True) if seg.logits]
        if not last:
            return None
        hidden = body.norm(hidden[torch.tensor(last, device=device)])
        return self.model.get_output_embeddings()(hidden).float()

    def new_kv(self, length: int) -> torch.Tensor:
        """An uninitialised KV buffer for `length` positions: [layers, 2, KVH, length, D]."""
        weight = self.model.model.embed_tokens.weight
        return weight.new_empty(len(self.layers), 2, self.kv_heads, length, self.head_dim)


@dataclass(slots=True)
class Segment:
    """New tokens of one sequence for `FusedDecoder.prefill`: `token_ids` at positions
    `start, start + 1, ...`, after `start` positions whose KV is already in `kv`
    (`[layers, 2, kv_heads, >= start + len(token_ids), head_dim]`); `logits`: return the last
    token's."""

    token_ids: Sequence[int]
    start: int
    kv: torch.Tensor
    logits: bool = True


def _norm(module: Any) -> tuple[torch.Tensor, float]:
    return module.weight, float(getattr(module, "variance_epsilon", getattr(module, "eps", 1e-6)))


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' Llama RMSNorm, op for op."""
    dtype = x.dtype
    x = x.to(torch.float32)
    variance = x.pow(2).mean(-1, keepdim=True)
    x = x * torch.rsqrt(variance + eps)
    return weight * x.to(dtype)


_FUSION_CHECKED: dict[tuple[torch.dtype, bool], bool] = {}


def fusion_changes_results(dtype: torch.dtype, packed: bool) -> bool:
    """Whether one matmul against concatenated weights differs from separate matmuls here."""
    key = (dtype, packed)
    if key not in _FUSION_CHECKED:
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(7, 96, generator=generator).to(dtype)
        parts = [torch.randn(n, 96, generator=generator).to(dtype) for n in (64, 32, 48)]
        if packed:
            whole = linear(x, pack(torch.cat(parts)), None)
            alone = [linear(x, pack(p), None) for p in parts]
        else:
            whole = F.linear(x, torch.cat(parts))
            alone = [F.linear(x, p) for p in parts]
        _FUSION_CHECKED[key] = not torch.equal(whole, torch.cat(alone, dim=-1))
    return _FUSION_CHECKED[key]
