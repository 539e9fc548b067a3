"""Version checks and one import shim for verl 0.9.1 in this project's environment.

verl 0.9.1's `apply_monkey_patch` (run whenever the FSDP engine builds a model) imports
`AutoModelForCausalLMWithValueHead` from `trl.experimental.ppo` or `trl` whenever trl is installed,
only to patch that class's `state_dict`. trl 1.16 (a dev dependency of this project, the GRPO
reference) has neither, so the engine build fails with ImportError although no value head is
used. `ensure_trl_value_head_importable` registers a stand-in module for that import path when,
and only when, trl is installed without it. Upstream fixes: verl PRs #6539 and #7625.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import logging
import sys
import types
import warnings

from packaging.version import Version

logger = logging.getLogger(__name__)

SUPPORTED_VERL = "0.9.1"
"""The verl version this backend is written and tested against (`verl==0.9.1` in pyproject)."""
SUPPORTED_TRANSFORMERS = (Version("5.5.3"), Version("5.11"))
SUPPORTED_TORCH = (Version("2.11"), Version("2.14"))

_SHIM_MODULE = "trl.experimental.ppo"


class VerlVersionError(RuntimeError):
    """verl, torch or transformers is missing or outside the supported combination."""


def installed_version(package: str) -> Version | None:
    try:
        return Version(importlib.metadata.version(package))
    except importlib.metadata.PackageNotFoundError:
        return None


def check_versions() -> dict[str, str]:
    """Fail fast unless verl, torch and transformers are the supported combination.

    Returns:
        The installed versions, for the run log.

    Raises:
        VerlVersionError: a package is missing or its version is not supported.

    Example:
        >>> check_versions()["verl"]  # doctest: +SKIP
        '0.9.1'
    """
    verl = installed_version("verl")
    if verl is None:
        raise VerlVersionError(
            "trainer.type 'verl' needs verl; install it with `pip install 'agentscope-rft[verl]'`"
        )
    if verl != Version(SUPPORTED_VERL):
        raise VerlVersionError(
            f"verl {verl} is installed but the verl trainer supports verl=={SUPPORTED_VERL} only "
            f"(its engine API changes between releases); install `verl=={SUPPORTED_VERL}`"
        )
    found = {"verl": str(verl)}
    for package, (low, high) in (
        ("torch", SUPPORTED_TORCH),
        ("transformers", SUPPORTED_TRANSFORMERS),
    ):
        version = installed_version(package)
        if version is None or not (low <= Version(version.base_version) < high):
            raise VerlVersionError(
                f"{package} {version} is installed; the verl trainer supports {package} "
                f">={low},<{high} with verl {SUPPORTED_VERL}"
            )
        found[package] = str(version)
    return found


class _ValueHeadStandIn:
    """Placeholder for verl 0.9.1's trl import; value-head models are not supported."""


def _trl_has_value_head() -> bool:
    for module_name in (_SHIM_MODULE, "trl"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # trl warns on any import from trl.experimental
            try:
                module = importlib.import_module(module_name)
            except ImportError:
                continue
        if hasattr(module, "AutoModelForCausalLMWithValueHead"):
            return True
    return False


def ensure_trl_value_head_importable() -> None:
    """Let verl's model patching run when the installed trl lacks the value-head class."""
    if _SHIM_MODULE in sys.modules or importlib.util.find_spec("trl") is None:
        return
    if _trl_has_value_head():
        return
    shim = types.ModuleType(_SHIM_MODULE)
    setattr(shim, "AutoModelForCausalLMWithValueHead", _ValueHeadStandIn)  # noqa: B010
    sys.modules[_SHIM_MODULE] = shim
    logger.info(
        "verl: trl %s has no AutoModelForCausalLMWithValueHead; registered a stand-in for "
        "verl 0.9.1's import (value-head critics are not used by this trainer)",
        installed_version("trl"),
    )
