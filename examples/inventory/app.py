"""The inventory agent: a plain AgentScope 2.x app that looks up stock counts with one tool.

Written the way a user writes their first agent: the default `Agent` (AgentScope's runtime-state
injection left on), one function tool, a worked example in the system prompt, nothing tuned for
training. `run(task, model)` plays one episode and returns 1.0 when the last number of the final
reply is the task's stock count, else 0.0. The count is only in `stock.json` (see `data.py`), so
the agent has to call `check_stock`. The table is the one next to this file, or
`$INVENTORY_STOCK` when set: the `stock.json` of `data.py --seed N --out DIR`, whose task files
the config's `tasks.*` then name.
"""

from __future__ import annotations

import functools
import json
import os
import re
from pathlib import Path

from agentscope.agent import Agent, ReActConfig
from agentscope.message import UserMsg
from agentscope.model import ChatModelBase
from agentscope.permission import PermissionBehavior, PermissionDecision
from agentscope.tool import FunctionTool, Toolkit

HERE = Path(__file__).resolve().parent
MAX_ITERS = 3
SYSTEM_PROMPT = """You answer questions about warehouse stock. Call the check_stock tool with \
the item and the warehouse, then answer with the number it returns.

Example:
User: How many brass hinges are in stock at the Porto warehouse?
You call check_stock(item="brass hinges", warehouse="Porto") and it returns "412".
You answer: There are 412 brass hinges in stock at the Porto warehouse."""

ALLOW = PermissionDecision(behavior=PermissionBehavior.ALLOW, message="stock lookups are read-only")


def stock_path() -> Path:
    """The stock table the tool reads: `$INVENTORY_STOCK`, else `stock.json` next to this file."""
    return Path(os.environ.get("INVENTORY_STOCK") or HERE / "stock.json")


@functools.cache
def stock_table() -> dict[str, dict[str, int]]:
    return json.loads(stock_path().read_text())


def check_task(task: dict) -> None:
    """Refuses a generated task whose answer is not its count in the table the tool reads.

    Tasks from `data.py --seed N --out DIR` hold DIR/stock.json's counts; searched in another
    table, every reply would score 0 and the run would train on nothing.
    """
    if "item" not in task or "warehouse" not in task:
        return  # a question of your own: nothing to compare
    count = stock_table().get(task["item"], {}).get(task["warehouse"])
    if count != int(task["answer"]):
        raise ValueError(
            f"task {task.get('task_id', task.get('id'))!r}: the answer {task['answer']} is not "
            f"the count of {task['item']} at {task['warehouse']} in {stock_path()} ({count}): "
            "the task was generated with another stock table; set INVENTORY_STOCK to the "
            "stock.json written beside the task files"
        )


def check_stock(item: str, warehouse: str) -> str:
    """Look up how many units of an item a warehouse holds.

    Args:
        item: The item's name, e.g. "brass hinges".
        warehouse: The warehouse's city, e.g. "Porto".
    """
    table = stock_table()
    counts = table.get(item.strip().lower())
    if counts is None:
        return f"unknown item {item!r}"
    by_city = {city.lower(): count for city, count in counts.items()}
    count = by_city.get(warehouse.strip().lower())
    if count is None:
        return f"unknown warehouse {warehouse!r}; warehouses: {', '.join(sorted(counts))}"
    return str(count)


_NUMBER = re.compile(r"\d[\d,]*")


def score(reply: str, answer: int) -> float:
    """1.0 when the last number in the reply is the stock count, else 0.0."""
    numbers = _NUMBER.findall(reply or "")
    return 1.0 if numbers and int(numbers[-1].replace(",", "")) == answer else 0.0


async def run(task: dict, model: ChatModelBase) -> float:
    """One episode: ask the agent the task's question and score its reply."""
    check_task(task)
    agent = Agent(
        name="inventory",
        system_prompt=SYSTEM_PROMPT,
        model=model,
        toolkit=Toolkit(tools=[FunctionTool(check_stock, permission=ALLOW)]),
        react_config=ReActConfig(max_iters=MAX_ITERS),
    )
    reply = await agent.reply(UserMsg(name="user", content=task["question"]))
    return score(reply.get_text_content() or "", int(task["answer"]))
