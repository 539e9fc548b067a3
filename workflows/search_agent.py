"""A web-search agent: an AgentScope ReAct `Agent` that answers questions with a search engine.

The agent gets the question, calls `search` (and, when it wants the whole page, `open_page`) on a
local BM25 engine over an encyclopedia, and answers as `<answer>...</answer>`. It runs on the
shipped generated encyclopedia (`environments.search`) or on your own corpus, e.g. Wikipedia
passages converted from the Search-R1 layout (`python -m environments.search.searchr1`).

    from workflows.search_agent import SearchAgentSettings, search_workflow

    run = search_workflow(SearchAgentSettings(max_turns=4, metric="em"))
    # run config:  workflow: my_app.py:run

`workflows.search_agent:run` is the default agent. Apart from `search_workflow`, which makes the
settings into a registered workflow, this reads like any AgentScope app: build the agent, put
the worked examples in its memory, ask the question, score the final answer.

Reward: token F1 (or exact match) of the tagged answer against the task's gold answers (`answer`,
or Search-R1's `golden_answers`; an untagged, over-long or hedged answer scores 0, see
`environments.search.rewards`), optionally mixed with a format reward, or an LLM judge's verdict
(an OpenAI-compatible endpoint, called outside the episode, so its calls are never trained).
An episode that used all its turns is returned as `truncated="turn_limit"`: still data.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from agentscope.agent import Agent, InjectionConfig, ReActConfig
from agentscope.message import (
    Msg,
    TextBlock,
    ToolCallBlock,
    ToolResultBlock,
    ToolResultState,
    UserMsg,
)
from agentscope.model import ChatModelBase
from agentscope.permission import PermissionBehavior, PermissionDecision
from agentscope.tool import FunctionTool, Toolkit
from agentscope.types import ReplyFinishedReason

import agentscope_rft
from agentscope_rft import Reward
from environments.search import DATA_DIR, SearchIndex, SearchTools, load_index
from environments.search.env import foreign_page
from workflows.search_reward import JudgeSettings, answer_reward, gold_answers, llm_judge

__all__ = [
    "SYSTEM_PROMPT",
    "Episode",
    "JudgeSettings",
    "SearchAgentSettings",
    "build_agent",
    "check_corpus",
    "gold_answers",
    "play",
    "run",
    "search_workflow",
]

SYSTEM_PROMPT = (
    "Answer the question using the encyclopedia. Call the search tool with a name, read the "
    "results, search again if you need to, then give only the answer as <answer>...</answer>."
)

# Worked examples over pages that no question of any shipped split names or reads (they are
# `--reserve`d when the splits are generated). The agent sees how a question turns into searches
# and a tagged answer; SmolLM2-135M writes no tool call from the schema alone, but imitates these.
DEMO_TASKS: dict[str, tuple[list[str], str]] = {
    "In what year was Gastthia Reildebirn born?": (["Gastthia Reildebirn"], "1749"),
    "In which country is the city where Hakar Seicall was born?": (
        ["Hakar Seicall", "Comwiana"],
        "Mikist",
    ),
}


@dataclass(frozen=True)
class SearchAgentSettings:
    """How the search agent runs and is rewarded.

    Attributes:
        corpus: A JSONL corpus (`{"id", "title", "text"}` lines, or Search-R1's
            `{"id", "contents"}`); `None` is the shipped generated encyclopedia.
        max_turns: ReAct iterations (tool-calling turns); then one forced final answer.
        top_k: Search results per query.
        open_page: Also give the agent `open_page` (whole pages); off keeps prompts short when
            the results' leads carry the facts, as in the generated encyclopedia.
        lead_chars: Characters of each result's page shown (the page's lead up to its first
            blank line: the fact box of a generated page, the start of a passage).
        metric: `f1` (token F1) or `em` (exact match) of the answer.
        format_reward: Weight `w` of the format reward: `(1 - w) * metric + w * form`, where
            `form` is 0.5 for a search that ran plus 0.5 for an answer in `<answer>` tags. 0 turns
            it off.
        demos: How many worked examples to put in the agent's memory (0 to 2; they come from the
            shipped encyclopedia, so use 0 on another corpus).
        judge: Score answers with an LLM judge instead of `metric` (None: off).

    Example:
        >>> SearchAgentSettings(max_turns=3).metric
        'f1'
    """

    corpus: str | None = None
    max_turns: int = 4
    top_k: int = 3
    open_page: bool = True
    lead_chars: int = 240
    metric: Literal["f1", "em"] = "f1"
    format_reward: float = 0.0
    demos: int = 2
    judge: JudgeSettings | None = None

    def __post_init__(self) -> None:
        problems = []
        if self.max_turns < 1:
            problems.append(f"max_turns must be >= 1, got {self.max_turns}")
        if not 1 <= self.top_k <= 10:
            problems.append(f"top_k must be in [1, 10], got {self.top_k}")
        if self.metric not in ("f1", "em"):
            problems.append(f"metric must be 'f1' or 'em', got {self.metric!r}")
        if not 0.0 <= self.format_reward <= 1.0:
            problems.append(f"format_reward must be in [0, 1], got {self.format_reward}")
        if not 0 <= self.demos <= len(DEMO_TASKS):
            problems.append(f"demos must be in [0, {len(DEMO_TASKS)}], got {self.demos}")
        if problems:
            raise ValueError("SearchAgentSettings: " + "; ".join(problems))


@dataclass
class Episode:
    """What one episode produced: the final reply and what the agent did."""

    reply: str
    queries: list[str] = field(default_factory=list)
    opened: list[str] = field(default_factory=list)
    turn_limit: bool = False


class Encyclopedia:
    """The agent's two tools over one index: short search results, whole pages on request."""

    def __init__(
        self, index: SearchIndex, top_k: int, lead_chars: int, open_page: bool = True
    ) -> None:
        self.tools = SearchTools(index, max_results=top_k)
        self.top_k = top_k
        self.lead_chars = lead_chars
        self.with_open_page = open_page

    def _lead(self, doc_id: str) -> str:
        document = self.tools.index.open(doc_id)
        text = document.text if document is not None else ""
        lead = text.split("\n\n", 1)[0].strip()
        return lead if len(lead) <= self.lead_chars else lead[: self.lead_chars].rstrip() + " ..."

    async def search(self, query: str) -> str:
        """Search the encyclopedia; returns the best pages with the start of each.

        Args:
            query: A name or keywords, for example "Zallast Soceirov".
        """
        self.tools.queries.append(query)
        hits = self.tools.index.search(query, self.top_k)
        if not hits:
            return f"No results for {query!r}. Try a name from the question."
        return "\n".join(
            f"[{rank}] {hit.title} (id: {hit.doc_id})\n{self._lead(hit.doc_id)}"
            for rank, hit in enumerate(hits, start=1)
        )

    async def open_page(self, doc_id: str) -> str:
        """Read a whole page.

        Args:
            doc_id: A page id from the search results, for example "d000002".
        """
        return await self.tools.open_page(doc_id)

    def toolkit(self) -> Toolkit:
        allow = PermissionDecision(behavior=PermissionBehavior.ALLOW, message="read-only search")
        functions = [self.search, self.open_page] if self.with_open_page else [self.search]
        # AgentScope wraps a tool's str result into a ToolChunk; its annotations omit str.
        return Toolkit(
            tools=[
                FunctionTool(fn, permission=allow, is_read_only=True)  # type: ignore[arg-type]
                for fn in functions
            ]
        )


