"""The web-search floors: trivial answers, the oracle under the agent's own tool settings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentscope_rft.api import import_file
from environments.search.corpus import save_corpus
from environments.search.pages import render_pages
from environments.search.splits import generate_splits
from environments.search.world import build_world
from workflows.search_agent import SearchAgentSettings
from workflows.search_floors import (
    TRIVIAL_AT,
    entity_names,
    flag_types,
    floor_scores,
    shipped_oracle,
)

REPORT = Path(__file__).resolve().parents[3] / "examples" / "web_search" / "report.py"
ROOT_DATA = Path(__file__).resolve().parents[3] / "environments" / "search" / "data"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[dict]]:
    world = build_world(400, seed=5)
    corpus = tmp_path_factory.mktemp("search") / "corpus.jsonl"
    save_corpus(corpus, render_pages(world))
    rows = generate_splits(world, {"test": 60}, seed=1)["test"]
    return str(corpus), [{"id": str(i), **row} for i, row in enumerate(rows)]


def test_entity_names_are_the_titles_the_question_names(tiny: tuple[str, list[dict]]) -> None:
    for row in tiny[1]:
        names = entity_names(row)
        assert len(names) == (2 if row["type"] == "comparison" else 1)
        assert names == row["supporting_titles"][: len(names)]


async def test_the_oracle_is_held_to_the_agent_s_turn_budget(tiny: tuple[str, list[dict]]) -> None:
    corpus, rows = tiny
    shipped = SearchAgentSettings(corpus=corpus, max_turns=2, top_k=1, open_page=False, demos=0)
    roomy = SearchAgentSettings(corpus=corpus, max_turns=4, top_k=1, open_page=True, demos=0)
    for row in rows:
        pages = len(row["supporting_ids"])
        answer = await shipped_oracle(row, shipped)
        # One search per page: two turns reach two pages, never the 3-4 of a multi-hop.
        assert (answer == row["answer"]) == (pages <= 2), row
        assert await shipped_oracle(row, roomy) == row["answer"], row


async def test_floors_flag_comparisons_and_put_multi_hop_apart(
    tiny: tuple[str, list[dict]],
) -> None:
    corpus, rows = tiny
    settings = SearchAgentSettings(corpus=corpus, max_turns=2, top_k=1, open_page=False, demos=0)
    scores = await floor_scores(rows, settings)
    # Copying one of the two compared names is right about half the time; hedging with both is 0.
    assert scores["best copy"]["comparison"] >= TRIVIAL_AT
    assert scores["name both"]["comparison"] == 0.0
    assert scores["oracle (unbounded)"]["all"] == 1.0
    assert scores["oracle (shipped tools)"]["multi_hop"] == 0.0
    assert scores["oracle (shipped tools)"]["single_hop"] == 1.0
    flags = flag_types(scores)
    assert flags["comparison"].startswith("trivial: ")
    assert flags["multi_hop"].startswith("apart: ")
    assert "single_hop" not in flags and "two_hop" not in flags


def test_report_prints_the_floors_and_what_counts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = import_file(REPORT)
    assert report.shipped_settings().max_turns == 2  # the oracle runs under app.py's settings
    out = tmp_path / "report.json"
    report.main(["--tasks", "val", "--json", str(out)])
    printed = capsys.readouterr().out
    assert "| oracle (shipped tools) |" in printed
    assert "* multi_hop: not counted (apart:" in printed
    assert "counted: single_hop, two_hop" in printed
    saved = json.loads(out.read_text())
    assert saved["counts"]["multi_hop"] > 0 and set(saved["flags"]) == {"comparison", "multi_hop"}
    # The README's floors are the committed artefact, which is what the command makes.
    assert saved == json.loads((REPORT.parent / "results" / "floors_val.json").read_text())


def _explored(folder: Path, f1: dict[str, float]) -> str:
    folder.mkdir(parents=True)
    lines = [
        json.dumps({"task_id": q, "metrics": {"f1": v}, "phase": "eval"}) for q, v in f1.items()
    ]
    (folder / "rollouts.jsonl").write_text("\n".join(lines) + "\n")
    return str(folder)


def test_report_compares_runs_question_by_question(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = import_file(REPORT)
    rows = [json.loads(line) for line in (ROOT_DATA / "val.jsonl").read_text().splitlines()]
    by_type: dict[str, list[str]] = {}
    for row in rows:
        by_type.setdefault(row["type"], []).append(str(row["id"]))
    single, two, comparison = (
        by_type["single_hop"][:4],
        by_type["two_hop"][:4],
        by_type["comparison"][:2],
    )
    asked = single + two + comparison
    base = _explored(tmp_path / "base", dict.fromkeys(asked, 0.0))
    # seed a answers every counted question; seed b half of them; both copy the comparisons.
    a = _explored(
        tmp_path / "a", {**dict.fromkeys(single + two, 1.0), **dict.fromkeys(comparison, 1.0)}
    )
    half = {q: float(i % 2 == 0) for i, q in enumerate(single + two)}
    b = _explored(tmp_path / "b", {**half, **dict.fromkeys(comparison, 1.0)})
    out = tmp_path / "report.json"
    report.main(
        [f"untrained={base}", f"seed_a={a}", f"seed_b={b}", "--tasks", "val", "--json", str(out),
         "--baseline", "untrained", "--group", "rl=seed_", "--compare", "seed_a:seed_b",
         "--compare", "seed_a,seed_b:untrained,untrained"]
    )  # fmt: skip
    printed = capsys.readouterr().out
    saved = json.loads(out.read_text())["comparisons"]
    # The comparisons (trivially solved) are not counted: 8 counted questions.
    assert saved["counted"] == {"untrained": 0.0, "seed_a": 1.0, "seed_b": 0.5}
    assert saved["gain"] == {"seed_a": 1.0, "seed_b": 0.5}
    group = saved["groups"]["rl"]
    assert group["runs"] == ["seed_a", "seed_b"] and group["mean"] == 0.75
    assert group["min_gain"] == 0.5 and group["std"] == pytest.approx(0.3536, abs=1e-4)
    pair = saved["pairs"]["seed_a:seed_b"]
    assert pair["diff"] == 0.5 and pair["questions"] == 8
    assert 0.0 <= pair["low"] < 0.5 < pair["high"] <= 1.0
    assert "seed_a:seed_b: +0.500 counted F1 [95% paired bootstrap" in printed
    # two seeds against the untrained model, each question's F1 averaged over the seeds
    pooled = saved["pairs"]["seed_a,seed_b:untrained,untrained"]
    assert pooled["diff"] == 0.75 and pooled["questions"] == 8
    assert pooled["low"] < 0.75 < pooled["high"]
    with pytest.raises(SystemExit, match="equally many"):
        report.main([f"x={base}", f"y={a}", "--tasks", "val", "--compare", "x,y:x"])
    with pytest.raises(SystemExit, match="matches no run"):
        report.main([f"x={base}", "--tasks", "val", "--group", "rl=seed"])


def test_report_reads_a_committed_reports_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`name=report.json#RUN`: a run whose folder is gone is compared through an earlier report's
    per-question F1, with the same numbers as from its folder."""
    report = import_file(REPORT)
    rows = [json.loads(line) for line in (ROOT_DATA / "val.jsonl").read_text().splitlines()]
    single = [str(r["id"]) for r in rows if r["type"] == "single_hop"][:4]
    two = [str(r["id"]) for r in rows if r["type"] == "two_hop"][:4]
    a = _explored(tmp_path / "a", {**dict.fromkeys(single, 1.0), **dict.fromkeys(two, 0.0)})
    b = _explored(tmp_path / "b", dict.fromkeys(single + two, 0.0))
    first = tmp_path / "first.json"
    report.main([f"seed_a={a}", "--tasks", "val", "--json", str(first)])
    again = tmp_path / "again.json"
    report.main(
        [f"seed_a={first}#seed_a", f"control_a={b}", "--tasks", "val", "--json", str(again),
         "--compare", "seed_a:control_a"]
    )  # fmt: skip
    saved = json.loads(again.read_text())
    assert saved["scores"]["seed_a"] == json.loads(first.read_text())["scores"]["seed_a"]
    assert saved["comparisons"]["pairs"]["seed_a:control_a"]["diff"] == 0.5
    with pytest.raises(SystemExit, match="no run 'seed_b' there; it has \\['seed_a'\\]"):
        report.main([f"x={first}#seed_b", "--tasks", "val"])
    (tmp_path / "bad.json").write_text("[1, 2]")
    with pytest.raises(SystemExit, match="not a report with per-question F1"):
        report.main([f"x={tmp_path / 'bad.json'}#seed_a", "--tasks", "val"])
    capsys.readouterr()


