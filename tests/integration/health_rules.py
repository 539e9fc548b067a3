"""Custom health rules for the tests (loaded by import path, as a user's rule would be)."""

from __future__ import annotations

from pathlib import Path

from agentscope_rft.health import Finding, StepMetrics


def once_at(history: list[StepMetrics], params: dict) -> Finding | None:
    """Fires at step `params["step"]` the first time the run gets there (a flag file remembers),
    its onset `params["onset"]`."""
    flag = Path(params["flag"])
    if history[-1].step != params["step"] or flag.exists():
        return None
    flag.write_text("fired")
    return Finding("reward/mean", 0.0, 1.0, "forced by the test", int(params["onset"]))


def always_at(history: list[StepMetrics], params: dict) -> Finding | None:
    """Fires whenever the run reaches step `params["step"]` (rollbacks never get past it)."""
    if history[-1].step != params["step"]:
        return None
    return Finding("reward/mean", 0.0, 1.0, "forced every time", int(params["onset"]))
