"""Time `VerlTrainer.step` against `TorchTrainer.step` on the same GRPO batch (trainer protocol).

Usage (from the repository root):
    PYTHONPATH=. python benchmarks/verl_trainer.py --model tiny-random --batch 16 --seq 128
    PYTHONPATH=. python benchmarks/verl_trainer.py --device cuda --dtype bfloat16 \
        --model smollm2-135m-instruct --batch 64 --seq 1024 --micro-batch-tokens 16384

Prints one JSON line per trainer: median step time after the first, trained tokens/s, and the
first step's loss (the two trainers must agree on it in fp32). One rank; multi-GPU layouts need
`--gpus N` (Ray actors, verl trainer only).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import torch

from agentscope_rft.algorithms import AlgorithmConfig
from agentscope_rft.config import TorchTrainerConfig, VerlTrainerConfig
from agentscope_rft.models import resolve_model
from agentscope_rft.types import Sample


def make_batch(num: int, length: int, vocab: int, group: int = 8) -> list[Sample]:
    """GRPO groups of `group` samples with mixed rewards; a quarter of each sample is prompt."""
    gen = torch.Generator().manual_seed(0)
    prompt = length // 4
    return [
        Sample(
            token_ids=torch.randint(3, vocab, (length,), generator=gen).tolist(),
            loss_mask=[0] * prompt + [1] * (length - prompt),
            logprobs=[0.0] * prompt + [-2.0] * (length - prompt),
            reward=float((i * 5) % 3),
            rollout_id=f"r{i}",
            task_id=f"t{i // group}",
        )
        for i in range(num)
    ]


def time_trainer(name: str, trainer: Any, samples: list[Sample], steps: int) -> dict[str, Any]:
    times, first_loss = [], None
    for step in range(steps):
        torch.manual_seed(step)
        started = time.perf_counter()
        metrics = trainer.step(samples, step)
        times.append(time.perf_counter() - started)
        first_loss = metrics["loss"] if first_loss is None else first_loss
    tokens = sum(s.num_trained_tokens for s in samples)
    median = statistics.median(times[1:] or times)
    return {
        "trainer": name,
        "step_s": round(median, 3),
        "first_step_s": round(times[0], 3),
        "trained_tokens_per_s": round(tokens / median, 1),
        "first_loss": first_loss,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="tiny-random")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--micro-batch-tokens", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--gpus", type=int, default=1)
    parser.add_argument("--skip-torch", action="store_true")
    args = parser.parse_args()

    path = resolve_model(args.model)
    from transformers import AutoConfig

    vocab = int(AutoConfig.from_pretrained(path).get_text_config().vocab_size)
    samples = make_batch(args.batch, args.seq, vocab)
    shared: dict[str, Any] = {
        "lr": 1e-6,
        "dtype": args.dtype,
        "micro_batch_tokens": args.micro_batch_tokens,
        "device": args.device,
    }
    algorithm = AlgorithmConfig()
    results = []
    if not args.skip_torch:
        from agentscope_rft.trainers.torch_trainer import TorchTrainer

        trainer = TorchTrainer(path, TorchTrainerConfig(**shared), algorithm, total_steps=10)
        results.append(time_trainer("torch", trainer, samples, args.steps))
        del trainer
    from agentscope_rft.trainers.verl.trainer import VerlTrainer

    verl_config = VerlTrainerConfig(n_gpus_per_node=args.gpus, **shared)
    verl_trainer = VerlTrainer(path, verl_config, algorithm, total_steps=10)
    results.append(time_trainer("verl", verl_trainer, samples, args.steps))
    verl_trainer.close()
    for row in results:
        row.update(model=args.model, device=args.device, dtype=args.dtype, batch=args.batch)
        row.update(seq=args.seq, threads=torch.get_num_threads())
        print(json.dumps(row))


if __name__ == "__main__":
    main()
