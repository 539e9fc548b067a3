"""A CPU device platform for verl, so its FSDP training engine runs on CPU with gloo.

verl 0.9.1 ships device platforms for CUDA, NPU and ROCm only (`verl.plugin.platform`); its FSDP
engine is registered in `verl.workers.engine.EngineRegistry` for the devices `cuda` and `npu`.
Two runtime registrations through verl's own registries make the same engine run on CPU:

1. `PlatformRegistry.register("cpu")` + `set_platform(CPUPlatform())`: verl asks the platform for
   the device name (`"cpu"`), the device id (`"cpu"`, so `tensor.to(get_device_id())` stays on CPU),
   the collective backend (`gloo`) and a `torch.<device>`-like module for memory/seed/stream calls.
2. `EngineRegistry.register("language_model", ["fsdp", "fsdp2"], device="cpu")` on verl's own
   `FSDPEngineWithLMHead`: the engine code is device-agnostic; only its registry key names devices.

Both must happen before `verl.workers.engine` is first imported, because verl's FSDP module reads
the device name at import time. Nothing in verl's files is changed.
"""

from __future__ import annotations

import logging
import os
import types
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

logger = logging.getLogger(__name__)

PLATFORM_NAME = "cpu"


def _cpu_device_module() -> types.ModuleType:
    """A `torch.cuda`-shaped namespace for CPU: what verl calls on `get_torch_device()`."""
    module = types.ModuleType("agentscope_rft_cpu_device")
    cpu = torch.cpu

    def _zero(*_args: Any, **_kwargs: Any) -> int:
        return 0

    def _noop(*_args: Any, **_kwargs: Any) -> None:
        return None

    def _mem_get_info(*_args: Any, **_kwargs: Any) -> tuple[int, int]:
        pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        return free, pages

    attrs: dict[str, Any] = {
        "is_available": lambda: True,
        "device_count": lambda: 1,
        "current_device": lambda: PLATFORM_NAME,
        "set_device": _noop,
        "synchronize": _noop,
        "empty_cache": _noop,
        "ipc_collect": _noop,
        "memory_allocated": _zero,
        "memory_reserved": _zero,
        "max_memory_allocated": _zero,
        "max_memory_reserved": _zero,
        "reset_peak_memory_stats": _noop,
        "set_per_process_memory_fraction": _noop,
        "mem_get_info": _mem_get_info,
        "get_device_name": lambda *_a, **_k: "cpu",
        "get_rng_state": lambda *_a, **_k: torch.get_rng_state(),
        "set_rng_state": lambda state, *_a, **_k: torch.set_rng_state(state),
        "manual_seed": torch.manual_seed,
        "manual_seed_all": torch.manual_seed,
        "Stream": cpu.Stream,
        "Event": cpu.Event,
        "stream": cpu.stream,
        "current_stream": cpu.current_stream,
        "amp": cpu.amp,
    }
    for name, value in attrs.items():
        setattr(module, name, value)
    return module


def _platform_class() -> type:
    from verl.plugin.platform import PlatformBase

    class CPUPlatform(PlatformBase):
        """verl platform for CPU-only processes: gloo collectives, no accelerator."""

        def __init__(self) -> None:
            self._module = _cpu_device_module()

        @property
        def device_name(self) -> str:
            return PLATFORM_NAME

        @property
        def vendor_name(self) -> str:
            return PLATFORM_NAME

        @property
        def device_module(self) -> types.ModuleType:
            return self._module

        def is_available(self) -> bool:
            return True

        def is_platform_available(self, use_smi_check: bool = False) -> bool:
            # Never win verl's auto-detection over a real accelerator; selected explicitly.
            return False

        def current_device(self) -> Any:
            # verl passes this to `tensor.to(...)`; an int would mean `cuda:<int>`.
            return PLATFORM_NAME

        def device_count(self) -> int:
            return 1

        def set_device(self, device_index: int) -> None:
            return None

        def synchronize(self, device_index: int | None = None) -> None:
            return None

        def manual_seed(self, seed: int) -> None:
            torch.manual_seed(seed)

        def manual_seed_all(self, seed: int) -> None:
            torch.manual_seed(seed)

        def set_allocator_settings(self, settings: str) -> None:
            return None

        def empty_cache(self) -> None:
            return None

        def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
            return None, None

        def communication_backend_name(self) -> str:
            return "gloo"

        def visible_devices_envvar(self) -> str:
            return "AGENTSCOPE_RFT_CPU_VISIBLE_DEVICES"

        @contextmanager
        def nvtx_range(self, msg: str) -> Iterator[None]:
            yield

        def profiler_start(self) -> None:
            return None

        def profiler_stop(self) -> None:
            return None

        def ray_resource_name(self) -> str:
            return "CPU"

        def ray_resource_options(self, num_gpus: float) -> dict[str, Any]:
            return {"num_cpus": num_gpus}

        def ray_noset_envvars(self) -> list[str]:
            return []

        def is_ipc_supported(self) -> bool:
            return False

        def cudart(self) -> Any:
            return None

    return CPUPlatform


_registered = False


def register_cpu_platform() -> None:
    """Make verl's FSDP engine run on CPU in this process (idempotent).

    Call before anything imports `verl.workers.engine` (verl reads the device name at import).

    Raises:
        RuntimeError: verl already picked another platform in this process.

    Example:
        >>> register_cpu_platform()  # doctest: +SKIP
        >>> from verl.utils.device import get_device_name
        >>> get_device_name()  # doctest: +SKIP
        'cpu'
    """
    global _registered
    if _registered:
        return
    from verl.plugin.platform import PlatformRegistry, get_platform

    PlatformRegistry.register(platform=PLATFORM_NAME)(_platform_class())
    # VERL_PLATFORM is verl's documented override of auto-detection; set only while resolving so
    # child processes that never registered the CPU platform are not pointed at it.
    previous = os.environ.get("VERL_PLATFORM")
    os.environ["VERL_PLATFORM"] = PLATFORM_NAME
    try:
        platform = get_platform()
    finally:
        if previous is None:
            del os.environ["VERL_PLATFORM"]
        else:
            os.environ["VERL_PLATFORM"] = previous
    if platform.device_name != PLATFORM_NAME:
        raise RuntimeError(
            f"verl already initialised its platform as {platform.device_name!r} in this process; "
            "register the CPU platform before anything imports verl's engines (trainer device: cpu)"
        )

    from verl.workers.engine import EngineRegistry, FSDPEngineWithLMHead

    registry = EngineRegistry._engines.get("language_model", {})
    if PLATFORM_NAME not in registry.get("fsdp", {}):
        EngineRegistry.register(
            model_type="language_model", backend=["fsdp", "fsdp2"], device=PLATFORM_NAME
        )(FSDPEngineWithLMHead)
    _registered = True
    logger.info("verl: registered the CPU platform (gloo) and the FSDP engine for device 'cpu'")
