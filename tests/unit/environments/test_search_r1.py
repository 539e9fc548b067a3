"""The Search-R1 layout: wiki-18 corpus lines and NQ/HotpotQA question files (parquet, JSONL)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from environments.jsonl import TaskFileError
from environments.search import SearchTools, load_corpus, load_index
from environments.search.corpus import CorpusError
from environments.search.searchr1 import convert_corpus, main, read_questions, split_contents

# Three passages exactly as wiki-18.jsonl writes them: an id string, the title quoted on the
# first line of `contents`.
WIKI18 = [
    {"id": "0", "contents": '"Aaron"\nAaron is a prophet, high priest, and the brother of Moses.'},
    {"id": "1", "contents": '"Moses"\nMoses is considered the most important prophet in Judaism.'},
    {"id": "2", "contents": '"Kestrow (city)"\nKestrow is the capital of Ombria, founded in 1765.'},
]


def _search_r1_row(index: int, question: str, golds: list[str], source: str) -> dict:
    """One row as Search-R1's data_process/nq_search.py writes it (FlashRAG columns kept)."""
    return {
        "id": f"train_{index}",
        "question": question,
        "golden_answers": golds,
        "data_source": source,
        "prompt": [{"role": "user", "content": f"Answer the given question. {question}"}],
        "ability": "fact-reasoning",
        "reward_model": {"style": "rule", "ground_truth": {"target": golds}},
        "extra_info": {"split": "train", "index": index},
    }


@pytest.fixture
def wiki18(tmp_path: Path) -> Path:
    path = tmp_path / "wiki-18.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in WIKI18))
    return path


@pytest.fixture
def nq_parquet(tmp_path: Path) -> Path:
    rows = [
        _search_r1_row(0, "who is the brother of moses?", ["Aaron"], "nq"),
        # FlashRAG numbers each dataset from train_0; Search-R1 concatenates them as they are.
        _search_r1_row(
            0, "what is the capital of ombria?", ["Kestrow", "Kestrow city"], "hotpotqa"
        ),
    ]
    path = tmp_path / "nq_hotpotqa_train.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def test_split_contents_reads_the_quoted_title() -> None:
    assert split_contents('"Aaron"\nAaron is a prophet.') == ("Aaron", "Aaron is a prophet.")
    assert split_contents('"A "quoted" name"\ntext') == ('A "quoted" name', "text")
    assert split_contents("Title without quotes\ntext") == ("Title without quotes", "text")
    assert split_contents("one line only") == ("", "one line only")


def test_wiki18_corpus_loads_and_searches_without_converting(wiki18: Path) -> None:
    documents = load_corpus(wiki18)
    assert [(d.id, d.title) for d in documents] == [
        ("0", "Aaron"),
        ("1", "Moses"),
        ("2", "Kestrow (city)"),
    ]
    assert documents[0].text == "Aaron is a prophet, high priest, and the brother of Moses."
    index = load_index(wiki18)
    assert index.search("brother of Moses", k=1)[0].doc_id == "0"


async def test_tools_open_a_wiki18_passage(wiki18: Path) -> None:
    tools = SearchTools(load_index(wiki18))
    assert "Kestrow (city) (id: 2)" in await tools.search("capital of Ombria", k=1)
    assert (await tools.open_page("1")).startswith("# Moses (id: 1)")


def test_convert_corpus_writes_id_title_text(wiki18: Path, tmp_path: Path) -> None:
    out = tmp_path / "corpus.jsonl"
    assert convert_corpus(wiki18, out) == 3
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows[2] == {
        "id": "2",
        "title": "Kestrow (city)",
        "text": "Kestrow is the capital of Ombria, founded in 1765.",
    }
    assert load_corpus(out) == load_corpus(wiki18)


def test_corpus_line_with_bad_contents_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(WIKI18[0]) + "\n" + json.dumps({"id": "1", "contents": 7}) + "\n")
    with pytest.raises(CorpusError, match=r"bad.jsonl:2: field 'contents' must be a string"):
        load_corpus(path)


def test_read_questions_from_search_r1_parquet(nq_parquet: Path) -> None:
    tasks = read_questions(nq_parquet)
    assert tasks == [
        {
            "id": "nq/train_0",
            "question": "who is the brother of moses?",
            "answer": ["Aaron"],
            "data_source": "nq",
        },
        {
            "id": "hotpotqa/train_0",
            "question": "what is the capital of ombria?",
            "answer": ["Kestrow", "Kestrow city"],
            "data_source": "hotpotqa",
        },
    ]


