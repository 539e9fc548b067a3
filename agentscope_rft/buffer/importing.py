"""Which samples of an import a SQL buffer already holds, and the report of what was skipped.

Importing a file into a buffer must never train a sample twice: a sample the buffer already holds
(pending, already trained, or dropped as stale) is skipped, and so is a second copy of a sample
within the file. A sample is identified by what the policy produced and where it came from:
`rollout_id`, `task_id`, `token_ids` and `loss_mask` (every exported file has these four; a
`sample_id` may be missing or empty in hand-made files).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from agentscope_rft.buffer.schema import CONSUMED, DROPPED, groups_table, samples_table
from agentscope_rft.types import Sample

SampleKey = tuple[str, str, bytes, bytes]
"""(rollout_id, task_id, token_ids blob, loss_mask blob): the identity of a stored sample."""

EncodedGroups = dict[str, list[tuple[Sample, dict[str, Any]]]]
"""Group key -> its samples with their storage rows, in call order."""

_LOOKUP_CHUNK = 500


def sample_key(row: Mapping[Any, Any]) -> SampleKey:
    """The identity of a sample from its storage row (see the module docstring)."""
    return (row["rollout_id"], row["task_id"], bytes(row["token_ids"]), bytes(row["loss_mask"]))


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _state_label(state: str, step: int | None) -> str:
    if state == CONSUMED:
        return f"trained by step {step}"
    if state == DROPPED:
        return "dropped" if step is None else f"dropped at step {step}"
    return "pending"


def stored_states(conn: sa.Connection, rollout_ids: Iterable[str]) -> dict[SampleKey, str]:
    """The stored samples of these rollouts, each with the state of its group as a label
    (`pending`, `trained by step 3`, `dropped at step 2`).

    The first import into a buffer adds an index on `rollout_id` (in the caller's transaction), so
    that looking samples up does not read the whole table; runs that never import do not pay for
    it on every `put`, and readers of any version ignore it.
    """
    conn.exec_driver_sql(
        f"CREATE INDEX IF NOT EXISTS ix_{samples_table.name}_rollout_id "
        f"ON {samples_table.name} (rollout_id)"
    )
    s, g = samples_table.c, groups_table.c
    ids = sorted(set(rollout_ids))
    held: dict[SampleKey, str] = {}
    for start in range(0, len(ids), _LOOKUP_CHUNK):
        rows = conn.execute(
            sa.select(s.rollout_id, s.task_id, s.token_ids, s.loss_mask, g.state, g.step)
            .join(groups_table, g.id == s.group_ref)
            .where(s.rollout_id.in_(ids[start : start + _LOOKUP_CHUNK]))
        ).mappings()
        for row in rows:
            held[sample_key(row)] = _state_label(row["state"], row["step"])
    return held


@dataclass(frozen=True, slots=True)
class SkippedSamples:
    """Samples of one group of the file that an import did not store, and why."""

    group: str
    """The group's key (`group_id`, else `task_id`)."""
    skipped: int
    of: int
    """The group's samples in the file."""
    reason: str

    def line(self) -> str:
        """One line for the user: `group g3: 4 of 4 samples already in the buffer (...)`."""
        text = f"group {self.group}: {self.skipped} of {_count(self.of, 'sample')} {self.reason}"
        if self.skipped < self.of:
            rest = self.of - self.skipped
            text += f"; its other {rest} {'was' if rest == 1 else 'were'} imported as a new group"
        return text


@dataclass(frozen=True, slots=True)
class ImportReport:
    """What an import stored and what it skipped.

    Example:
        >>> report = ImportReport(groups=2, samples=8, skipped=())
        >>> report.summary()
        'imported 2 groups (8 samples)'
    """

    groups: int
    samples: int
    skipped: tuple[SkippedSamples, ...]

    @property
    def skipped_samples(self) -> int:
        return sum(s.skipped for s in self.skipped)

    def summary(self) -> str:
        """One line: what was imported and, if anything, how much was skipped."""
        text = f"imported {_count(self.groups, 'group')} ({_count(self.samples, 'sample')})"
        if self.skipped:
            text += (
                f"; skipped {_count(self.skipped_samples, 'sample')} of "
                f"{_count(len(self.skipped), 'group')} "
                "that the buffer already holds or that the file repeats (nothing is trained "
                "twice)"
            )
        return text

    def lines(self, limit: int = 20) -> list[str]:
        """`summary()` and then one line per group with skipped samples (at most `limit`)."""
        out = [self.summary()]
        out += [f"  {s.line()}" for s in self.skipped[:limit]]
        if len(self.skipped) > limit:
            out.append(f"  ... and {len(self.skipped) - limit} more groups with skipped samples")
        return out


def plan_import(
    groups: EncodedGroups, held: Mapping[SampleKey, str]
) -> tuple[EncodedGroups, ImportReport]:
    """The groups (and samples) of an import to store, and the report of what is skipped.

    A sample is skipped when `held` has it (its label says in which state) or when an earlier
    line of the import had it; a group keeps the samples not skipped, in their order.
    """
    seen: set[SampleKey] = set()
    keep: EncodedGroups = {}
    skipped: list[SkippedSamples] = []
    for key, members in groups.items():
        reasons: Counter[str] = Counter()
        new = []
        for sample, row in members:
            identity = sample_key(row)
            if identity in held:
                reasons[f"already in the buffer ({held[identity]})"] += 1
            elif identity in seen:
                reasons["repeated in the file"] += 1
            else:
                seen.add(identity)
                new.append((sample, row))
        if new:
            keep[key] = new
        if reasons:
            why = "; ".join(
                reason if len(reasons) == 1 else f"{count} {reason}"
                for reason, count in reasons.items()
            )
            skipped.append(SkippedSamples(key, sum(reasons.values()), len(members), why))
    stored = sum(len(m) for m in keep.values())
    return keep, ImportReport(groups=len(keep), samples=stored, skipped=tuple(skipped))
