"""Hand CPU memory that PyTorch has freed back to the operating system.

glibc's allocator keeps freed heap pages (in one arena per thread) for reuse. A training step on
CPU frees gigabytes of activations in the trainer's thread, and the engine's batches free theirs
in another; without a trim the process keeps the peak of each, grows with every longer batch,
and on a small machine ends in the OOM killer. `malloc_trim(0)` returns the free pages after a
step; `compact_allocator` (`engine.compact_allocator`) makes glibc return large blocks as soon as
they are freed, so the peak within a step follows what is live too.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import os
import sys
from typing import Any

logger = logging.getLogger(__name__)


@functools.cache
def _glibc(function: str) -> Any:
    """glibc's `function` (None off Linux, or where the C library is not glibc, e.g. musl)."""
    if not sys.platform.startswith("linux"):
        return None
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        return getattr(ctypes.CDLL(name), function)
    except (OSError, AttributeError):
        return None


M_MMAP_THRESHOLD, M_ARENA_MAX = -3, -8
"""glibc's `mallopt` parameters (malloc.h)."""
COMPACT_MMAP_THRESHOLD = 64 * 1024
COMPACT_ARENAS = 2


@functools.cache
def compact_allocator() -> dict[str, int]:
    """Have glibc give freed tensors back to the system at once: allocations above 64 KiB are
    mapped on their own (unmapped when freed; glibc otherwise raises this threshold to the largest
    block freed so far and keeps such blocks in its heap) and at most 2 heap arenas (not one per
    thread, each keeping its own free pages). Returns the settings applied (empty where the C
    library has no `mallopt`); a setting the environment gives (`MALLOC_MMAP_THRESHOLD_`,
    `MALLOC_ARENA_MAX`) is left as it is. Process-wide, once.

    Example:
        >>> isinstance(compact_allocator(), dict)
        True
    """
    mallopt = _glibc("mallopt")
    if mallopt is None:
        return {}
    applied: dict[str, int] = {}
    for env, param, value in (
        ("MALLOC_MMAP_THRESHOLD_", M_MMAP_THRESHOLD, COMPACT_MMAP_THRESHOLD),
        ("MALLOC_ARENA_MAX", M_ARENA_MAX, COMPACT_ARENAS),
    ):
        if env in os.environ:
            continue
        if mallopt(ctypes.c_int(param), ctypes.c_int(value)) == 1:
            applied[env] = value
    if applied:
        logger.info("compact allocator: %s (engine.compact_allocator)", applied)
    return applied


def release_freed_memory() -> bool:
    """Return freed heap memory to the OS; False where the C library cannot (not glibc).

    Example:
        >>> release_freed_memory() in (True, False)
        True
    """
    trim = _glibc("malloc_trim")
    if trim is None:
        return False
    trim(0)
    return True


def weight_sharing_refusal(config: Any, engine: object, trainer: object) -> str | None:
    """Why the engine cannot compute with the trainer's weights in place (None: it can).

    It can in a synchronous run (the engine is idle while the trainer steps) of the embedded
    engine and the torch trainer without LoRA (whose synced weights are merged copies), when both
    hold the policy on the same device in the same dtype.
    """
    from agentscope_rft.engines.embedded import EmbeddedEngine
    from agentscope_rft.trainers.torch_trainer import TorchTrainer

    if not isinstance(engine, EmbeddedEngine) or not isinstance(trainer, TorchTrainer):
        return "only the embedded engine with the torch trainer shares weights"
    if not getattr(config.engine, "share_trainer_weights", False):
        return "engine.share_trainer_weights is off"
    if config.run.mode != "sync":
        return f"run.mode {config.run.mode} explores while the trainer steps"
    if config.trainer.lora is not None:
        return "trainer.lora: the synced weights are merged copies"
    weight = next(trainer.model.parameters())
    if engine.dtype != weight.dtype:
        return f"engine dtype {engine.dtype} differs from the trainer's {weight.dtype}"
    if engine.batcher.model.device != weight.device:
        return f"engine device {engine.batcher.model.device} differs from the trainer's"
    return None


async def share_trainer_weights(config: Any, engine: object, trainer: object) -> int:
    """Have the embedded engine compute with the trainer's weights in place where it can (see
    `weight_sharing_refusal`); returns the bytes of the engine's own copy freed (0: not shared,
    the reason logged)."""
    refusal = weight_sharing_refusal(config, engine, trainer)
    if refusal is not None:
        if getattr(config.engine, "type", None) == "embedded":
            logger.info("engine keeps its own copy of the weights: %s", refusal)
        return 0
    shared = int(await engine.share_weights(trainer.state_dict_for_sync()))  # type: ignore[attr-defined]
    release_freed_memory()
    logger.info("engine computes with the trainer's weights in place (%.2f GB freed)", shared / 1e9)
    return shared
