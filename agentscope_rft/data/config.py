"""`DataConfig`, the `data:` section of a run config: task selection and experience operators.

Short YAML works::

    data:
      selector: {type: curriculum}
      operators:
        - {type: status, drop: [truncated]}
        - {type: dedup, threshold: 0.9}
        - {type: group_judge, endpoint: {base_url: policy}}
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, JsonValue, model_validator

from agentscope_rft.config_base import Section


class MixConfig(Section):
    """Several task sets mixed by weight: a task's set is the value of one of its columns."""

    field: str = "source"
    """The task column naming each task's set (e.g. `source: gsm8k`)."""
    weights: dict[str, float] = Field(default_factory=dict)
    """Share of each set in a batch, by set name (normalised); sets not named get 0. Empty:
    equal weights. A column of numbers names its sets by their text: `{1: 3, 2: 1}` for
    `difficulty: 1` and `difficulty: 2`."""

    @model_validator(mode="before")
    @classmethod
    def _number_keys(cls, data: Any) -> Any:
        # YAML reads `weights: {1: 3}` with integer keys; the sets of a numeric column are named
        # by their text (`str(value)`), so the keys are too.
        if isinstance(data, dict) and isinstance(data.get("weights"), dict):
            weights = {
                str(k) if isinstance(k, int | float | bool) else k: v
                for k, v in data["weights"].items()
            }
            data = {**data, "weights": weights}
        return data

    @model_validator(mode="after")
    def _non_negative(self) -> MixConfig:
        bad = {k: v for k, v in self.weights.items() if not (0 <= v < math.inf)}
        if bad:
            raise ValueError(f"mix.weights must be finite numbers >= 0, got {bad}")
        return self


class UniformSelectorConfig(Section):
    """Every task once per epoch, shuffled per epoch (`tasks.shuffle`); the default."""

    type: Literal["uniform"] = "uniform"
    mix: MixConfig | None = None
    """Mix task sets by weight (null: one set)."""


class CurriculumSelectorConfig(Section):
    """Online curriculum: tasks with the highest learnability under a per-task Beta posterior,
    from recent results (BOTS-style)."""

    type: Literal["curriculum"] = "curriculum"
    learnability: Literal["success", "informative"] = "informative"
    """`informative`: the chance that the task's next group has rewards that differ, which is
    what GRPO-style advantages learn from; it needs no reward scale, and a task whose rewards are
    small but varied counts as learnable, not as hard. `success`: p(1-p) of the task's success
    rate (rewards clipped to [0, 1], partial credit counted fractionally), as BOTS. The default
    `informative` reached the target on 8 of 8 seeds where `success` did on 5 (benchmarks.md)."""
    sampling: Literal["thompson", "greedy"] = "thompson"
    """`thompson`: draw p per task from its posterior (explores); `greedy`: the posterior mean."""
    prior: float = Field(default=1.0, gt=0)
    """Beta(prior, prior) before any result: p = 0.5 (the most learnable under `success`;
    under `informative` tasks seen to give varied groups rank above unseen ones)."""
    decay: float = Field(default=0.8, gt=0, le=1)
    """Earlier evidence of a task is multiplied by this at each new result (1: never forget)."""
    uniform_share: float = Field(default=0.0, ge=0, le=1)
    """Share of each batch drawn uniformly at random instead (a hedge against bad estimates)."""
    mix: MixConfig | None = None
    """Mix task sets by weight; within each set, the curriculum chooses."""


class CustomSelectorConfig(Section):
    """A user's selector class by import path: `cls(tasks, seed=..., **args)` implementing
    `agentscope_rft.data.selection.TaskSelector`."""

    type: Literal["custom"] = "custom"
    path: str = Field(min_length=3)
    """`package.module:Class` or `path/to/file.py:Class`."""
    args: dict[str, JsonValue] = Field(default_factory=dict)
    """Keyword arguments of the class."""


SelectorConfig = Annotated[
    UniformSelectorConfig | CurriculumSelectorConfig | CustomSelectorConfig,
    Field(discriminator="type"),
]


