"""What callers hand the continuous batcher: generation jobs and weight swaps.

Both are made on a caller's event loop and answered from the engine thread through their
future (`resolve`, `reject`, scheduled with `loop.call_soon_threadsafe`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from llguidance import LLMatcher

from agentscope_rft.engines.base import GenerationOutput
from agentscope_rft.types import SamplingParams

TokenCallback = Callable[[int, int], None]
"""Called from the engine thread with (choice index, token id) for streamed requests."""


@dataclass(eq=False)
class GenerationJob:
    """A queued request; results arrive on `done` (resolved on the caller's loop)."""

    prompt_ids: list[int]
    sampling: SamplingParams
    max_new_tokens: int
    loop: asyncio.AbstractEventLoop
    done: asyncio.Future[list[GenerationOutput]]
    on_token: TokenCallback | None = None
    matchers: list[LLMatcher] | None = None
    """One fresh grammar matcher per choice (`structured.GrammarMask.matcher`): the choices
    must follow the grammar."""
    outputs: list[GenerationOutput | None] = field(default_factory=list)
    cancelled: bool = False


@dataclass(eq=False)
class WeightSwap:
    """New weights to apply between engine steps, once the running batch has drained."""

    apply: Callable[[], None]
    version: int
    loop: asyncio.AbstractEventLoop
    done: asyncio.Future[float]
    requested_at: float


def resolve(future: asyncio.Future[Any], value: Any) -> None:
    if not future.done():
        future.set_result(value)


def reject(future: asyncio.Future[Any], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)
