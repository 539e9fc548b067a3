"""Task files a user gets wrong: each is a `TaskSetError` naming the file, the line and the fix."""

import pytest

from agentscope_rft.explorer.tasks import TaskSetError, load_tasks


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
