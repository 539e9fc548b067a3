"""A short end-to-end training run on one device: the embedded engine + the torch trainer.

    python benchmarks/gpu_check.py [--device cuda] [--shape qwen2.5-0.5b] [--steps 4]

The model is Qwen2.5-0.5B-shaped (24 layers, hidden 896, GQA 14/2 heads, MLP 4864), randomly
initialised, with the project's real tokenizer (SmolLM2's, so the vocabulary is 49,152 rather
than Qwen's 151,936); nothing is downloaded. Each step explores 8 prompts x 8 completions of
exactly `--tokens` tokens (reward: the share of vowels, which varies, so every group trains),
trains one GRPO step in bf16 and syncs the weights into the engine. Prints one line per measure:
tokens/s (trained tokens through the trainer), step time, peak GPU memory and MFU (6 x
non-embedding parameters x tokens of the train passes, plus 6 x the vocabulary projection x
trained tokens, over train time and the device's peak bf16 FLOP/s).

`--device cpu --shape tiny` runs the same path on CPU in a minute (`scripts/gpu_check.sh
--dry-run`): everything but CUDA.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import tempfile
import time
from pathlib import Path

SHAPES = {
    "qwen2.5-0.5b": {
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
    },
    "tiny": {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
    },
}
PEAK_BF16_FLOPS = {"H100": 989e12, "H200": 989e12, "A100": 312e12}
"""Dense bf16 tensor-core peaks (SXM), for MFU."""

WORKFLOW = """
import openai
from agentscope_rft.integration.agentscope import current_scope

async def run(task, model):
    scope = current_scope()
    client = openai.AsyncOpenAI(base_url=scope.base_url, api_key=scope.api_key)
    r = await client.chat.completions.create(
        model="policy", messages=[{"role": "user", "content": task["prompt"]}],
        max_tokens=TOKENS, extra_body={"ignore_eos": True})
    text = r.choices[0].message.content or ""
    return sum(c in "aeiou" for c in text) / max(1, len(text))
"""


def build_model(shape: str, out: Path) -> tuple[int, int]:
    """A random Qwen2 model of `shape` with the project's tokenizer in `out`; its parameters and
    those of its (tied) embedding."""
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    from agentscope_rft.models import EMBEDDED_MODEL, resolve_model

    tokenizer = AutoTokenizer.from_pretrained(resolve_model(EMBEDDED_MODEL))
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        rope_theta=1e6,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **SHAPES[shape],
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return sum(p.numel() for p in model.parameters()), config.vocab_size * config.hidden_size


def peak_flops(device: str) -> float:
    import torch

    if device.startswith("cuda"):
        name = torch.cuda.get_device_name()
        for key, flops in PEAK_BF16_FLOPS.items():
            if key in name:
                return flops
        return PEAK_BF16_FLOPS["H100"]
    size = 1024
    a = torch.randn(size, size)
    b = torch.randn(size, size)
    a @ b
    started = time.perf_counter()
    for _ in range(10):
        a @ b
    return 2 * size**3 * 10 / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--shape", choices=list(SHAPES), default="qwen2.5-0.5b")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--work", default=None, help="folder for the model and run (default tmp)")
    args = parser.parse_args()

    import torch

    from agentscope_rft.config import load_config
    from agentscope_rft.runtime.local import train

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("gpu_check: no CUDA device visible (use --device cpu for a dry run)")
    work = Path(args.work or tempfile.mkdtemp(prefix="gpu-check-"))
    model_dir = work / "model"
    started = time.perf_counter()
    parameters, embedding = build_model(args.shape, model_dir)
    (work / "check_app.py").write_text(WORKFLOW.replace("TOKENS", str(args.tokens)))
    prompts = ["Write a poem about the sea.", "Describe a city.", "Tell a story.", "Explain rain."]
    (work / "tasks.jsonl").write_text(
        "".join(json.dumps({"id": i, "prompt": p}) + "\n" for i, p in enumerate(prompts * 2))
    )
    dtype = "bfloat16" if args.device.startswith("cuda") else "float32"
    config = load_config(
        None,
        [
            f"model.name_or_path={model_dir}",
            f"workflow={work / 'check_app.py'}:run",
            f"tasks.train={work / 'tasks.jsonl'}",
            f"engine.device={args.device}",
            f"engine.dtype={dtype}",
            f"trainer.device={args.device}",
            f"trainer.dtype={dtype}",
            "trainer.lr=1e-6",
            "explorer.group_size=8",
            "explorer.tasks_per_step=8",
            f"explorer.sampling.max_tokens={args.tokens}",
            "algorithm.filter_zero_variance_groups=false",
            f"run.steps={args.steps}",
            f"run.dir={work / 'run'}",
            "run.name=gpu-check",
            "monitor.tensorboard=false",
            "monitor.plot_every=0",
            "monitor.console=false",
        ],
    )
    if args.device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    asyncio.run(train(config, work / "run"))
    rows = [json.loads(x) for x in (work / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r.get("phase") == "train" and "time/step" in r]
    if len(steps) != args.steps:
        raise SystemExit(f"gpu_check: {len(steps)} of {args.steps} steps finished")
    timed = steps[1:] or steps  # the first step warms kernels up
    mean = {k: sum(r[k] for r in timed) / len(timed) for k in ("time/step", "time/train")}
    trained = sum(r["train/trained_tokens"] for r in timed) / len(timed)
    passed = sum(r["train/tokens"] for r in timed) / len(timed)
    # Every token of a pass runs the layers; only trained positions run the vocabulary projection.
    flops = 6 * (parameters - embedding) * passed + 6 * embedding * trained
    mfu = flops / mean["time/train"] / peak_flops(args.device)
    peak = torch.cuda.max_memory_allocated() / 2**30 if args.device.startswith("cuda") else None
    device = torch.cuda.get_device_name() if args.device.startswith("cuda") else "CPU"
    print(f"gpu_check: {args.shape} ({parameters / 1e6:.0f}M parameters) on {device}, {dtype}")
    print(f"tokens/s (trained): {trained / mean['time/train']:.0f}")
    print(f"tokens/s (train passes, prompt + completion): {passed / mean['time/train']:.0f}")
    print(f"step time: {mean['time/step']:.2f} s (train {mean['time/train']:.2f} s)")
    print(f"peak GPU memory: {f'{peak:.2f} GiB' if peak is not None else 'n/a (CPU)'}")
    print(f"MFU: {100 * mfu:.1f}%")
    print(f"loss finite: {all(abs(r['loss']) < float('inf') for r in steps)}")
    print(f"wall: {time.perf_counter() - started:.0f} s")
    if args.work is None:
        shutil.rmtree(work, ignore_errors=True)  # the model and run folder were scratch


if __name__ == "__main__":
    main()
