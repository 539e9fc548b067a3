"""Hand CPU memory that PyTorch has freed back to the operating system.

glibc's allocator keeps freed heap pages (in one arena per thread) for reuse. A training step on
CPU frees gigabytes of activations in the trainer's thread, and the engine's batches free theirs
in another; without a trim the process keeps the peak of each, grows with every longer batch,
and on a small machine ends in the OOM killer. `malloc_trim(0)` returns the free pages.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys
from typing import Any


@functools.cache
def _malloc_trim() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        return ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):  # not glibc (e.g. musl)
        return None


def release_freed_memory() -> bool:
    """Return freed heap memory to the OS; False where the C library cannot (not glibc).

    Example:
        >>> release_freed_memory() in (True, False)
        True
    """
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
