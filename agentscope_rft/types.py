"""Typed records that cross component boundaries.

`SamplingParams` and `ToolCall` travel from the gateway to an engine; `Call` is what the gateway
records for every model call; `Rollout` is one finished episode; `Sample` is one flat training
sequence. Everything here is plain data with JSON round-trips, no behaviour beyond validation.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

JSON = dict[str, Any]
MIN_TEMPERATURE = 1e-3
"""The smallest non-zero sampling temperature: logits divided by less can overflow (fp16)."""


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How to sample one completion (OpenAI semantics; `top_k=-1` means off).

    Example:
        >>> SamplingParams(temperature=0.7, max_tokens=64, seed=1).n
        1
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    seed: int | None = None
    n: int = 1
    top_logprobs: int = 0
    ignore_eos: bool = False
    """Keep generating past the end-of-sequence token (benchmarks)."""

    def __post_init__(self) -> None:
        problems = []
        if not (0.0 <= self.temperature <= 2.0) or math.isnan(self.temperature):
            problems.append(f"temperature must be in [0, 2], got {self.temperature}")
        elif 0.0 < self.temperature < MIN_TEMPERATURE:  # logits / temperature would overflow
            problems.append(
                f"temperature must be 0 (greedy) or at least {MIN_TEMPERATURE:g}, got "
                f"{self.temperature}"
            )
        if not (0.0 < self.top_p <= 1.0):
            problems.append(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k == 0 or self.top_k < -1:
            problems.append(f"top_k must be -1 (off) or >= 1, got {self.top_k}")
        if self.max_tokens is not None and self.max_tokens < 1:
            problems.append(f"max_tokens must be >= 1, got {self.max_tokens}")
        if not (1 <= self.n <= 64):
            problems.append(f"n must be in [1, 64], got {self.n}")
        if not (0 <= self.top_logprobs <= 20):
            problems.append(f"top_logprobs must be in [0, 20], got {self.top_logprobs}")
        if len(self.stop) > 8 or any(not s for s in self.stop):
            problems.append("stop must be at most 8 non-empty strings")
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A tool call parsed from generated text. `arguments` is JSON text."""

    id: str
    name: str
    arguments: str


@dataclass(slots=True)
class Call:
    """One recorded model call: the exact tokens the policy saw and sampled.

    With `n > 1` a request produces `n` calls that share `request_id` and `prompt_ids` and differ
    in `choice_index`.
    """

    call_id: str
    request_id: str
    rollout_id: str | None
    agent_name: str | None
    messages: list[JSON]
    tools: list[JSON] | None
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    policy_version: int
    content: str | None = None
    reasoning: str | None = None
    """The thinking split off the reply (`engine.reasoning_parser`); its tokens are in
    `completion_ids` like the rest."""
    tool_calls: list[ToolCall] = field(default_factory=list)
    choice_index: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    model: str = ""
    started_at: float = 0.0
    finished_at: float = 0.0
    prompt_reused_tokens: int = 0
    """Leading prompt tokens copied from an earlier call of the same rollout instead of
    re-rendered, so the model sees exactly the tokens it sampled (0 when rendered afresh)."""

    def __post_init__(self) -> None:
        if len(self.completion_ids) != len(self.logprobs):
            raise ValueError(
                f"call {self.call_id}: {len(self.completion_ids)} completion ids but "
                f"{len(self.logprobs)} log-probs"
            )

    def to_dict(self) -> JSON:
        data = dataclasses.asdict(self)
        data["tool_calls"] = [dataclasses.asdict(tc) for tc in self.tool_calls]
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Call:
        values = dict(data)
        values["tool_calls"] = [ToolCall(**tc) for tc in values.get("tool_calls") or []]
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in known})


class RolloutStatus(enum.StrEnum):
    OK = "ok"
    TRUNCATED = "truncated"
    """Cut short by a limit (the app's turn limit, the context window): still trained."""
    FAILED = "failed"
    TIMEOUT = "timeout"


def plain_scalar(value: Any) -> Any:
    """A 0-d numpy or torch value (`np.bool_`, `np.array(0.5)`, `torch.tensor(0.5)`) as the
    Python number it holds; anything else as it is.

    Example:
        >>> import numpy as np
        >>> plain_scalar(np.bool_(True)), plain_scalar("x")
        (True, 'x')
    """
    item = getattr(value, "item", None)
    if getattr(value, "ndim", None) == 0 and callable(item):
        return item()
    return value


@dataclass(frozen=True, slots=True)
class Reward:
    """What a workflow or judge returns: a scalar reward plus optional detail.

    Example:
        >>> Reward(1.0, metrics={"exact_match": 1.0}, success=True).value
        1.0
    """

    value: float
    metrics: Mapping[str, float] = field(default_factory=dict)
    success: bool | None = None
    """Whether the episode solved its task; `None` lets the explorer decide (`value > 0`)."""
    truncated: str | None = None
    """Why the episode was cut short, if it was (e.g. `turn_limit`): the rollout is recorded with
    status `truncated` and this reason, and still trained with `value`."""


@dataclass(frozen=True, slots=True)
class StepReward:
    """A reward emitted during an episode with `emit_reward`.

    `step` is the index of the model call it belongs to (in the emitting agent's call order); `None`
    means "the latest call at the time of emission".
    """

    value: float
    call_index: int
    agent_name: str | None = None


