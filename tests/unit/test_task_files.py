"""Task files: JSON rows load as written, and files a user gets wrong are a `TaskSetError`
naming the file, the line and the fix."""

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


@pytest.mark.parametrize("content", [b"", b"\n  \n"])
def test_a_jsonl_file_without_tasks_says_so(tmp_path, content):
    path = tmp_path / "tasks.jsonl"
    path.write_bytes(content)
    with pytest.raises(TaskSetError, match=r"tasks\.jsonl has no tasks: write one JSON object"):
        load_tasks(path)


@pytest.mark.parametrize("suffix", [".json", ".csv", ".parquet"])
def test_an_empty_file_of_another_format_says_so(tmp_path, suffix):
    path = tmp_path / f"tasks{suffix}"
    path.write_bytes(b"")
    with pytest.raises(TaskSetError, match=rf"tasks\{suffix} is empty"):
        load_tasks(path)


def test_a_line_that_is_not_utf8_is_named(tmp_path):
    path = tmp_path / "tasks.jsonl"
    path.write_bytes(b'{"id": "a", "prompt": "x"}\n{"id": "b", "prompt": "caf\xe9"}\n')
    with pytest.raises(TaskSetError, match=r"line 2: not UTF-8 text \(byte 0xe9 at column 27\)"):
        load_tasks(path)


def test_blank_lines_are_skipped(tmp_path):
    path = tmp_path / "tasks.jsonl"
    path.write_text('{"id": "a"}\n\n{"id": "b"}\n')
    assert [t.id for t in load_tasks(path)] == ["a", "b"]


def test_a_json_file_that_is_not_utf8_says_so(tmp_path):
    path = tmp_path / "tasks.json"
    path.write_bytes(b'[{"id": "a", "prompt": "caf\xe9"}]')
    with pytest.raises(TaskSetError, match=r"tasks\.json: not UTF-8 text"):
        load_tasks(path)


@pytest.mark.parametrize("task", ["What is 2+3?", [{"id": "t1"}], None])
async def test_check_workflow_says_its_task_is_one_dict_before_loading_a_model(task):
    from agentscope_rft.check import check_workflow

    class NoEngine:  # starting it would be loading a model first
        async def start(self):
            raise AssertionError("the task is checked before the engine starts")

    async def run(task, model):
        return 1.0

    with pytest.raises(TaskSetError, match="pass one task as the dict your workflow gets"):
        await check_workflow(run, task, engine=NoEngine(), show=False)  # type: ignore[arg-type]


def test_ids_restarting_per_dataset_are_qualified_by_several_id_columns(tmp_path):
    # A file that concatenates datasets (Search-R1's NQ + HotpotQA train set: FlashRAG numbers
    # each dataset's rows from train_0) repeats ids; the error names the fix, which loads it.
    rows = [
        {"id": "train_0", "data_source": "nq", "question": "q1"},
        {"id": "train_1", "data_source": "nq", "question": "q2"},
        {"id": "train_0", "data_source": "hotpotqa", "question": "q3"},
        {"id": "x", "question": "no source"},
    ]
    path = write_jsonl(tmp_path / "merged.jsonl", rows)
    with pytest.raises(TaskSetError, match=r"id_field=\[data_source, id\]"):
        load_tasks(path)
    tasks = load_tasks(path, id_field=["data_source", "id"])
    assert [t.id for t in tasks] == ["nq/train_0", "nq/train_1", "hotpotqa/train_0", "x"]
    assert tasks[0].data == rows[0]  # the row itself is unchanged
    with pytest.raises(TaskSetError, match="share the id 'nq/train_0'"):
        load_tasks(rows[:1] * 2, id_field=["data_source", "id"])
