"""Answer rewards: SQuAD-style normalized exact match and token F1, plus an LLM-judge hook."""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.IGNORECASE | re.DOTALL)
_ANSWER_LINE = re.compile(r"(?:final answer|answer)\s*[:：]\s*(.+)", re.IGNORECASE)
_PUNCTUATION = str.maketrans("", "", string.punctuation + "–—‘’“”")

Complete = Callable[[str], Awaitable[str]]
"""An async function that sends a prompt to an LLM and returns its text reply."""


def normalize_answer(text: str) -> str:
    """SQuAD normalization: lower case, no punctuation, no articles, single spaces.

    Example:
        >>> normalize_answer("The  Republic of Ombria!")
        'republic of ombria'
    """
    text = text.lower().translate(_PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def _golds(gold: str | Sequence[str]) -> list[str]:
    return [gold] if isinstance(gold, str) else list(gold)


def exact_match(prediction: str, gold: str | Sequence[str]) -> float:
    """1.0 if the normalized prediction equals a normalized gold answer, else 0.0.

    Example:
        >>> exact_match("the Kestrow Bank", ["Kestrow Bank"])
        1.0
    """
    predicted = normalize_answer(prediction)
    return float(any(predicted == normalize_answer(answer) for answer in _golds(gold)))


def token_f1(prediction: str, gold: str | Sequence[str]) -> float:
    """The best SQuAD token F1 of the prediction against the gold answers.

    Example:
        >>> round(token_f1("Ada Voss the poet", "Ada Voss"), 3)
        0.8
    """
    predicted = normalize_answer(prediction).split()
    best = 0.0
    for answer in _golds(gold):
        reference = normalize_answer(answer).split()
        if not predicted or not reference:
            best = max(best, float(predicted == reference))
            continue
        common = sum((Counter(predicted) & Counter(reference)).values())
        if common:
            precision, recall = common / len(predicted), common / len(reference)
            best = max(best, 2 * precision * recall / (precision + recall))
    return best


def extract_answer(text: str) -> str:
    """The answer part of an agent's reply.

    Takes the last `<answer>...</answer>` if present, else the text after the last
    `Answer:` / `Final answer:`, else the whole reply.

    Example:
        >>> extract_answer("I searched twice. <answer>1842</answer>")
        '1842'
    """
    tagged = _ANSWER_TAG.findall(text)
    if tagged:
        return tagged[-1].strip()
    lines = _ANSWER_LINE.findall(text)
    return lines[-1].strip() if lines else text.strip()


def score(reply: str, task: Mapping[str, Any], metric: str = "f1") -> float:
    """The reward of an agent's final reply on a search task row.

    Args:
        reply: The agent's final text; `extract_answer` picks the answer out of it.
        task: A task row with `answer` (a string or a list of accepted strings).
        metric: `"f1"` (token F1) or `"em"` (exact match).

    Returns:
        A reward in [0, 1].

    Example:
        >>> score("<answer>Kestrow</answer>", {"answer": "Kestrow"}, metric="em")
        1.0
    """
    if metric not in ("f1", "em"):
        raise ValueError(f"unknown metric {metric!r}; use 'f1' or 'em'")
    prediction = extract_answer(reply)
    function = token_f1 if metric == "f1" else exact_match
    return function(prediction, task["answer"])


JUDGE_PROMPT = """You grade answers to questions. Decide whether the predicted answer means the \
same as the gold answer (ignore wording, case and articles; a number must match exactly).

Question: {question}
Gold answer: {gold}
Predicted answer: {prediction}

Reply with one word: CORRECT or INCORRECT."""


def parse_judge_verdict(reply: str) -> float | None:
    """1.0 for a CORRECT verdict, 0.0 for INCORRECT, None if the reply has neither."""
    words = re.findall(r"\b(INCORRECT|CORRECT)\b", reply.upper())
    if not words:
        return None
    return 1.0 if words[-1] == "CORRECT" else 0.0


async def judge_score(
    question: str,
    prediction: str,
    gold: str | Sequence[str],
    complete: Complete,
    fallback: str = "f1",
) -> float:
    """Grades an answer with an LLM judge; an exact match skips the call.

    Args:
        question: The question.
        prediction: The predicted answer (already extracted).
        gold: The gold answer(s).
        complete: Sends a prompt to the judge model and returns its reply (any client: an
            AgentScope model, an OpenAI client, a stub in tests).
        fallback: Metric used when the judge reply has no verdict (`"f1"` or `"em"`).

    Returns:
        A reward in [0, 1].

    Example:
        >>> import asyncio
        >>> async def judge(prompt: str) -> str:
        ...     return "CORRECT"
        >>> asyncio.run(judge_score("Capital?", "Kestrow city", "Kestrow", judge))
        1.0
    """
    if exact_match(prediction, gold):
        return 1.0
    golds = _golds(gold)
    prompt = JUDGE_PROMPT.format(question=question, gold=" / ".join(golds), prediction=prediction)
    verdict = parse_judge_verdict(await complete(prompt))
    if verdict is not None:
        return verdict
    return token_f1(prediction, golds) if fallback == "f1" else exact_match(prediction, golds)
