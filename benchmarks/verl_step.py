"""Time one verl training step (and a plain PyTorch step on the same batch, for scale).

Usage (CPU, single process, from the repository root):
    PYTHONPATH=. python benchmarks/verl_step.py --model tiny-random --batch 8 --seq 256 --steps 3
GPU (bf16), one process per GPU:
    torchrun --nproc-per-node 1 benchmarks/verl_step.py --device cuda --dtype bf16 \
        --model smollm2-135m-instruct --batch 32 --seq 1024 --micro-batch 8

Prints one JSON line per step from rank 0: step time, trained tokens/s and verl's MFU estimate
(verl's FlopsCounter; 0 on CPU, where it knows no peak FLOP/s).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from agentscope_rft.models import resolve_model
from agentscope_rft.trainers.verl.convert import build_batch
from agentscope_rft.trainers.verl.engine import VerlEngineSettings, VerlTrainingEngine
from agentscope_rft.trainers.verl.loss import TokenLossInputs, VerlLoss
from agentscope_rft.types import Sample


def ppo_clip(x: TokenLossInputs) -> tuple[torch.Tensor, dict[str, float]]:
    ratio = torch.exp(x.logprobs - x.old_logprobs)
    per_token = -torch.min(ratio * x.advantages, ratio.clamp(0.8, 1.2) * x.advantages)
    loss = (per_token * x.mask).sum() / x.mask.sum()
    return loss, {"pg_loss": float(loss.detach())}


def make_batch(num: int, length: int, vocab: int) -> tuple[list[Sample], torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    prompt = length // 4
    samples = [
        Sample(
            token_ids=torch.randint(3, vocab, (length,), generator=gen).tolist(),
            loss_mask=[0] * prompt + [1] * (length - prompt),
            logprobs=[0.0] * prompt + [-1.0] * (length - prompt),
            reward=float(i % 2),
            rollout_id=f"r{i}",
            task_id=f"t{i // 4}",
        )
        for i in range(num)
    ]
    advantages = torch.tensor([1.0 if i % 2 else -1.0 for i in range(num)])
    return samples, advantages


def plain_torch_step_s(path: str, samples: list[Sample], micro_batch: int, device: str) -> float:
    """Seconds for one plain PyTorch step (fp32, same micro-batching), after one warm-up step."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="sdpa").to(device)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    ids = torch.tensor([list(s.token_ids) for s in samples], device=device)
    elapsed = 0.0
    for _ in range(2):
        started = time.perf_counter()
        for micro in ids.split(micro_batch):
            logits = model(input_ids=micro).logits
            logprobs = torch.log_softmax(logits[:, :-1].float(), -1)
            picked = logprobs.gather(-1, micro[:, 1:, None]).squeeze(-1)
            (-picked.mean()).backward()
        optimizer.step()
        optimizer.zero_grad()
        if device == "cuda":
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - started
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="tiny-random")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument("--compare-torch", action="store_true", help="also time a plain step")
    args = parser.parse_args()

    path = str(resolve_model(args.model))
    settings = VerlEngineSettings(
        model_path=path,
        device=args.device,
        micro_batch_size=args.micro_batch,
        param_dtype=args.dtype,
        lr=1e-6,
        gradient_checkpointing=args.gradient_checkpointing,
    )
    started = time.perf_counter()
    engine = VerlTrainingEngine(settings, VerlLoss(ppo_clip, weighting="tokens"))
    build_s = time.perf_counter() - started
    samples, advantages = make_batch(args.batch, args.seq, len(engine.tokenizer))
    batch = build_batch(
        samples, advantages, pad_token_id=engine.pad_token_id, multiple_of=engine.batch_multiple
    )
    times = []
    for step in range(args.steps):
        metrics = engine.train_step(batch)
        times.append(metrics["step_time_s"])
        if engine.rank == 0:
            record = {
                "step": step,
                "step_time_s": round(metrics["step_time_s"], 3),
                "trained_tokens_per_s": round(metrics["num_tokens"] / metrics["step_time_s"], 1),
                "mfu": metrics.get("mfu"),
                "loss": metrics["loss"],
            }
            print(json.dumps(record), flush=True)
    if engine.rank == 0:
        summary = {
            "model": args.model,
            "device": args.device,
            "dtype": args.dtype,
            "world_size": engine.world_size,
            "batch": f"{args.batch}x{args.seq}",
            "micro_batch": args.micro_batch,
            "build_s": round(build_s, 2),
            "median_step_s_after_first": round(statistics.median(times[1:] or times), 3),
        }
        if args.compare_torch:
            summary["plain_torch_step_s"] = round(
                plain_torch_step_s(path, samples, args.micro_batch, args.device), 3
            )
        print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
