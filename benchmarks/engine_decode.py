"""One decode step of the embedded model, with and without the engine's CPU decode changes.

    python benchmarks/engine_decode.py [--batch 1,8,32] [--context 100,450] [--threads 1]

Each variant prefills `batch` distinct random prompts of `context` tokens into the engine's own
KV cache (`BatchCache`: buffers with spare room, as the running batch has them), then times 20
decode steps (median) in the same process, one variant after the other:

- `sdpa`: transformers' SDPA attention, plain `F.linear` (the engine before this work)
- `grouped`: the engine's decode attention (`engines/attention.py`), plain `F.linear`
- `grouped+packed`: that, plus oneDNN-packed linear weights (`engines/packed.py`)
- `fused`: the fused decode step (`engines/fused.py`) on the packed model (the default)

Also checked: every variant's logits equal `sdpa`'s to bf16 rounding. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import time
from typing import Any

import torch

from agentscope_rft.engines.attention import use_decode_attention
from agentscope_rft.engines.fused import FusedDecoder
from agentscope_rft.engines.kv_cache import BatchCache
from agentscope_rft.engines.packed import pack_linear_weights
from agentscope_rft.models import EMBEDDED_MODEL, load_causal_lm, resolve_model

VARIANTS = ("sdpa", "grouped", "grouped+packed", "fused")


def load(variant: str, path: str, dtype: torch.dtype) -> tuple[Any, FusedDecoder | None]:
    model = load_causal_lm(resolve_model(path), dtype=dtype, device="cpu").eval()
    if variant != "sdpa":
        use_decode_attention(model)
    if variant in ("grouped+packed", "fused"):
        pack_linear_weights(model)
    return model, FusedDecoder(model) if variant == "fused" else None


@torch.inference_mode()
def decode_steps(
    model: Any, fused: FusedDecoder | None, batch: int, context: int, steps: int = 20
) -> tuple[float, torch.Tensor]:
    generator = torch.Generator().manual_seed(batch * 100_003 + context)
    ids = torch.randint(100, 40_000, (batch, context), generator=generator)
    cache = BatchCache(model.config.num_hidden_layers)
    mask = torch.ones(batch, context, dtype=torch.long)
    out = model(input_ids=ids, attention_mask=mask, past_key_values=cache, use_cache=True)
    token = out.logits[:, -1].argmax(-1)
    positions = torch.full((batch,), context)
    times, logits = [], []
    for _ in range(steps):
        mask = torch.cat([mask, mask.new_ones(batch, 1)], dim=1)
        started = time.perf_counter()
        if fused is not None:
            step_logits = fused.step(token, positions, mask, cache)
        else:
            step_logits = (
                model(
                    input_ids=token[:, None],
                    attention_mask=mask,
                    position_ids=positions[:, None],
                    past_key_values=cache,
                    use_cache=True,
                    cache_position=torch.tensor([mask.shape[1] - 1]),
                )
                .logits[:, -1]
                .float()
            )
        times.append(time.perf_counter() - started)
        logits.append(step_logits)
        token, positions = step_logits.argmax(-1), positions + 1
    return statistics.median(times), torch.stack(logits)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", default="1,8,32")
    parser.add_argument("--context", default="100,450")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--model", default=EMBEDDED_MODEL)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    load_avg = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    shapes = [(int(b), int(c)) for c in args.context.split(",") for b in args.batch.split(",")]
    results: dict[tuple[str, int, int], float] = {}
    reference: dict[tuple[int, int], torch.Tensor] = {}
    worst: dict[str, float] = {}
    for variant in VARIANTS:
        model, fused = load(variant, args.model, dtype)
        for batch, context in shapes:
            seconds, logits = decode_steps(model, fused, batch, context)
            results[variant, batch, context] = seconds
            # Greedy paths may part where bf16 rounding flips a near-tie: compare the first step.
            first = reference.setdefault((batch, context), logits[0])
            error = float((logits[0] - first).abs().max())
            worst[variant] = max(worst.get(variant, 0.0), error)
            print(f"{variant} batch {batch} context {context}: {seconds * 1000:.1f} ms", flush=True)
        del model, fused
    print(f"\n{args.model}, {args.dtype}, {args.threads} thread(s); uptime at start: {load_avg}\n")
    print("| batch x context | " + " | ".join(f"{v} (ms)" for v in VARIANTS) + " | speed-up |")
    print("|---|" + "---:|" * (len(VARIANTS) + 1))
    for batch, context in shapes:
        cells = [f"{results[v, batch, context] * 1000:.1f}" for v in VARIANTS]
        gain = results[VARIANTS[0], batch, context] / results[VARIANTS[-1], batch, context]
        print(f"| {batch} x {context} | " + " | ".join(cells) + f" | {gain:.2f}x |")
    print(
        "\nlargest first-step logit difference from sdpa: "
        + ", ".join(f"{v} {worst[v]:.3g}" for v in VARIANTS)
    )


if __name__ == "__main__":
    main()
