"""The web-search example's agent: `workflows.search_agent` with CPU-sized settings.

Two tool turns, the best search result only (with its page's fact box), no `open_page`, token-F1
reward with a small format reward, two worked examples in the agent's memory: prompts stay near
500 tokens, so a step explores in minutes on two cores. Everything else is the app in
`workflows/search_agent.py`. With two turns, multi-hop questions (3-4 pages, one search each)
cannot be answered: `report.py` shows it with the oracle under these settings and reports them
apart.

The corpus is the shipped encyclopedia, or `$SEARCH_CORPUS` when set: the `corpus.jsonl` of a
world made by `python -m environments.search.generate --out DIR`, whose task files the config's
`tasks.*` then name (README: "Another world or your own data").
"""

import os

from workflows.search_agent import SearchAgentSettings, search_workflow

SETTINGS = SearchAgentSettings(
    corpus=os.environ.get("SEARCH_CORPUS") or None,
    max_turns=2,
    top_k=1,
    open_page=False,
    metric="f1",
    format_reward=0.1,
)
"""The shipped settings (`report.py` runs its oracle under exactly these)."""

run = search_workflow(SETTINGS)