DEFAULT_CORPUS = DATA_DIR / "corpus.jsonl"
"""The corpus searched when `SearchAgentSettings.corpus` is None."""


@functools.cache
def _index(corpus: str | None) -> SearchIndex:
    return load_index() if corpus is None else load_index(corpus)


def check_corpus(task: dict[str, Any], index: SearchIndex, corpus: str | None) -> None:
    """Refuses a generated task whose pages are not in the searched corpus.

    Generated rows name their supporting pages (`supporting_ids`, `supporting_titles`); a task
    from another world (a fresh `environments.search.generate --out DIR`) searched in this corpus
    could never be answered, and would train on reward 0 without a word. Rows without them
    (Search-R1's, a user's own) are not checked.

    Raises:
        ValueError: A supporting page is missing from the corpus or has another title.

    Example:
        >>> check_corpus({"id": "q1", "question": "?", "answer": "x"}, _index(None), None)
    """
    foreign = foreign_page(task, index)
    if foreign is not None:
        doc_id, title = foreign
        where = corpus or f"the shipped encyclopedia ({DEFAULT_CORPUS})"
        raise ValueError(
            f"task {task.get('id')!r} reads page {doc_id} ({title!r}), which is not in the "
            f"corpus searched, {where}: the task was generated with another corpus. Search "
            "the corpus.jsonl written beside the task files: SearchAgentSettings(corpus=...), "
            "or $SEARCH_CORPUS for examples/web_search/app.py"
        )


def build_agent(model: ChatModelBase, tools: Encyclopedia, max_turns: int) -> Agent:
    """The ReAct agent: system prompt, the two tools, a turn limit, no injected timestamps."""
    return Agent(
        name="searcher",
        system_prompt=SYSTEM_PROMPT,
        model=model,
        toolkit=tools.toolkit(),
        react_config=ReActConfig(max_iters=max_turns),
        injection_config=InjectionConfig(inject_runtime_state=False),
    )


