"""The search agent for the GPU recipe: Search-R1's setting on a real corpus.

Four tool turns, top-3 passages per search, `open_page`, exact-match reward (what Search-R1 and
Agent Lightning report), no worked examples (an instruction-tuned 3B/7B model follows the tool
format from the schema). The corpus comes from `$SEARCH_CORPUS`: a wiki-18 style JSONL
(`{"id", "contents"}` lines, loaded as they are); unset, the shipped generated encyclopedia.
"""

import os

from workflows.search_agent import SearchAgentSettings, search_workflow

run = search_workflow(
    SearchAgentSettings(
        corpus=os.environ.get("SEARCH_CORPUS"),
        max_turns=4,
        top_k=3,
        lead_chars=600,
        metric="em",
        demos=0,
    )
)