def test_read_questions_from_jsonl_and_verl_only_columns(tmp_path: Path) -> None:
    path = tmp_path / "dev.jsonl"
    rows = [
        {"id": "dev_0", "question": "q0", "golden_answers": ["a0"]},
        {"question": "q1", "reward_model": {"ground_truth": {"target": ["a1", "b1"]}}},
        {"question": "q2", "answer": "a2"},
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    tasks = read_questions(path)
    assert [t["id"] for t in tasks] == ["dev_0", "dev-1", "dev-2"]
    assert [t["answer"] for t in tasks] == [["a0"], ["a1", "b1"], ["a2"]]


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"query": "q", "golden_answers": ["a"]}, r"row 1: no 'question' text \(columns: "),
        ({"question": "q", "golden_answers": []}, r"row 1: no gold answers; give 'golden_answers'"),
        ({"question": "q", "golden_answers": [""]}, r"row 1: no gold answers"),
    ],
)
def test_question_file_with_wrong_fields_is_a_clear_error(
    tmp_path: Path, row: dict, message: str
) -> None:
    path = tmp_path / "questions.parquet"
    pq.write_table(pa.Table.from_pylist([row]), path)
    with pytest.raises(TaskFileError, match=message):
        read_questions(path)


def test_missing_or_unsupported_question_file(tmp_path: Path) -> None:
    with pytest.raises(TaskFileError, match="no such file"):
        read_questions(tmp_path / "missing.parquet")
    (tmp_path / "q.csv").write_text("question\nq\n")
    with pytest.raises(TaskFileError, match=r"unsupported format '\.csv'"):
        read_questions(tmp_path / "q.csv")
    # A truncated download, an empty file or another format renamed: one line, not ArrowInvalid.
    for name, content in (("empty.parquet", b""), ("html.parquet", b"<html>403</html>")):
        (tmp_path / name).write_bytes(content)
        with pytest.raises(TaskFileError, match=rf"{name}: not a readable parquet file"):
            read_questions(tmp_path / name)


def test_command_line_converts_both(
    nq_parquet: Path, wiki18: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    main(["questions", str(nq_parquet), str(tmp_path / "train.jsonl")])
    main(["corpus", str(wiki18), str(tmp_path / "corpus.jsonl")])
    assert "wrote 2 questions rows" in capsys.readouterr().out
    assert len((tmp_path / "train.jsonl").read_text().splitlines()) == 2
    with pytest.raises(SystemExit) as exit_info:
        main(["corpus", str(tmp_path / "missing.jsonl"), str(tmp_path / "out.jsonl")])
    assert exit_info.value.code == 2
    assert "missing.jsonl: no such file" in capsys.readouterr().err
    (tmp_path / "cut.parquet").write_bytes(b"PAR1 cut short")
    with pytest.raises(SystemExit) as exit_info:
        main(["questions", str(tmp_path / "cut.parquet"), str(tmp_path / "out.jsonl")])
    assert exit_info.value.code == 2
    assert "cut.parquet: not a readable parquet file" in capsys.readouterr().err


def test_a_repeated_id_within_one_data_source_is_an_error(tmp_path: Path) -> None:
    row = _search_r1_row(0, "who is the brother of moses?", ["Aaron"], "nq")
    path = tmp_path / "twice.jsonl"
    path.write_text((json.dumps(row) + "\n") * 2)
    with pytest.raises(TaskFileError, match=r"row 2: duplicate id 'nq/train_0'"):
        read_questions(path)


def test_a_contents_line_with_its_own_title_keeps_it(tmp_path: Path) -> None:
    # {"id", "title", "contents"} lines: the title is the row's, not the passage's first line.
    rows = [
        {"id": "a", "title": "Aaron", "contents": "Aaron is a prophet.\nHe was Moses' brother."},
        {"id": "b", "title": "Moses", "contents": '"Moses"\nMoses led the Exodus.'},
    ]
    path = tmp_path / "titled.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert [(d.title, d.text) for d in load_corpus(path)] == [
        ("Aaron", "Aaron is a prophet.\nHe was Moses' brother."),
        ("Moses", "Moses led the Exodus."),
    ]
