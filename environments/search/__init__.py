"""Offline web search: a local BM25 engine, a synthetic encyclopedia, questions and rewards.

Example:
    >>> from environments.search import SearchTools, load_index, load_tasks, score
    >>> task = load_tasks("test")[0]
    >>> tools = SearchTools(load_index())  # one per episode; the index is shared
    >>> score("<answer>no idea</answer>", task)
    0.0
"""

from environments.search.corpus import CorpusError, Document, load_corpus, save_corpus
from environments.search.env import DATA_DIR, load_index, load_tasks
from environments.search.index import SearchHit, SearchIndex
from environments.search.rewards import (
    GradedReply,
    answer_problem,
    exact_match,
    extract_answer,
    grade_reply,
    judge_prompt,
    judge_score,
    max_answer_words,
    normalize_answer,
    score,
    token_f1,
)
from environments.search.tools import SearchTools

__all__ = [
    "DATA_DIR",
    "CorpusError",
    "Document",
    "GradedReply",
    "SearchHit",
    "SearchIndex",
    "SearchTools",
    "answer_problem",
    "exact_match",
    "extract_answer",
    "grade_reply",
    "judge_prompt",
    "judge_score",
    "load_corpus",
    "load_index",
    "load_tasks",
    "max_answer_words",
    "normalize_answer",
    "save_corpus",
    "score",
    "token_f1",
]
