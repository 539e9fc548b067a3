"""Build time and query latency of the search environment's BM25 index, against a linear scan.

    python benchmarks/search_index.py [--pages 1000 10000] [--questions 100]

For each corpus size: the index build (`SearchIndex.build`, bm25s), then the latency of every
supporting-page title and question of `--questions` generated questions (p50 / p99 / max), and the
same queries answered by a baseline that scores every page by word overlap (what an index saves).
The wall-clock bounds the test suite once asserted live here (build < 30 s, slowest query < 0.5 s
at 10k pages, on a shared 2-core machine); `tests/integration/environments/test_search_scale.py`
checks only the results.
"""

from __future__ import annotations

import argparse
import re
import time

from environments.search.index import SearchIndex
from environments.search.pages import render_pages
from environments.search.questions import generate_questions
from environments.search.world import build_world

WORD = re.compile(r"\w+")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def linear_scan(texts: list[set[str]], query: str, k: int = 5) -> list[int]:
    words = set(WORD.findall(query.lower()))
    scores = [(len(words & text), i) for i, text in enumerate(texts)]
    return [i for score, i in sorted(scores, reverse=True)[:k] if score]


def measure(num_pages: int, num_questions: int) -> dict[str, float]:
    world = build_world(num_pages, seed=11)
    pages = render_pages(world)
    started = time.perf_counter()
    index = SearchIndex.build(pages)
    build_s = time.perf_counter() - started
    rows = generate_questions(world, num_questions, seed=1)
    queries = [t for row in rows for t in row["supporting_titles"]] + [
        str(row["question"]) for row in rows
    ]
    ours = []
    for query in queries:
        started = time.perf_counter()
        index.search(query, k=5)
        ours.append(time.perf_counter() - started)
    texts = [set(WORD.findall(f"{p.title} {p.text}".lower())) for p in pages]
    scan = []
    for query in queries[:50]:
        started = time.perf_counter()
        linear_scan(texts, query)
        scan.append(time.perf_counter() - started)
    return {
        "pages": num_pages,
        "queries": len(queries),
        "build_s": build_s,
        "p50_ms": 1000 * percentile(ours, 0.5),
        "p99_ms": 1000 * percentile(ours, 0.99),
        "max_ms": 1000 * max(ours),
        "scan_p50_ms": 1000 * percentile(scan, 0.5),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, nargs="+", default=[1000, 10_000])
    parser.add_argument("--questions", type=int, default=100)
    args = parser.parse_args()
    print("| pages | build | query p50 / p99 / max | linear scan p50 | speed-up (p50) |")
    print("|---|---|---|---|---|")
    for num_pages in args.pages:
        r = measure(num_pages, args.questions)
        print(
            f"| {r['pages']:,} | {r['build_s']:.2f} s | {r['p50_ms']:.2f} / {r['p99_ms']:.2f} / "
            f"{r['max_ms']:.2f} ms | {r['scan_p50_ms']:.1f} ms | "
            f"{r['scan_p50_ms'] / r['p50_ms']:.0f}x |"
        )


if __name__ == "__main__":
    main()
