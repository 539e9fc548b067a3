"""A scripted search agent for demonstrations: it reads the task's `program` (the generator's
solution) and plays it as tool calls through the agent's own conversation.

Given the conversation so far, `oracle_reply(tasks)` answers as the model would: the next
`search` call of the question's chain (one entity per call, the name copied from the question or
read from the last result's fact box), or `<answer>...</answer>` once the asked fact is read. It
reads only what the agent saw (the tool results in the messages), so an episode it wins is one
the policy could have played under the same settings.

Example:
    >>> reply = oracle_reply([{"question": "In what year was Ada Voss born?", "answer": "1749",
    ...                        "program": ["start:Ada Voss", "get:born"]}])
    >>> print(reply([{"role": "user", "content": "In what year was Ada Voss born?"}]))
    <tool_call>
    {"name": "search", "arguments": {"query": "Ada Voss"}}
    </tool_call>
    >>> reply([{"role": "user", "content": "In what year was Ada Voss born?"},
    ...        {"role": "assistant", "content": None},
    ...        {"role": "tool", "content": "[1] Ada Voss (id: d1)\\nType: person\\nBorn: 1749"}])
    '<answer>1749</answer>'
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from agentscope_rft.demos import episode_turns
from workflows.search_floors import lead_facts, solve_program

GIVE_UP = "<answer>unknown</answer>"
"""The reply when the chain cannot go on (a fact not in the result): the episode is lost."""


def search_call(query: str) -> str:
    """A `search` tool call as the model writes it (Hermes `<tool_call>` block)."""
    call = {"name": "search", "arguments": {"query": query}}
    return f"<tool_call>\n{json.dumps(call, ensure_ascii=False)}\n</tool_call>"


def next_action(task: Mapping[str, Any], results: Sequence[str]) -> str:
    """The scripted reply after `results` (the episode's tool results so far, in order): the
    program's next read as a search, or its answer once every read is done."""
    walk = solve_program(task)
    try:
        title, label = next(walk)
        for result in results:
            facts = lead_facts(result, title)
            title, label = walk.send(None if facts is None else facts.get(label))
    except StopIteration as done:
        return GIVE_UP if done.value is None else f"<answer>{done.value}</answer>"
    return search_call(title)


def oracle_reply(
    tasks: Iterable[Mapping[str, Any]],
) -> Callable[[list[dict[str, Any]], Any], str]:
    """A scripted model for the search agent: the episode's question (the last user turn that is
    one of `tasks`' questions, after any worked examples in memory) is looked up, and its program
    played."""
    by_question = {str(task["question"]).strip(): task for task in tasks}

    def reply(messages: list[dict[str, Any]], tools: Any = None) -> str:
        found = episode_turns(messages, by_question)
        if found is None:
            return GIVE_UP
        task, results = found
        return next_action(task, results)

    return reply
