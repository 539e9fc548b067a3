"""The fused decode step and ragged prefill: equal to the transformers forward, independent of
what else is in the batch, and following weight swaps."""

import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    GPT2Config,
    LlamaConfig,
    MistralConfig,
    Qwen2Config,
    Qwen3Config,
)

from agentscope_rft.engines.attention import use_decode_attention
from agentscope_rft.engines.fused import FusedDecoder, Segment, fused_decode_unsupported
from agentscope_rft.engines.kv_cache import BatchCache, GrowingLayer, right_pad_mask
from agentscope_rft.engines.packed import pack_linear_weights, packed_weight, packing_unsupported
from agentscope_rft.engines.weights import copy_weights
from agentscope_rft.models import load_causal_lm

SMALL = dict(
    vocab_size=300,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
)
PACKING = packing_unsupported(torch.nn.Linear(4, 4, dtype=torch.bfloat16)) is None


def random_model(config, dtype):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    return model.to(dtype).eval()


def prepare(model, dtype):
    use_decode_attention(model)
    if dtype in (torch.bfloat16, torch.float16) and PACKING:
        pack_linear_weights(model)
    return model


def decode(model, steps, fused=None):
    """Prefill three left-padded rows, then `steps` greedy steps; the logits of every step.

    The cache keeps 3 spare columns, so it grows in the middle of the steps."""
    generator = torch.Generator().manual_seed(1)
    vocab = model.config.vocab_size
    ids = torch.randint(3, vocab, (3, 11), generator=generator)
    mask = torch.ones(3, 11, dtype=torch.long)
    mask[1, :4] = 0
    mask[2, :9] = 0
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = BatchCache(model.config.num_hidden_layers)
    with torch.inference_mode():
        out = model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
        )
        for layer in cache.layers:
            assert isinstance(layer, GrowingLayer) and layer.keys is not None
            layer.assign(layer.keys, layer.values, spare=3)
        token = out.logits[:, -1].float().argmax(-1)
        position = positions[:, -1] + 1
        steps_logits = []
        for _ in range(steps):
            mask = torch.cat([mask, mask.new_ones(3, 1)], dim=1)
            if fused is not None:
                logits = fused.step(token, position, mask, cache)
            else:
                logits = (
                    model(
                        input_ids=token[:, None],
                        attention_mask=mask,
                        position_ids=position[:, None],
                        past_key_values=cache,
                        use_cache=True,
                        cache_position=torch.tensor([mask.shape[1] - 1]),
                    )
                    .logits[:, -1]
                    .float()
                )
            steps_logits.append(logits)
            token, position = logits.argmax(-1), position + 1
    return torch.stack(steps_logits)


