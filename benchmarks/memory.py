"""Where the quickstart's memory goes: peak RSS per component, each in its own process.

    python benchmarks/memory.py [--parts imports,engine,trainer,logprobs,seq,quickstart]
        [--seq-lengths 1024,2048,4096,8192] [--json out.json]

Every part runs in a fresh child process (so its peak RSS, `ru_maxrss`, is its own) on
SmolLM2-135M-Instruct on CPU, trainer dtype `auto` (the quickstart's setting):

- `imports`: Python with torch, transformers and the runtime imported (the floor of every process).
- `engine`: the embedded engine serving 32 concurrent chats that share a ~400-token system prompt,
  48 new tokens each (one quickstart explore step), with its default prefix cache.
- `trainer`: the torch trainer on quickstart-shaped GRPO batches (32 samples: a 376-token shared
  prefix, a 12-token question, 20-90 trained tokens; `micro_batch_tokens: 2048`): RSS after
  loading (weights), after the first step (+ gradients and AdamW moments), and the step's peak;
  before (dense log-probs: the full [tokens, vocab] fp32 softmax kept for backward; transformers'
  `sdpa`, which copies K/V per query head under a padding mask), with chunked log-probs, after
  (chunked + grouped-head attention), and after with `--budget` as `memory_budget_gib`.
- `logprobs`: the log-prob + entropy pass alone over 1,500 trained tokens, dense vs chunked.
- `quickstart`: README command 1's training run cut to `--steps` steps (no validation) under
  `/usr/bin/time -v`, the engine with its own copy of the weights, sharing the trainer's
  (`engine.share_trainer_weights`), and sharing with AdamW's moments in bf16
  (`trainer.optimizer_state_dtype`), one after the other; `--budget` sets `memory_budget_gib` in
  all. Peak RSS of the whole run, wall time, and each step's reward (the same rollouts expected).
- `seq`: one sample of N tokens (all trained; beside a 64-token one): the step's peak RSS above
  the fixed memory, for each N (linear growth = no quadratic attention buffer). With `--device
  cuda`, the trainer runs on the GPU (bf16) and the figures are torch's allocated GPU memory.

Prints Markdown tables for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

GB = 1e9


def peak_rss() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GB


def current_rss() -> float:
    import psutil

    from agentscope_rft.runtime.memory import release_freed_memory

    release_freed_memory()
    return psutil.Process().memory_info().rss / GB


def _imports() -> None:
    import torch  # noqa: F401
    import transformers  # noqa: F401

    import agentscope_rft.runtime.local  # noqa: F401


def child_imports(args: argparse.Namespace) -> dict:
    _imports()
    return {"peak_gb": peak_rss(), "rss_gb": current_rss()}


def child_engine(args: argparse.Namespace) -> dict:
    import asyncio

    from agentscope_rft.engines.base import ChatRequest
    from agentscope_rft.engines.embedded import EmbeddedEngine
    from agentscope_rft.types import SamplingParams

    _imports()
    if args.module_packs == "keep":  # the engine before 2026-11-29: every linear layer packed
        from agentscope_rft.engines.fused import FusedDecoder

        FusedDecoder.drop_module_packs = lambda self: 0  # type: ignore[method-assign]
    floor = current_rss()
    system = "You are a careful calculator agent. " * 50  # ~400 tokens shared by every call

    async def run() -> float:
        engine = EmbeddedEngine(args.model)
        await engine.start()
        loaded = current_rss()

        async def one(i: int) -> None:
            request = ChatRequest(
                messages=[
                    {"role": "system", "content": system},
                    {"role": "user", "content": f"What is {i} times {i + 7}? Think it through."},
                ],
                sampling=SamplingParams(temperature=1.0, max_tokens=48, seed=i, ignore_eos=True),
            )
            async for _ in engine.chat(request):
                pass

        await asyncio.gather(*[one(i) for i in range(32)])
        await engine.close()
        return loaded

    loaded = asyncio.run(run())
    return {"floor_gb": floor, "loaded_gb": loaded, "peak_gb": peak_rss()}


def _dense_logprobs(self, base, selected, targets, temperature):  # type: ignore[no-untyped-def]
    """The trainer's log-probs before chunking: the whole [M, V] fp32 softmax, kept for backward."""
    head = base.get_output_embeddings()
    with self._autocast():
        logits = head(selected)
    logp = (logits.float() / temperature.unsqueeze(-1)).log_softmax(dim=-1)
    token = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return token, -(logp.exp() * logp).sum(-1)


