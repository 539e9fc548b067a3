"""A 10k-page corpus: generation, index build and query latency stay small."""

from __future__ import annotations

import time

from environments.search.index import SearchIndex
from environments.search.pages import render_pages
from environments.search.questions import generate_questions
from environments.search.world import build_world


def test_ten_thousand_page_index_builds_and_answers_fast() -> None:
    world = build_world(10_000, seed=11)
    pages = render_pages(world)
    start = time.perf_counter()
    index = SearchIndex.build(pages)
    build_s = time.perf_counter() - start
    rows = generate_questions(world, 100, seed=1)
    queries = [title for row in rows for title in row["supporting_titles"]]
    queries += [str(row["question"]) for row in rows]
    slowest = 0.0
    found = 0
    for query in queries:
        start = time.perf_counter()
        hits = index.search(query, k=5)
        slowest = max(slowest, time.perf_counter() - start)
        found += bool(hits)
    assert found == len(queries)
    # Generous bounds for a shared 2-core machine: measured ~0.4 s build, ~1-2 ms per query.
    assert build_s < 30
    assert slowest < 0.5
    for row in rows:
        for title, doc_id in zip(row["supporting_titles"], row["supporting_ids"], strict=True):
            assert doc_id in [hit.doc_id for hit in index.search(title, k=5)]
