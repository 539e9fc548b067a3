"""Samples and groups for buffer tests."""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import sqlalchemy as sa

from agentscope_rft.buffer import Buffer
from agentscope_rft.buffer.schema import metadata
from agentscope_rft.types import Sample


def make_sample(
    group: str,
    index: int = 0,
    *,
    num_tokens: int = 12,
    policy_version: int = 0,
    seed: int | None = None,
) -> Sample:
    """A sample with distinct, checkable arrays; every optional field set to a non-default."""
    rng = random.Random(f"{group}/{index}/{seed}")
    prompt = num_tokens // 3
    return Sample(
        token_ids=[rng.randrange(0, 2**31 - 1) for _ in range(num_tokens)],
        loss_mask=[0] * prompt + [1] * (num_tokens - prompt),
        logprobs=[0.0] * prompt + [-rng.random() * 5 for _ in range(num_tokens - prompt)],
        reward=rng.uniform(-1, 1),
        rollout_id=f"{group}-r{index}",
        task_id=f"task-{group}",
        policy_version=policy_version,
        group_id=group,
        agent_name="solver" if index % 2 else None,
        stop_reason="length" if index % 3 == 0 else "stop",
        temperature=0.7,
        token_rewards=[0.0] * (num_tokens - 1) + [0.5] if index % 2 else None,
        num_calls=1 + index % 3,
        sample_id=f"{group}-s{index}",
        metrics={"turns": float(index), "tool_errors": 0.0},
    )


def make_group(group: str, size: int = 3, **kwargs: int) -> list[Sample]:
    return [make_sample(group, i, **kwargs) for i in range(size)]


def as_float32(values: list[float]) -> list[float]:
    import numpy as np

    return np.asarray(values, dtype=np.float32).astype(float).tolist()


def stored_form(sample: Sample) -> Sample:
    """What a storage that keeps log-probs and token rewards as float32 gives back."""
    import dataclasses

    return dataclasses.replace(
        sample,
        logprobs=as_float32(list(sample.logprobs)),
        token_rewards=None
        if sample.token_rewards is None
        else as_float32(list(sample.token_rewards)),
    )


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
