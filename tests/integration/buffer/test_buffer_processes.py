"""Real processes on one SQLite file: a writer killed mid-write, an explorer writing while a
trainer reads, and several readers claiming concurrently."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from buffer_procs import make_group

from agentscope_rft.buffer import SQLBuffer, iter_stored_samples
from agentscope_rft.buffer.schema import metadata
from agentscope_rft.types import Sample

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = Path(__file__).with_name("buffer_procs.py")


def spawn(*args: object) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(SCRIPT.parent)])}
    return subprocess.Popen(
        [sys.executable, str(SCRIPT), *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
    )


def wait_for_line(proc: subprocess.Popen[str], wanted: str, limit: float = 30.0) -> list[str]:
    """Lines the process printed up to and including the first that starts with `wanted`."""
    assert proc.stdout is not None
    deadline = time.monotonic() + limit
    lines: list[str] = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise AssertionError(f"process ended before {wanted!r}: {proc.stderr.read()}")  # type: ignore[union-attr]
        lines.append(line.strip())
        if line.startswith(wanted):
            return lines
    raise AssertionError(f"no {wanted!r} within {limit} s")


def kill(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    assert proc.returncode == -signal.SIGKILL


def check_whole_groups(path: Path, size: int, num_tokens: int) -> list[int]:
    """Open the file the way a resumed run does and check that every stored group is complete and
    every sample's arrays are intact; returns the stored group numbers."""
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    by_group: dict[str, list[Sample]] = {}
    for sample in iter_stored_samples(path):
        by_group.setdefault(sample.group_id, []).append(sample)
    groups = sorted(int(key[1:]) for key in by_group)
    for group in groups:
        expected = make_group(group, size, num_tokens)
        assert by_group[f"g{group}"] == expected, f"group {group} is damaged"
    return groups


async def test_a_writer_killed_inside_a_transaction_leaves_only_whole_groups(
    tmp_path: Path,
) -> None:
    path = tmp_path / "buffer.db"
    writer = spawn("write-then-hang", path, 4, 3000)
    wait_for_line(writer, "inside-transaction")  # group 1's rows are written, not committed
    kill(writer)

    assert check_whole_groups(path, 4, 3000) == [0]
    buffer = SQLBuffer(path)  # usable: counts agree, and it takes new groups
    assert (await buffer.stats())["pending_samples"] == 4
    await buffer.put(make_group(1, 4, 10))
    assert len(await buffer.get(2, step=1, timeout=5)) == 8
    await buffer.close()


async def test_a_writer_killed_at_a_random_moment_of_large_writes(tmp_path: Path) -> None:
    path = tmp_path / "buffer.db"
    size, num_tokens = 16, 8000  # about 1.2 MB per put
    writer = spawn("write", path, 0, 1000, size, num_tokens, 0)
    wait_for_line(writer, "stored 2")
    time.sleep(0.137)
    kill(writer)
    said = [line.split() for line in writer.stdout.read().splitlines()]  # type: ignore[union-attr]
    last_stored = max([2] + [int(n) for word, n in said if word == "stored"])
    last_begun = max([2] + [int(n) for word, n in said if word == "begin"])

    groups = check_whole_groups(path, size, num_tokens)
    assert groups == list(range(len(groups)))
    assert last_stored <= groups[-1] <= last_begun  # every returned put is there, nothing more
    buffer = SQLBuffer(path)
    stats = await buffer.stats()
    assert stats["pending_groups"] * size == stats["pending_samples"] == len(groups) * size
    await buffer.close()


async def test_a_trainer_process_reads_what_an_explorer_process_writes(tmp_path: Path) -> None:
    path = tmp_path / "buffer.db"
    SQLBuffer(path)  # created before either side starts
    explorer = spawn("write", path, 0, 12, 2, 64, 0.02)
    trainer = SQLBuffer(path, poll_interval=0.02)

    batches = [await trainer.get(3, step=step, timeout=30) for step in range(1, 5)]

    assert explorer.wait(30) == 0, explorer.stderr.read()  # type: ignore[union-attr]
    received = [s for batch in batches for s in batch]
    assert received == [s for group in range(12) for s in make_group(group, 2, 64)]
    await trainer.close()


POSTGRES_ENV = "AGENTSCOPE_RFT_TEST_POSTGRES_URL"


@pytest.fixture(params=["sqlite", "postgres"])
def shared_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh buffer location several processes can open."""
    if request.param == "sqlite":
        return str(tmp_path / "buffer.db")
    url = os.environ.get(POSTGRES_ENV)
    if not url:
        pytest.skip(f"set {POSTGRES_ENV} to a throwaway Postgres database to run this test")
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        metadata.drop_all(conn)
    engine.dispose()
    return url


async def test_reader_processes_never_claim_the_same_group(shared_url: str) -> None:
    buffer = SQLBuffer(shared_url)
    readers = [spawn("read", shared_url, 1, 1.0, step, 0.01) for step in range(3)]
    for reader in readers:
        wait_for_line(reader, "ready")  # all are polling the empty buffer
    await buffer.put([s for group in range(90) for s in make_group(group, 2, 16)])
    await buffer.close()

    claimed = []
    for reader in readers:
        out, err = reader.communicate(timeout=60)
        assert reader.returncode == 0, err
        claimed.append(json.loads(out.strip().splitlines()[-1]))

    everything = [rid for ids in claimed for rid in ids]
    assert len(everything) == len(set(everything)) == 180
    assert all(ids for ids in claimed), "a reader got nothing: the test did not exercise races"
