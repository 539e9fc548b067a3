"""Where the embedded engine's time goes in a GRPO-sized exploration, on CPU or CUDA.

    python benchmarks/engine_profile.py [--device cuda] [--prompts 32] [--tokens 32]
    python benchmarks/engine_profile.py --device cpu --shape tiny     # a dry run, seconds

The GRPO step vs TRL on one H100 (docs/benchmarks.md, 2026-11-27) spent 5.0 s exploring 32
completions x 32 tokens, where the same exploration takes ~2.1 s on a 2-core CPU: ~150 ms a
decode step for a 135M model. This script serves the same shape of work (`--prompts` chat
requests in flight, exactly `--tokens` new tokens each) twice, the second under torch's profiler,
and prints what a GPU session needs to find the gap in one call:

- wall seconds, decode steps and milliseconds per decode step, tokens/s;
- per decode step: torch ops, host-device synchronisations (`aten::_local_scalar_dense`, i.e.
  `.item()` / `.tolist()` on device tensors, and `cudaStreamSynchronize` /
  `cudaDeviceSynchronize`), kernel launches and host<->device copies;
- the device's busy share of the wall time (CUDA: summed kernel time over wall);
- the ops by self host time and by device time (top `--top`).

Side by side, HF `model.generate` on the same prompts as one left-padded batch (what TRL's
GRPOTrainer generates with when it does not use vLLM), same dtype and device, so the figures come
with a baseline from the same run.

Then the same work with a busy Python thread beside the engine (an app's CPU-heavy code on the
event loop: a reward check, a simulator), at the interpreter's default switch interval and at
0.5 ms: every torch op releases the GIL, so a host-bound decode step (a small model on a GPU)
waits up to one switch interval per op while another thread runs Python. On this CPU, a tiny
model: 10 ms a step idle, 1.37 s beside a spinning thread at 5 ms, 0.10 s at 0.5 ms. If the
GPU's step is slow only beside the app, that is where its time goes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import torch
from engine_throughput import ours, prompts
from gpu_check import SHAPES, build_model
from torch.profiler import ProfilerActivity, profile

from agentscope_rft.engines.batcher import ContinuousBatcher
from agentscope_rft.engines.embedded import EmbeddedEngine
from agentscope_rft.models import EMBEDDED_MODEL, load_causal_lm, resolve_model

SYNC_OPS = ("aten::_local_scalar_dense", "cudaStreamSynchronize", "cudaDeviceSynchronize")
LAUNCHES = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernelEx")
COPIES = ("cudaMemcpyAsync", "cudaMemcpy")


class EngineThreadProfiler:
    """torch's profiler started and stopped on the engine's own thread (it records the ops of the
    thread it runs on): polled from the batcher's loop, which passes `_maybe_swap` every turn."""

    def __init__(self, activities: list[ProfilerActivity]) -> None:
        self.activities = activities
        self.want = False
        self.prof: profile | None = None
        self.started, self.stopped = threading.Event(), threading.Event()
        original = ContinuousBatcher._maybe_swap

        def polled(batcher: ContinuousBatcher) -> None:
            self.poll()
            original(batcher)

        ContinuousBatcher._maybe_swap = polled  # type: ignore[method-assign]

    def poll(self) -> None:
        if self.want and self.prof is None:
            self.prof = profile(activities=self.activities)
            self.prof.__enter__()
            self.started.set()
        elif not self.want and self.prof is not None and not self.stopped.is_set():
            self.prof.__exit__(None, None, None)
            self.stopped.set()

    async def run(self, engine: EmbeddedEngine, work: Any) -> tuple[profile, Any]:
        """`await work()` with the engine thread profiled; the profile and work's result."""
        self.want = True
        engine.batcher._wake.set()
        await asyncio.to_thread(self.started.wait)
        out = await work()
        self.want = False
        engine.batcher._wake.set()
        await asyncio.to_thread(self.stopped.wait)
        assert self.prof is not None
        return self.prof, out


async def serve(engine: EmbeddedEngine, convs: list[list[dict]], tokens: int) -> float:
    """Seconds to serve every conversation at once, `tokens` new tokens each (`ours` of
    engine_throughput.py, which checks every completion has them)."""
    done = await ours(engine, convs, tokens, len(convs))
    return len(convs) * tokens / done["tokens_per_s"]


def _spin(stop: threading.Event) -> None:
    """Pure Python until `stop`: it holds the GIL whenever the engine thread lets it go."""
    while not stop.is_set():
        sum(range(2000))


