"""The storages every contract test runs against: memory, a SQLite file, and Postgres when
`AGENTSCOPE_RFT_TEST_POSTGRES_URL` names a throwaway database (see docs/buffer.md)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import pytest
import sqlalchemy as sa
from buffer_helpers import stored_form

from agentscope_rft.buffer import Buffer, MemoryBuffer, SQLBuffer
from agentscope_rft.buffer.schema import metadata
from agentscope_rft.types import Sample

POSTGRES_ENV = "AGENTSCOPE_RFT_TEST_POSTGRES_URL"


def postgres_url() -> str:
    url = os.environ.get(POSTGRES_ENV)
    if not url:
        pytest.skip(f"set {POSTGRES_ENV} to a throwaway Postgres database to run this test")
    return url


def reset_postgres(url: str) -> None:
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        metadata.drop_all(conn)
        conn.exec_driver_sql("DROP TABLE IF EXISTS buffer_meta")
    engine.dispose()


@dataclass
class Storage:
    """A fresh buffer plus how it gives samples back (SQL: float32 log-probs)."""

    buffer: Buffer
    expect: Callable[[Sample], Sample]
    open_again: Callable[[], Buffer] | None
    """Open the same storage a second time (another 'process'); None for memory."""


@pytest.fixture(params=["memory", "sqlite", "postgres"])
async def storage(request: pytest.FixtureRequest, tmp_path) -> AsyncIterator[Storage]:
    if request.param == "memory":
        made = Storage(MemoryBuffer(), lambda s: s, None)
    else:
        if request.param == "sqlite":
            url = f"sqlite:///{tmp_path / 'buffer.db'}"
        else:
            url = postgres_url()
            reset_postgres(url)
        made = Storage(
            SQLBuffer(url, poll_interval=0.01, synchronous="normal"),
            stored_form,
            lambda: SQLBuffer(url, poll_interval=0.01),
        )
    yield made
    await made.buffer.close()
