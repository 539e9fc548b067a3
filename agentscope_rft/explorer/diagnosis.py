"""What makes an app unlearnable, read off its rollouts: each finding names the cause and the fix.

Pure functions over rollouts (a batch, a validation pass, one `check_workflow` episode). A rule
returns a `Finding` or None:

- `no_tool_calls`: the requests offered tools, yet at most `TOOL_EPISODE_SHARE` of those
  episodes made a tool call;
- `echoed_runtime_state`: at least `ECHO_SHARE` of the replies to a prompt that carries
  AgentScope's injected `<system-reminder>` echo it (its wording, time, date or timezone);
- `token_cap`: at least `TOKEN_CAP_SHARE` of the replies end at the token limit
  (`finish_reason == "length"`);
- `equal_rewards`: every group (the ok episodes of one task, 2 or more) has one reward for all.

`diagnose` runs them all; `RunDiagnosis` reports a run's first batches once (log lines, a
`diagnosis.jsonl` record and `diagnosis/*` metrics).
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from agentscope_rft.gateway.runtime_state import runtime_state_blocks
from agentscope_rft.types import Call, Rollout

logger = logging.getLogger(__name__)

TOOL_EPISODE_SHARE = 0.1
"""`no_tool_calls` fires when at most this share of the episodes offered tools made a tool call
(one in ten: a model that calls a tool now and then still gives GRPO contrasts to learn from)."""
ECHO_SHARE = 0.05
"""`echoed_runtime_state` fires when at least this share of the calls echo the reminder."""
TOKEN_CAP_SHARE = 0.2
"""`token_cap` fires when at least this share of the calls stop at the token limit."""
TOOL_MARKUP = re.compile(r"<tool_call>\s*\{")
"""The start of a Hermes tool call (a reply that only mentions `<tool_call>` is not an attempt)."""
REWARD_TOLERANCE = 1e-9
"""Rewards closer than this count as equal."""

ECHO_WORDING = re.compile(r"system-reminder|current[\s_-]*time|ground[\s_-]*truth", re.I)
"""Wording of AgentScope's runtime-state reminder (its tags and template) that, in a reply to a
prompt carrying the reminder, shows the reply is about the reminder rather than the task."""


@dataclass(frozen=True, slots=True)
class Finding:
    """One diagnosis: what was seen (`count` of `total`), its cause and the fix, in `message`."""

    code: str
    count: int
    total: int
    message: str

    @property
    def share(self) -> float:
        return self.count / self.total if self.total else 0.0

    def to_dict(self) -> dict[str, object]:
        return {**asdict(self), "share": self.share}


def _calls(rollouts: Sequence[Rollout]) -> list[Call]:
    return [c for r in rollouts if r.ok for c in r.calls]


def no_tool_calls(rollouts: Sequence[Rollout]) -> Finding | None:
    """Tools are offered in the requests, but (almost) no episode calls one.

    Example:
        >>> no_tool_calls([]) is None
        True
    """
    offered = [r for r in rollouts if r.ok and any(c.tools for c in r.calls)]
    if not offered:
        return None
    calling = sum(any(c.tool_calls for c in r.calls) for r in offered)
    if calling > TOOL_EPISODE_SHARE * len(offered):
        return None
    replies = [c.content for r in offered for c in r.calls if c.content]
    names = sorted({t.get("function", {}).get("name", "?") for r in offered for c in r.calls
                    for t in c.tools or []})  # fmt: skip
    markup = sum(1 for text in replies if TOOL_MARKUP.search(text))
    described = sum(1 for text in replies if any(f"{n}(" in text for n in names))
    if markup:
        cause = (
            f"{markup} repl(ies) wrote tool-call markup that did not parse (check the chat "
            "template's tool-call format)"
        )
    elif described:
        cause = (
            f"{described} repl(ies) write the call as text (`{names[0]}(...)` in prose or code) "
            "instead of in the chat format's tool-call markup"
        )
    else:
        cause = "the model answers in plain text instead"
    return Finding(
        "no_tool_calls",
        calling,
        len(offered),
        f"tools ({', '.join(names[:5])}) were offered in {len(offered)} episode(s) but "
        f"{f'only {calling}' if calling else 'none'} made a tool call: {cause}. "
        "Episodes that never use the tool rarely earn a reward, so there is little to learn "
        "from. Fix: show the model how, with a few worked episodes (tool call, result, answer) "
        "in the agent's memory, an SFT warm start on a few written episodes (`offline.path` + "
        "`offline.warmup_steps`), or a larger model; see docs/workflows.md, 'A first signal on "
        "a small model'",
    )


def _echoes(call: Call) -> bool:
    """Whether the reply echoes the runtime state its prompt carried: the reminder's wording, or
    a value from it (the time, its date, the timezone). Only a prompt with a reminder counts."""
    text = call.content or ""
    blocks = runtime_state_blocks(call.messages) if text else []
    if not blocks:
        return False
    if ECHO_WORDING.search(text):
        return True
    values: set[str] = set()
    for block in blocks:
        for tag in ("current-time", "timezone"):
            for value in re.findall(rf"<{tag}>(.*?)</{tag}>", block, re.S):
                values.add(value.strip())
                values.add(value.strip()[:10])  # the date of an ISO time
    return any(len(v) >= 3 and v in text for v in values)


def echoed_runtime_state(rollouts: Sequence[Rollout]) -> Finding | None:
    """Replies copy the runtime-state reminder AgentScope injects (or the time in it)."""
    calls = _calls(rollouts)
    echoed = sum(_echoes(c) for c in calls)
    if not calls or echoed == 0 or echoed < ECHO_SHARE * len(calls):
        return None
    return Finding(
        "echoed_runtime_state",
        echoed,
        len(calls),
        f"{echoed} of {len(calls)} replies echo the `<system-reminder>` with the current time "
        "that AgentScope's Agent injects by default (InjectionConfig.inject_runtime_state): "
        "they copy or talk about it (its wording, time or timezone) instead of doing the task. "
        "Fix: set `gateway.runtime_state: drop` in the config (the gateway removes the "
        "reminder; no app edit), or build the Agent with "
        "`injection_config=InjectionConfig(inject_runtime_state=False)`",
    )


def token_cap(rollouts: Sequence[Rollout]) -> Finding | None:
    """Replies stop at the token limit (`finish_reason == "length"`)."""
    calls = _calls(rollouts)
    capped = [c for c in calls if c.finish_reason == "length"]
    if not calls or not capped or len(capped) < TOKEN_CAP_SHARE * len(calls):
        return None
    longest = max(len(c.completion_ids) for c in capped)
    echo = sum(_echoes(c) for c in capped)
    cause = (
        f" ({echo} of them echo the injected `<system-reminder>`: see `gateway.runtime_state`)"
        if echo
        else ""
    )
    thinking = sum(1 for c in capped if c.reasoning and not c.content and not c.tool_calls)
    if thinking:
        cause += (
            f" ({thinking} of them cut inside their thinking, with no answer: a reasoning model "
            "needs room to think and then answer, and an AgentScope agent given no answer asks "
            "again with the same prompt, up to its `max_iters`)"
        )
    return Finding(
        "token_cap",
        len(capped),
        len(calls),
        f"{len(capped)} of {len(calls)} replies hit the token cap (up to {longest} tokens)"
        f"{cause}: a cut reply rarely holds a tool call or an answer, and long replies make "
        "steps slow. Fix: if replies ramble or repeat, show the expected format (worked episodes "
        "in the agent's memory, an SFT warm start); if they need the room, raise "
        "`explorer.sampling.max_tokens` (and `explorer.max_tokens_per_call`)",
    )


def equal_rewards(rollouts: Sequence[Rollout]) -> Finding | None:
    """Every group (the ok episodes of one task, at least 2) has the same reward throughout."""
    groups: dict[str, list[float]] = defaultdict(list)
    for r in rollouts:
        if r.ok:
            groups[r.task_id].append(r.reward)
    sized = [g for g in groups.values() if len(g) >= 2]
    if not sized:
        return None
    flat = [g for g in sized if max(g) - min(g) <= REWARD_TOLERANCE]
    if len(flat) < len(sized):
        return None
    values = sorted({round(g[0], 6) for g in flat})
    shown = ", ".join(f"{v:g}" for v in values[:5])
    return Finding(
        "equal_rewards",
        len(flat),
        len(sized),
        f"all {len(sized)} task group(s) (a task's episodes) have equal rewards within the "
        f"group (reward {shown}): "
        "group-relative advantages are all zero, so a training step learns nothing. Fix: make "
        "some episodes succeed (worked episodes in the agent's memory, an SFT warm start, easier "
        "tasks, a larger model), give partial credit in the reward, or raise "
        "`explorer.group_size`; `explorer.dynamic_sampling` skips such groups",
    )


RULES = (no_tool_calls, echoed_runtime_state, token_cap, equal_rewards)


def diagnose(rollouts: Sequence[Rollout], *, groups: bool = True) -> list[Finding]:
    """Every rule's finding over `rollouts` (`groups=False`: skip `equal_rewards`).

    Example:
        >>> [f.code for f in diagnose(result.rollouts)]  # doctest: +SKIP
        ['echoed_runtime_state', 'token_cap', 'equal_rewards']
    """
    rules = RULES if groups else RULES[:-1]
    return [f for f in (rule(rollouts) for rule in rules) if f is not None]


def diagnosis_metrics(findings: Sequence[Finding]) -> dict[str, float]:
    """`diagnosis/<code>`: the share each finding measured (absent rules are not logged)."""
    return {f"diagnosis/{f.code}": f.share for f in findings}


class RunDiagnosis:
    """Diagnoses a run's first batch of each phase once: log lines (a finding's code is logged
    once per run), a record per phase in `diagnosis.jsonl`, and metrics to log with the step.

    Example:
        >>> diagnosis = RunDiagnosis(Path("runs/x"))  # doctest: +SKIP
        >>> metrics = diagnosis.first(step, "train", result.rollouts)  # doctest: +SKIP
    """

    def __init__(self, run_dir: Path | None) -> None:
        self.path = run_dir / "diagnosis.jsonl" if run_dir is not None else None
        self.phases: set[str] = set()
        self.logged: set[str] = set()

    def first(self, step: int, phase: str, rollouts: Sequence[Rollout]) -> dict[str, float]:
        """Diagnose `rollouts` if `phase` has not been diagnosed yet; returns its metrics."""
        if phase in self.phases or not rollouts:
            return {}
        self.phases.add(phase)
        findings = diagnose(rollouts)
        self.report(findings, f"{phase} (step {step}, {len(rollouts)} episodes)")
        if self.path is not None:
            record = {
                "time": time.time(),
                "step": step,
                "phase": phase,
                "episodes": len(rollouts),
                "findings": [f.to_dict() for f in findings],
            }
            with open(self.path, "a") as handle:
                handle.write(json.dumps(record) + "\n")
        return diagnosis_metrics(findings)

    def report(self, findings: Sequence[Finding], where: str) -> None:
        """Log each finding not yet logged, once."""
        fresh = [f for f in findings if f.code not in self.logged]
        for finding in fresh:
            self.logged.add(finding.code)
            logger.warning("diagnosis (%s): %s", where, finding.message)
        if not findings and not self.logged:
            logger.info("diagnosis (%s): no finding", where)