async def beside_busy_thread(
    engine: EmbeddedEngine, convs: list[list[dict]], tokens: int, intervals: list[float]
) -> list[dict[str, float]]:
    """Milliseconds per decode step serving `convs` while another thread runs Python, at each
    of `intervals` (`sys.setswitchinterval`, seconds); the interval is restored after."""
    default, out = sys.getswitchinterval(), []  # rows: interval, tokens a request, ms a step
    try:
        for interval in intervals:
            sys.setswitchinterval(interval)
            stop = threading.Event()
            spinner = threading.Thread(target=_spin, args=(stop,), daemon=True)
            engine.batcher.stats.clear()
            spinner.start()
            try:
                seconds = await serve(engine, convs, tokens)
            finally:
                stop.set()
                spinner.join()
            steps = max(1, int(engine.batcher.stats["decode_steps"]))
            out.append(
                {
                    "switch_interval_ms": 1e3 * interval,
                    "tokens": tokens,
                    "ms_per_decode_step": 1e3 * seconds / steps,
                }
            )
    finally:
        sys.setswitchinterval(default)
    return out


def hf_generate(
    engine: EmbeddedEngine,
    device: torch.device,
    convs: list[list[dict]],
    tokens: int,
    activities: list[ProfilerActivity],
) -> tuple[float, profile]:
    """Seconds for HF `generate` on the conversations as one left-padded batch (after a warm-up),
    and the profile of another such call."""
    assert engine.dtype is not None
    model = load_causal_lm(engine.model_path, dtype=engine.dtype).to(device)
    rows = [engine.renderer.render_ids(conv) for conv in convs]
    width = max(len(r) for r in rows)
    pad = engine.tokenizer.pad_token_id or 0
    ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows], device=device)
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device=device)

    def run(new: int) -> float:
        _sync(device)
        started = time.perf_counter()
        with torch.no_grad():
            out = model.generate(
                ids,
                attention_mask=mask,
                do_sample=True,
                temperature=1.0,
                top_k=0,
                max_new_tokens=new,
                min_new_tokens=new,
                pad_token_id=pad,
            )
        _sync(device)
        assert out.shape[1] - width == new
        return time.perf_counter() - started

    run(2)
    seconds = run(tokens)
    with profile(activities=activities) as prof:
        run(tokens)
    return seconds, prof


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def op_table(events: Any, steps: int, top: int, device: bool) -> list[dict[str, Any]]:
    """The ops (`key_averages()`) by self host time (or device time), counts and milliseconds per
    decode step."""
    key = "self_device_time_total" if device else "self_cpu_time_total"
    ranked = sorted(events, key=lambda e: getattr(e, key, 0.0), reverse=True)[:top]
    return [
        {
            "op": e.key,
            "calls_per_step": e.count / steps,
            "ms_per_step": getattr(e, key, 0.0) / 1e3 / steps,
        }
        for e in ranked
    ]


def per_step(events: Any, steps: int) -> dict[str, float]:
    """aten ops, host-device syncs, kernel launches and copies per step (`key_averages()`)."""

    def calls(names: tuple[str, ...]) -> float:
        return sum(e.count for e in events if e.key in names) / steps

    return {
        "aten_ops": sum(e.count for e in events if e.key.startswith("aten::")) / steps,
        "syncs": calls(SYNC_OPS),
        "kernel_launches": calls(LAUNCHES),
        "copies": calls(COPIES),
    }


