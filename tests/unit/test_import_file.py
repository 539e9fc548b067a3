"""`agentscope_rft.api.import_file`: a file imports its own neighbours, whatever other folder's
neighbour of the same name (`app`, `task`) this process imported first."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from agentscope_rft.api import WorkflowError, import_file, load_callable


def example(folder: Path, answer: str) -> Path:
    folder.mkdir()
    (folder / "task.py").write_text(f"ANSWER = {answer!r}\n")
    (folder / "app.py").write_text(
        "from task import ANSWER\n\ndef later():\n    import task\n    return task.ANSWER\n"
    )
    return folder / "app.py"


def test_each_file_gets_its_own_neighbours(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # start as a fresh process would: no `task` or `app` imported yet (other tests import
    # example folders' modules of those names); monkeypatch puts theirs back afterwards
    for name in ("task", "app"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    first = import_file(example(tmp_path / "one", "one"))
    second = import_file(example(tmp_path / "two", "two"))
    assert (first.ANSWER, second.ANSWER) == ("one", "two")
    # the first folder's `task` stays the one other code imported under that name
    assert sys.modules["task"].ANSWER == "one"
    assert first.later() == "one"
    sys.modules.pop("task", None)


def test_an_installed_module_of_that_name_is_put_back(tmp_path: Path) -> None:
    import json

    folder = tmp_path / "own"
    folder.mkdir()
    (folder / "json.py").write_text("MINE = True\n")
    (folder / "app.py").write_text("import json\nMINE = json.MINE\n")
    assert import_file(folder / "app.py").MINE
    assert sys.modules["json"] is json


def test_a_module_spec_naming_a_file_of_the_working_directory_says_how_to_name_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `agentscope-rft` is a console script: the working directory is not on sys.path there.
    (tmp_path / "user_app_xyz.py").write_text("async def run(task, model):\n    return 1.0\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    with pytest.raises(WorkflowError) as err:
        load_callable("user_app_xyz:run")
    message = str(err.value)
    assert "`user_app_xyz.py:<function>`" in message
    assert "(user_app_xyz.py is in the working directory)" in message
    with pytest.raises(WorkflowError) as other:  # a module that fails inside: no hint
        load_callable("json.nope:run")
    assert "a file is named by its path" not in str(other.value)
