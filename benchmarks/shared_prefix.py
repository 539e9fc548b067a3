"""Torch trainer step with and without shared-prefix passes, on an agent-shaped GRPO batch.

    python benchmarks/shared_prefix.py [--model smollm2-135m-instruct] [--prefix 420]
        [--task-prompt 12] [--tasks 4] [--group 8] [--steps 3] [--micro-batch-tokens 2048]
        [--dtype auto|float32|bfloat16] [--child plain|shared|grouped  (one side only)]

The batch looks like the quickstart's: every sample starts with the same `--prefix` tokens
(system prompt, tool schema, worked examples), then a per-task prompt (`--task-prompt` tokens: the
quickstart's 12-token question, or an agent's task and first observation) and a sampled answer
of 20-90 trained tokens. Baseline: `trainer.share_prefix: false` (every row runs its whole
sequence). Ours: `share_prefix: true` (the shared prefix runs once per mini-batch; gradients flow
through it) without and with `share_group_prefix` (each group's task prompt runs once per
micro-batch too). Each side runs in its own process (so peak RSS is its own) on the same batches;
reported: median step seconds after a warm-up step, peak RSS, and the loss of the first step
(all must agree). Prints a Markdown table for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import statistics
import subprocess
import sys
import time

from agentscope_rft.types import Sample


def batch(prefix: int, task_prompt: int, tasks: int, group: int, seed: int) -> list[Sample]:
    rng = random.Random(seed)
    shared = [rng.randrange(100, 40000) for _ in range(prefix)]
    samples = []
    for t in range(tasks):
        question = [rng.randrange(100, 40000) for _ in range(task_prompt)]
        for e in range(group):
            answer = [rng.randrange(100, 40000) for _ in range(rng.randint(20, 90))]
            context = len(shared) + len(question)
            samples.append(
                Sample(
                    token_ids=shared + question + answer,
                    loss_mask=[0] * context + [1] * len(answer),
                    logprobs=[0.0] * context + [-rng.uniform(0.5, 3.0) for _ in answer],
                    reward=float(e % 2),
                    rollout_id=f"s{seed}t{t}e{e}",
                    task_id=f"t{t}",
                    group_id=f"s{seed}t{t}",
                )
            )
    return samples


SIDES = {
    "plain": "share_prefix: false (baseline)",
    "shared": "share_prefix: true, share_group_prefix: false",
    "grouped": "share_prefix: true, share_group_prefix: true",
}


def child(args: argparse.Namespace) -> None:
    from agentscope_rft.algorithms import AlgorithmConfig
    from agentscope_rft.config import TorchTrainerConfig
    from agentscope_rft.models import resolve_model
    from agentscope_rft.trainers.torch_trainer import TorchTrainer

    config = TorchTrainerConfig(
        lr=1e-5,
        micro_batch_tokens=args.micro_batch_tokens,
        share_prefix=args.child != "plain",
        share_group_prefix=args.child == "grouped",
        dtype=args.dtype,
        device="cpu",
    )
    trainer = TorchTrainer(
        resolve_model(args.model), config, AlgorithmConfig(), total_steps=args.steps + 1
    )
    times, first_loss = [], None
    for step in range(args.steps + 1):
        samples = batch(args.prefix, args.task_prompt, args.tasks, args.group, seed=step)
        started = time.perf_counter()
        metrics = trainer.step(samples, step)
        times.append(time.perf_counter() - started)
        first_loss = metrics["loss"] if first_loss is None else first_loss
    shape = (args.prefix, args.task_prompt, args.tasks, args.group)
    tokens = sum(len(s.token_ids) for s in batch(*shape, seed=0))
    print(
        json.dumps(
            {
                "side": args.child,
                "step_s": statistics.median(times[1:]),
                "tokens": tokens,
                "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
                "first_loss": first_loss,
                "dtype": str(trainer.autocast_dtype or "float32"),
            }
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--prefix", type=int, default=420)
    parser.add_argument("--task-prompt", type=int, default=12)
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"])
    parser.add_argument("--tasks", type=int, default=4)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--micro-batch-tokens", type=int, default=2048)
    parser.add_argument("--child", choices=SIDES)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    rows = {}
    for side in SIDES:
        argv = [sys.executable, __file__, *sys.argv[1:], "--child", side]
        out = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
        rows[side] = json.loads(out.strip().splitlines()[-1])
    plain = rows["plain"]
    print(
        f"{args.tasks * args.group} samples, {args.prefix}-token shared prefix, "
        f"{args.task_prompt}-token task prompts, "
        f"{plain['tokens']} tokens per batch, {args.model}, "
        f"micro_batch_tokens {args.micro_batch_tokens}\n"
    )
    print("| trainer step | seconds (median) | tokens/s | peak RSS GB | first-step loss | dtype |")
    print("|---|---|---|---|---|---|")
    for side, name in SIDES.items():
        row = rows[side]
        print(
            f"| {name} | {row['step_s']:.1f} | {row['tokens'] / row['step_s']:.0f} | "
            f"{row['peak_rss_gb']:.1f} | {row['first_loss']:.6f} | {row['dtype']} |"
        )
    for side in ("shared", "grouped"):
        print(f"speed-up of {SIDES[side]}: {plain['step_s'] / rows[side]['step_s']:.2f}x")


if __name__ == "__main__":
    main()
