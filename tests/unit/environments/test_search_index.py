"""The search index, the agent tools (as AgentScope FunctionTools) and bad corpus input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from environments.jsonl import TaskFileError
from environments.search.corpus import CorpusError, Document, load_corpus, save_corpus
from environments.search.env import load_tasks
from environments.search.index import SearchIndex
from environments.search.tools import SearchTools

DOCUMENTS = [
    Document("d1", "Kestrow", "Type: city\nCountry: Ombria\n\nKestrow is a city in Ombria."),
    Document("d2", "Ombria", "Type: country\nCapital: Kestrow\n\nOmbria is a country."),
    Document("d3", "Kestrow Bank", "Type: organisation\n\nThe Kestrow Bank is a bank in Kestrow."),
]


def test_search_ranks_pages_and_makes_snippets() -> None:
    index = SearchIndex.build(DOCUMENTS)
    hits = index.search("capital of Ombria", k=2)
    assert hits[0].doc_id == "d2"
    assert hits[0].snippet == "Capital: Kestrow"
    # An exact title goes first even when another page says the word more often.
    assert index.search("kestrow", k=3)[0].doc_id == "d1"
    assert index.search("unheard-of words", k=3) == []
    assert len(index.search("Kestrow", k=50)) == 3
    assert index.open("d3") == DOCUMENTS[2]
    assert index.open("nope") is None


def test_index_is_cached_by_corpus_content(tmp_path: Path) -> None:
    SearchIndex.build(DOCUMENTS, cache_dir=tmp_path)
    (folder,) = [path for path in tmp_path.iterdir() if not path.name.startswith(".")]
    assert (folder / "done.json").is_file()
    cached = SearchIndex.build(DOCUMENTS, cache_dir=tmp_path)
    assert cached.search("capital of Ombria", k=1)[0].doc_id == "d2"
    SearchIndex.build(DOCUMENTS[:2], cache_dir=tmp_path)
    assert len([p for p in tmp_path.iterdir() if not p.name.startswith(".")]) == 2


def test_empty_index_is_a_clear_error() -> None:
    with pytest.raises(CorpusError, match="empty corpus"):
        SearchIndex.build([])
    with pytest.raises(CorpusError, match="no document contains a word"):
        SearchIndex.build([Document("a", "", "...")])


def test_corpus_round_trip_and_broken_lines(tmp_path: Path) -> None:
    path = tmp_path / "corpus.jsonl"
    save_corpus(path, DOCUMENTS)
    assert load_corpus(path) == DOCUMENTS
    lines = path.read_text().splitlines()
    path.write_text(lines[0] + "\n" + lines[1][:-3] + "\n")
    with pytest.raises(CorpusError, match=r"corpus\.jsonl:2: not valid JSON"):
        load_corpus(path)
    path.write_text(json.dumps({"id": "a", "title": "A"}) + "\n")
    with pytest.raises(CorpusError, match=r":1: field 'text' must be a string"):
        load_corpus(path)
    path.write_text((json.dumps({"id": "a", "title": "A", "text": "x"}) + "\n") * 2)
    with pytest.raises(CorpusError, match=r":2: duplicate document id 'a'"):
        load_corpus(path)
    path.write_text("\n")
    with pytest.raises(CorpusError, match="no documents"):
        load_corpus(path)
    with pytest.raises(CorpusError, match="no such file"):
        load_corpus(tmp_path / "missing.jsonl")
    # Integer ids (as wiki-18's and many dumps') read as strings, in either layout.
    path.write_text(
        json.dumps({"id": 7, "title": "A", "text": "x"}) + "\n"
        + json.dumps({"id": 8, "contents": '"B"\ny'}) + "\n"
    )  # fmt: skip
    assert [d.id for d in load_corpus(path)] == ["7", "8"]
    path.write_text(json.dumps({"id": True, "title": "A", "text": "x"}) + "\n")
    with pytest.raises(CorpusError, match=r":1: field 'id' must be a string, got bool"):
        load_corpus(path)
    # A corpus without a searchable word names its file.
    path.write_text(json.dumps({"id": "a", "title": "The", "text": "of the!"}) + "\n")
    with pytest.raises(
        CorpusError,
        match=r"corpus\.jsonl: cannot build a search index: no document contains a word",
    ):
        SearchIndex.from_jsonl(path, cache_dir=None)


def test_user_question_files_are_checked(tmp_path: Path) -> None:
    path = tmp_path / "questions.jsonl"
    path.write_text(json.dumps({"id": "q1", "question": "Capital?", "answer": ["Kestrow"]}) + "\n")
    assert load_tasks(path)[0]["answer"] == ["Kestrow"]
    path.write_text(json.dumps({"id": "q1", "question": "Capital?"}) + "\n")
    with pytest.raises(TaskFileError, match=r"questions\.jsonl:1: missing key\(s\) \['answer'\]"):
        load_tasks(path)
    for answer in (3, [], "", [" "], ["Kestrow", ""]):
        path.write_text(json.dumps({"id": "q1", "question": "Capital?", "answer": answer}) + "\n")
        with pytest.raises(TaskFileError, match="'answer' must be a non-blank string"):
            load_tasks(path)
    path.write_text(json.dumps({"id": "q1", "question": " ", "answer": "Kestrow"}) + "\n")
    with pytest.raises(TaskFileError, match="task 'q1': 'question' must be non-empty text"):
        load_tasks(path)
    path.write_text("\n")
    with pytest.raises(TaskFileError, match=r"questions\.jsonl: no questions"):
        load_tasks(path)
    # Search-R1's parquet (binary) given where JSONL goes: named, with the converter (it was a
    # bare UnicodeDecodeError naming no file).
    parquet = tmp_path / "nq_test.parquet"
    parquet.write_bytes(b"PAR1\x15\x04\x98\xff\xfe" * 20)
    with pytest.raises(TaskFileError, match=r"nq_test\.parquet: not UTF-8 text .*searchr1"):
        load_tasks(parquet)
    with pytest.raises(CorpusError, match=r"nq_test\.parquet: not UTF-8 text"):
        load_corpus(parquet)


async def test_tools_format_results_and_record_use() -> None:
    tools = SearchTools(SearchIndex.build(DOCUMENTS), max_page_chars=30)
    listing = await tools.search("capital of Ombria", k=1)
    assert listing == "[1] Ombria (id: d2)\n    Capital: Kestrow"
    assert "No results" in await tools.search("zzz")
    page = await tools.open_page("d1")
    assert page.startswith("# Kestrow (id: d1)\n\nType: city")
    assert page.endswith("[... page truncated]")
    assert "No page with id 'd9'" in await tools.open_page("d9")
    assert tools.queries == ["capital of Ombria", "zzz"]
    assert tools.opened == ["d1"]


async def test_tools_wrap_as_agentscope_function_tools() -> None:
    from agentscope.tool import Toolkit

    tools = SearchTools(SearchIndex.build(DOCUMENTS))
    schemas = {
        schema["function"]["name"]: schema["function"]
        for schema in await Toolkit(tools=tools.function_tools()).get_tool_schemas()
    }
    assert set(schemas) == {"search", "open_page"}
    search = schemas["search"]
    assert search["description"].startswith("Search the encyclopedia")
    assert search["parameters"]["required"] == ["query"]
    assert search["parameters"]["properties"]["query"] == {
        "type": "string",
        "description": "Keywords to search for.",
    }
    assert search["parameters"]["properties"]["k"]["default"] == 5
    assert schemas["open_page"]["parameters"]["required"] == ["doc_id"]
    search_tool = tools.function_tools()[0]
    assert (await search_tool.check_permissions()).behavior.value == "allow"
    chunk = await search_tool(query="Kestrow", k=1)
    assert chunk.content[0].text.startswith("[1] Kestrow (id: d1)")
