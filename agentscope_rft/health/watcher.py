"""`HealthWatcher`: runs the health rules after every training step and records their events.

The training loop calls `observe(step, metrics)` once per step; it gets back the events that
fired (at most one per rule and streak: a rule that keeps failing does not fire again until it
has recovered), adds `health_metrics(events)` to the step's metrics, and acts on the strongest
action. Events go to `<run_dir>/health.jsonl`, one JSON object per line.

`health.jsonl` holds the events of the steps that stand: when the run goes on from an earlier
checkpoint (a resume after a kill, a rollback), the events of the steps it redoes are cut
(`rewind_events`), and the events of the rollbacks that happened stay (each one is at the step
that found the problem, past the step it went back to).
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from agentscope_rft.health.config import CustomRule, HealthConfig
from agentscope_rft.health.rules import Finding, StepMetrics, rule_function

logger = logging.getLogger(__name__)

HEALTH_FILE = "health.jsonl"
ACTION_CODES = {"warn": 1.0, "stop": 2.0, "rollback": 3.0}
"""`health/<rule>` metric values by action."""


@dataclass(frozen=True, slots=True)
class HealthEvent:
    """One firing of a rule, as recorded in `health.jsonl` (a dashboard marks it on the curve)."""

    step: int
    time: float
    rule: str
    action: str
    metric: str
    value: float | None
    threshold: float | None
    message: str
    onset: int
    rolled_back_to: int | None = None


class HealthWatcher:
    """The run's health rules over its training steps.

    Args:
        config: The `health:` section.
        run_dir: Where `health.jsonl` is appended.
        history: Training steps already logged.
        policy_from: The first step of the RL objective (`offline.warmup_steps`; an offline run
            has none): the rules that judge the policy (every rule but `non_finite`, custom ones
            included) see only the steps from it on. SFT on demonstrations lowers the entropy by
            design; a warm start must not be taken for a collapse, nor set the entropy baseline.
        resumed: `(step, rollbacks)` of the checkpoint a resume starts from: the history is read
            from `metrics.jsonl` and the events from `health.jsonl`, cut to the steps that stand.
        marked: On a resume, the unhealthy steps the run state saved (`marks()`).

    Example:
        >>> watcher = HealthWatcher(HealthConfig(), Path("runs/demo"))  # doctest: +SKIP
        >>> events = watcher.observe(3, {"entropy/mean": 0.01, "loss": 0.2})  # doctest: +SKIP
    """

    def __init__(
        self,
        config: HealthConfig,
        run_dir: Path,
        history: Sequence[StepMetrics] = (),
        policy_from: int = 0,
        resumed: tuple[int, int] | None = None,
        marked: Sequence[Sequence[int]] = (),
    ) -> None:
        self.config = config
        self.policy_from = policy_from
        self.path = run_dir / HEALTH_FILE
        self.rules: list[tuple[str, str, Callable[[Sequence[StepMetrics]], Any]]] = []
        # The acting rules again without patience: a streak marks its steps unhealthy from its
        # first step, before it has lasted long enough to fire. (Rules that only warn do not
        # judge checkpoints.)
        self.probes: list[tuple[str, Callable[[Sequence[StepMetrics]], Any]]] = []
        for name, settings in config.named_rules():
            self.rules.append((name, settings.action, rule_function(name, settings)))
            acts = settings.action in ("stop", "rollback")
            if acts and not isinstance(settings, CustomRule) and settings.patience > 1:
                eager = settings.model_copy(update={"patience": 1})
                self.probes.append((name, rule_function(name, eager)))
        self.history: list[StepMetrics] = list(history)
        self._firing: dict[str, int] = {}  # rule -> onset of the streak it already fired for
        self.suspect_steps: set[int] = set()
        """Steps some rule's streak covers: their weights are not a healthy checkpoint."""
        self.last_observed = self.history[-1].step if self.history else -1
        if resumed is not None:  # (step, rollbacks) of the checkpoint a resume starts from
            self.history = history_from_metrics(run_dir)
            # (the marks of streaks that had not fired yet: `marks()`, saved with the run state)
            self.suspect_steps = {s for first, last in marked for s in range(first, last + 1)}
            self.rewind(*resumed)

    def observe(self, step: int, metrics: Mapping[str, float]) -> list[HealthEvent]:
        """Add the step's metrics and run every rule; returns the events that fired now."""
        self.history = [h for h in self.history if h.step < step]
        self.history.append(StepMetrics(step, dict(metrics)))
        self.last_observed = step
        for name, probe in self.probes:
            early = self._run_rule(name, probe)
            if early is not None:
                self.suspect_steps.update(range(early.onset, step + 1))
        events: list[HealthEvent] = []
        for name, action, rule in self.rules:
            finding = self._run_rule(name, rule)
            if finding is None:
                self._firing.pop(name, None)
                continue
            if action != "warn":
                self.suspect_steps.update(range(finding.onset, step + 1))
            if self._firing.get(name) == finding.onset:
                continue  # still broken since it fired: say it once
            self._firing[name] = finding.onset
            events.append(
                HealthEvent(
                    step=step,
                    time=round(time.time(), 3),
                    rule=name,
                    action=action,
                    metric=finding.metric,
                    value=finding.value,
                    threshold=finding.threshold,
                    message=finding.message,
                    onset=finding.onset,
                )
            )
        return events

    def _run_rule(self, name: str, rule: Callable[[Sequence[StepMetrics]], Any]) -> Finding | None:
        history = self.history
        if name != "non_finite":  # (a NaN is a NaN in any objective)
            history = [h for h in history if h.step >= self.policy_from]
        if not history:  # (a warm start's SFT steps: no RL step to judge yet)
            return None
        try:
            finding = rule(history)
        except Exception as exc:  # a user's rule must not end the run it watches
            logger.warning("health rule %s raised %s: %s (ignored)", name, type(exc).__name__, exc)
            return None
        if finding is not None and not isinstance(finding, Finding):
            logger.warning("health rule %s returned %r, not a Finding (ignored)", name, finding)
            return None
        return finding

    def record(self, event: HealthEvent) -> None:
        """Append the event to `health.jsonl` and log it."""
        record = asdict(event)
        for key in ("value", "threshold"):  # strict JSON: a NaN or inf value is written as null
            if record[key] is not None and not math.isfinite(record[key]):
                record[key] = None
        line = json.dumps(record) + "\n"
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(line)
        log = logger.info if event.action == "warn" else logger.warning
        log("health: step %d: %s -> %s: %s", event.step, event.rule, event.action, event.message)

    def rewind(self, step: int, rollbacks: int) -> None:
        """Forget steps from `step` on: the run goes on from the weights of `step` (a rollback
        to them, or a resume) with `rollbacks` rollbacks done. `health.jsonl` keeps the events
        of the steps before `step` and of those rollbacks; a warning still broken since it was
        recorded there is not said again, an acting rule's streak still marks its steps."""
        self.history = [h for h in self.history if h.step < step]
        self.suspect_steps = {s for s in self.suspect_steps if s < step}
        self.last_observed = step - 1
        self._firing.clear()
        for event in rewind_events(self.path, step, rollbacks):
            if event.rolled_back_to is not None:
                continue  # (its steps were redone: a new firing there is said again)
            if event.action == "warn":
                self._firing[event.rule] = event.onset
            else:
                self.suspect_steps.update(range(event.onset, event.step + 1))

    def marks(self) -> list[list[int]]:
        """`suspect_steps` as `[first, last]` runs, for the run state: a resumed run gets them
        back (`marked`), those of a streak that had not lasted long enough to fire included
        (`health.jsonl` has only the events that fired)."""
        runs: list[list[int]] = []
        for step in sorted(self.suspect_steps):
            if runs and runs[-1][1] == step - 1:
                runs[-1][1] = step
            else:
                runs.append([step, step])
        return runs

    def healthy(self, step: int) -> bool:
        """Whether the policy of version `step` (the weights trained by `step` steps, which
        played step `step`'s episodes) was watched and broke no rule that stops or rolls back."""
        return step <= self.last_observed and step not in self.suspect_steps


