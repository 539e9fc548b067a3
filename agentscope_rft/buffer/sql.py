"""`SQLBuffer`: a durable buffer in a SQLite file (default) or any SQLAlchemy database.

Every `put` is one transaction, so a crash leaves whole groups or nothing. A `get` claims its
groups in one transaction that re-checks their state, so two readers (threads or processes) never
take the same group. Database work runs in a worker thread; waiting polls with a short sleep, so
a `get` sees `put`s from other processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import sqlalchemy as sa

from agentscope_rft.buffer.base import (
    STATS_KEYS,
    BufferTimeout,
    check_get_args,
    timeout_message,
)
from agentscope_rft.buffer.codec import decode_sample, encode_sample, sample_where
from agentscope_rft.buffer.importing import (
    EncodedGroups,
    ImportReport,
    plan_import,
    stored_states,
)
from agentscope_rft.buffer.replay import (
    ReplayCandidate,
    ReplayConfig,
    choose,
    mark_reuse,
    replay_count,
)
from agentscope_rft.buffer.schema import (
    CONSUMED,
    DROPPED,
    PENDING,
    SAMPLE_COLUMNS,
    create_buffer_engine,
    describe,
    groups_table,
    replays_table,
    samples_table,
    to_url,
)
from agentscope_rft.types import Sample

_MAX_CLAIM_RETRIES = 20


class _ClaimConflict(Exception):
    """Rolls back a claim that lost a race with another reader."""


@dataclass(slots=True)
class _Attempt:
    """One try of `get`: the claimed groups and their samples, or why there were not enough."""

    group_ids: list[int] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    ready: int = 0
    dropped: int = 0


def _encode_groups(samples: list[Sample]) -> EncodedGroups:
    """Samples by group with their storage rows; validates every sample first."""
    by_group: EncodedGroups = {}
    for index, sample in enumerate(samples):
        row = encode_sample(sample, sample_where(sample, index))
        by_group.setdefault(sample.group, []).append((sample, row))
    return by_group


def _insert_groups(conn: sa.Connection, groups: EncodedGroups) -> None:
    """Insert each group as a new pending group with its samples (inside the caller's
    transaction)."""
    if not groups:
        return
    now = time.time()
    rows: list[dict[str, Any]] = []
    for key, members in groups.items():
        inserted = conn.execute(
            groups_table.insert().values(
                group_key=key,
                num_samples=len(members),
                min_policy_version=min(s.policy_version for s, _ in members),
                state=PENDING,
                step=None,
                created_at=now,
                updated_at=now,
            )
        )
        (group_ref,) = inserted.inserted_primary_key or (None,)
        rows.extend({**row, "group_ref": group_ref} for _, row in members)
    conn.execute(samples_table.insert(), rows)


class SQLBuffer:
    """A `Buffer` in a SQL database: crash-safe, shared between processes, resumable.

    Opening checks (or creates) the schema and fails with `BufferFormatError` naming the file
    when it is not a buffer this version can read.

    Args:
        url: a SQLAlchemy URL (`sqlite:///run/buffer.db`, `postgresql+psycopg://...`) or a path
            to a SQLite file.
        create: create the file and tables when absent; otherwise a missing buffer is an error.
        poll_interval: seconds between checks while `get` waits for groups.
        busy_timeout: SQLite only: seconds a transaction waits for another process's lock.
        synchronous: SQLite only: `full` also survives power loss; `normal` survives process
            crashes (the guarantee a killed run needs) and commits faster.
        replay: replay trained groups (see `agentscope_rft.buffer.replay`); their reuse counts
            are rows of the database, claimed in the same transaction as the fresh groups.

    Example:
        >>> buffer = SQLBuffer("sqlite:///runs/demo/buffer.db")
        >>> await buffer.put(group_samples)  # doctest: +SKIP
        >>> batch = await buffer.get(4, step=1, min_policy_version=0, timeout=60)  # doctest: +SKIP
        >>> await buffer.close()  # doctest: +SKIP
    """

    def __init__(
        self,
        url: str | Path,
        *,
        create: bool = True,
        poll_interval: float = 0.1,
        busy_timeout: float = 30.0,
        synchronous: Literal["normal", "full"] = "full",
        replay: ReplayConfig | None = None,
    ) -> None:
        if poll_interval <= 0:
            raise ValueError(f"poll_interval must be > 0 seconds, got {poll_interval}")
        self._url = to_url(url)
        self.where = describe(self._url)
        """The buffer's location for messages (SQLite file, or URL without password)."""
        self._poll_interval = poll_interval
        self._engine = create_buffer_engine(
            self._url, create=create, busy_timeout=busy_timeout, synchronous=synchronous
        )
        self._replay = replay
        self._priority = replay.priority_fn() if replay is not None else None
        self._closed = False

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"the buffer {self.where} is closed")

    async def put(self, samples: Sequence[Sample]) -> None:
        """Store whole groups in one transaction; a bad sample raises and stores nothing.

        Cancelling a `put` waits for its transaction to end before `CancelledError` propagates;
        the groups may then be stored (check `stats` before putting them again).
        """
        self._check_open()
        if samples:
            work = asyncio.ensure_future(asyncio.to_thread(self._put, list(samples)))
            try:
                await asyncio.shield(work)
            except asyncio.CancelledError:
                with contextlib.suppress(Exception):
                    await work
                raise

    def _put(self, samples: list[Sample]) -> None:
        groups = _encode_groups(samples)
        with self._engine.begin() as conn:
            _insert_groups(conn, groups)

    async def put_new(self, samples: Sequence[Sample]) -> ImportReport:
        """Store the samples this buffer does not hold yet, in one transaction; what an import
        uses, so that importing a file twice, or a file exported from this same buffer, never
        makes a sample trainable twice.

        A sample the buffer holds in any state (pending, trained, dropped), identified by
        `rollout_id`, `task_id`, `token_ids` and `loss_mask`, is skipped, as is a repeat of a
        sample earlier in `samples`; a group keeps its other samples. The check and the insert are
        one transaction (on Postgres under a lock that keeps other writers out meanwhile).

        Returns:
            What was stored and, group by group, what was skipped and why.

        Raises:
            BufferInputError: a sample cannot be stored; nothing of the call is stored.

        Example:
            >>> report = await buffer.put_new(import_samples("samples.jsonl"))  # doctest: +SKIP
            >>> print(report.summary())  # doctest: +SKIP
            imported 3 groups (12 samples); skipped 8 samples of 2 groups ...
        """
        self._check_open()
        work = asyncio.ensure_future(asyncio.to_thread(self._put_new, list(samples)))
        try:
            return await asyncio.shield(work)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                await work
            raise

    def _put_new(self, samples: list[Sample]) -> ImportReport:
        groups = _encode_groups(samples)
        with self._engine.begin() as conn:
            if conn.dialect.name == "postgresql":  # SQLite: BEGIN IMMEDIATE already excludes
                conn.exec_driver_sql(f"LOCK TABLE {groups_table.name} IN EXCLUSIVE MODE")
            held = stored_states(conn, (s.rollout_id for s in samples))
            keep, report = plan_import(groups, held)
            _insert_groups(conn, keep)
        return report

    async def get(
        self,
        num_groups: int,
        *,
        step: int,
        min_policy_version: int = 0,
        timeout: float | None = None,
    ) -> list[Sample]:
        """The samples of the `num_groups` oldest fresh groups; see `Buffer.get`."""
        check_get_args(num_groups, timeout)
        start = time.monotonic()
        dropped = 0
        while True:
            self._check_open()
            attempt = await self._attempt(num_groups, step, min_policy_version)
            dropped += attempt.dropped
            if attempt.group_ids:
                return attempt.samples
            waited = time.monotonic() - start
            if timeout is not None and waited >= timeout:
                raise BufferTimeout(
                    timeout_message(
                        waited=waited,
                        num_groups=num_groups,
                        min_policy_version=min_policy_version,
                        ready=attempt.ready,
                        dropped=dropped,
                        where=self.where,
                    )
                )
            pause = (
                self._poll_interval
                if timeout is None
                else min(self._poll_interval, timeout - waited)
            )
            await asyncio.sleep(pause)

    async def _attempt(self, num_groups: int, step: int, min_policy_version: int) -> _Attempt:
        work = asyncio.ensure_future(
            asyncio.to_thread(self._try_claim, num_groups, step, min_policy_version)
        )
        try:
            return await asyncio.shield(work)
        except asyncio.CancelledError:
            # The thread finishes its transaction regardless; give back what it claimed, or the
            # groups would count as trained by a step that never saw them.
            attempt = await work
            if attempt.group_ids:
                await asyncio.to_thread(self._unclaim, attempt.group_ids, step)
            raise

    def _try_claim(self, num_groups: int, step: int, min_policy_version: int) -> _Attempt:
        g = groups_table.c
        stale = sa.case((g.min_policy_version < min_policy_version, 1), else_=0)
        with self._engine.connect().execution_options(read_only=True) as conn, conn.begin():
            pending, num_stale = conn.execute(
                sa.select(sa.func.count(), sa.func.coalesce(sa.func.sum(stale), 0)).where(
                    g.state == PENDING
                )
            ).one()
        if num_stale == 0 and pending < num_groups:
            return _Attempt(ready=pending)
        for _ in range(_MAX_CLAIM_RETRIES):
            try:
                with self._engine.begin() as conn:
                    dropped = conn.execute(
                        sa.update(groups_table)
                        .where(g.state == PENDING, g.min_policy_version < min_policy_version)
                        .values(state=DROPPED, step=step, updated_at=time.time())
                    ).rowcount
                    return self._claim_oldest(conn, num_groups, step, dropped)
            except _ClaimConflict:
                continue
        raise RuntimeError(f"{self.where}: could not claim {num_groups} groups (contention)")

    def _claim_oldest(
        self, conn: sa.Connection, num_groups: int, step: int, dropped: int
    ) -> _Attempt:
        g = groups_table.c
        ids = list(
            conn.execute(
                sa.select(g.id)
                .where(g.state == PENDING)
                .order_by(g.id)
                .limit(num_groups)
                # row-locking databases: skip groups another reader is claiming right now
                # (SQLite ignores this; its BEGIN IMMEDIATE already serializes claims)
                .with_for_update(skip_locked=True)
            ).scalars()
        )
        if len(ids) < num_groups:
            return _Attempt(ready=len(ids), dropped=dropped)
        claimed = conn.execute(
            sa.update(groups_table)
            .where(g.id.in_(ids), g.state == PENDING)
            .values(state=CONSUMED, step=step, updated_at=time.time())
        ).rowcount
        if claimed != len(ids):
            # another reader took some of them between our SELECT and UPDATE (a database
            # without SKIP LOCKED): roll back, drops included, and pick again
            raise _ClaimConflict
        samples = self._read_groups(conn, ids)
        if self._replay is not None:
            samples += self._claim_replays(conn, num_groups, step)
        return _Attempt(ids, samples, len(ids), dropped)

    def _claim_replays(self, conn: sa.Connection, num_groups: int, step: int) -> list[Sample]:
        """Choose and record this step's replayed groups; their samples, marked."""
        assert self._replay is not None and self._priority is not None
        g, r, s = groups_table.c, replays_table.c, samples_table.c
        uses = (
            sa.select(r.group_ref, sa.func.count().label("uses")).group_by(r.group_ref).subquery()
        )
        rows = conn.execute(
            sa.select(g.id, g.min_policy_version, sa.func.coalesce(uses.c.uses, 0))
            .outerjoin(uses, uses.c.group_ref == g.id)
            .where(
                g.state == CONSUMED,
                g.step < step,
                g.min_policy_version >= step - self._replay.max_staleness,
                sa.func.coalesce(uses.c.uses, 0) < self._replay.max_reuse,
            )
        ).all()
        if not rows:
            return []
        rewards: dict[int, list[float]] = {}
        for group_ref, reward in conn.execute(
            sa.select(s.group_ref, s.reward)
            .where(s.group_ref.in_([row[0] for row in rows]))
            .order_by(s.group_ref, s.id)
        ):
            rewards.setdefault(group_ref, []).append(reward)
        candidates = [
            ReplayCandidate(gid, tuple(rewards.get(gid, ())), version, int(count))
            for gid, version, count in rows
        ]
        chosen = choose(
            candidates,
            replay_count(self._replay, num_groups),
            step=step,
            config=self._replay,
            priority=self._priority,
        )
        if not chosen:
            return []
        conn.execute(replays_table.insert(), [{"group_ref": c.seq, "step": step} for c in chosen])
        out: list[Sample] = []
        for candidate in chosen:  # in priority order, like the memory buffer
            members = self._read_group_samples(conn, candidate.seq)
            out.extend(mark_reuse(members, candidate.reuse_count + 1))
        return out

    @staticmethod
    def _read_group_samples(conn: sa.Connection, group_id: int) -> list[Sample]:
        s = samples_table.c
        rows = conn.execute(
            sa.select(*SAMPLE_COLUMNS).where(s.group_ref == group_id).order_by(s.id)
        ).mappings()
        return [decode_sample(row) for row in rows]

    @staticmethod
    def _read_groups(conn: sa.Connection, group_ids: list[int]) -> list[Sample]:
        s = samples_table.c
        rows = conn.execute(
            sa.select(*SAMPLE_COLUMNS).where(s.group_ref.in_(group_ids)).order_by(s.group_ref, s.id)
        ).mappings()
        return [decode_sample(row) for row in rows]

    def _unclaim(self, group_ids: list[int], step: int) -> None:
        g = groups_table.c
        with self._engine.begin() as conn:
            conn.execute(
                sa.update(groups_table)
                .where(g.id.in_(group_ids), g.state == CONSUMED, g.step == step)
                .values(state=PENDING, step=None, updated_at=time.time())
            )

    async def requeue_after(self, step: int) -> int:
        """Make groups consumed or dropped by steps after `step` pending again (original order);
        returns how many samples that gives back."""
        self._check_open()
        return await asyncio.to_thread(self._requeue_after, step)

    def _requeue_after(self, step: int) -> int:
        return self._release_after(step, PENDING)

    def _release_after(self, step: int, state: str) -> int:
        """Put the groups consumed or dropped by steps after `step` in `state` (pending: a resume
        trains them again; dropped: a rollback abandoned them); returns their samples."""
        g = groups_table.c
        taken = sa.and_(g.state.in_((CONSUMED, DROPPED)), g.step > step)
        with self._engine.begin() as conn:
            # the lost steps' replays did not happen either: their reuse counts go back
            conn.execute(sa.delete(replays_table).where(replays_table.c.step > step))
            count = conn.execute(
                sa.select(sa.func.coalesce(sa.func.sum(g.num_samples), 0)).where(taken)
            ).scalar_one()
            conn.execute(
                sa.update(groups_table)
                .where(taken)
                .values(state=state, step=None, updated_at=time.time())
            )
        return int(count)

    async def abandon_after(self, step: int) -> int:
        """Mark the groups consumed or dropped by steps after `step` dropped for good (a rollback
        abandoned those steps) and delete those steps' replays; returns the samples dropped."""
        self._check_open()
        return await asyncio.to_thread(self._abandon_after, step)

    def _abandon_after(self, step: int) -> int:
        return self._release_after(step, DROPPED)

    async def discard_pending(self) -> int:
        """Mark every pending group dropped (a resumed run re-explores them); returns samples."""
        self._check_open()
        return await asyncio.to_thread(self._discard_pending)

    def _discard_pending(self) -> int:
        g = groups_table.c
        pending = g.state == PENDING
        with self._engine.begin() as conn:
            count = conn.execute(
                sa.select(sa.func.coalesce(sa.func.sum(g.num_samples), 0)).where(pending)
            ).scalar_one()
            conn.execute(
                sa.update(groups_table).where(pending).values(state=DROPPED, updated_at=time.time())
            )
        return int(count)

    async def stats(self) -> dict[str, float]:
        """Counts of groups and samples by state (`STATS_KEYS`)."""
        self._check_open()
        return await asyncio.to_thread(self._stats)

    def _stats(self) -> dict[str, float]:
        g = groups_table.c
        counts = dict.fromkeys(STATS_KEYS, 0.0)
        with self._engine.connect().execution_options(read_only=True) as conn, conn.begin():
            rows = conn.execute(
                sa.select(g.state, sa.func.count(), sa.func.sum(g.num_samples)).group_by(g.state)
            )
            for state, groups, samples in rows:
                counts[f"{state}_groups"] = float(groups)
                counts[f"{state}_samples"] = float(samples or 0)
        return counts

    async def close(self) -> None:
        """Close the database connections; later calls raise `RuntimeError`."""
        if not self._closed:
            self._closed = True
            await asyncio.to_thread(self._engine.dispose)
