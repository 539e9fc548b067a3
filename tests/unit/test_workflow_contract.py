"""Which callables are workflows (async functions, app objects with an async `__call__`), and
what a `workflow:` naming anything else says."""

import asyncio

import pytest

from agentscope_rft.api import WorkflowError, load_workflow


class App:
    """An app kept as an object (its settings on `self`), run by calling it."""

    def __init__(self, bonus: float) -> None:
        self.bonus = bonus

    async def __call__(self, task, model):
        return task["base"] + self.bonus


class SyncApp:
    def __call__(self, task, model):
        return 1.0


def test_an_app_object_with_an_async_call_is_a_workflow(tmp_path):
    app_file = tmp_path / "my_app.py"
    app_file.write_text(
        "class App:\n    async def __call__(self, task, model):\n        return 0.5\nrun = App()\n"
    )
    for spec, expected in ((App(0.25), 1.25), (f"{app_file}:run", 0.5)):
        workflow = load_workflow(spec)
        assert workflow.name == "App"
        assert asyncio.run(workflow({"base": 1.0}, None)) == expected


def test_a_synchronous_app_says_how_to_write_it():
    with pytest.raises(WorkflowError, match=r"`SyncApp` must be an async function") as error:
        load_workflow(SyncApp())
    assert "object at 0x" not in str(error.value)

    def run(task, model):
        return 1.0

    with pytest.raises(WorkflowError, match=r"async def run\(task, model\)"):
        load_workflow(run)


def test_a_workflow_that_is_not_a_function_names_what_it_is(tmp_path):
    app = tmp_path / "app.py"
    app.write_text("RUN = 3\n\ndef sync_run(task, model):\n    return 1.0\n")
    with pytest.raises(WorkflowError, match=r"workflow is 3 \(a int\), not a function: point"):
        load_workflow(f"{app}:RUN")
    with pytest.raises(WorkflowError, match=r"must be an async function"):
        load_workflow(f"{app}:sync_run")
