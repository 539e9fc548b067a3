"""Preflight's warning when a held-out split shares tasks: validation with train or test, test
with train."""

from __future__ import annotations

import logging

from agentscope_rft.explorer.tasks import Task
from agentscope_rft.runtime.preflight import _warn_overlap


def test_a_shared_task_is_counted_once_whether_its_id_or_content_matches(caplog):
    train = [Task("a", {"id": "a", "q": "1+1"}), Task("b", {"id": "b", "q": "2+2"})]
    val = [
        Task("a", {"id": "a", "q": "1+1"}),  # same id and content: one task
        Task("c", {"id": "c", "q": "2+2"}),  # same content only
        Task("b", {"id": "b", "q": "9+9"}),  # same id only
        Task("d", {"id": "d", "q": "3+3"}),  # new
    ]
    with caplog.at_level(logging.WARNING):
        _warn_overlap(train, val, [], "id")
    assert [r.getMessage().split(" (")[0] for r in caplog.records] == ["tasks.val shares 3 task(s)"]


def test_disjoint_splits_say_nothing(caplog):
    with caplog.at_level(logging.WARNING):
        _warn_overlap([Task("a", {"q": 1})], [Task("b", {"q": 2})], [Task("c", {"q": 3})], "id")
    assert caplog.records == []


def test_a_test_split_sharing_tasks_with_train_is_warned_with_or_without_val(caplog):
    train = [Task("a", {"id": "a", "q": "1+1"}), Task("b", {"id": "b", "q": "2+2"})]
    test = [Task("x", {"id": "x", "q": "2+2"}), Task("y", {"id": "y", "q": "5+5"})]
    for vals in ([], [Task("v", {"id": "v", "q": "7+7"})]):
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            _warn_overlap(train, vals, test, "id")
        assert [r.getMessage().split(" (same")[0] for r in caplog.records] == [
            "tasks.eval (test) shares 1 task(s)"
        ]
        assert "with tasks.train" in caplog.records[0].getMessage()