CONFIGS = {
    "llama": LlamaConfig(**SMALL),
    "qwen2 (q/k/v bias)": Qwen2Config(**SMALL),
    "qwen3 (q/k norm)": Qwen3Config(**SMALL, head_dim=16),
    "mistral (no window)": MistralConfig(**SMALL, sliding_window=None),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("kind", list(CONFIGS))
def test_fused_steps_equal_the_transformers_forward_bit_for_bit(kind, dtype):
    model = prepare(random_model(CONFIGS[kind], dtype), dtype)
    fused = FusedDecoder(model)
    reference = decode(model, steps=6)
    assert torch.equal(decode(model, steps=6, fused=fused), reference)


def test_the_embedded_model_is_fused_and_follows_weight_swaps(tiny_model_path):
    dtype = torch.bfloat16
    model = prepare(load_causal_lm(tiny_model_path, dtype=dtype), dtype)
    fused = FusedDecoder(model)
    assert torch.equal(decode(model, 5, fused), decode(model, 5))

    generator = torch.Generator().manual_seed(0)
    new = {
        name: tensor + 0.05 * torch.randn(tensor.shape, generator=generator).to(tensor.dtype)
        for name, tensor in model.state_dict().items()
    }
    before = decode(model, 5, fused)
    copy_weights(model, new)  # the fused copies are retaken: never the old weights
    after = decode(model, 5, fused)
    assert not torch.equal(before, after)
    fresh = prepare(load_causal_lm(tiny_model_path, dtype=dtype), dtype)
    copy_weights(fresh, new)
    assert torch.equal(after, decode(fresh, 5))


@pytest.mark.skipif(not PACKING, reason="oneDNN bf16 packing does not work on this CPU")
def test_dropping_the_fused_layers_packs_keeps_results_and_swaps(tiny_model_path):
    """The engine frees the packed copies of q/k/v and gate/up (the fused groups pack their own):
    the fused steps, the plain forward and later weight swaps give what they gave before."""
    dtype = torch.bfloat16
    model = prepare(load_causal_lm(tiny_model_path, dtype=dtype), dtype)
    fused = FusedDecoder(model)
    if not fused.fuse:
        pytest.skip("fused matmuls round differently here: the decoder uses the modules' packs")
    before_fused, before_plain = decode(model, 5, fused), decode(model, 5)
    layers = model.model.layers
    assert fused.drop_module_packs() == 5 * len(layers)
    assert fused.drop_module_packs() == 0  # once
    attn, mlp = layers[0].self_attn, layers[0].mlp
    assert packed_weight(attn.q_proj) is None and packed_weight(mlp.up_proj) is None
    assert packed_weight(attn.o_proj) is not None and packed_weight(mlp.down_proj) is not None
    assert torch.equal(decode(model, 5, fused), before_fused)
    assert torch.equal(decode(model, 5), before_plain)

    generator = torch.Generator().manual_seed(0)
    new = {
        name: tensor + 0.05 * torch.randn(tensor.shape, generator=generator).to(tensor.dtype)
        for name, tensor in model.state_dict().items()
    }
    copy_weights(model, new)  # repacks what is still packed and retakes the fused copies
    fresh = prepare(load_causal_lm(tiny_model_path, dtype=dtype), dtype)
    copy_weights(fresh, new)
    assert torch.equal(decode(model, 5, fused), decode(fresh, 5))
    assert packed_weight(attn.q_proj) is None


def prompts(model, lengths, seed=2):
    generator = torch.Generator().manual_seed(seed)
    vocab = model.config.vocab_size
    return [torch.randint(3, vocab, (n,), generator=generator).tolist() for n in lengths]


def reference_prefill(model, ids):
    """Last-token logits and KV (`[layers, 2, KVH, T, D]`) of `ids` alone, by transformers."""
    cache = BatchCache(model.config.num_hidden_layers)
    with torch.inference_mode():
        out = model(input_ids=torch.tensor([ids]), past_key_values=cache, use_cache=True)
    kv = torch.stack([torch.stack([layer.keys[0], layer.values[0]]) for layer in cache.layers])
    return out.logits[0, -1].float(), kv


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("kind", list(CONFIGS))
def test_ragged_prefill_equals_each_prompt_alone(kind, dtype):
    """Prompts of different lengths in one unpadded batch: each gets the logits and KV it gets
    from the transformers forward alone (bf16 bit for bit; fp32 within matmul rounding), and
    the same results whatever else is in the batch, or when split after cached blocks."""
    model = prepare(random_model(CONFIGS[kind], dtype), dtype)
    fused = FusedDecoder(model)
    batch = prompts(model, (23, 7, 40, 1))
    kvs = [fused.new_kv(len(ids)) for ids in batch]
    logits = fused.prefill([Segment(ids, 0, kv) for ids, kv in zip(batch, kvs, strict=True)])
    assert logits is not None and logits.shape == (4, model.config.vocab_size)
    exact = dtype == torch.bfloat16
    for ids, kv, row in zip(batch, kvs, logits, strict=True):
        ref_logits, ref_kv = reference_prefill(model, ids)
        if exact:
            assert torch.equal(row, ref_logits) and torch.equal(kv, ref_kv)
        else:
            torch.testing.assert_close(row, ref_logits, rtol=0, atol=1e-5)
            torch.testing.assert_close(kv, ref_kv, rtol=0, atol=1e-5)
    # The first 16 tokens already in the KV buffer (a cached prefix), the rest computed.
    split = [fused.new_kv(len(ids)) for ids in batch[::2]]
    for kv, whole in zip(split, kvs[::2], strict=True):
        kv[:, :, :, :16] = whole[:, :, :, :16]
    tails = fused.prefill(
        [Segment(ids[16:], 16, kv) for ids, kv in zip(batch[::2], split, strict=True)]
    )
    assert tails is not None
    alone = fused.prefill([Segment(batch[2], 0, fused.new_kv(40))])
    assert alone is not None
    if exact:
        assert torch.equal(tails, logits[::2]) and torch.equal(alone[0], logits[2])
        assert all(torch.equal(a, b) for a, b in zip(split, kvs[::2], strict=True))
    else:
        torch.testing.assert_close(tails, logits[::2], rtol=0, atol=1e-5)
        torch.testing.assert_close(alone[0], logits[2], rtol=0, atol=1e-5)


def test_ragged_prefill_rejects_segments_without_room():
    model = prepare(random_model(CONFIGS["llama"], torch.float32), torch.float32)
    fused = FusedDecoder(model)
    with pytest.raises(ValueError, match="room for their KV"):
        fused.prefill([Segment([5, 6, 7], 0, fused.new_kv(2))])
    with pytest.raises(ValueError, match="needs new tokens"):
        fused.prefill([Segment([], 0, fused.new_kv(2))])
    assert fused.prefill([Segment([5], 0, fused.new_kv(1), logits=False)]) is None


def test_rows_joining_longer_keep_the_running_rows_results():
    """A longer row joins a running batch: the running rows stay in place (zero columns between
    their end and the new end, masked) and decode exactly as they would have without it."""
    dtype = torch.bfloat16
    model = prepare(random_model(CONFIGS["llama"], dtype), dtype)
    fused = FusedDecoder(model)
    short, long = prompts(model, (9, 30))

    def run(rows):
        kvs = [fused.new_kv(len(ids)) for ids in rows]
        logits = fused.prefill([Segment(ids, 0, kv) for ids, kv in zip(rows, kvs, strict=True)])
        assert logits is not None
        cache = BatchCache(model.config.num_hidden_layers)
        mask = cache.append_rows(kvs[:1])
        if len(rows) > 1:  # join the longer row afterwards, the way the engine does
            joined = cache.append_rows(kvs[1:])
            mask = torch.cat([right_pad_mask(mask, joined.shape[1]), joined])
        token = logits.argmax(-1)
        position = torch.tensor([len(ids) for ids in rows])
        out = []
        for _ in range(4):
            mask = torch.cat([mask, mask.new_ones(len(rows), 1)], dim=1)
            step = fused.step(token, position, mask, cache)
            out.append(step)
            token, position = step.argmax(-1), position + 1
        return torch.stack(out)

    together = run([short, long])
    assert torch.equal(together[:, 0], run([short])[:, 0])
    assert torch.equal(together[:, 1], run([long])[:, 0])


def test_unsupported_models_say_why():
    gpt2 = AutoModelForCausalLM.from_config(GPT2Config(n_layer=1, n_embd=32, n_head=2))
    assert "model type 'gpt2'" in (fused_decode_unsupported(gpt2) or "")
    window = random_model(MistralConfig(**SMALL, sliding_window=8), torch.float32)
    assert "sliding-window" in (fused_decode_unsupported(window) or "")
    with pytest.raises(ValueError, match="fused decode is not available"):
        FusedDecoder(gpt2)
