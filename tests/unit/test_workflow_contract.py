"""A `workflow:` that names something other than `async def run(task, model)` says what it is."""

import pytest

from agentscope_rft.api import WorkflowError, load_workflow


def test_a_workflow_that_is_not_a_function_names_what_it_is(tmp_path):
    app = tmp_path / "app.py"
    app.write_text("RUN = 3\n\ndef sync_run(task, model):\n    return 1.0\n")
    with pytest.raises(WorkflowError, match=r"workflow is 3 \(a int\), not a function: point"):
        load_workflow(f"{app}:RUN")
    with pytest.raises(WorkflowError, match=r"must be an async function"):
        load_workflow(f"{app}:sync_run")