class RewardRangeOp(Section):
    """Drop episodes whose reward is outside [min, max]."""

    type: Literal["reward_range"] = "reward_range"
    min: float | None = Field(default=None, allow_inf_nan=False)
    """Lowest reward kept (null: no bound)."""
    max: float | None = Field(default=None, allow_inf_nan=False)
    """Highest reward kept (null: no bound)."""

    @model_validator(mode="after")
    def _ordered(self) -> RewardRangeOp:
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(
                f"reward_range: min {self.min} > max {self.max} would drop every episode; swap them"
            )
        return self


class LengthOp(Section):
    """Drop episodes whose trained (policy-sampled) tokens are outside [min_tokens, max_tokens]."""

    type: Literal["length"] = "length"
    min_tokens: int = Field(default=0, ge=0)
    """Fewest sampled tokens kept."""
    max_tokens: int | None = Field(default=None, ge=1)
    """Most sampled tokens kept (null: no bound)."""

    @model_validator(mode="after")
    def _ordered(self) -> LengthOp:
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(
                f"length: min_tokens {self.min_tokens} > max_tokens {self.max_tokens} would drop "
                "every episode; swap them"
            )
        return self


class StatusOp(Section):
    """Drop episodes by how they ended."""

    type: Literal["status"] = "status"
    drop: tuple[Literal["truncated"], ...] = ("truncated",)
    """Episode statuses dropped (failed and timed-out episodes never produce samples)."""
    stop_reasons: list[Literal["stop", "length", "tool_calls"]] = Field(default_factory=list)
    """Also drop episodes with a sample that stopped for one of these (e.g. `length`: a call hit
    its token limit)."""


class FormatOp(Section):
    """Check the final response against a regular expression."""

    type: Literal["format"] = "format"
    pattern: str = Field(min_length=1)
    """Python regex the response must contain (`re.search`, DOTALL)."""
    action: Literal["drop", "reward"] = "reward"
    """`drop`: drop failing episodes; `reward`: set their reward to `reward`."""
    reward: float = Field(default=0.0, allow_inf_nan=False)
    """Reward of a failing episode (`action: reward`)."""

    @model_validator(mode="after")
    def _compiles(self) -> FormatOp:
        try:
            re.compile(self.pattern, re.DOTALL)
        except re.error as exc:
            raise ValueError(f"format: pattern {self.pattern!r} is not a regex ({exc})") from exc
        return self


class DedupOp(Section):
    """Near-duplicate removal: episodes whose responses have word n-gram Jaccard similarity >=
    `threshold` to an earlier kept one (estimated by MinHash) are dropped."""

    type: Literal["dedup"] = "dedup"
    threshold: float = Field(default=0.9, gt=0, le=1)
    """Jaccard similarity at which two responses are duplicates."""
    ngram: int = Field(default=3, ge=1)
    """Words per shingle."""
    num_perm: int = Field(default=128, ge=8, le=1024)
    """MinHash permutations (more: a closer estimate, slower)."""
    scope: Literal["group", "batch"] = "group"
    """Compare within a task's group, or across the whole explored batch (offline data: always
    across the whole file)."""


class JudgeEndpoint(Section):
    """An OpenAI-compatible chat endpoint for a judge."""

    base_url: str = "policy"
    """`policy`: the run's own gateway (the policy judges; its calls are never trained); else a
    URL ending before `/chat/completions`, e.g. `http://127.0.0.1:8000/v1`."""
    model: str | None = None
    """Model name sent; default: the policy's name (`policy`), else required."""
    api_key_env: str | None = None
    """Environment variable holding the API key (null: the gateway's key for `policy`, else
    none)."""
    timeout: float = Field(default=60.0, gt=0)
    """Seconds one judge call may take."""
    max_retries: int = Field(default=2, ge=0)
    """Retries of a call that failed, timed out or answered something unparsable."""
    temperature: float = Field(default=0.0, ge=0, le=2)
    """Sampling temperature of the judge."""
    max_tokens: int = Field(default=512, ge=1)
    """Completion limit of a judge call."""
    concurrency: int = Field(default=8, ge=1)
    """Judge calls in flight at once."""
    structured_output: bool = True
    """Ask for the answer's JSON schema as `response_format` (constrained decoding, so even a
    small judge answers parsable JSON); an endpoint that refuses it is asked without."""

    @model_validator(mode="after")
    def _model_named(self) -> JudgeEndpoint:
        if self.base_url != "policy":
            if not self.base_url.startswith(("http://", "https://")):
                raise ValueError(
                    f"endpoint.base_url {self.base_url!r}: use `policy` or an http(s) URL"
                )
            if self.model is None:
                raise ValueError(f"endpoint.model: name the model served at {self.base_url}")
        return self