async def main(args: argparse.Namespace) -> dict[str, Any]:
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("engine_profile: no CUDA device visible (use --device cpu)")
    with tempfile.TemporaryDirectory() as tmp:
        model = resolve_model(EMBEDDED_MODEL)
        if args.shape is not None:
            model = Path(tmp) / args.shape
            build_model(args.shape, model)
        activities = [ProfilerActivity.CPU]
        if args.device.startswith("cuda"):
            activities.append(ProfilerActivity.CUDA)
        profiler = EngineThreadProfiler(activities)
        engine = EmbeddedEngine(
            model, dtype=args.dtype, device=args.device, fused_decode=not args.no_fused
        )
        await engine.start()
        device = engine.batcher.device
        convs = prompts(args.prompts)
        try:
            await serve(engine, convs, args.tokens)  # warm-up: kernels, allocator, caches
            engine.batcher.stats.clear()
            plain = await serve(engine, convs, args.tokens)
            steps = int(engine.batcher.stats["decode_steps"])
            prof, profiled = await profiler.run(engine, lambda: serve(engine, convs, args.tokens))
            baseline, hf_prof = await asyncio.to_thread(
                hf_generate, engine, device, convs, args.tokens, activities
            )
            # 4 tokens: at 5 ms a wait, a GPU step of ~1,000 Python-level ops could take seconds
            busy_thread = await beside_busy_thread(
                engine, convs, min(args.tokens, 4), [sys.getswitchinterval(), 5e-4]
            )
        finally:
            await engine.close()
    on_device = device.type == "cuda"
    events, decode_steps = prof.key_averages(), max(1, steps)
    busy = None
    if on_device:
        kernel_us = sum(e.self_device_time_total for e in events if e.device_type.name == "CUDA")
        busy = kernel_us / 1e6 / profiled
    result = {
        "device": torch.cuda.get_device_name() if on_device else "CPU",
        "dtype": str(engine.dtype).removeprefix("torch."),
        "prompts": args.prompts,
        "tokens": args.tokens,
        "wall_s": plain,
        "profiled_wall_s": profiled,
        "decode_steps": steps,
        "ms_per_decode_step": 1e3 * plain / decode_steps,
        "tokens_per_s": args.prompts * args.tokens / plain,
        "hf_generate_s": baseline,
        "hf_generate_tokens_per_s": args.prompts * args.tokens / baseline,
        "per_step": per_step(events, decode_steps),
        "hf_generate_per_step": per_step(hf_prof.key_averages(), args.tokens),
        "device_busy_share": busy,
        "beside_busy_thread": busy_thread,
        "top_host": op_table(events, decode_steps, args.top, device=False),
        "top_device": op_table(events, decode_steps, args.top, device=True) if on_device else [],
    }
    report(result)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return result


def report(r: dict[str, Any]) -> None:
    print(
        f"\nengine_profile: {r['prompts']} requests x {r['tokens']} tokens, {r['dtype']}, "
        f"{r['device']}\n"
    )
    print("| | seconds | tokens/s | ratio |")
    print("|---|---:|---:|---:|")
    print(
        f"| embedded engine, all in flight | {r['wall_s']:.2f} | {r['tokens_per_s']:.0f} | "
        f"{r['hf_generate_s'] / r['wall_s']:.2f}x |"
    )
    print(
        f"| HF generate, one padded batch | {r['hf_generate_s']:.2f} | "
        f"{r['hf_generate_tokens_per_s']:.0f} | 1.00x |"
    )
    step = r["per_step"]
    print(
        f"\ndecode steps {r['decode_steps']}, {r['ms_per_decode_step']:.1f} ms each "
        f"(under the profiler: {r['profiled_wall_s']:.2f} s in all); per step: "
        f"{step['aten_ops']:.0f} aten ops, {step['syncs']:.1f} host-device syncs, "
        f"{step['kernel_launches']:.0f} kernel launches, {step['copies']:.1f} copies"
    )
    hf = r["hf_generate_per_step"]
    print(
        f"HF generate per token step: {hf['aten_ops']:.0f} aten ops, {hf['syncs']:.1f} syncs, "
        f"{hf['kernel_launches']:.0f} kernel launches, {hf['copies']:.1f} copies"
    )
    if r["device_busy_share"] is not None:
        print(f"device busy {100 * r['device_busy_share']:.0f}% of the profiled wall time")
    for row in r["beside_busy_thread"]:
        print(
            f"beside a busy Python thread ({row['tokens']} tokens a request), "
            f"switch interval {row['switch_interval_ms']:.1f} ms: "
            f"{row['ms_per_decode_step']:.1f} ms a decode step"
        )
    for title, rows in (("host", r["top_host"]), ("device", r["top_device"])):
        if not rows:
            continue
        print(f"\n| op (by self {title} time) | calls/step | ms/step |")
        print("|---|---:|---:|")
        for row in rows:
            print(f"| {row['op']} | {row['calls_per_step']:.1f} | {row['ms_per_step']:.2f} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="cuda")
    parser.add_argument(
        "--shape",
        choices=list(SHAPES),
        default=None,
        help="a random model of this shape (default: the embedded model)",
    )
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument(
        "--no-fused",
        action="store_true",
        help="on CPU, decode through the model's own forward, as on a GPU (no fused decoder)",
    )
    parser.add_argument("--json", default=None)
    asyncio.run(main(parser.parse_args()))
