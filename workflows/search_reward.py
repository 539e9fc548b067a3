"""Rewards of the search agent: F1 / exact match of the answer, format shaping, an LLM judge.

The metrics themselves (SQuAD normalization, token F1, answer extraction, the judge prompt) live
in `environments.search.rewards`; this module applies them to a task row and a reply.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from agentscope_rft import Reward
from environments.search import (
    exact_match,
    grade_reply,
    judge_score,
    normalize_answer,
    token_f1,
)

logger = logging.getLogger(__name__)


class TaskFormatError(KeyError):
    """A task row without usable gold answers (names the row and the fields it needs)."""

    def __str__(self) -> str:
        return str(self.args[0])


def gold_answers(task: Mapping[str, Any]) -> list[str]:
    """The accepted answers of a task row.

    Reads `answer` (a string or a list), else Search-R1's `golden_answers`, else verl's
    `reward_model.ground_truth.target`.

    Raises:
        TaskFormatError: none of them is present and non-empty.

    Example:
        >>> gold_answers({"golden_answers": ["Paris", "City of Paris"]})
        ['Paris', 'City of Paris']
    """
    value: Any = task.get("answer")
    if value is None:
        value = task.get("golden_answers")
    if value is None and isinstance(task.get("reward_model"), Mapping):
        truth = task["reward_model"].get("ground_truth")
        value = truth.get("target") if isinstance(truth, Mapping) else truth
    if isinstance(value, str):
        value = [value]
    if isinstance(value, Sequence) or hasattr(value, "tolist"):
        golds = [str(v) for v in (value.tolist() if hasattr(value, "tolist") else value)]
        if golds and all(g.strip() for g in golds):
            return golds
    name = f"task {task['id']!r}" if task.get("id") is not None else "this task"
    raise TaskFormatError(
        f"{name} has no gold answer: give 'answer' (a string or a list of "
        f"strings) or Search-R1's 'golden_answers' (fields present: {sorted(task)})"
    )


def answer_reward(
    reply: str,
    golds: Sequence[str],
    metric: Literal["f1", "em"] = "f1",
    format_weight: float = 0.0,
    form: float = 1.0,
) -> Reward:
    """The reward of a final reply: `(1 - w) * metric + w * form`.

    The metric is 0 for an untagged, over-long or hedged answer (`grade_reply`): such a reply
    earns at most the format share, as a wrong tagged answer does. The metrics say which rule
    fired (`untagged`, `too_long`, `hedged`: 1.0 when it did; several tagged answers count as
    hedged).

    Args:
        reply: The agent's final text (`grade_reply` takes the `<answer>` part).
        golds: Accepted answers.
        metric: `f1` or `em`: which one is the reward (both are in the metrics).
        format_weight: `w`, the share of the reward given for a well-formed episode.
        form: How well the episode followed the format, in [0, 1] (the caller decides).

    Example:
        >>> answer_reward("<answer>the Kestrow Bank</answer>", ["Kestrow Bank"]).value
        1.0
        >>> answer_reward("no tags, Kestrow Bank", ["Kestrow Bank"], "em", 0.2, 0.5).value
        0.1
    """
    graded = grade_reply(reply, golds)
    answer = graded.answer
    f1 = token_f1(answer, golds) if answer is not None else 0.0
    em = exact_match(answer, golds) if answer is not None else 0.0
    score = f1 if metric == "f1" else em
    value = (1.0 - format_weight) * score + format_weight * form
    metrics = {
        "f1": f1,
        "em": em,
        "form": form,
        "untagged": float(graded.problem == "untagged"),
        "too_long": float(graded.problem == "too_long"),
        "hedged": float(graded.problem in ("hedged", "several_answers")),
    }
    return Reward(value, metrics=metrics, success=em >= 1.0)


@dataclass(frozen=True)
class JudgeSettings:
    """An LLM judge: any OpenAI-compatible chat endpoint.

    Attributes:
        base_url: The endpoint, e.g. `http://localhost:8000/v1`.
        model: The judge model's name at that endpoint.
        api_key_env: Environment variable holding the API key (unset: no key).
        timeout: Seconds one judge call may take.
        max_retries: Retries of a failed call (the OpenAI client's own).

    Example:
        >>> JudgeSettings("http://localhost:8000/v1", "qwen2.5-7b-instruct").timeout
        30.0
    """

    base_url: str
    model: str
    api_key_env: str | None = "OPENAI_API_KEY"
    timeout: float = 30.0
    max_retries: int = 1


async def llm_judge(
    task: Mapping[str, Any], reply: str, settings: JudgeSettings
) -> tuple[float, dict[str, float]]:
    """Grades the reply's answer with the judge; an exact match skips the call, and so does an
    untagged, empty, over-long or hedged answer, which scores 0 (`grade_reply`).

    A judge that cannot be reached, times out or errors does not fail the episode: the reward
    falls back to token F1 and the metric `judge_error` counts it (1.0), with one log line.

    Returns:
        The reward and metrics (`judge_error`, `judge_called`).

    Example:
        >>> import asyncio
        >>> settings = JudgeSettings("http://127.0.0.1:9/v1", "judge")  # an exact match: no call
        >>> asyncio.run(llm_judge({"answer": "Kestrow"}, "<answer>Kestrow</answer>", settings))
        (1.0, {'judge_called': 0.0, 'judge_error': 0.0})
    """
    import openai

    golds = gold_answers(task)
    graded = grade_reply(reply, golds)
    if graded.answer is None or not normalize_answer(graded.answer):
        return 0.0, {"judge_called": 0.0, "judge_error": 0.0}
    answer = graded.answer
    if exact_match(answer, golds):
        return 1.0, {"judge_called": 0.0, "judge_error": 0.0}
    api_key = os.environ.get(settings.api_key_env or "", "") or "no-key"
    async with openai.AsyncOpenAI(
        base_url=settings.base_url,
        api_key=api_key,
        timeout=settings.timeout,
        max_retries=settings.max_retries,
    ) as client:

        async def complete(prompt: str) -> str:
            response = await client.chat.completions.create(
                model=settings.model,
                messages=[{"role": "user", "content": prompt}],
                temperature=0.0,
                max_tokens=8,
            )
            return response.choices[0].message.content or ""

        try:
            value = await judge_score(str(task.get("question", "")), answer, golds, complete)
        except openai.OpenAIError as exc:
            logger.warning(
                "LLM judge at %s failed (%s: %s); scoring this answer by token F1 instead",
                settings.base_url,
                type(exc).__name__,
                str(exc)[:200],
            )
            return token_f1(answer, golds), {"judge_called": 1.0, "judge_error": 1.0}
    return value, {"judge_called": 1.0, "judge_error": 0.0}