@dataclass(frozen=True, slots=True)
class StepState:
    """The environment state a model call acts in, recorded with `emit_state`.

    Calls of different episodes of one group that act in the same state (same `key`) form a step
    group for step-level advantages (GiGPO's anchor states).
    """

    key: str
    call_index: int
    """Index of the model call it belongs to, in the emitting agent's call order."""
    agent_name: str | None = None


@dataclass(slots=True)
class Rollout:
    """One finished (or failed) episode of a workflow on one task."""

    rollout_id: str
    task_id: str
    task: JSON
    calls: list[Call]
    reward: float
    status: RolloutStatus = RolloutStatus.OK
    error: str | None = None
    truncated: str | None = None
    """Why a `truncated` episode was cut short (`turn_limit`, `context_window`, ...)."""
    success: bool = False
    step_rewards: list[StepReward] = field(default_factory=list)
    step_states: list[StepState] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    started_at: float = 0.0
    finished_at: float = 0.0
    attempts: int = 1
    late_calls: int = 0
    """Model calls still in flight when the episode returned or timed out."""
    aborted_calls: int = 0
    """Of those, the ones aborted at the engine (not recorded)."""
    runner: str | None = None
    """The process the (last) attempt ran in: `local/<pid>`, or `<node>/<pid>` for a Ray runner."""

    @property
    def ok(self) -> bool:
        """Whether the episode is data: it finished, or a limit cut it short (`truncated`)."""
        return self.status in (RolloutStatus.OK, RolloutStatus.TRUNCATED)

    def to_dict(self) -> JSON:
        data = dataclasses.asdict(self)
        data["status"] = str(self.status)
        data["calls"] = [c.to_dict() for c in self.calls]
        return data


SAMPLE_KINDS = ("rl", "sft", "dpo_chosen", "dpo_rejected")


@dataclass(frozen=True, slots=True)
class Sample:
    """One flat training sequence.

    `token_ids`, `loss_mask` and `logprobs` have the same length. `loss_mask` is 1 on tokens the
    policy sampled (they are trained), 0 on everything else (prompts, tool results, user turns).
    `logprobs` are the behaviour policy's (the engine's) log-probs, 0 where masked.
    `token_rewards`, when present, carries rewards emitted at specific tokens (per-step rewards
    land on the last sampled token of their call).

    Example:
        >>> s = Sample(token_ids=[1, 2, 3], loss_mask=[0, 1, 1], logprobs=[0.0, -0.5, -0.1],
        ...            reward=1.0, rollout_id="r1", task_id="t1")
        >>> s.num_trained_tokens
        2
    """

    token_ids: Sequence[int]
    loss_mask: Sequence[int]
    logprobs: Sequence[float]
    reward: float
    rollout_id: str
    task_id: str
    policy_version: int = 0
    group_id: str = ""
    """The advantage group: samples of the same task explored in the same batch (a task explored
    again later forms a new group). Empty means `task_id`."""
    agent_name: str | None = None
    stop_reason: str = "stop"
    temperature: float = 1.0
    token_rewards: Sequence[float] | None = None
    num_calls: int = 1
    sample_id: str = ""
    kind: str = "rl"
    """`rl` (sampled by the policy), `sft` (demonstration), `dpo_chosen` / `dpo_rejected`."""
    pair_id: str | None = None
    """Links the two samples of a DPO pair."""
    step_states: Sequence[str] | None = None
    """The anchor state of each call in the sample, in call order (`""` where none was recorded;
    see `emit_state`); None when the episode recorded none."""
    metrics: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in SAMPLE_KINDS:
            raise ValueError(f"sample kind {self.kind!r} is not one of {SAMPLE_KINDS}")
        n = len(self.token_ids)
        if len(self.loss_mask) != n or len(self.logprobs) != n:
            raise ValueError(
                f"sample {self.sample_id or self.rollout_id}: token_ids ({n}), loss_mask "
                f"({len(self.loss_mask)}) and logprobs ({len(self.logprobs)}) differ in length"
            )
        if self.step_states is not None and len(self.step_states) != self.num_calls:
            raise ValueError(
                f"sample {self.sample_id or self.rollout_id}: step_states has "
                f"{len(self.step_states)} entries for {self.num_calls} calls"
            )
        if self.token_rewards is not None and len(self.token_rewards) != n:
            raise ValueError(
                f"sample {self.sample_id or self.rollout_id}: token_rewards has "
                f"{len(self.token_rewards)} entries for {n} tokens"
            )

    @property
    def group(self) -> str:
        return self.group_id or self.task_id

    @property
    def num_trained_tokens(self) -> int:
        return int(sum(self.loss_mask))

    def to_dict(self) -> JSON:
        data = dataclasses.asdict(self)
        for key in ("token_ids", "loss_mask", "logprobs", "token_rewards"):
            if data[key] is not None:
                data[key] = list(data[key])
        data["metrics"] = dict(self.metrics)
        if self.step_states is not None:
            data["step_states"] = list(self.step_states)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Sample:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown sample fields: {sorted(unknown)}")
        return cls(**dict(data))
