"""The fused decode step: bit-identical to the transformers forward, and follows weight swaps."""

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
from agentscope_rft.engines.batcher import copy_weights
from agentscope_rft.engines.fused import FusedDecoder, fused_decode_unsupported
from agentscope_rft.engines.kv_cache import BatchCache, GrowingLayer
from agentscope_rft.engines.packed import pack_linear_weights, packing_unsupported
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


def test_unsupported_models_say_why():
    gpt2 = AutoModelForCausalLM.from_config(GPT2Config(n_layer=1, n_embd=32, n_head=2))
    assert "model type 'gpt2'" in (fused_decode_unsupported(gpt2) or "")
    window = random_model(MistralConfig(**SMALL, sliding_window=8), torch.float32)
    assert "sliding-window" in (fused_decode_unsupported(window) or "")
    with pytest.raises(ValueError, match="fused decode is not available"):
        FusedDecoder(gpt2)