def _trainer(args: argparse.Namespace, **settings: object):  # type: ignore[no-untyped-def]
    from agentscope_rft.algorithms import AlgorithmConfig
    from agentscope_rft.config import TorchTrainerConfig
    from agentscope_rft.models import resolve_model
    from agentscope_rft.trainers.torch_trainer import TorchTrainer

    if args.logprobs == "dense":
        TorchTrainer._token_logprobs = _dense_logprobs  # type: ignore[method-assign]
    if args.attention == "sdpa":  # transformers' sdpa: K/V copied per query head (before)
        import agentscope_rft.trainers.torch_trainer as module

        module.use_training_attention = lambda model, device: False  # type: ignore[assignment]
    config = TorchTrainerConfig.model_validate(
        {"lr": 1e-5, "device": args.device, "dtype": args.dtype, **settings}
    )
    return TorchTrainer(resolve_model(args.model), config, AlgorithmConfig(), total_steps=8)


def child_trainer(args: argparse.Namespace) -> dict:
    sys.path.insert(0, os.path.dirname(__file__))
    from shared_prefix import batch

    _imports()
    floor = current_rss()
    settings: dict[str, object] = {"micro_batch_tokens": args.micro_batch_tokens}
    if args.budget:
        settings["memory_budget_gib"] = args.budget
    trainer = _trainer(args, **settings)
    loaded = current_rss()
    times, losses = [], []
    for step in range(args.steps):
        started = time.perf_counter()
        metrics = trainer.step(batch(376, 12, 4, 8, seed=step), step)  # the quickstart's shape
        times.append(time.perf_counter() - started)
        losses.append(metrics["loss"])
        if step == 0:
            after_first = current_rss()
    return {
        "floor_gb": floor,
        "loaded_gb": loaded,
        "fixed_gb": after_first,
        "peak_gb": peak_rss(),
        "step_s": min(times[1:] or times),
        "loss": losses[0],
        "micro_batch_tokens": trainer.plan.micro_batch_tokens,
    }


def child_logprobs(args: argparse.Namespace) -> dict:
    import torch

    from agentscope_rft.engines.embedded import pick_dtype
    from agentscope_rft.trainers.logprobs import token_logprobs_entropy

    _imports()
    auto = pick_dtype("auto", torch.device("cpu"))
    dtype = getattr(torch, args.dtype) if args.dtype != "auto" else auto
    tokens, hidden, vocab = 1500, 576, 49152
    h = torch.randn(tokens, hidden).to(dtype).requires_grad_()
    w = (torch.randn(vocab, hidden) * 0.02).to(dtype).requires_grad_()
    targets = torch.randint(vocab, (tokens,))
    temperature = torch.ones(tokens)
    floor = current_rss()
    started = time.perf_counter()
    if args.logprobs == "dense":
        logp = ((h @ w.t()).float() / temperature.unsqueeze(-1)).log_softmax(-1)
        lp = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        ent = -(logp.exp() * logp).sum(-1)
    else:
        lp, ent = token_logprobs_entropy(h, w, None, targets, temperature)
    (lp.sum() + 0.01 * ent.sum()).backward()
    return {
        "floor_gb": floor,
        "peak_gb": peak_rss(),
        "s": time.perf_counter() - started,
        "dtype": str(dtype),
    }


def child_seq(args: argparse.Namespace) -> dict:
    from agentscope_rft.types import Sample

    _imports()
    trainer = _trainer(args, micro_batch_tokens=max(args.length, 16))

    def row(n: int, seed: int) -> list[Sample]:
        import random

        rng = random.Random(seed)
        ids = [rng.randrange(100, 40000) for _ in range(n)]
        # The long row and a 64-token one with another reward: a group that trains.
        return [
            Sample(
                token_ids=ids[:size],
                loss_mask=[0] + [1] * (size - 1),
                logprobs=[0.0] + [-1.0] * (size - 1),
                reward=float(r),
                rollout_id=f"r{seed}{r}",
                task_id="t",
                group_id="g",
            )
            for r, size in enumerate((n, min(n, 64)))
        ]

    trainer.step(row(64, 0), 0)  # gradients and AdamW state exist from here on
    if args.device.startswith("cuda"):  # GPU memory: allocated by torch, not the process RSS
        import torch

        torch.cuda.synchronize()
        fixed = torch.cuda.memory_allocated() / GB
        before = torch.cuda.max_memory_allocated() / GB
        torch.cuda.reset_peak_memory_stats()
        started = time.perf_counter()
        trainer.step(row(args.length, 1), 1)
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() / GB
    else:
        fixed = current_rss()
        before = peak_rss()
        started = time.perf_counter()
        trainer.step(row(args.length, 1), 1)
        peak = peak_rss()
    return {
        "length": args.length,
        "device": args.device,
        "fixed_gb": fixed,
        "peak_gb": peak,
        "warmup_peak_gb": before,
        "step_s": time.perf_counter() - started,
    }