async def demo_messages(count: int, top_k: int, lead_chars: int) -> list[Msg]:
    """The worked examples as earlier turns: question, searches with their real results (in the
    shipped encyclopedia), answer."""
    tools = Encyclopedia(_index(None), top_k, lead_chars)
    messages: list[Msg] = []
    for i, (question, (queries, answer)) in enumerate(list(DEMO_TASKS.items())[:count]):
        blocks: list[Any] = []
        for j, query in enumerate(queries):
            call_id = f"demo_{i}_{j}"
            result = await tools.search(query)
            blocks.append(
                ToolCallBlock(id=call_id, name="search", input=json.dumps({"query": query}))
            )
            blocks.append(
                ToolResultBlock(
                    id=call_id, name="search", output=result, state=ToolResultState.SUCCESS
                )
            )
        blocks.append(TextBlock(text=f"<answer>{answer}</answer>"))
        messages.append(UserMsg(name="user", content=question))
        messages.append(Msg(name="searcher", role="assistant", content=blocks))
    return messages


async def play(
    task: dict[str, Any], model: ChatModelBase, settings: SearchAgentSettings
) -> Episode:
    """One episode: the agent reads the question, searches, and answers."""
    question = task.get("question")
    if not isinstance(question, str) or not question.strip():
        raise KeyError(
            f"task {task.get('id')!r} has no 'question' text (fields: {sorted(task)}); search "
            "tasks need 'question' and 'answer' (or Search-R1's 'golden_answers')"
        )
    index = _index(settings.corpus)
    check_corpus(task, index, settings.corpus)
    tools = Encyclopedia(index, settings.top_k, settings.lead_chars, settings.open_page)
    agent = build_agent(model, tools, settings.max_turns)
    agent.state.context.extend(
        await demo_messages(settings.demos, settings.top_k, settings.lead_chars)
    )
    reply = await agent.reply(UserMsg(name="user", content=question))
    return Episode(
        reply=reply.get_text_content() or "",
        queries=list(tools.tools.queries),
        opened=list(tools.tools.opened),
        turn_limit=reply.finished_reason == ReplyFinishedReason.EXCEED_MAX_ITERS,
    )


_ANSWER_TAG = re.compile(r"<answer>.*?</answer>", re.IGNORECASE | re.DOTALL)


def _reward(task: dict[str, Any], episode: Episode, settings: SearchAgentSettings) -> Reward:
    golds = gold_answers(task)
    form = 0.5 * bool(episode.queries) + 0.5 * bool(_ANSWER_TAG.search(episode.reply))
    reward = answer_reward(episode.reply, golds, settings.metric, settings.format_reward, form)
    metrics = {
        **reward.metrics,
        "searches": float(len(episode.queries)),
        "pages_opened": float(len(episode.opened)),
        "turn_limit": float(episode.turn_limit),
    }
    return Reward(
        reward.value,
        metrics=metrics,
        success=reward.success,
        truncated="turn_limit" if episode.turn_limit else None,
    )


def search_workflow(settings: SearchAgentSettings | None = None) -> agentscope_rft.Workflow:
    """The search agent with these settings, as a registered workflow.

    Without a judge the episode returns its reward; with one, the episode returns what it did
    and the judge (run outside the episode by agentscope-rft) scores it.

    Raises:
        FileNotFoundError: `settings.corpus` names a file that does not exist.

    Example:
        >>> run = search_workflow(SearchAgentSettings(max_turns=3))
        >>> run.name
        'search_agent'
    """
    settings = settings or SearchAgentSettings()
    if settings.corpus is not None and not Path(settings.corpus).is_file():
        raise FileNotFoundError(
            f"search corpus {settings.corpus} does not exist: give a JSONL corpus "
            '({"id", "title", "text"} or wiki-18\'s {"id", "contents"} lines), or corpus=None '
            "for the shipped encyclopedia"
        )

    async def episode(task: dict[str, Any], model: ChatModelBase) -> Episode | Reward:
        gold_answers(task)  # a row without gold answers fails before the agent runs
        played = await play(task, model, settings)
        return played if settings.judge is not None else _reward(task, played, settings)

    async def judge(task: dict[str, Any], played: Episode) -> Reward:
        assert settings.judge is not None
        scored = _reward(task, played, settings)
        verdict, judge_metrics = await llm_judge(task, played.reply, settings.judge)
        metrics = {**scored.metrics, **judge_metrics}
        return Reward(verdict, metrics=metrics, success=verdict >= 1.0, truncated=scored.truncated)

    workflow: agentscope_rft.Workflow = agentscope_rft.workflow(
        episode, judge=judge if settings.judge is not None else None, name="search_agent"
    )
    return workflow


run = search_workflow()
"""The default search agent (shipped encyclopedia, 4 turns, token-F1 reward)."""
