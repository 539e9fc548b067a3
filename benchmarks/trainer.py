"""One GRPO step, ours vs TRL's GRPOTrainer: same model, prompts, group size, lengths, steps.

    python benchmarks/trainer.py [--prompts 4] [--group 8] [--tokens 32] [--steps 3]

Both sides do the whole step: generate `prompts x group` completions of exactly `--tokens`
tokens (sampling, temperature 1), score them, compute GRPO advantages, one optimizer step.
Ours: the embedded engine + gateway + explorer + torch trainer + in-process weight sync (the real
`agentscope-rft train` loop with a minimal workflow). TRL: `trl.GRPOTrainer` (HF `generate`).
Each side runs in its own process (peak RSS is per process) after one warm-up step, on glibc's
allocator unless named in `--jemalloc` (run again under jemalloc, as `run.allocator: jemalloc`
starts `agentscope-rft train`); reported:
seconds per step, trained tokens/s, peak RSS, and an MFU-style figure: trained tokens/s x 6N
FLOPs over this CPU's measured bf16 matmul FLOP/s. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROMPTS = [
    "Write a poem about the sea.",
    "Describe a busy city street.",
    "Tell a story about a dragon.",
    "Explain how rain forms.",
    "Describe a winter forest.",
    "Write about an old train station.",
    "Describe a jazz concert.",
    "Tell me about bread.",
]


def matmul_flops(device: str = "cpu") -> float:
    """This device's measured bf16 matmul FLOP/s (the MFU-style figure's denominator)."""
    import torch

    size = 1024 if device == "cpu" else 8192
    a = torch.randn(size, size, dtype=torch.bfloat16, device=device)
    b = torch.randn(size, size, dtype=torch.bfloat16, device=device)
    for _ in range(3):
        a @ b
    runs = 20
    if device != "cpu":
        torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(runs):
        a @ b
    if device != "cpu":
        torch.cuda.synchronize()
    return 2 * size**3 * runs / (time.perf_counter() - started)


# ----------------------------------------------------------------------------- ours
WORKFLOW = """
from agentscope_rft.integration.agentscope import current_scope

async def run(task, model):
    # The episode's client on the run's shared connection pool (a new `openai.AsyncOpenAI` per
    # episode would load the system's CA certificates each time, ~20 ms on the event loop).
    client = current_scope().client_for(None)
    r = await client.chat.completions.create(
        model="policy", messages=[{"role": "user", "content": task["prompt"]}],
        max_tokens=TOKENS, extra_body={"ignore_eos": True})
    text = r.choices[0].message.content or ""
    return sum(c in "aeiou" for c in text) / max(1, len(text))
