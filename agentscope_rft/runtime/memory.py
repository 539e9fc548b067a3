"""The process's memory allocator, and handing freed CPU memory back to the operating system.

A training step on CPU frees gigabytes of activations in the trainer's thread, and the engine's
batches free theirs in another. `run.allocator` chooses who serves those tensors:

- `glibc` (the default): the C library's allocator as the environment configures it. It keeps
  each thread's freed heap pages (one arena per thread) for reuse, so the process keeps the peak
  of each; `malloc_trim(0)` after a step returns what it can.
- `glibc-compact`: glibc with allocations above 64 KiB mapped on their own and 2 arenas, so
  the peak follows what is live too, at the cost of mapping every large tensor's pages afresh.
- `jemalloc` (Ray's wheel bundles one, or the system's `libjemalloc.so.2`):
  size classes keep the resident memory near what is live with fewer fresh pages than
  glibc-compact. The CLI starts the run under it (`preload_allocator` re-executes the command
  with `LD_PRELOAD`); its child processes (vLLM, browsers, runners) keep their environment.
- `tcmalloc` (gperftools' `libtcmalloc_minimal.so.4`, e.g. Debian/Ubuntu `libtcmalloc-minimal4`):
  the same restart; per-thread caches over central size classes, so freed pages are reused
  across threads without being mapped afresh.
- `auto`: tcmalloc where found, else jemalloc, else glibc (with `trainer.memory_budget_gib`,
  tcmalloc kept the quickstart's peak under 4 GB at 1.03x glibc's time, jemalloc at 1.18x).

Measured on the quickstart in docs/benchmarks.md.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import importlib.util
import logging
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentscope_rft.engines.base import Engine
    from agentscope_rft.trainers.base import Trainer

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
        logger.info("compact allocator: %s (run.allocator: glibc-compact)", applied)
    return applied


KERNEL_CACHE_ENTRIES = 256
"""oneDNN primitives a process keeps (oneDNN's own default: 1,024)."""
_KERNEL_CACHE_ENV = "ONEDNN_PRIMITIVE_CACHE_CAPACITY"


def limit_kernel_cache(entries: int = KERNEL_CACHE_ENTRIES) -> int | None:
    """Cap oneDNN's cache of primitives at `entries`, before this process's first bf16 matmul on
    CPU: each matmul shape it meets gets a primitive of ~0.6 MiB of compiled kernels, kept in an
    LRU cache of 1,024 by default, and a training run meets new shapes every step (micro-batches
    of other sizes, attention over other lengths): ~30 MB a step on the quickstart, up to 0.6 GiB.
    The trainer's matmuls run on bucketed sizes (`trainers.cast_linear`), so its shapes recur
    and a smaller cache keeps them. A value the environment gives (`ONEDNN_PRIMITIVE_CACHE_CAPACITY`
    or `DNNL_PRIMITIVE_CACHE_CAPACITY`) is kept. Returns the capacity in force (None: the
    environment's, unparsed).

    Example:
        >>> limit_kernel_cache() is None or limit_kernel_cache() > 0
        True
    """
    for name in (_KERNEL_CACHE_ENV, "DNNL_PRIMITIVE_CACHE_CAPACITY"):
        if name in os.environ:
            value = os.environ[name]
            return int(value) if value.isdigit() else None
    os.environ[_KERNEL_CACHE_ENV] = str(entries)  # (oneDNN reads it at its first primitive)
    return entries


def release_freed_memory() -> bool:
    """Return freed memory to the OS: glibc's `malloc_trim(0)`, under jemalloc a purge of every
    arena's unused pages, under tcmalloc `MallocExtension_ReleaseFreeMemory`; False where none
    applies.

    Example:
        >>> release_freed_memory() in (True, False)
        True
    """
    loaded = loaded_allocator()
    if loaded == "jemalloc":
        mallctl = _preloaded_symbol("mallctl")
        if mallctl is not None:
            mallctl(f"arena.{JEMALLOC_ALL_ARENAS}.purge".encode(), None, None, None, 0)
            return True
    if loaded == "tcmalloc":
        release = _preloaded_symbol("MallocExtension_ReleaseFreeMemory")
        if release is not None:
            release()
            return True
    trim = _glibc("malloc_trim")
    if trim is None:
        return False
    trim(0)
    return True


# --------------------------------------------------------------------------- run.allocator

ALLOCATORS = ("auto", "jemalloc", "tcmalloc", "glibc", "glibc-compact")
"""`run.allocator`'s named choices (a path to a shared library is one more kind)."""
JEMALLOC_ALL_ARENAS = 4096
"""jemalloc's `MALLCTL_ARENAS_ALL`: `arena.4096.purge` purges every arena."""
_PRELOADED = "_AGENTSCOPE_RFT_PRELOADED"
"""Set on the re-executed command: the library it was started under."""
_LD_PRELOAD_WAS = "_AGENTSCOPE_RFT_LD_PRELOAD_WAS"
"""The LD_PRELOAD the command had before (restored in it, so its children keep theirs)."""
_exec_allowed = False


class AllocatorError(ValueError):
    """`run.allocator` asks for an allocator this process cannot use; the message names the fix."""


def allow_exec() -> None:
    """Let `preload_allocator` re-execute this process: only the CLI's own entry point calls it
    (a CLI invoked inside another program, e.g. a test's runner, must not replace it)."""
    global _exec_allowed
    _exec_allowed = True


def loaded_allocator() -> str:
    """The allocator serving this process's malloc: `jemalloc` or `tcmalloc` where such a library
    is mapped (preloaded), else `glibc` (`system` off Linux)."""
    if not sys.platform.startswith("linux"):
        return "system"
    return _mapped_allocator()


@functools.cache
def _mapped_allocator() -> str:
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return "glibc"
    for line in maps.splitlines():
        name = line.rsplit("/", 1)[-1]
        for kind in ("jemalloc", "tcmalloc"):
            if kind in name and ".so" in name:
                return kind
    return "glibc"


def jemalloc_library() -> str | None:
    """A jemalloc shared library to preload: the one Ray's wheel bundles (`ray/core/
    libjemalloc.so`, installed with the `ray`/`verl`/`dev` extras), else the system's
    (`libjemalloc.so.2`, e.g. Debian/Ubuntu `libjemalloc2`); None where neither is found."""
    spec = importlib.util.find_spec("ray")  # finds the package without importing it
    for folder in (spec.submodule_search_locations or []) if spec else []:
        bundled = Path(folder) / "core" / "libjemalloc.so"
        if bundled.is_file():
            return str(bundled)
    return ctypes.util.find_library("jemalloc")


def tcmalloc_library() -> str | None:
    """gperftools' tcmalloc to preload: the system's `libtcmalloc_minimal.so.4` (Debian/Ubuntu
    `libtcmalloc-minimal4`), else the full `libtcmalloc.so.4`; None where neither is found."""
    return ctypes.util.find_library("tcmalloc_minimal") or ctypes.util.find_library("tcmalloc")


def _wanted_library(choice: str) -> str | None:
    """The library `choice` preloads (None: none; `auto` without one found)."""
    if choice in ("glibc", "glibc-compact"):
        return None
    if choice == "tcmalloc":
        found = tcmalloc_library()
        if found is None:
            raise AllocatorError(
                "run.allocator: tcmalloc was asked for and no tcmalloc library was found: "
                "install gperftools' (apt install libtcmalloc-minimal4; dnf install "
                "gperftools-libs), give its path as run.allocator, or set run.allocator: "
                "jemalloc or glibc"
            )
        return found
    if choice not in ("auto", "jemalloc"):  # a path to an allocator library
        if not Path(choice).is_file():
            raise AllocatorError(
                f"run.allocator: {choice!r} is not a file; give a shared library (e.g. "
                "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2) or one of " + ", ".join(ALLOCATORS)
            )
        return choice
    if choice == "auto":  # the fastest low-memory allocator found (docs/benchmarks.md)
        return tcmalloc_library() or jemalloc_library()
    found = jemalloc_library()
    if found is None:
        raise AllocatorError(
            "run.allocator: jemalloc was asked for and no jemalloc library was found: install "
            "Ray (pip install 'ray[default]', whose wheel bundles one) or the system's "
            "(apt install libjemalloc2), give its path as run.allocator, or set run.allocator: "
            "auto (tcmalloc or jemalloc where found) or glibc"
        )
    return found


def preload_allocator(choice: str) -> None:
    """Start this command under `choice`'s allocator library: re-execute it (same arguments,
    same process id) with the library in `LD_PRELOAD`, where the CLI allows it (`allow_exec`)
    and the library is not loaded yet. In the re-executed command: restore the environment's
    LD_PRELOAD, so child processes start as they would have. Linux only; elsewhere `auto` keeps
    the system's allocator and any other choice but glibc is an error.

    Raises:
        AllocatorError: `jemalloc` or `tcmalloc` asked for and none found, or a path that is not
            a file.
    """
    if _PRELOADED in os.environ:  # the re-executed command
        preloaded = os.environ.pop(_PRELOADED)
        was = os.environ.pop(_LD_PRELOAD_WAS, "")
        if was:
            os.environ["LD_PRELOAD"] = was
        else:
            os.environ.pop("LD_PRELOAD", None)
        if loaded_allocator() == "glibc":
            logger.warning(
                "allocator: %s was not loaded (the dynamic loader ignored LD_PRELOAD): running "
                "on glibc's; run.allocator: glibc says so without trying",
                preloaded,
            )
        return
    if not sys.platform.startswith("linux"):
        if choice not in ("auto", "glibc"):
            raise AllocatorError(
                f"run.allocator: {choice} works on Linux only; use auto or glibc here"
            )
        return
    library = _wanted_library(choice)
    if library is None or loaded_allocator() != "glibc" or not _exec_allowed:
        return
    env = dict(os.environ)
    was = env.get("LD_PRELOAD", "")
    env["LD_PRELOAD"] = f"{library}:{was}" if was else library
    env[_PRELOADED] = library
    env[_LD_PRELOAD_WAS] = was
    logger.info("allocator: restarting this command under %s (run.allocator: %s)", library, choice)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os.execve(sys.executable, list(sys.orig_argv), env)


def apply_allocator(choice: str) -> str:
    """Apply `choice` in this process, before the engine and trainer allocate: glibc-compact's
    settings, or a check that the library asked for is the one serving malloc (a run started
    from Python, not the CLI, cannot be re-executed: a log line says how to start it under
    jemalloc). Returns the allocator in use (`loaded_allocator`).

    Raises:
        AllocatorError: `jemalloc`, `tcmalloc` (or a library path) asked for and not loaded, or a
            glibc setting asked for under another allocator.
    """
    loaded = loaded_allocator()
    if choice in ("glibc", "glibc-compact"):
        if loaded not in ("glibc", "system"):
            raise AllocatorError(
                f"run.allocator: {choice} asked for, but {loaded} serves this process (its "
                "LD_PRELOAD): drop it from LD_PRELOAD, or set run.allocator: auto"
            )
        if choice == "glibc-compact":
            compact_allocator()
        return loaded
    if loaded == "glibc" and sys.platform.startswith("linux"):
        library = _wanted_library(choice)
        if library is not None:
            hint = (
                f"start it with the agentscope-rft command, or with LD_PRELOAD={library} "
                "before python"
            )
            if choice != "auto":
                raise AllocatorError(
                    f"run.allocator: {choice} asked for, but this process runs on glibc's "
                    f"allocator: {hint}"
                )
            logger.info("allocator: glibc (run.allocator: auto; for %s: %s)", library, hint)
    logger.info("allocator: %s", loaded)
    return loaded


@functools.cache
def _preloaded_symbol(name: str) -> Any:
    """A C function of the preloaded allocator (its symbols are the process's); None if absent."""
    try:
        return getattr(ctypes.CDLL(None), name)
    except (OSError, AttributeError):
        return None


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


def live_trainer_weights(config: Any, trainer: object) -> Callable[[], Any] | None:
    """Where the trainer's weights can be read without a copy (the torch trainer without LoRA:
    its parameters themselves), the function that reads them: an embedded engine with its own
    copy frees it while the trainer steps and takes it from them after (the sync that follows
    then copies nothing). None for a trainer whose weights are merged or gathered copies (LoRA,
    verl): reading them twice a step would cost a copy each time."""
    from agentscope_rft.trainers.torch_trainer import TorchTrainer

    if not isinstance(trainer, TorchTrainer) or config.trainer.lora is not None:
        return None
    return trainer.state_dict_for_sync


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


async def sync_weights(engine: Engine, trainer: Trainer, version: int) -> float:
    """Send the trainer's weights to the engine as policy `version`; returns the seconds taken."""
    from agentscope_rft.engines.threads import in_own_thread

    started = time.perf_counter()
    weights = await in_own_thread(trainer.state_dict_for_sync)
    await engine.load_weights(weights, version)
    del weights
    # The step's activations and the weight copy are free now: give the pages back.
    release_freed_memory()
    return time.perf_counter() - started
