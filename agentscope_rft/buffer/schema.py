"""The SQL schema of a buffer and how a database is opened and checked.

Four tables, portable across SQLAlchemy backends (BLOB/BYTEA for arrays, TEXT for JSON):
`buffer_meta` (key/value, holds `schema_version`), `buffer_groups` (one row per stored group: its
state and the step that took it), `buffer_samples` (one row per sample, blobs per
`codec.ARRAY_DTYPES`) and `buffer_replays` (one row per replay of a trained group: the step).
SQLite files run in WAL mode with a busy timeout, and every write
transaction starts with `BEGIN IMMEDIATE`, so concurrent writers queue instead of failing.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Literal

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import URL, Connection, Engine, make_url

from agentscope_rft.buffer.base import BufferFormatError

logger = logging.getLogger(__name__)

SCHEMA_VERSION = 3
"""Bump on any incompatible change of the tables below; older files are then refused."""

PENDING, CONSUMED, DROPPED = "pending", "consumed", "dropped"

_BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")  # SQLite rowid needs INTEGER

metadata = sa.MetaData()

meta_table = sa.Table(
    "buffer_meta",
    metadata,
    sa.Column("key", sa.String(64), primary_key=True),
    sa.Column("value", sa.Text(), nullable=False),
)

groups_table = sa.Table(
    "buffer_groups",
    metadata,
    sa.Column("id", _BigId, primary_key=True, autoincrement=True),
    sa.Column("group_key", sa.Text(), nullable=False),
    sa.Column("num_samples", sa.Integer(), nullable=False),
    sa.Column("min_policy_version", sa.BigInteger(), nullable=False),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("step", sa.BigInteger(), nullable=True),
    sa.Column("created_at", sa.Double(), nullable=False),
    sa.Column("updated_at", sa.Double(), nullable=False),
    sa.Index("ix_buffer_groups_state_id", "state", "id"),
)

samples_table = sa.Table(
    "buffer_samples",
    metadata,
    sa.Column("id", _BigId, primary_key=True, autoincrement=True),
    sa.Column("group_ref", _BigId, sa.ForeignKey("buffer_groups.id"), nullable=False, index=True),
    sa.Column("sample_id", sa.Text(), nullable=False),
    sa.Column("rollout_id", sa.Text(), nullable=False),
    sa.Column("task_id", sa.Text(), nullable=False),
    sa.Column("group_id", sa.Text(), nullable=False),
    sa.Column("kind", sa.String(32), nullable=False),
    sa.Column("pair_id", sa.Text(), nullable=True),
    sa.Column("agent_name", sa.Text(), nullable=True),
    sa.Column("stop_reason", sa.Text(), nullable=False),
    sa.Column("policy_version", sa.BigInteger(), nullable=False),
    sa.Column("reward", sa.Double(), nullable=False),
    sa.Column("temperature", sa.Double(), nullable=False),
    sa.Column("num_calls", sa.Integer(), nullable=False),
    sa.Column("num_tokens", sa.Integer(), nullable=False),
    sa.Column("token_ids", sa.LargeBinary(), nullable=False),
    sa.Column("loss_mask", sa.LargeBinary(), nullable=False),
    sa.Column("logprobs", sa.LargeBinary(), nullable=False),
    sa.Column("token_rewards", sa.LargeBinary(), nullable=True),
    sa.Column("metrics_json", sa.Text(), nullable=False),
    sa.Column("step_states_json", sa.Text(), nullable=True),
)

replays_table = sa.Table(
    "buffer_replays",
    metadata,
    sa.Column("id", _BigId, primary_key=True, autoincrement=True),
    sa.Column("group_ref", _BigId, sa.ForeignKey("buffer_groups.id"), nullable=False, index=True),
    sa.Column("step", sa.BigInteger(), nullable=False),
)

SAMPLE_COLUMNS = tuple(c for c in samples_table.columns if c.name not in ("id", "group_ref"))


def to_url(url_or_path: str | Path) -> URL:
    """A SQLAlchemy URL; a plain path (no `://`) means a SQLite file.

    Example:
        >>> to_url("runs/a/buffer.db").render_as_string()
        'sqlite:///runs/a/buffer.db'
    """
    text = str(url_or_path)
    if "://" not in text:
        return URL.create("sqlite", database=text)
    try:
        return make_url(text)
    except sa_exc.ArgumentError as err:
        raise BufferFormatError(f"buffer url {text!r} is not a SQLAlchemy URL ({err})") from err


def describe(url: URL) -> str:
    """The buffer's location for messages: the file for SQLite, the URL without password."""
    if url.get_backend_name() == "sqlite":
        return str(url.database)
    return url.render_as_string(hide_password=True)


def _sqlite_file(url: URL, create: bool) -> Path:
    database = url.database or ""
    if database in ("", ":memory:") or database.startswith("file::memory:"):
        raise BufferFormatError(
            "an in-memory SQLite URL cannot be shared between threads or processes; use a file "
            "(sqlite:///path/buffer.db) or buffer type 'memory'"
        )
    path = Path(database)
    if not path.exists():
        if not create:
            raise BufferFormatError(f"{path}: no such buffer file")
        path.parent.mkdir(parents=True, exist_ok=True)
    elif path.is_dir():
        raise BufferFormatError(f"{path}: is a folder; the buffer url must name a file")
    return path


