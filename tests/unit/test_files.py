"""`replace_text`: the one way small run files (state, status, best, sweep, task stats) are
written whole or not at all."""

from __future__ import annotations

import pytest

from agentscope_rft.files import replace_text


def test_a_failed_replace_keeps_the_old_file_and_leaves_no_temporary_one(tmp_path):
    target = tmp_path / "state.json"
    replace_text(target, "old")
    assert target.read_text() == "old"

    blocked = tmp_path / "status.json"
    blocked.mkdir()  # the rename onto it fails, as a full disk fails the write before it
    with pytest.raises(OSError):
        replace_text(blocked, "new")
    # write_state, write_status, write_json left a `.tmp` beside the file (zero bytes on a full
    # disk) after a failure
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json", "status.json"]
    replace_text(target, "new")
    assert target.read_text() == "new"
