"""A 10k-page corpus: the index builds and finds every supporting page of generated questions.

Build time and query latency are measured by `benchmarks/search_index.py` (docs/benchmarks.md),
not asserted here: wall-clock limits depend on the machine's load.
"""

from __future__ import annotations

from environments.search.index import SearchIndex
from environments.search.pages import render_pages
from environments.search.questions import generate_questions
from environments.search.world import build_world


def test_ten_thousand_page_index_answers_every_question() -> None:
    world = build_world(10_000, seed=11)
    pages = render_pages(world)
    index = SearchIndex.build(pages)
    assert len(pages) == 10_000
    rows = generate_questions(world, 100, seed=1)
    queries = [title for row in rows for title in row["supporting_titles"]]
    queries += [str(row["question"]) for row in rows]
    assert all(index.search(query, k=5) for query in queries)
    for row in rows:
        for title, doc_id in zip(row["supporting_titles"], row["supporting_ids"], strict=True):
            assert doc_id in [hit.doc_id for hit in index.search(title, k=5)]
