"""The Search-R1 data layout: wiki-18 style corpora and NQ / HotpotQA style question files.

Search-R1 (and Agent Lightning, verl, SkyRL, rLLM after it) retrieve from `wiki-18.jsonl`, one
passage per line as `{"id": "0", "contents": "\\"Title\\"\\nText"}`, and train on parquet files
whose rows carry `question` and `golden_answers` (a list of accepted strings), next to verl's
`prompt` / `reward_model` columns. This module reads both:

- `load_corpus` in `environments.search.corpus` already accepts `{"id", "contents"}` lines (it
  calls `split_contents`), so `load_index("wiki-18.jsonl")` works without converting;
- `read_questions` turns a question file (parquet or JSONL) into task rows
  `{"id", "question", "answer": [...], "data_source"}`, and `convert_corpus` rewrites a corpus as
  `{"id", "title", "text"}` lines. As a command:

    python -m environments.search.searchr1 questions nq_hotpotqa_train.parquet train.jsonl
    python -m environments.search.searchr1 corpus wiki-18.jsonl corpus.jsonl
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from environments.jsonl import TaskFileError, iter_jsonl, write_jsonl
from environments.search.corpus import CorpusError, Document, load_corpus, save_corpus


def split_contents(contents: str) -> tuple[str, str]:
    """`(title, text)` of a wiki-18 passage: the first line is the quoted title.

    Example:
        >>> split_contents('"Kestrow"\\nKestrow is a city in Ombria.')
        ('Kestrow', 'Kestrow is a city in Ombria.')
        >>> split_contents("No title line")
        ('', 'No title line')
    """
    first, newline, rest = contents.partition("\n")
    if not newline:
        return "", contents.strip()
    title = first.strip()
    if len(title) >= 2 and title[0] == title[-1] == '"':
        title = title[1:-1]
    return title.strip(), rest.strip()


def _rows(path: Path) -> Iterator[tuple[int, Mapping[str, Any]]]:
    if not path.is_file():
        raise TaskFileError(f"{path}: no such file; pass the path of a .parquet or .jsonl file")
    if path.suffix.lower() == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            table = pq.read_table(path)
        except pa.ArrowException as error:  # empty, truncated, or not parquet at all
            raise TaskFileError(
                f"{path}: not a readable parquet file ({error}); re-download or re-export it"
            ) from None
        yield from enumerate(table.to_pylist(), start=1)
    elif path.suffix.lower() == ".jsonl":
        yield from iter_jsonl(path)
    else:
        raise TaskFileError(f"{path}: unsupported format {path.suffix!r}; use .parquet or .jsonl")


def _golds(row: Mapping[str, Any]) -> list[str] | None:
    value: Any = row.get("golden_answers", row.get("answer"))
    if value is None and isinstance(row.get("reward_model"), Mapping):
        truth = row["reward_model"].get("ground_truth")
        value = truth.get("target") if isinstance(truth, Mapping) else truth
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list | tuple) or not value:
        return None
    golds = [str(v) for v in value]
    return golds if all(g.strip() for g in golds) else None


def read_questions(path: str | Path) -> list[dict[str, Any]]:
    """Task rows from a Search-R1 style question file (parquet or JSONL).

    A row needs `question` (text) and `golden_answers` (a list of strings; `answer` or verl's
    `reward_model.ground_truth.target` also work). Its `id` (else `<file stem>-<row>`) is
    qualified by its `data_source` (`nq`, `hotpotqa`, ...) when present, `nq/train_0`, as
    `tasks.id_field: [data_source, id]` reads the file: Search-R1's merged files number each
    dataset's rows from `train_0`. `data_source` is kept, so results can be split by dataset.

    Raises:
        TaskFileError: A missing or unreadable file, a row without a question or gold answers
            (named by row number), a duplicate id, or an empty file.

    Example:
        >>> rows = read_questions("nq_hotpotqa_train.parquet")  # doctest: +SKIP
        >>> rows[0]["answer"]  # doctest: +SKIP
        ['Wilhelm Conrad Röntgen']
    """
    path = Path(path)
    tasks: list[dict[str, Any]] = []
    seen: set[str] = set()
    for number, row in _rows(path):
        question = row.get("question")
        if not isinstance(question, str) or not question.strip():
            raise TaskFileError(
                f"{path}: row {number}: no 'question' text (columns: {sorted(row)}); Search-R1 "
                "question files have 'question' and 'golden_answers'"
            )
        golds = _golds(row)
        if golds is None:
            raise TaskFileError(
                f"{path}: row {number}: no gold answers; give 'golden_answers' (a non-empty list "
                f"of strings) or 'answer' (columns: {sorted(row)})"
            )
        task_id = str(row["id"]) if row.get("id") is not None else f"{path.stem}-{number - 1}"
        if row.get("data_source") is not None:  # ids restart per dataset in a merged file
            task_id = f"{row['data_source']}/{task_id}"
        if task_id in seen:
            raise TaskFileError(f"{path}: row {number}: duplicate id {task_id!r}")
        seen.add(task_id)
        task: dict[str, Any] = {"id": task_id, "question": question.strip(), "answer": golds}
        if row.get("data_source") is not None:
            task["data_source"] = str(row["data_source"])
        tasks.append(task)
    if not tasks:
        raise TaskFileError(f"{path}: no questions in the file")
    return tasks


def convert_corpus(source: str | Path, target: str | Path) -> int:
    """Rewrites a corpus (wiki-18 `{"id", "contents"}` lines, or ours) as `{"id", "title", "text"}`.

    Returns:
        The number of documents written.

    Raises:
        CorpusError: As `load_corpus` (a broken line, a missing field, duplicate ids, no lines).

    Example:
        >>> convert_corpus("wiki-18.jsonl", "corpus.jsonl")  # doctest: +SKIP
        21015324
    """
    documents: list[Document] = load_corpus(source)
    return save_corpus(target, documents)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description="Convert Search-R1 data to the search env's JSONL."
    )
    sub = parser.add_subparsers(dest="what", required=True)
    questions = sub.add_parser("questions", help="a parquet/JSONL question file -> task JSONL")
    questions.add_argument("source", type=Path)
    questions.add_argument("target", type=Path)
    corpus = sub.add_parser("corpus", help='a wiki-18 {"id","contents"} corpus -> id/title/text')
    corpus.add_argument("source", type=Path)
    corpus.add_argument("target", type=Path)
    args = parser.parse_args(argv)
    try:
        if args.what == "questions":
            count = write_jsonl(args.target, read_questions(args.source))
        else:
            count = convert_corpus(args.source, args.target)
    except (TaskFileError, CorpusError) as error:
        parser.exit(2, f"error: {error}\n")
    print(f"wrote {count} {args.what} rows to {args.target}")


if __name__ == "__main__":
    main()