"""


def run_ours(args: argparse.Namespace, work: Path) -> dict:
    import asyncio
    import json as js

    from agentscope_rft.config import load_config
    from agentscope_rft.runtime.local import train

    (work / "bench_app.py").write_text(WORKFLOW.replace("TOKENS", str(args.tokens)))
    tasks = work / "tasks.jsonl"
    tasks.write_text(
        "".join(
            js.dumps({"id": i, "prompt": p}) + "\n" for i, p in enumerate(PROMPTS[: args.prompts])
        )
    )
    config = load_config(
        None,
        [
            f"workflow={work / 'bench_app.py'}:run",
            f"tasks.train={tasks}",
            f"explorer.group_size={args.group}",
            f"explorer.tasks_per_step={args.prompts}",
            f"explorer.sampling.max_tokens={args.tokens}",
            "algorithm.filter_zero_variance_groups=false",
            "trainer.lr=1e-6",
            f"run.steps={args.steps + 1}",
            f"run.dir={work / 'run'}",
            "run.name=bench",
            "monitor.tensorboard=false",
            "monitor.plot_every=0",
            "monitor.console=false",
            "tasks.shuffle=false",
            f"engine.device={args.device}",
            f"trainer.device={args.device}",
        ],
    )
    started = time.perf_counter()
    asyncio.run(train(config, work / "run"))
    total = time.perf_counter() - started
    rows = [js.loads(x) for x in (work / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r.get("phase") == "train" and "time/step" in r][1:]
    per_step = sum(r["time/step"] for r in steps) / len(steps)  # explore + train + sync
    trained = sum(r["train/trained_tokens"] for r in steps) / len(steps)
    phases = ("explore", "train", "sync")
    split = {k: sum(r[f"time/{k}"] for r in steps) / len(steps) for k in phases}
    return {
        "name": "agentscope-rft (embedded engine + torch trainer)",
        "split": split,
        "s_per_step": per_step,
        "trained_tokens_per_step": trained,
        "wall_s": total,
    }


# ----------------------------------------------------------------------------- TRL
def run_trl(args: argparse.Namespace, work: Path) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from agentscope_rft.models import EMBEDDED_MODEL, resolve_model

    path = resolve_model(EMBEDDED_MODEL)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(args.device)
    data = Dataset.from_list(
        [{"prompt": [{"role": "user", "content": p}]} for p in PROMPTS[: args.prompts]]
        * (args.steps + 2)
    )

    def vowel_share(completions: list, **_: object) -> list[float]:
        texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
        return [sum(ch in "aeiou" for ch in t) / max(1, len(t)) for t in texts]

    times: list[float] = []

    class Timer(TrainerCallback):
        def on_step_begin(self, *a: object, **k: object) -> None:
            self.t = time.perf_counter()

        def on_step_end(self, *a: object, **k: object) -> None:
            times.append(time.perf_counter() - self.t)

    bf16 = args.trl_bf16
    config = GRPOConfig(
        output_dir=str(work / "trl"),
        per_device_train_batch_size=args.prompts * args.group,
        num_generations=args.group,
        max_completion_length=args.tokens,
        learning_rate=1e-6,
        max_steps=args.steps + 1,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=args.device == "cpu",
        bf16=bf16,
        temperature=1.0,
        beta=0.0,
        generation_kwargs={"min_new_tokens": args.tokens},
        dataloader_num_workers=0,
        steps_per_generation=1,
        shuffle_dataset=False,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=vowel_share,
        args=config,
        train_dataset=data,
        processing_class=tokenizer,
        callbacks=[Timer()],
    )
    started = time.perf_counter()
    trainer.train()
    total = time.perf_counter() - started
    per_step = sum(times[1:]) / len(times[1:])
    return {
        "name": f"TRL 1.16 GRPOTrainer ({'bf16' if bf16 else 'fp32'})",
        "s_per_step": per_step,
        "trained_tokens_per_step": args.prompts * args.group * args.tokens,
        "wall_s": total,
    }


def where(device: str) -> str:
    if device == "cpu":
        return f"{os.cpu_count()} CPUs"
    import torch

    return torch.cuda.get_device_name()


def child(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        result = run_ours(args, Path(tmp)) if args.child == "ours" else run_trl(args, Path(tmp))
    result["peak_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2
    from agentscope_rft.runtime.memory import loaded_allocator

    result["name"] += f" ({loaded_allocator()})"
    if args.device != "cpu":
        import torch

        result["peak_gpu_gb"] = torch.cuda.max_memory_allocated() / 1024**3
    print("RESULT " + json.dumps(result))


def main(args: argparse.Namespace) -> None:
    from agentscope_rft.models import EMBEDDED_MODEL, load_causal_lm, resolve_model

    params = sum(p.numel() for p in load_causal_lm(resolve_model(EMBEDDED_MODEL)).parameters())
    flops = matmul_flops(args.device)
    results = []
    from agentscope_rft.runtime.memory import jemalloc_library

    jemalloc = jemalloc_library()
    runs = [(side, False) for side in args.sides] + [(side, True) for side in args.jemalloc]
    for side, preload in runs:
        cmd = [sys.executable, __file__, "--child", side, *sys.argv[1:]]
        env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
        if preload:
            if jemalloc is None:
                raise SystemExit("--jemalloc: no jemalloc library found (pip install ray)")
            env["LD_PRELOAD"] = jemalloc
        done = subprocess.run(cmd, capture_output=True, text=True, env=env)
        line = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
        if done.returncode != 0 or not line:
            print(done.stderr[-4000:], file=sys.stderr)
            raise SystemExit(f"{side} failed")
        results.append(json.loads(line[-1][len("RESULT ") :]))
    trl = [r for r in results if r["name"].startswith("TRL")]
    base = (trl or results)[0]["s_per_step"]  # the first TRL run (glibc), else the first run
    print(
        f"\nSmolLM2-135M ({params / 1e6:.1f}M params), {args.prompts} prompts x {args.group} "
        f"completions x {args.tokens} tokens, {args.steps} measured steps, {where(args.device)}, "
        f"bf16 matmul {flops / 1e9:.0f} GFLOP/s\n"
    )
    print("| | s/step | trained tokens/s | peak RSS (GB) | MFU-style | speed-up vs TRL |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in results:
        tps = r["trained_tokens_per_step"] / r["s_per_step"]
        mfu = tps * 6 * params / flops
        print(
            f"| {r['name']} | {r['s_per_step']:.1f} | {tps:.1f} | {r['peak_rss_gb']:.2f} | "
            f"{mfu:.1%} | {base / r['s_per_step']:.2f}x |"
        )
    for r in results:
        if "peak_gpu_gb" in r:
            print(f"\n{r['name']}: peak GPU memory {r['peak_gpu_gb']:.2f} GiB")
    for r in results:
        if "split" in r:
            parts = ", ".join(f"{k} {v:.1f} s" for k, v in r["split"].items())
            print(f"\n{r['name']}, mean step: {parts}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--trl-bf16", action="store_true")
    parser.add_argument(
        "--device", default="cpu", help="cuda: both sides on the GPU (ours in bf16, `auto`)"
    )
    parser.add_argument("--sides", nargs="+", default=["ours", "trl"])
    parser.add_argument(
        "--jemalloc",
        nargs="*",
        default=[],
        choices=["ours", "trl"],
        help="sides to run once more under jemalloc (LD_PRELOAD), after --sides",
    )
    parser.add_argument("--child", choices=["ours", "trl"])
    parsed = parser.parse_args()
    child(parsed) if parsed.child else main(parsed)
