"""The environments' commands answer bad arguments and data with one error line, no traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from environments.alfworld import evaluate as alfworld_evaluate
from environments.alfworld import generate as alfworld_generate
from environments.alfworld import real as alfworld_real
from environments.frozenlake import generate as frozenlake_generate
from environments.search import evaluate as search_evaluate
from environments.search import generate as search_generate

CASES: list[tuple[Callable[[list[str]], None], list[str], str]] = [
    (
        search_generate.main,
        ["--pages", "10", "--out", "{tmp}"],
        "num_pages=10 is too small for a world",
    ),
    (
        search_generate.main,
        ["--reserve", "Nobody", "--out", "{tmp}"],
        "reserved titles ['Nobody'] are not pages",
    ),
    (
        search_generate.main,
        ["--pages", "100", "--train", "5000", "--val", "0", "--test", "1", "--out", "{tmp}"],
        "cannot draw 5000 train",
    ),
    (search_evaluate.main, ["--split", "{tmp}/none.jsonl"], "none.jsonl: no such file"),
    (
        alfworld_generate.main,
        ["--task-types", "bogus", "--out", "{tmp}"],
        "unknown ALFWorld task type 'bogus'",
    ),
    (
        alfworld_generate.main,
        ["--sizes", "huge", "--out", "{tmp}"],
        "unknown layout sizes ['huge']",
    ),
    (alfworld_generate.main, ["--task-types", ",", "--out", "{tmp}"], "no task types given"),
    (alfworld_generate.main, ["--sizes", "", "--out", "{tmp}"], "no layout sizes given"),
    (alfworld_evaluate.main, ["--split", "{tmp}/none.jsonl"], "none.jsonl: no such file"),
    (
        alfworld_real.main,
        ["--data", "{tmp}", "--out", "{tmp}/rows.jsonl"],
        "no json_2.1.1/ folder; ALFWORLD_DATA must point",
    ),
    (
        frozenlake_generate.main,
        ["--train", "-1", "--out", "{tmp}"],
        "train: the number of tasks must be >= 0",
    ),
]


@pytest.mark.parametrize(("main", "argv", "message"), CASES)
def test_a_bad_argument_is_one_error_line(
    main: Callable[[list[str]], None],
    argv: list[str],
    message: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = [arg.replace("{tmp}", str(tmp_path)) for arg in argv]
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith("error: ") and message in error, error


@pytest.mark.parametrize(
    ("main", "argv", "stale"),
    [
        (
            search_generate.main,
            ["--pages", "100", "--train", "3", "--val", "0", "--test", "2"],
            "val",
        ),
        (
            alfworld_generate.main,
            ["--train", "1", "--val", "0", "--test", "0", "--skip-oracle-check"],
            "test",
        ),
        (frozenlake_generate.main, ["--train", "3", "--test", "0", "--sizes", "4"], "test"),
    ],
)
def test_a_split_of_zero_tasks_leaves_no_file_of_an_earlier_draw(
    main: Callable[[list[str]], None], argv: list[str], stale: str, tmp_path: Path
) -> None:
    # An earlier draw (another seed) wrote this split; read beside the new ones, it would share
    # their entities, rooms or maps.
    (tmp_path / f"{stale}.jsonl").write_text('{"id": "old"}\n')
    main([*argv, "--seed", "5", "--out", str(tmp_path)])
    assert (tmp_path / "train.jsonl").is_file()
    assert not (tmp_path / f"{stale}.jsonl").exists()


def test_evaluate_refuses_questions_of_another_world(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Scored in the shipped corpus, a fresh world's questions gave the oracle 0.0, silently.
    search_generate.main(["--pages", "100", "--train", "2", "--val", "0", "--test", "2",
                          "--seed", "3", "--out", str(tmp_path)])  # fmt: skip
    tasks = str(tmp_path / "test.jsonl")
    with pytest.raises(SystemExit) as exit_info:
        search_evaluate.main(["--split", tasks])
    assert exit_info.value.code == 2
    assert "pass the corpus.jsonl written beside the task file" in capsys.readouterr().err
    search_evaluate.main(["--split", tasks, "--corpus", str(tmp_path / "corpus.jsonl")])
    assert '"scripted_em": {\n    "all": 1.0' in capsys.readouterr().out


def test_evaluate_names_what_its_baselines_need_on_your_own_questions(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Search-R1 questions (converted) over a wiki-18 corpus: no `program` for the scripted
    # solver, which ended in a KeyError traceback.
    corpus = tmp_path / "wiki-18.jsonl"
    corpus.write_text('{"id": "0", "contents": "\\"Aaron\\"\\nAaron is Moses\' brother."}\n')
    tasks = tmp_path / "nq.jsonl"
    tasks.write_text(
        '{"id": "nq/test_0", "question": "who is moses\' brother?", "answer": ["Aaron"]}\n'
    )
    with pytest.raises(SystemExit) as exit_info:
        search_evaluate.main(["--split", str(tasks), "--corpus", str(corpus)])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert "task 'nq/test_0' has no 'program'" in error and "agentscope-rft explore" in error


def test_the_documented_alfworld_real_command_prints_only_its_error(tmp_path: Path) -> None:
    # `python -m environments.alfworld.real` used to open with runpy's RuntimeWarning (the
    # package had imported the module it was asked to run).
    root = Path(__file__).resolve().parents[3]
    done = subprocess.run(
        [sys.executable, "-m", "environments.alfworld.real", "--data", str(tmp_path), "--out",
         str(tmp_path / "rows.jsonl")],
        capture_output=True, text=True, cwd=root, check=False,
        env={**os.environ, "PYTHONPATH": str(root), "PYTHONWARNINGS": "default"},
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"error: {tmp_path.resolve()}: no json_2.1.1/ folder; ALFWORLD_DATA must point at "
        "downloaded ALFWorld data"
    ]
