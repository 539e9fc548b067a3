"""Task files load as written: JSON rows keep their own fields and types."""

import json

import pytest

from agentscope_rft.explorer.tasks import TaskSetError, load_tasks

ROWS = [
    {"id": "a", "question": "Combien font 2+2 ? 日本", "answer": "4", "meta": {"src": "x"}},
    {"id": "b", "question": "2+3?", "answer": 5, "hint": "add"},
    {"question": "no id", "answer": ["6", "six"]},
]


def write_jsonl(path, rows, encoding="utf-8"):
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding)
    return path


@pytest.mark.parametrize("name", ["tasks.jsonl", "tasks.json"])
def test_json_rows_keep_their_fields_and_types(tmp_path, name):
    path = tmp_path / name
    if name.endswith(".jsonl"):
        write_jsonl(path, ROWS)
    else:
        path.write_text(json.dumps(ROWS, ensure_ascii=False), "utf-8")
    tasks = load_tasks(path)
    assert [t.id for t in tasks] == ["a", "b", "row-2"]
    # no column of another row added (as None), no value cast to its column's type
    assert [t.data for t in tasks] == ROWS


def test_a_byte_order_mark_and_json_lines_named_json_load(tmp_path):
    assert [t.data for t in load_tasks(write_jsonl(tmp_path / "bom.jsonl", ROWS, "utf-8-sig"))] == (
        ROWS
    )
    assert [t.data for t in load_tasks(write_jsonl(tmp_path / "lines.json", ROWS))] == ROWS


def test_a_json_file_that_is_not_a_list_says_so(tmp_path):
    path = tmp_path / "tasks.json"
    path.write_text(json.dumps({"data": ROWS}))
    with pytest.raises(TaskSetError, match="must hold a list of task objects, not a dict"):
        load_tasks(path)
    path.write_text('[{"id": 1},')
    with pytest.raises(TaskSetError, match=r"tasks\.json: invalid JSON"):
        load_tasks(path)
