"""The `Buffer` contract between the explorer (writes) and the trainer (reads), and its errors.

A buffer stores whole advantage groups. `put` adds one or more whole groups atomically; `get`
hands out complete groups in insertion order (FIFO), each exactly once, and records which training
step took them, so that a resumed run can give back what a lost step had taken (`requeue_after`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from agentscope_rft.types import Sample

STATS_KEYS = (
    "pending_groups",
    "pending_samples",
    "consumed_groups",
    "consumed_samples",
    "dropped_groups",
    "dropped_samples",
)
"""The keys of `Buffer.stats()`: groups and samples waiting, trained, and dropped as stale."""


class BufferInputError(ValueError):
    """`put` got a sample it cannot store; the message names the sample and the field."""


class BufferFormatError(RuntimeError):
    """A storage file or database is not a buffer this version can read; names the file."""


class BufferTimeout(TimeoutError):
    """`get` waited its whole timeout; the message says what it was waiting for."""


@runtime_checkable
class Buffer(Protocol):
    """Storage of training samples between the explorer and the trainer.

    Implementations: `MemoryBuffer` (one process, nothing survives it) and `SQLBuffer` (SQLite
    file or any SQLAlchemy URL; crash-safe, shared between processes).

    Example:
        >>> from agentscope_rft.buffer import MemoryBuffer
        >>> buffer = MemoryBuffer()
        >>> await buffer.put(group_samples)  # doctest: +SKIP
        >>> batch = await buffer.get(8, step=1, min_policy_version=0, timeout=30)  # doctest: +SKIP
    """

    async def put(self, samples: Sequence[Sample]) -> None:
        """Store whole groups (samples sharing `Sample.group`) atomically: all or nothing.

        Raises:
            BufferInputError: a sample cannot be stored; nothing of the call is stored.
        """
        ...

    async def get(
        self,
        num_groups: int,
        *,
        step: int,
        min_policy_version: int = 0,
        timeout: float | None = None,
    ) -> list[Sample]:
        """All samples of the `num_groups` oldest complete groups, marked consumed by `step`.

        Pending groups with a sample older than `min_policy_version` are dropped (counted in
        `stats`). Waits until enough groups exist; `timeout=None` waits forever.

        Raises:
            BufferTimeout: not enough groups within `timeout` seconds.
        """
        ...

    async def requeue_after(self, step: int) -> int:
        """Make groups consumed or dropped by steps after `step` pending again, in their original
        order; returns how many samples that gives back."""
        ...

    async def abandon_after(self, step: int) -> int:
        """Drop for good the groups consumed or dropped by steps after `step`, and undo those
        steps' replays: a rollback abandons them, and what they trained (explored, as a rule, by
        the policies it rolls back from) is never trained or replayed again. Returns how many
        samples that drops."""
        ...

    async def discard_pending(self) -> int:
        """Drop every group not yet trained on; returns how many samples that was."""
        ...

    async def stats(self) -> dict[str, float]:
        """Counts of groups and samples by state; the keys are `STATS_KEYS`."""
        ...

    async def close(self) -> None:
        """Release the storage; later calls raise `RuntimeError`."""
        ...


async def get_counting_stale(
    buffer: Buffer,
    num_groups: int,
    *,
    step: int,
    min_policy_version: int,
    timeout: float | None,
) -> tuple[list[Sample], dict[str, float]]:
    """`buffer.get`, and the step metrics of the groups it dropped as stale on the way:
    `buffer/stale_groups_dropped` and `buffer/stale_samples_dropped` (a group's version is its
    oldest sample's, a sample's its oldest call's). The trainer is the buffer's only reader.

    Example:
        >>> samples, metrics = await get_counting_stale(
        ...     buffer, 4, step=3, min_policy_version=1, timeout=60)  # doctest: +SKIP
        >>> metrics["buffer/stale_groups_dropped"]  # doctest: +SKIP
        0.0
    """
    before = await buffer.stats()
    samples = await buffer.get(
        num_groups, step=step, min_policy_version=min_policy_version, timeout=timeout
    )
    after = await buffer.stats()
    metrics = {
        f"buffer/stale_{kind}_dropped": after[f"dropped_{kind}"] - before[f"dropped_{kind}"]
        for kind in ("groups", "samples")
    }
    return samples, metrics


def check_get_args(num_groups: int, timeout: float | None) -> None:
    """Reject arguments of `Buffer.get` that can never be satisfied."""
    if isinstance(num_groups, bool) or not isinstance(num_groups, int) or num_groups < 1:
        raise ValueError(f"get: num_groups must be an integer >= 1, got {num_groups!r}")
    if timeout is not None and timeout < 0:
        raise ValueError(f"get: timeout must be >= 0 seconds or None, got {timeout!r}")


def timeout_message(
    *,
    waited: float,
    num_groups: int,
    min_policy_version: int,
    ready: int,
    dropped: int,
    where: str,
) -> str:
    """What a timed-out `get` was waiting for, in one sentence a user can act on."""
    wanted = f"{num_groups} group{'s' if num_groups != 1 else ''}"
    if min_policy_version > 0:
        wanted += f" with policy_version >= {min_policy_version}"
    return (
        f"waited {waited:.1f} s for {wanted} in {where}: have {ready} ready, {dropped} dropped "
        "as stale while waiting; is the explorer running?"
    )


def group_samples(samples: Sequence[Sample]) -> dict[str, list[Sample]]:
    """Samples by `Sample.group`, groups in order of first appearance."""
    groups: dict[str, list[Sample]] = {}
    for sample in samples:
        groups.setdefault(sample.group, []).append(sample)
    return groups