def create_buffer_engine(
    url: URL,
    *,
    create: bool,
    busy_timeout: float = 30.0,
    synchronous: Literal["normal", "full"] = "full",
) -> Engine:
    """An engine for `url` with the schema checked (and created when `create` and absent).

    Raises:
        BufferFormatError: no such file (when not `create`), not a database, a database without
            a buffer (when not `create`), or a buffer of another schema version.
    """
    where = describe(url)
    try:
        if url.get_backend_name() == "sqlite":
            _sqlite_file(url, create)
            engine = sa.create_engine(url, connect_args={"timeout": busy_timeout})
            _configure_sqlite(engine, busy_timeout, synchronous)
        else:
            engine = sa.create_engine(url, pool_pre_ping=True)
    except (sa_exc.NoSuchModuleError, ImportError) as err:
        raise BufferFormatError(
            f"buffer url {where}: no database driver for {url.drivername!r} ({err}); for "
            "Postgres use postgresql+psycopg://... and install agentscope-rft[postgres]"
        ) from err
    try:
        _check_schema(engine, where, create)
    except sa_exc.DatabaseError as err:
        engine.dispose()
        fix = (
            "make room on its disk, or point the buffer url at a file on a disk with room"
            if "disk is full" in str(err.orig)
            else "point the buffer url at a buffer database or a new file"
        )
        raise BufferFormatError(f"{where}: cannot open the buffer ({err.orig}); {fix}") from err
    except BaseException:
        engine.dispose()
        raise
    return engine


def _configure_sqlite(
    engine: Engine, busy_timeout: float, synchronous: Literal["normal", "full"]
) -> None:
    @sa.event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Take transaction control from the sqlite3 module, which would not BEGIN before SELECTs;
        # SQLAlchemy's begin event below emits BEGIN itself.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute(f"PRAGMA busy_timeout = {int(busy_timeout * 1000)}")
            mode = cursor.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                logger.warning("buffer: SQLite refused WAL mode (journal_mode=%s)", mode)
            cursor.execute(f"PRAGMA synchronous = {synchronous.upper()}")
        finally:
            cursor.close()

    @sa.event.listens_for(engine, "begin")
    def _on_begin(connection: Connection) -> None:
        # A read that upgrades to a write cannot wait on the busy timeout (SQLITE_BUSY at once);
        # taking the write lock at BEGIN makes writers queue instead.
        immediate = not connection.get_execution_options().get("read_only", False)
        connection.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


def _check_schema(engine: Engine, where: str, create: bool) -> None:
    with engine.connect().execution_options(read_only=not create) as conn, conn.begin():
        tables = set(sa.inspect(conn).get_table_names())
        if meta_table.name not in tables:
            ours = tables & set(metadata.tables)
            if ours:
                raise BufferFormatError(
                    f"{where}: has buffer tables {sorted(ours)} but no schema version "
                    f"({meta_table.name} is missing); it was not written by agentscope-rft"
                )
            if not create:
                raise BufferFormatError(f"{where}: is not an agentscope-rft buffer (no tables)")
            metadata.create_all(conn)
            conn.execute(
                meta_table.insert(),
                [
                    {"key": "schema_version", "value": str(SCHEMA_VERSION)},
                    {"key": "created_at", "value": repr(time.time())},
                ],
            )
            logger.info("buffer: created %s (schema version %d)", where, SCHEMA_VERSION)
            return
        stored = conn.execute(
            sa.select(meta_table.c.value).where(meta_table.c.key == "schema_version")
        ).scalar()
        if stored == "1":
            _upgrade_from_1(conn, where)
            stored = "2"
        if stored == "2":
            _upgrade_from_2(conn, where)
            stored = str(SCHEMA_VERSION)
    if stored != str(SCHEMA_VERSION):
        raise BufferFormatError(
            f"{where}: buffer schema version {stored} but this agentscope-rft reads version "
            f"{SCHEMA_VERSION}; export it with the version that wrote it "
            "(`agentscope-rft buffer export`) or use a new buffer file"
        )


def _upgrade_from_1(conn: Connection, where: str) -> None:
    """Version 2 added the nullable `step_states_json` column: add it in place, keep every row."""
    conn.execute(sa.text(f"ALTER TABLE {samples_table.name} ADD COLUMN step_states_json TEXT"))
    conn.execute(meta_table.update().where(meta_table.c.key == "schema_version").values(value="2"))
    logger.info("buffer: upgraded %s from schema version 1 to 2", where)


def _upgrade_from_2(conn: Connection, where: str) -> None:
    """Version 3 added the `buffer_replays` table (replay counts): create it, keep every row."""
    replays_table.create(conn, checkfirst=True)
    conn.execute(meta_table.update().where(meta_table.c.key == "schema_version").values(value="3"))
    logger.info("buffer: upgraded %s from schema version 2 to 3", where)
