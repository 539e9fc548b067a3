"""`BufferConfig`, the `buffer:` section of a run config, and `build_buffer`.

Short YAML works::

    buffer: {type: memory}                        # default: one process, synchronous runs
    buffer: {type: sql}                           # SQLite file <run_dir>/buffer.db
    buffer: {type: sql, url: postgresql+psycopg://rft@db-host/rft}
    buffer: {type: sql, replay: {ratio: 0.5, max_reuse: 2}}   # prioritized replay
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import ConfigDict, Field, model_validator

from agentscope_rft.buffer.base import Buffer
from agentscope_rft.buffer.memory import MemoryBuffer
from agentscope_rft.buffer.replay import ReplayConfig
from agentscope_rft.buffer.sql import SQLBuffer
from agentscope_rft.config_base import Section

logger = logging.getLogger(__name__)

DEFAULT_SQLITE_NAME = "buffer.db"
_ONLY_FOR = {
    "sql": ("url", "poll_interval", "busy_timeout", "synchronous"),
    "memory": ("retain_steps",),
}


class BufferConfig(Section):
    """Where samples wait between the explorer and the trainer.

    Example:
        >>> BufferConfig.model_validate({"type": "sql"}).synchronous
        'full'
    """

    model_config = ConfigDict(frozen=True, validate_assignment=False)
    key_label: ClassVar[str] = "buffer"

    type: Literal["memory", "sql"] = "memory"
    """`memory`: in-process queue, lost with the process. `sql`: SQLite file or database URL;
    survives crashes, shared between processes, lets a resumed run continue."""
    url: str | None = None
    """`sql` only: a SQLAlchemy URL or a SQLite file path; default `sqlite:///<run_dir>/buffer.db`.
    Postgres: `postgresql+psycopg://user:password@host/dbname` (needs `agentscope-rft[postgres]`).
    """
    poll_interval: float = Field(default=0.1, gt=0.0, le=60.0)
    """`sql` only: seconds between checks while the trainer waits for groups from another
    process."""
    busy_timeout: float = Field(default=30.0, gt=0.0)
    """`sql` with SQLite only: seconds a transaction waits for another process's lock."""
    synchronous: Literal["normal", "full"] = "full"
    """`sql` with SQLite only: `full` survives power loss; `normal` survives process crashes
    only, with faster commits."""
    retain_steps: int = Field(default=2, ge=0)
    """`memory` only: how many recent steps' groups `requeue_after` can give back."""
    replay: ReplayConfig | None = None
    """Train groups more than once, by priority, with a reuse limit and a staleness bound, e.g.
    `{ratio: 0.5, max_reuse: 1, priority: advantage}`; null: every group once."""

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        return {"type": data} if isinstance(data, str) else data

    @model_validator(mode="after")
    def _keys_match_type(self) -> BufferConfig:
        for buffer_type, keys in _ONLY_FOR.items():
            # A saved resolved config lists every key with its default: only set values count.
            used = [
                key
                for key in keys
                if key in self.model_fields_set
                and getattr(self, key) != type(self).model_fields[key].default
            ]
            if used and self.type != buffer_type:
                raise ValueError(
                    f"buffer keys {used} apply to type {buffer_type!r} only; set "
                    f"`type: {buffer_type}` or remove them"
                )
        return self


def build_buffer(config: BufferConfig, run_dir: str | Path) -> Buffer:
    """The buffer `config` describes; a SQL buffer without `url` lives in `run_dir`.

    Raises:
        BufferFormatError: the SQL database exists but is not a buffer this version can read.

    Example:
        >>> buffer = build_buffer(BufferConfig(type="sql"), "runs/demo")  # doctest: +SKIP
        >>> buffer.where  # doctest: +SKIP
        'runs/demo/buffer.db'
    """
    if config.type == "memory":
        return MemoryBuffer(retain_steps=config.retain_steps, replay=config.replay)
    url = config.url
    if url is None:
        url = f"sqlite:///{Path(run_dir) / DEFAULT_SQLITE_NAME}"
        logger.info("buffer: url not set, using %s", url)
    return SQLBuffer(
        url,
        poll_interval=config.poll_interval,
        busy_timeout=config.busy_timeout,
        synchronous=config.synchronous,
        replay=config.replay,
    )
