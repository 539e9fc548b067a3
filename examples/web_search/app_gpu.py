"""The search agent for the GPU recipe: Search-R1's setting on a real corpus.

Four tool turns, top-3 passages per search, `open_page`, exact-match reward (what Search-R1 and
Agent Lightning report), no worked examples (an instruction-tuned 3B/7B model follows the tool
format from the schema). The corpus comes from `$SEARCH_CORPUS`: a wiki-18 style JSONL
(`{"id", "contents"}` lines, loaded as they are). It is required: the recipe's questions are
Search-R1's, which the generated encyclopedia of the CPU example cannot answer.
"""

import os

from workflows.search_agent import SearchAgentSettings, search_workflow

CORPUS = os.environ.get("SEARCH_CORPUS")
if not CORPUS:
    raise RuntimeError(
        "examples/web_search/app_gpu.py searches a real corpus: set SEARCH_CORPUS to a wiki-18 "
        'style JSONL ({"id", "contents"} lines, as Search-R1 publishes it); the CPU example '
        "(config.yaml, app.py) uses the generated encyclopedia"
    )

run = search_workflow(
    SearchAgentSettings(
        corpus=CORPUS,
        max_turns=4,
        top_k=3,
        lead_chars=600,
        metric="em",
        demos=0,
    )
)