CHILDREN = {
    "imports": child_imports,
    "engine": child_engine,
    "trainer": child_trainer,
    "logprobs": child_logprobs,
    "seq": child_seq,
}


def quickstart_run(steps: int, budget: float | None, share: bool, *extra: str) -> dict:
    """README command 1's run, `steps` steps, under `/usr/bin/time -v`: peak RSS and wall.
    `extra`: more `--set` items (e.g. `trainer.optimizer_state_dtype=bfloat16`)."""
    import re
    import tempfile

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with tempfile.TemporaryDirectory(prefix="memory-quickstart-") as run_dir:
        argv = ["/usr/bin/time", "-v", sys.executable, "-m", "agentscope_rft.cli", "train"]
        argv += ["--config", os.path.join(root, "examples/quickstart/config.yaml")]
        sets = [f"run.steps={steps}", "run.eval_every=0", f"run.dir={run_dir}"]
        sets.append(f"engine.share_trainer_weights={str(share).lower()}")
        if budget is not None:
            sets.append(f"trainer.memory_budget_gib={budget}")
        sets += extra
        for item in sets:
            argv += ["--set", item]
        started = time.perf_counter()
        done = subprocess.run(argv, capture_output=True, text=True, cwd=root)
        wall = time.perf_counter() - started
        if done.returncode != 0:
            raise RuntimeError(f"quickstart run failed:\n{done.stderr[-3000:]}")
        kb = re.search(r"Maximum resident set size \(kbytes\): (\d+)", done.stderr)
        assert kb is not None, done.stderr[-2000:]
        with open(os.path.join(run_dir, "metrics.jsonl")) as handle:
            rows = [json.loads(line) for line in handle]
    rewards = [round(r["reward/mean"], 4) for r in rows if "reward/mean" in r and "loss" in r]
    return {"peak_gb": int(kb.group(1)) * 1024 / GB, "wall_s": wall, "rewards": rewards}


