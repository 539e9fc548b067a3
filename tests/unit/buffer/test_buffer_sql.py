"""SQL storage specifics: opening and checking files, durability across reopen, SQLite set-up."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
import sqlalchemy as sa
from buffer_helpers import make_group, stored_form

from agentscope_rft.buffer import BufferFormatError, SQLBuffer
from agentscope_rft.buffer.schema import SCHEMA_VERSION, to_url


async def test_samples_survive_close_and_reopen(tmp_path: Path) -> None:
    path = tmp_path / "runs" / "a" / "buffer.db"  # parent folders are created
    first = SQLBuffer(path)
    await first.put(make_group("a"))
    await first.put(make_group("b"))
    await first.get(1, step=1, timeout=1)
    await first.close()

    again = SQLBuffer(f"sqlite:///{path}", create=False)
    assert (await again.stats())["pending_groups"] == 1
    assert await again.get(1, step=2, timeout=1) == [stored_form(s) for s in make_group("b")]
    await again.close()


def test_sqlite_runs_in_wal_mode_with_a_schema_version(tmp_path: Path) -> None:
    path = tmp_path / "buffer.db"
    SQLBuffer(path)
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        version = conn.execute("SELECT value FROM buffer_meta WHERE key = 'schema_version'")
        assert version.fetchone()[0] == str(SCHEMA_VERSION)


def test_a_file_that_is_not_a_database_is_named(tmp_path: Path) -> None:
    path = tmp_path / "notes.db"
    path.write_text("these are my notes, not a database\n" * 100)
    with pytest.raises(BufferFormatError, match=rf"{path}: cannot open the buffer \(file is not"):
        SQLBuffer(path)
    assert path.read_text().startswith("these are my notes")  # untouched


def test_a_buffer_on_a_full_disk_says_to_make_room_not_to_pick_another_database(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk while creating the buffer told the user to point the url at a database."""
    from sqlalchemy import exc as sa_exc

    from agentscope_rft.buffer import schema

    def full(engine, where, create):
        raise sa_exc.OperationalError(
            "CREATE TABLE", None, sqlite3.OperationalError("database or disk is full")
        )

    monkeypatch.setattr(schema, "_check_schema", full)
    path = tmp_path / "buffer.db"
    with pytest.raises(BufferFormatError) as error:
        SQLBuffer(path)
    assert str(error.value) == (
        f"{path}: cannot open the buffer (database or disk is full); make room on its disk, or "
        "point the buffer url at a file on a disk with room"
    )


def test_a_buffer_of_another_schema_version_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "buffer.db"
    SQLBuffer(path)
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE buffer_meta SET value = '99' WHERE key = 'schema_version'")
    expected = rf"{path}: buffer schema version 99 .* version {SCHEMA_VERSION}"
    with pytest.raises(BufferFormatError, match=expected):
        SQLBuffer(path)


async def test_a_version_1_buffer_is_upgraded_in_place_with_its_samples(tmp_path: Path) -> None:
    path = tmp_path / "buffer.db"
    first = SQLBuffer(path)
    await first.put(make_group("a"))
    await first.close()
    with sqlite3.connect(path) as conn:  # what version 1 wrote: no step_states_json column
        conn.execute("ALTER TABLE buffer_samples DROP COLUMN step_states_json")
        conn.execute("UPDATE buffer_meta SET value = '1' WHERE key = 'schema_version'")
    again = SQLBuffer(path, create=False)
    assert await again.get(1, step=1, timeout=1) == [stored_form(s) for s in make_group("a")]
    await again.close()
    with sqlite3.connect(path) as conn:
        version = conn.execute("SELECT value FROM buffer_meta WHERE key = 'schema_version'")
        assert version.fetchone()[0] == str(SCHEMA_VERSION)


def test_a_database_with_other_tables_gets_buffer_tables_but_foreign_buffer_tables_fail(
    tmp_path: Path,
) -> None:
    shared = tmp_path / "app.db"
    with sqlite3.connect(shared) as conn:
        conn.execute("CREATE TABLE users (name TEXT)")
    SQLBuffer(shared)  # adds its tables next to the app's

    foreign = tmp_path / "foreign.db"
    with sqlite3.connect(foreign) as conn:
        conn.execute("CREATE TABLE buffer_samples (x INTEGER)")
    with pytest.raises(BufferFormatError, match="no schema version"):
        SQLBuffer(foreign)


