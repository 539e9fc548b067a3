"""JSONL export and import, and the `buffer` CLI sub-app."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from buffer_helpers import make_group, make_sample, postgres_url, reset_postgres, stored_form
from typer.testing import CliRunner

from agentscope_rft.buffer import (
    DEFAULT_EXPORT_FIELDS,
    BufferFormatError,
    BufferInputError,
    SQLBuffer,
    export_samples,
    import_samples,
    import_to_buffer,
)
from agentscope_rft.buffer.cli import buffer_app
from agentscope_rft.buffer.export import SAMPLE_FIELDS


@pytest.fixture
async def filled(tmp_path: Path) -> Path:
    """A buffer with groups a (consumed), b and c (pending)."""
    path = tmp_path / "buffer.db"
    buffer = SQLBuffer(path)
    for name in "abc":
        await buffer.put(make_group(name, 2))
    await buffer.get(1, step=1, timeout=1)
    await buffer.close()
    return path


def test_default_export_has_the_documented_fields(filled: Path, tmp_path: Path) -> None:
    out = tmp_path / "out" / "samples.jsonl"
    assert export_samples(filled, out) == 6
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    required = {"token_ids", "loss_mask", "logprobs", "reward", "rollout_id", "task_id"}
    required |= {"policy_version", "agent_name", "stop_reason", "kind", "group_id", "sample_id"}
    assert set(lines[0]) == required == set(DEFAULT_EXPORT_FIELDS)
    assert [line["rollout_id"] for line in lines] == [f"{g}-r{i}" for g in "abc" for i in (0, 1)]
    assert not list(tmp_path.glob("out/*.partial"))


def test_export_all_fields_round_trips_through_import(filled: Path, tmp_path: Path) -> None:
    out = tmp_path / "all.jsonl"
    export_samples(filled, out, SAMPLE_FIELDS)
    expected = [stored_form(s) for name in "abc" for s in make_group(name, 2)]
    assert import_samples(out) == expected


def test_export_by_state(filled: Path, tmp_path: Path) -> None:
    out = tmp_path / "pending.jsonl"
    assert export_samples(filled, out, ["rollout_id"], state="pending") == 4
    assert out.read_text().splitlines()[0] == '{"rollout_id": "b-r0"}'
    assert export_samples(filled, out, ["rollout_id"], state="dropped") == 0


def test_export_errors(filled: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown sample field 'rewards'; did you mean 'reward'"):
        export_samples(filled, tmp_path / "x.jsonl", ["rewards"])
    with pytest.raises(BufferFormatError, match="no such buffer file"):
        export_samples(tmp_path / "nope.db", tmp_path / "x.jsonl")
    assert not (tmp_path / "nope.db").exists()


GOOD = '{"token_ids": [1, 2], "loss_mask": [0, 1], "logprobs": [0, -1], "reward": 1, '
GOOD += '"rollout_id": "r", "task_id": "t"}'


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", r"bad.jsonl:2: not valid JSON"),
        ("[1, 2]", r"bad.jsonl:2: each line must be a JSON object"),
        (GOOD.replace('"reward"', '"rewrd"'), r"bad.jsonl:2: unknown field 'rewrd'; did you mean"),
        (GOOD.replace(', "task_id": "t"', ""), r"bad.jsonl:2: missing field 'task_id'"),
        (GOOD.replace("[0, 1]", "[0, 1, 1]"), r"bad.jsonl:2: .* differ in length"),
        (GOOD.replace("[1, 2]", '["a", "b"]'), r"bad.jsonl:2: field 'token_ids' must hold int"),
    ],
)
def test_import_names_file_line_and_field(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(GOOD + "\n" + line + "\n")
    with pytest.raises(BufferInputError, match=message):
        import_samples(path)


def test_import_names_a_line_that_is_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_bytes(GOOD.encode() + b'\n{"task_id": "caf\xe9"}\n')
    with pytest.raises(BufferInputError, match=r"bad\.jsonl:2: not UTF-8 text \(byte 0xe9"):
        import_samples(path)


def test_import_skips_blank_lines_and_fills_defaults(tmp_path: Path) -> None:
    path = tmp_path / "ok.jsonl"
    path.write_text("\n" + GOOD + "\n\n")
    (sample,) = import_samples(path)
    assert (sample.kind, sample.policy_version, sample.group) == ("rl", 0, "t")
    with pytest.raises(BufferInputError, match="no such file"):
        import_samples(tmp_path / "missing.jsonl")


runner = CliRunner()


def test_cli_export_stats_and_import(filled: Path, tmp_path: Path) -> None:
    out = tmp_path / "s.jsonl"
    result = runner.invoke(buffer_app, ["export", "--url", str(filled), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "wrote 6 samples" in result.output
    assert len(out.read_text().splitlines()) == 6

    result = runner.invoke(buffer_app, ["stats", "--url", f"sqlite:///{filled}"])
    assert result.exit_code == 0, result.output
    assert re.search(r"pending\s*│\s*2\s*│\s*4\s*│", result.output)
    assert re.search(r"consumed\s*│\s*1\s*│\s*2\s*│", result.output)

    copy = tmp_path / "copy.db"
    full = tmp_path / "full.jsonl"
    runner.invoke(
        buffer_app, ["export", "--url", str(filled), "--out", str(full), "--fields", "all"]
    )
    result = runner.invoke(buffer_app, ["import", "--url", str(copy), "--input", str(full)])
    assert result.exit_code == 0, result.output
    assert export_samples(copy, tmp_path / "again.jsonl", SAMPLE_FIELDS) == 6
    assert (tmp_path / "again.jsonl").read_text() == full.read_text()


def test_cli_errors_are_one_clear_line(tmp_path: Path) -> None:
    result = runner.invoke(buffer_app, ["stats", "--url", str(tmp_path / "missing.db")])
    assert result.exit_code == 2
    assert "missing.db: no such buffer file" in result.output
    result = runner.invoke(
        buffer_app, ["export", "--url", str(tmp_path / "x.db"), "--out", "o", "--fields", "bogus"]
    )
    assert result.exit_code == 2 and "unknown sample field 'bogus'" in result.output


def test_cli_export_to_a_folder_or_under_a_file_is_one_clear_line(
    filled: Path, tmp_path: Path
) -> None:
    """`--out runs` (a folder) ended in an IsADirectoryError traceback."""
    result = runner.invoke(buffer_app, ["export", "--url", str(filled), "--out", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert f"{tmp_path} is a folder: give the file to write" in result.output
    under_a_file = filled / "samples.jsonl"  # the buffer file taken for a folder
    result = runner.invoke(buffer_app, ["export", "--url", str(filled), "--out", str(under_a_file)])
    assert result.exit_code == 2, result.output
    assert f"cannot write {under_a_file}: " in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["buffer.db"]  # no partial file left


async def stats_of(path: Path | str) -> dict[str, float]:
    buffer = SQLBuffer(path, create=False)
    try:
        return await buffer.stats()
    finally:
        await buffer.close()


@pytest.mark.parametrize("fields", [DEFAULT_EXPORT_FIELDS, SAMPLE_FIELDS])
async def test_importing_an_export_into_its_own_buffer_adds_nothing(
    filled: Path, tmp_path: Path, fields: tuple[str, ...]
) -> None:
    out = tmp_path / "all.jsonl"
    export_samples(filled, out, fields)
    before = await stats_of(filled)
    report = await import_to_buffer(out, filled)
    assert (report.groups, report.samples, report.skipped_samples) == (0, 0, 6)
    assert [s.line() for s in report.skipped] == [
        "group a: 2 of 2 samples already in the buffer (trained by step 1)",
        "group b: 2 of 2 samples already in the buffer (pending)",
        "group c: 2 of 2 samples already in the buffer (pending)",
    ]
    assert await stats_of(filled) == before  # group a is not pending again: never trained twice


async def test_a_second_import_and_repeats_in_the_file_are_skipped(
    filled: Path, tmp_path: Path
) -> None:
    out = tmp_path / "all.jsonl"
    export_samples(filled, out, SAMPLE_FIELDS)
    twice = tmp_path / "twice.jsonl"
    twice.write_text(out.read_text() + out.read_text())
    other = tmp_path / "other.db"
    first = await import_to_buffer(twice, other)
    assert (first.groups, first.samples) == (3, 6)
    assert {s.line() for s in first.skipped} == {
        f"group {g}: 2 of 4 samples repeated in the file; its other 2 were imported as a new group"
        for g in "abc"
    }
    second = await import_to_buffer(out, other)
    assert (second.groups, second.samples, second.skipped_samples) == (0, 0, 6)
    assert (await stats_of(other))["pending_samples"] == 6
    assert export_samples(other, tmp_path / "again.jsonl", SAMPLE_FIELDS) == 6
    assert (tmp_path / "again.jsonl").read_text() == out.read_text()


async def test_an_import_keeps_the_new_samples_of_a_group_partly_held(
    filled: Path, tmp_path: Path
) -> None:
    out = tmp_path / "a.jsonl"
    export_samples(filled, out, SAMPLE_FIELDS, state="consumed")  # group a, trained by step 1
    extra = stored_form(make_sample("a", 7))
    out.write_text(out.read_text() + json.dumps(extra.to_dict()) + "\n")
    report = await import_to_buffer(out, filled)
    assert (report.groups, report.samples) == (1, 1)
    assert [s.line() for s in report.skipped] == [
        "group a: 2 of 3 samples already in the buffer (trained by step 1); its other 1 was "
        "imported as a new group"
    ]
    buffer = SQLBuffer(filled)
    batch = await buffer.get(3, step=2, timeout=1)  # b, c and the new sample of a
    await buffer.close()
    assert [s.rollout_id for s in batch] == ["b-r0", "b-r1", "c-r0", "c-r1", "a-r7"]


def test_cli_import_says_what_it_skipped_and_why(filled: Path, tmp_path: Path) -> None:
    out = tmp_path / "s.jsonl"
    export_samples(filled, out)
    result = runner.invoke(buffer_app, ["import", "--url", str(filled), "--input", str(out)])
    assert result.exit_code == 0, result.output
    assert f"{out}: imported 0 groups (0 samples); skipped 6 samples of 3 groups" in (
        " ".join(result.output.split())
    )
    assert "group a: 2 of 2 samples already in the buffer (trained by step 1)" in result.output


async def test_importing_into_postgres_skips_what_it_holds(tmp_path: Path) -> None:
    url = postgres_url()
    reset_postgres(url)
    buffer = SQLBuffer(url)
    for name in "ab":
        await buffer.put(make_group(name, 2))
    await buffer.get(1, step=1, timeout=1)
    await buffer.close()
    out = tmp_path / "all.jsonl"
    export_samples(url, out, SAMPLE_FIELDS)
    report = await import_to_buffer(out, url)
    assert (report.groups, report.skipped_samples) == (0, 4)
    assert (await stats_of(url))["pending_groups"] == 1


async def test_an_import_looks_samples_up_by_an_index(filled: Path, tmp_path: Path) -> None:
    import sqlalchemy as sa

    out = tmp_path / "all.jsonl"
    export_samples(filled, out)
    await import_to_buffer(out, filled)
    engine = sa.create_engine(f"sqlite:///{filled}")
    with engine.connect() as conn:
        plan = conn.exec_driver_sql(
            "EXPLAIN QUERY PLAN SELECT id FROM buffer_samples WHERE rollout_id IN ('a-r0', 'b-r1')"
        ).all()
    engine.dispose()
    assert "ix_buffer_samples_rollout_id" in " ".join(str(row) for row in plan)


def test_cli_export_to_a_full_disk_is_one_clear_line_and_keeps_the_previous_export(
    filled: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk mid-export was an OSError traceback."""
    import errno

    from agentscope_rft.buffer import export

    out = tmp_path / "samples.jsonl"
    out.write_text("the export of yesterday\n")
    to_json = export.sample_to_json
    written: list[int] = []

    def until_full(sample, names):
        if len(written) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        written.append(1)
        return to_json(sample, names)

    monkeypatch.setattr(export, "sample_to_json", until_full)
    result = runner.invoke(buffer_app, ["export", "--url", str(filled), "--out", str(out)])
    assert result.exit_code == 2, result.output
    assert " ".join(result.output.split()) == (
        f"error: cannot write {out}: No space left on device after 2 samples; nothing was left "
        "there: make room, or give --out a file on a disk with room"
    )
    assert out.read_text() == "the export of yesterday\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["buffer.db", "samples.jsonl"]