def spawn(args: argparse.Namespace, part: str, *extra: str) -> dict:
    argv = [sys.executable, __file__, "--child", part, "--model", args.model]
    argv += ["--device", args.device, *extra]
    out = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--parts", default="imports,engine,logprobs,trainer,seq")
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--seq-lengths", default="1024,2048,4096,8192")
    parser.add_argument("--seq-attention", default="gqa", help="sdpa,gqa: both")
    parser.add_argument("--budget", type=float, default=None)
    parser.add_argument("--json", default=None)
    parser.add_argument("--child", choices=list(CHILDREN))
    parser.add_argument("--logprobs", choices=["dense", "chunked"], default="chunked")
    parser.add_argument("--module-packs", choices=["keep", "drop"], default="drop")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--attention", choices=["sdpa", "gqa"], default="gqa")
    parser.add_argument("--micro-batch-tokens", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--length", type=int, default=1024)
    parser.add_argument(
        "--device", default="cpu", help="cuda: the `seq` part measures GPU memory (bf16)"
    )
    args = parser.parse_args()
    if args.child:
        print(json.dumps(CHILDREN[args.child](args)))
        return
    parts = args.parts.split(",")
    results: dict[str, object] = {}
    if "imports" in parts:
        results["imports"] = spawn(args, "imports")
        print("imports", results["imports"], flush=True)
    if "engine" in parts:
        # `keep`: the fused layers' own packed copies kept as well (the baseline, bf16 only)
        for packs in ("keep", "drop"):
            results[f"engine_{packs}"] = spawn(args, "engine", "--module-packs", packs)
            print(f"engine ({packs} module packs)", results[f"engine_{packs}"], flush=True)
    if "logprobs" in parts:
        for kind in ("dense", "chunked"):
            results[f"logprobs_{kind}"] = spawn(args, "logprobs", "--logprobs", kind)
            print(f"logprobs {kind}", results[f"logprobs_{kind}"], flush=True)
    if "trainer" in parts:
        variants = {
            "before": ["--logprobs", "dense", "--attention", "sdpa"],
            "chunked": ["--logprobs", "chunked", "--attention", "sdpa"],
            "after": ["--logprobs", "chunked", "--attention", "gqa"],
        }
        if args.budget:
            variants["budget"] = ["--logprobs", "chunked", "--budget", str(args.budget)]
        for name, extra in variants.items():
            results[f"trainer_{name}"] = spawn(args, "trainer", *extra)
            print(f"trainer {name}", results[f"trainer_{name}"], flush=True)
    if "quickstart" in parts:
        variants: list[tuple[str, bool, tuple[str, ...]]] = [
            ("copy", False, ()),
            ("shared", True, ()),
            ("shared_bf16_moments", True, ("trainer.optimizer_state_dtype=bfloat16",)),
        ]
        for name, share, extra in variants:
            results[f"quickstart_{name}"] = quickstart_run(args.steps, args.budget, share, *extra)
            print(f"quickstart {name}", results[f"quickstart_{name}"], flush=True)
    if "seq" in parts:
        for length in args.seq_lengths.split(","):
            for attention in args.seq_attention.split(","):
                name = f"seq_{length}_{attention}"
                results[name] = spawn(args, "seq", "--length", length, "--attention", attention)
                print(f"seq {length} {attention}", results[name], flush=True)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(results, handle, indent=1)
    report(results)


def report(results: dict) -> None:
    """Markdown tables for docs/benchmarks.md."""
    rows: list[tuple[str, float, float]] = []
    if "imports" in results:
        rows.append(
            ("imports (Python, torch, transformers, runtime)", results["imports"]["peak_gb"], 0)
        )
    for packs in ("keep", "drop"):
        e = results.get(f"engine_{packs}")
        if e:
            what = f"{packs} the fused layers' packed copies"
            loaded = e["loaded_gb"] - e["floor_gb"]
            rows.append((f"engine: weights loaded ({what})", e["loaded_gb"], loaded))
            chats = e["peak_gb"] - e["loaded_gb"]
            rows.append((f"engine: 32 concurrent chats ({what})", e["peak_gb"], chats))
    for kind in ("dense", "chunked"):
        r = results.get(f"logprobs_{kind}")
        if r:
            label = f"log-probs + entropy, 1,500 tokens, {kind} ({r['s']:.1f} s)"
            rows.append((label, r["peak_gb"], r["peak_gb"] - r["floor_gb"]))
    for name in ("before", "chunked", "after", "budget"):
        r = results.get(f"trainer_{name}")
        if r:
            fixed = r["fixed_gb"] - r["floor_gb"]
            rows.append((f"trainer {name}: weights + grads + AdamW", r["fixed_gb"], fixed))
            label = (
                f"trainer {name}: step (micro-batch {r['micro_batch_tokens']} tokens, "
                f"{r['step_s']:.1f} s, loss {r['loss']:.6f})"
            )
            rows.append((label, r["peak_gb"], r["peak_gb"] - r["fixed_gb"]))
    print("\n| component | peak RSS (GB) | above its floor (GB) |\n|---|---:|---:|")
    for label, peak, above in rows:
        print(f"| {label} | {peak:.2f} | {above:.2f} |")
    runs = {k: v for k, v in results.items() if k.startswith("quickstart_")}
    if runs:
        print("\n| quickstart run | peak RSS (GB) | wall (s) | step rewards |\n|---|---:|---:|---|")
        for name, r in runs.items():
            label = name.removeprefix("quickstart_")
            print(f"| {label} | {r['peak_gb']:.2f} | {r['wall_s']:.0f} | {r['rewards']} |")
    seq = {k: v for k, v in results.items() if k.startswith("seq_")}
    if seq:
        print("\n| tokens | attention | step peak above fixed (GB) | GB per 1k tokens | s |")
        print("|---:|---|---:|---:|---:|")
        for name, r in seq.items():
            above = r["peak_gb"] - r["fixed_gb"]
            per_k = above / r["length"] * 1000
            attention = name.rsplit("_", 1)[1]
            print(
                f"| {r['length']} | {attention} | {above:.2f} | {per_k:.2f} | {r['step_s']:.0f} |"
            )


if __name__ == "__main__":
    main()
