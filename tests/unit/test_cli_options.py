"""Numeric command-line options out of range are refused before any work."""

import pytest
from typer.testing import CliRunner

from agentscope_rft.cli import app


@pytest.mark.parametrize(
    "args",
    [
        ["explore", "--limit", "-1"],  # was tasks[:-1]: every task but the last
        ["explore", "--limit", "0"],
        ["explore", "--group-size", "0"],  # was the config's group size
        ["serve", "--max-batch-size", "0"],
        ["serve", "--port", "70000"],
        ["dashboard", "--port", "-5"],
    ],
)
def test_out_of_range_options_are_usage_errors(args):
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "Invalid value for" in result.output