def test_opening_without_create_needs_an_existing_buffer(tmp_path: Path) -> None:
    with pytest.raises(BufferFormatError, match="no such buffer file"):
        SQLBuffer(tmp_path / "missing.db", create=False)
    assert not (tmp_path / "missing.db").exists()
    empty = tmp_path / "empty.db"
    sqlite3.connect(empty).close()
    with pytest.raises(BufferFormatError, match="is not an agentscope-rft buffer"):
        SQLBuffer(empty, create=False)


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///:memory:"])
def test_in_memory_sqlite_is_refused_with_the_alternative(url: str) -> None:
    with pytest.raises(BufferFormatError, match="buffer type 'memory'"):
        SQLBuffer(url)


def test_a_folder_is_not_a_buffer_file(tmp_path: Path) -> None:
    with pytest.raises(BufferFormatError, match="is a folder"):
        SQLBuffer(tmp_path)


def test_paths_and_urls() -> None:
    assert to_url("runs/a/buffer.db").render_as_string() == "sqlite:///runs/a/buffer.db"
    assert to_url("/abs/buffer.db").database == "/abs/buffer.db"
    url = to_url("postgresql+psycopg://rft:secret@db/rft")
    assert url.get_backend_name() == "postgresql"
    with pytest.raises(BufferFormatError, match="is not a SQLAlchemy URL"):
        to_url("not a url://x")


@pytest.mark.parametrize("url", ["nonsense://host/db", "postgresql+nodriver://host/db"])
def test_unknown_dialects_and_drivers_say_what_to_install(url: str) -> None:
    with pytest.raises(
        BufferFormatError, match=r"no database driver .* agentscope-rft\[postgres\]"
    ):
        SQLBuffer(url)


async def test_put_is_one_transaction(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A failure while inserting the second group's rows rolls back the first group too.
    buffer = SQLBuffer(tmp_path / "buffer.db")
    real_execute = sa.Connection.execute
    calls = {"n": 0}

    def failing_execute(self, statement, *args, **kwargs):  # type: ignore[no-untyped-def]
        if getattr(statement, "table", None) is not None and statement.table.name == (
            "buffer_samples"
        ):
            calls["n"] += 1
            raise sa.exc.OperationalError("INSERT", {}, Exception("disk I/O error"))
        return real_execute(self, statement, *args, **kwargs)

    monkeypatch.setattr(sa.Connection, "execute", failing_execute)
    with pytest.raises(sa.exc.OperationalError):
        await buffer.put(make_group("a") + make_group("b"))
    monkeypatch.undo()

    assert calls["n"] == 1
    assert sum((await buffer.stats()).values()) == 0
    await buffer.close()


async def test_a_lost_claim_race_rolls_back_and_picks_again(tmp_path: Path) -> None:
    # Between our SELECT and UPDATE another reader takes group "a" (possible on databases without
    # SKIP LOCKED): the claim and the stale drop roll back, and the retry gets whole groups.
    buffer = SQLBuffer(tmp_path / "buffer.db")
    for name, version in (("stale", 0), ("a", 1), ("b", 1), ("c", 1)):
        await buffer.put(make_group(name, 1, policy_version=version))
    races = []

    def other_reader_takes_a(conn, cursor, statement, parameters, context, executemany):  # type: ignore[no-untyped-def]
        if statement.startswith("UPDATE buffer_groups") and "consumed" in parameters and not races:
            races.append(statement)
            cursor.execute("UPDATE buffer_groups SET state = 'consumed' WHERE group_key = 'a'")

    sa.event.listen(buffer._engine, "before_cursor_execute", other_reader_takes_a)
    batch = await buffer.get(2, step=1, min_policy_version=1, timeout=1)

    assert len(races) == 1
    assert [s.group_id for s in batch] == ["a", "b"]  # the race was rolled back
    stats = await buffer.stats()
    assert (stats["dropped_groups"], stats["consumed_groups"], stats["pending_groups"]) == (1, 2, 1)
    await buffer.close()
