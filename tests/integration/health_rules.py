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


def in_turn(history: list[StepMetrics], params: dict) -> Finding | None:
    """Fires the k-th time the run reaches a step of `params["firings"]` (`[step, onset]`
    pairs, in order; a count file remembers how many fired)."""
    count = Path(params["count"])
    fired = int(count.read_text()) if count.exists() else 0
    firings = params["firings"]
    if fired >= len(firings) or history[-1].step != firings[fired][0]:
        return None
    count.write_text(str(fired + 1))
    return Finding("reward/mean", 0.0, 1.0, "forced in turn", int(firings[fired][1]))


def on_visit(history: list[StepMetrics], params: dict) -> Finding | None:
    """Fires the `params["visit"]`-th time the run reaches step `params["step"]` (a count file
    remembers the visits)."""
    if history[-1].step != params["step"]:
        return None
    count = Path(params["count"])
    visits = (int(count.read_text()) if count.exists() else 0) + 1
    count.write_text(str(visits))
    if visits != params["visit"]:
        return None
    return Finding("reward/mean", 0.0, 1.0, "forced on a visit", params["step"])