async def test_floors_refuse_tasks_of_another_world(tiny: tuple[str, list[dict]]) -> None:
    # Searched in the shipped encyclopedia, a fresh world's oracles scored 0 and every question
    # type was flagged "apart", with no word about the corpus.
    _, rows = tiny
    shipped = SearchAgentSettings(max_turns=2, top_k=1, open_page=False, demos=0)
    with pytest.raises(ValueError, match="the task was generated with another corpus"):
        await floor_scores(rows[:3], shipped)
    with pytest.raises(ValueError, match="no tasks"):
        await floor_scores([], shipped)


def test_report_names_a_corpus_or_task_mismatch(
    tmp_path: Path, tiny: tuple[str, list[dict]]
) -> None:
    report = import_file(REPORT)
    tasks = tmp_path / "test.jsonl"
    tasks.write_text("".join(json.dumps(row) + "\n" for row in tiny[1][:3]))
    with pytest.raises(SystemExit, match=r"error: task '0' reads page .* another corpus"):
        report.main(["--tasks", str(tasks)])
    elsewhere = _explored(tmp_path / "run", {"not-a-test-question": 1.0})
    with pytest.raises(SystemExit, match="the runs answered none of the 3 questions"):
        report.main([f"run={elsewhere}", "--tasks", str(tasks)])