class _JudgeOpBase(Section):
    endpoint: JudgeEndpoint = Field(default_factory=JudgeEndpoint)
    """Where the judge runs."""
    question_field: str = "question"
    """Task column with the question shown to the judge."""
    reference_field: str | None = None
    """Task column with a reference answer shown to the judge (null: none)."""
    weight: float = Field(default=1.0, ge=0, le=1)
    """New reward = (1 - weight) * reward + weight * judge score."""
    on_failure: Literal["keep", "drop"] = "keep"
    """A group the judge could not score: keep its rewards, or drop it (both counted)."""
    max_response_chars: int = Field(default=4000, ge=16)
    """Longer responses are cut (from the middle) before judging."""


class GroupJudgeOp(_JudgeOpBase):
    """RULER-style: one judge call scores all episodes of a task's group relative to each other
    (0 to 1 each)."""

    type: Literal["group_judge"] = "group_judge"
    instructions: str | None = None
    """Extra grading instructions (null: judge correctness and helpfulness)."""


class RubricJudgeOp(_JudgeOpBase):
    """One judge call per episode scores it against a rubric; its reward is the weighted mean."""

    type: Literal["rubric_judge"] = "rubric_judge"
    rubric: dict[str, float] = Field(default_factory=dict)
    """Criteria (text) and their weights, e.g. `{"Cites a source": 1, "Answer correct": 3}`."""
    rubric_field: str | None = None
    """Task column holding the rubric (a dict like `rubric`), used instead when present."""

    @model_validator(mode="after")
    def _has_rubric(self) -> RubricJudgeOp:
        if not self.rubric and self.rubric_field is None:
            raise ValueError("rubric_judge needs `rubric: {criterion: weight}` or `rubric_field`")
        if any(w < 0 for w in self.rubric.values()) or (
            self.rubric and sum(self.rubric.values()) <= 0
        ):
            raise ValueError("rubric weights must be >= 0 with a positive sum")
        return self


class CustomOp(Section):
    """A user's operator by import path: `fn(groups: list[Group], cfg) -> list[Group]` (sync or
    async), `cfg` being `args` as a dict."""

    type: Literal["custom"] = "custom"
    path: str = Field(min_length=3)
    """`package.module:function` or `path/to/file.py:function`."""
    name: str | None = None
    """Name in the metrics (default: the function's name)."""
    args: dict[str, JsonValue] = Field(default_factory=dict)
    """Passed as the function's second argument."""


OperatorConfig = Annotated[
    RewardRangeOp
    | LengthOp
    | StatusOp
    | FormatOp
    | DedupOp
    | GroupJudgeOp
    | RubricJudgeOp
    | CustomOp,
    Field(discriminator="type"),
]

JUDGE_TYPES = ("group_judge", "rubric_judge")


class DataConfig(Section):
    """The data side: which tasks are explored next, and what happens to finished groups before
    they enter the buffer (and to offline data before training). See docs/data.md.

    Example:
        >>> DataConfig.model_validate({"selector": {"type": "curriculum"}}).selector.decay
        0.8
    """

    key_label: ClassVar[str] = "data"

    selector: SelectorConfig = Field(default_factory=UniformSelectorConfig)
    """How training tasks are chosen: `uniform` (default), `curriculum` or `custom`."""
    operators: list[OperatorConfig] = Field(default_factory=list)
    """Applied in order to each explored step's groups before they enter the buffer; what each
    drops or changes is counted in the step metrics (`data/<operator>/...`)."""
    offline_operators: list[OperatorConfig] = Field(default_factory=list)
    """Applied once to offline data (`offline.path`) when it is read, before training."""

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("selector"), str):
            data = {**data, "selector": {"type": data["selector"]}}
        return data

    @model_validator(mode="after")
    def _offline_judges(self) -> DataConfig:
        for op in self.offline_operators:
            if isinstance(op, GroupJudgeOp | RubricJudgeOp) and op.endpoint.base_url == "policy":
                raise ValueError(
                    f"data.offline_operators: {op.type} with endpoint `policy` needs a running "
                    "gateway, which offline data is read before; give an endpoint URL"
                )
        return self
