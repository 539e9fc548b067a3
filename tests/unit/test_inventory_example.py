"""The inventory example: its committed data is what its generator writes, and the tool answers."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import pytest

from agentscope_rft.api import import_file

HERE = Path(__file__).resolve().parents[2] / "examples" / "inventory"


def load(name: str) -> ModuleType:
    module: ModuleType = import_file(HERE / f"{name}.py")
    return module


def test_the_committed_files_are_the_generators_output(tmp_path):
    data = load("data")
    stock, splits = data.generate(0)
    assert json.loads((HERE / "stock.json").read_text()) == stock
    for split, tasks in splits.items():
        lines = (HERE / f"tasks_{split}.jsonl").read_text().splitlines()
        assert [json.loads(line) for line in lines] == tasks
    assert data.generate(1)[1] != splits  # the seed matters


def test_the_splits_ask_about_disjoint_items_and_the_tool_knows_every_answer():
    data, app = load("data"), load("app")
    _, splits = data.generate(0)
    items = {split: {t["item"] for t in tasks} for split, tasks in splits.items()}
    assert not items["train"] & items["test"] and not items["train"] & items["val"]
    assert not items["val"] & items["test"]
    for task in splits["test"]:
        assert app.check_stock(task["item"].upper(), task["warehouse"]) == str(task["answer"])
        assert app.score(f"There are {task['answer']} in stock.", task["answer"]) == 1.0
    assert app.score("There are 12 bolts, not 13.", 12) == 0.0  # the last number counts
    assert app.check_stock("gold bars", "Leeds") == "unknown item 'gold bars'"
    assert app.check_stock("oak valves", "Paris").startswith("unknown warehouse 'Paris'")


def test_tasks_of_another_seed_need_their_own_stock_table(tmp_path, monkeypatch):
    # `data.py --seed 7 --out DIR`: the tool used to read the shipped table, so every answer
    # was wrong and every reward 0, silently.
    data, app = load("data"), load("app")
    stock, splits = data.generate(7)
    task = splits["train"][0]
    assert app.stock_table()[task["item"]][task["warehouse"]] != task["answer"]
    with pytest.raises(ValueError, match="generated with another stock table; set INVENTORY_STOCK"):
        app.check_task(task)
    (tmp_path / "stock.json").write_text(json.dumps(stock))
    monkeypatch.setenv("INVENTORY_STOCK", str(tmp_path / "stock.json"))
    app = load("app")
    app.check_task(task)
    assert app.check_stock(task["item"], task["warehouse"]) == str(task["answer"])
    app.check_task({"task_id": "mine", "question": "How many?", "answer": 3})  # no item: no check
