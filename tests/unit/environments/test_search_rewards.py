"""Search rewards: SQuAD normalization, exact match, token F1, answer extraction, LLM judge."""

from __future__ import annotations

import pytest

from environments.search.rewards import (
    Complete,
    exact_match,
    extract_answer,
    judge_score,
    normalize_answer,
    parse_judge_verdict,
    score,
    token_f1,
)


def test_normalize_answer_drops_case_punctuation_articles_and_spaces() -> None:
    assert normalize_answer("  The Republic  of Ombria! ") == "republic of ombria"
    assert normalize_answer("2,751,011") == "2751011"
    assert normalize_answer("An apple, a pear.") == "apple pear"
    # Punctuation of any script; letters keep their accents, symbols stay.
    assert normalize_answer("北京。") == "北京"
    assert normalize_answer("«Paris»") == normalize_answer("„Paris“") == "paris"
    assert normalize_answer("¿São Paulo?") == "são paulo"
    assert normalize_answer("100 °C") == "100 °c"


@pytest.mark.parametrize(
    ("prediction", "gold", "expected"),
    [
        ("the Kestrow Bank", "Kestrow Bank", 1.0),
        ("Kestrow", ["Ombria", "kestrow."], 1.0),
        ("Kestrow Bank", "Kestrow", 0.0),
        ("", "Kestrow", 0.0),
    ],
)
def test_exact_match(prediction: str, gold: str | list[str], expected: float) -> None:
    assert exact_match(prediction, gold) == expected


def test_token_f1_matches_hand_computed_values() -> None:
    # prediction tokens [ada, voss, poet], gold [ada, voss]: P = 2/3, R = 1, F1 = 0.8.
    assert token_f1("Ada Voss the poet", "Ada Voss") == pytest.approx(0.8)
    # [born, 1842] vs [1842]: P = 1/2, R = 1, F1 = 2/3.
    assert token_f1("born 1842", "1842") == pytest.approx(2 / 3)
    # Repeated tokens count once per occurrence: [a1, a1] vs [a1]: P = 1/2, R = 1.
    assert token_f1("kestrow kestrow", "kestrow") == pytest.approx(2 / 3)
    assert token_f1("Ombria", "Kestrow") == 0.0
    assert token_f1("1842", ["Kestrow", "1842"]) == 1.0
    assert token_f1("the", "a") == 1.0  # both normalize to nothing


def test_extract_answer_prefers_tags_then_answer_lines() -> None:
    assert extract_answer("<answer>x</answer> then <answer> Kestrow </answer>") == "Kestrow"
    assert extract_answer("I think so.\nFinal answer: 1842") == "1842"
    assert extract_answer("Kestrow") == "Kestrow"


def test_score_reads_the_task_answer() -> None:
    task = {"answer": "Ada Voss"}
    assert score("<answer>Ada Voss the poet</answer>", task) == pytest.approx(0.8)
    assert score("<answer>Ada Voss the poet</answer>", task, metric="em") == 0.0
    with pytest.raises(ValueError, match="unknown metric 'bleu'"):
        score("x", task, metric="bleu")


def test_parse_judge_verdict() -> None:
    assert parse_judge_verdict("CORRECT") == 1.0
    assert parse_judge_verdict("The answer is incorrect.") == 0.0
    assert parse_judge_verdict("I am not sure") is None


async def test_judge_score_uses_the_judge_and_falls_back() -> None:
    prompts: list[str] = []

    def judge(reply: str) -> Complete:
        async def complete(prompt: str) -> str:
            prompts.append(prompt)
            return reply

        return complete

    assert await judge_score("Q?", "Kestrow", "Kestrow", judge("INCORRECT")) == 1.0
    assert prompts == []  # an exact match needs no judge call
    assert await judge_score("Q?", "the city Kestrow", "Kestrow", judge("CORRECT")) == 1.0
    assert "Gold answer: Kestrow" in prompts[-1]
    assert await judge_score("Q?", "Ombria", "Kestrow", judge("INCORRECT")) == 0.0
    # An empty answer is 0 without a call: a lenient judge must not pay for saying nothing.
    calls = len(prompts)
    for empty in ("", "  ", "...", "the"):
        assert await judge_score("Q?", empty, "Kestrow", judge("CORRECT")) == 0.0, empty
    assert len(prompts) == calls
    # No verdict in the reply: token F1 of [kestrow, city] vs [kestrow] = 2/3.
    assert await judge_score("Q?", "Kestrow city", "Kestrow", judge("hmm")) == pytest.approx(2 / 3)
