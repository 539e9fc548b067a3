"""`dtype: auto` on CPU: bf16 only where the CPU computes it natively and it is faster.

Whether bf16 matmuls beat fp32 is a property of the machine, but one timing of it is not: on a
loaded machine the same 20 matmuls measured 0.30x and 36.9x the speed of fp32 in two runs, so
the engine and the trainer of one run disagreed, and a resumed run trained in another dtype than
the run it continued. The speed-up is therefore measured once per machine (the best of several
rounds, each dtype's fastest) and kept in the cache folder; every later process reads it.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import time
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

ROUNDS = 5


def cpu_has_native_bf16() -> bool:
    """False on an x86 CPU without bf16 instructions (`avx512_bf16` or AMX), where bf16 matmuls
    are converted in software: a timing there is a near tie that flips between runs (measured
    1.01-1.05x), and training in bf16 is slower. True elsewhere (other architectures: timed)."""
    if platform.machine().lower() not in ("x86_64", "amd64", "i386", "i686"):
        return True
    cpu = getattr(torch, "cpu", None)
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    found = [getattr(cpu, name, None) for name in checks]
    if not any(callable(check) for check in found):
        return True  # a torch without these probes: time it as before
    return any(callable(check) and bool(check()) for check in found)


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _measure() -> float:
    """fp32 matmul time over bf16's, each the fastest of `ROUNDS` interleaved rounds."""
    best = {torch.float32: float("inf"), torch.bfloat16: float("inf")}
    operands = {
        dtype: (torch.randn(16, 576, dtype=dtype), torch.randn(576, 1536, dtype=dtype))
        for dtype in best
    }
    for _ in range(ROUNDS):
        for dtype, (a, b) in operands.items():
            for _ in range(3):
                a @ b
            start = time.perf_counter()
            for _ in range(20):
                a @ b
            best[dtype] = min(best[dtype], time.perf_counter() - start)
    return best[torch.float32] / best[torch.bfloat16]


def bf16_speedup(cache: Path | None = None) -> tuple[float, Path | None]:
    """bf16 matmul speed over fp32 on this CPU, and the file it is kept in (None: not kept).

    Example:
        >>> speedup, kept_in = bf16_speedup()  # doctest: +SKIP
    """
    if cache is None:
        from agentscope_rft.models import cache_root

        cache = cache_root() / "cpu_bf16_speedup.json"
    key = f"{_cpu_name()} | torch {torch.__version__}"
    try:
        saved = json.loads(cache.read_text())
        if saved.get("key") == key and isinstance(saved.get("speedup"), int | float):
            return float(saved["speedup"]), cache
    except (OSError, ValueError, AttributeError):
        pass
    speedup = _measure()
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        partial = cache.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(json.dumps({"key": key, "speedup": speedup}))
        partial.replace(cache)
    except OSError:
        return speedup, None
    return speedup, cache


def pick_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """Resolve `auto`: bf16 on CUDA; on CPU, bf16 only where its matmuls are faster here.

    Example:
        >>> pick_dtype("float32", torch.device("cpu"))
        torch.float32
    """
    named = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if dtype != "auto":
        return named[dtype]
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if not cpu_has_native_bf16():
        logger.info(
            "engine dtype auto -> float32 (this x86 CPU has no native bf16, avx512_bf16 or AMX: "
            "bf16 would be converted in software)"
        )
        return torch.float32
    speedup, kept_in = bf16_speedup()
    chosen = torch.bfloat16 if speedup > 1.0 else torch.float32
    logger.info(
        "engine dtype auto -> %s (bf16 matmul %.2fx the speed of fp32 on this CPU, %s)",
        str(chosen).removeprefix("torch."),
        speedup,
        f"measured once, kept in {kept_in}: delete it to measure again" if kept_in else "measured",
    )
    return chosen
