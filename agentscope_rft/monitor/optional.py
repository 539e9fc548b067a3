"""Import of the optional tracking backends (W&B, MLflow), with the install hint on failure."""

from __future__ import annotations

import importlib
from types import ModuleType

INSTALL_HINT = "pip install 'agentscope-rft[monitor]'"


class MissingBackendError(ImportError):
    """A tracking backend is enabled in the config but its package is not installed."""


def import_backend(module: str, config_key: str) -> ModuleType:
    """Import `module`, or fail with a message naming the config key and the install command.

    Example:
        >>> wandb = import_backend("wandb", "monitor.wandb.enabled")  # doctest: +SKIP
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingBackendError(
            f"{config_key} is true but {module!r} is not installed: {INSTALL_HINT} "
            f"(or set {config_key}: false)"
        ) from exc
