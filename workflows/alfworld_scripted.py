"""A scripted ALFWorld player that reads the ALFWorld agent's prompts, as the model does.

It takes the goal object when a `take` command for it is admissible, carries it to the target and
puts it there (pick-and-place goals), opens closed receptacles, and otherwise visits receptacles
it has not visited in this game, in listed order. Plug it into `agentscope_rft.testing.
ScriptedEngine` to run the real app (gateway, recorder, game engine) without model compute: the
tests and `benchmarks/alfworld_rollouts.py` do.

Example:
    >>> from agentscope_rft.testing import ScriptedEngine  # doctest: +SKIP
    >>> engine = ScriptedEngine(searcher_reply)  # doctest: +SKIP
"""

from __future__ import annotations

import re
from typing import Any

_GOAL = re.compile(r"Your task is to: (?:put )?(?:some |a )?(\w+) (?:in|on) (\w+)")


def _text(message: dict[str, Any]) -> str:
    content = message.get("content") or ""
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content)
    return str(content)


def searcher_reply(messages: list[dict[str, Any]], tools: Any = None) -> str:
    """The next command for an OpenAI-format conversation with the ALFWorld agent."""
    start = max(i for i, m in enumerate(messages) if "Your task is to" in _text(m))
    users = [_text(m) for m in messages[start:] if m["role"] == "user"]
    goal = _GOAL.findall(_text(messages[start]))
    if not goal:
        return "look"
    obj, target = goal[-1]
    listed = users[-1].rsplit("Admissible actions: ", 1)[-1].rstrip(".").split(", ")
    for command in listed:
        if command.startswith(f"move {obj} ") and f"to {target}" in command:
            return command
    for command in listed:
        if command.startswith(f"take {obj} "):
            return command
    holding = any(c.startswith(f"move {obj} ") for c in listed)
    wanted = [c for c in listed if c.startswith(f"go to {target}")] if holding else []
    opens = [c for c in listed if c.startswith("open ")]
    said = [_text(m) for m in messages[start:] if m["role"] == "assistant"]
    unvisited = [c for c in listed if c.startswith("go to ") and c not in said]
    return (wanted or opens or unvisited or ["look"])[0]
