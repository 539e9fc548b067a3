"""MemoryBuffer's retention window, BufferConfig validation and build_buffer."""

from __future__ import annotations

from pathlib import Path

import pytest
from buffer_helpers import make_group
from pydantic import ValidationError

from agentscope_rft.buffer import BufferConfig, MemoryBuffer, SQLBuffer, build_buffer


async def test_memory_buffer_requeues_only_retained_steps() -> None:
    buffer = MemoryBuffer(retain_steps=2)
    for g in range(4):
        await buffer.put(make_group(f"g{g}", 1))
    for step in (1, 2, 3):
        await buffer.get(1, step=step, timeout=1)

    with pytest.raises(
        ValueError, match=r"last 2 steps only .* steps up to 1; use buffer type 'sql'"
    ):
        await buffer.requeue_after(0)
    assert await buffer.requeue_after(1) == 2  # steps 2 and 3 are retained
    batch = await buffer.get(3, step=2, timeout=1)
    assert [s.group_id for s in batch] == ["g1", "g2", "g3"]


def test_config_defaults_and_short_forms() -> None:
    assert BufferConfig().type == "memory"
    assert BufferConfig.model_validate("sql").type == "sql"
    config = BufferConfig.model_validate({"type": "sql", "url": "sqlite:///x.db"})
    assert (config.url, config.poll_interval, config.synchronous) == ("sqlite:///x.db", 0.1, "full")


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"type": "sql", "urll": "x"}, "unknown buffer key 'urll'; did you mean 'url'?"),
        ({"type": "redis"}, "Input should be 'memory' or 'sql'"),
        ({"url": "sqlite:///x.db"}, r"buffer keys \['url'\] apply to type 'sql' only"),
        ({"type": "sql", "retain_steps": 3}, "apply to type 'memory' only"),
        ({"type": "sql", "poll_interval": 0}, "greater than 0"),
    ],
)
def test_config_errors_name_the_key(data: dict, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        BufferConfig.model_validate(data)


def test_every_config_field_is_documented() -> None:
    for name, info in BufferConfig.model_fields.items():
        assert info.description, f"BufferConfig.{name} has no docstring"


async def test_build_buffer_puts_the_default_sqlite_file_in_the_run_dir(tmp_path: Path) -> None:
    buffer = build_buffer(BufferConfig(type="sql"), tmp_path / "run")
    assert isinstance(buffer, SQLBuffer)
    assert buffer.where == str(tmp_path / "run" / "buffer.db")
    assert (tmp_path / "run" / "buffer.db").is_file()
    await buffer.close()
    custom = build_buffer(BufferConfig(type="sql", url=str(tmp_path / "b.db")), tmp_path)
    assert isinstance(custom, SQLBuffer) and custom.where == str(tmp_path / "b.db")
    await custom.close()
    assert isinstance(build_buffer(BufferConfig(), tmp_path), MemoryBuffer)
