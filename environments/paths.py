"""Where environments keep caches (built search indexes, exported games)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """The cache folder (`$AGENTSCOPE_RFT_CACHE`, default `~/.cache/agentscope-rft`).

    The same rule as `agentscope_rft.models.cache_root`, repeated here so that the environments
    import nothing from the training stack.

    Example:
        >>> cache_root().name  # doctest: +SKIP
        'agentscope-rft'
    """
    root = os.environ.get("AGENTSCOPE_RFT_CACHE")
    return Path(root).expanduser() if root else Path.home() / ".cache" / "agentscope-rft"
