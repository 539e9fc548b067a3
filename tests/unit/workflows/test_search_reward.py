"""The search agent's reward: gold answers from each task layout, F1/EM, format shaping."""

from __future__ import annotations

import numpy as np
import pytest

from environments.search import extract_answer
from workflows.search_agent import SearchAgentSettings
from workflows.search_reward import TaskFormatError, answer_reward, gold_answers


@pytest.mark.parametrize(
    ("task", "golds"),
    [
        ({"answer": "Kestrow"}, ["Kestrow"]),
        ({"answer": ["Kestrow", "Kestrow city"]}, ["Kestrow", "Kestrow city"]),
        ({"golden_answers": ["Aaron"]}, ["Aaron"]),
        # Parquet read through pandas gives numpy arrays.
        ({"golden_answers": np.array(["Aaron", "Aharon"], dtype=object)}, ["Aaron", "Aharon"]),
        ({"reward_model": {"ground_truth": {"target": ["1765"]}}}, ["1765"]),
        ({"answer": 1765}, None),
        ({"answer": []}, None),
        ({"answer": ["Kestrow", " "]}, None),
        ({"question": "q"}, None),
    ],
)
def test_gold_answers(task: dict, golds: list[str] | None) -> None:
    if golds is None:
        with pytest.raises(TaskFormatError, match="no gold answer: give 'answer'"):
            gold_answers(task)
    else:
        assert gold_answers(task) == golds


@pytest.mark.parametrize(
    ("reply", "answer"),
    [
        ("<answer>1765</answer>", "1765"),
        ("<answer>first</answer> then <ANSWER> second </ANSWER>", "second"),
        ("<answer>\nKestrow\n</answer>", "Kestrow"),
        ("It is Kestrow.\nAnswer: Kestrow", "Kestrow"),
        ("<answer>unclosed", "<answer>unclosed"),
        ("", ""),
    ],
)
def test_extract_answer_edge_cases(reply: str, answer: str) -> None:
    assert extract_answer(reply) == answer


def test_answer_reward_f1_em_and_shaping() -> None:
    # "the Kestrow Bank" vs "Kestrow": normalized tokens [kestrow, bank] vs [kestrow]: F1 2/3.
    reward = answer_reward("<answer>the Kestrow Bank</answer>", ["Kestrow"])
    assert reward.value == pytest.approx(2 / 3)
    assert reward.metrics == {"f1": pytest.approx(2 / 3), "em": 0.0, "form": 1.0}
    assert reward.success is False
    assert answer_reward("<answer>Kestrow</answer>", ["x", "kestrow"], "em").value == 1.0
    # With w = 0.2: 0.8 * F1 + 0.2 * form.
    shaped = answer_reward("<answer>Kestrow Bank</answer>", ["Kestrow"], "f1", 0.2, 0.5)
    assert shaped.value == pytest.approx(0.8 * 2 / 3 + 0.2 * 0.5)
    assert shaped.metrics["f1"] == pytest.approx(2 / 3)  # the metric is reported unshaped
    assert answer_reward("nothing", ["Kestrow"], "em", 0.2, 0.0).value == 0.0


def test_settings_reject_bad_values() -> None:
    with pytest.raises(ValueError, match=r"max_turns must be >= 1, got 0.*metric must be"):
        SearchAgentSettings(max_turns=0, metric="bleu")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"format_reward must be in \[0, 1\]"):
        SearchAgentSettings(format_reward=1.5)
    with pytest.raises(ValueError, match=r"demos must be in \[0, 2\]"):
        SearchAgentSettings(demos=3)
