"""The storages every contract test runs against: memory, a SQLite file, and Postgres when
`AGENTSCOPE_RFT_TEST_POSTGRES_URL` names a throwaway database (see docs/buffer.md)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from buffer_helpers import Storage, postgres_url, reset_postgres, stored_form

from agentscope_rft.buffer import MemoryBuffer, SQLBuffer


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