def health_metrics(events: Sequence[HealthEvent]) -> dict[str, float]:
    """`health/<rule>` = 1 (warn), 2 (stop), 3 (rollback) for each event, and their count."""
    out = {f"health/{e.rule}": ACTION_CODES.get(e.action, 1.0) for e in events}
    if events:
        out["health/events"] = float(len(events))
    return out


def strongest(events: Sequence[HealthEvent]) -> HealthEvent | None:
    """The event whose action matters most: rollback, then stop, then warn."""
    ranked = sorted(events, key=lambda e: ACTION_CODES.get(e.action, 0.0), reverse=True)
    return ranked[0] if ranked and ranked[0].action != "warn" else None


def read_events(run_dir: Path) -> list[HealthEvent]:
    """The events in `<run_dir>/health.jsonl` (a torn last line is skipped)."""
    return [event for _, event in _event_lines(run_dir / HEALTH_FILE)]


def _event_lines(path: Path) -> list[tuple[str, HealthEvent]]:
    """Each whole line of the events file `path` with its event (torn lines are skipped)."""
    if not path.is_file():
        return []
    found = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            found.append((line, HealthEvent(**json.loads(line))))
        except (json.JSONDecodeError, TypeError):
            continue
    return found


def rewind_events(
    path: Path, step: int, rollbacks: int, out: Path | None = None
) -> list[HealthEvent]:
    """Cut the events file `path` (into `out`, else in place) to what a run going on from its
    checkpoint after `step` steps with `rollbacks` rollbacks done keeps: the events of steps
    before `step`, and the first `rollbacks` rollback events (those of a kill before a rollback
    was saved go: the resumed run redoes it). A torn line goes too. Returns the events kept.

    Example:
        >>> rewind_events(Path("runs/quickstart/health.jsonl"), 5, 1)  # doctest: +SKIP
        [HealthEvent(step=7, ..., rolled_back_to=4)]
    """
    target = out or path
    if not path.is_file():
        return []
    lines, kept, seen = [], [], 0
    for line, event in _event_lines(path):
        if event.rolled_back_to is not None:
            seen += 1
            if seen > rollbacks:
                continue
        elif event.step >= step:
            continue
        lines.append(line + "\n")
        kept.append(event)
    partial = target.with_name(target.name + ".rewind")
    partial.write_text("".join(lines), encoding="utf-8")
    os.replace(partial, target)  # a kill meanwhile leaves the old file or the new one
    return kept


def history_from_metrics(run_dir: Path) -> list[StepMetrics]:
    """The training steps a run logged so far (what survived resumes and rollbacks)."""
    from agentscope_rft.monitor.records import (
        METRICS_FILE,
        per_step,
        read_metrics,
        surviving_history,
    )

    path = run_dir / METRICS_FILE
    if not path.is_file() or not path.stat().st_size:  # lost (resume warns): no history
        return []
    records = surviving_history(read_metrics(path))
    return [StepMetrics(r.step, dict(r.metrics)) for r in per_step(records, "train")]
