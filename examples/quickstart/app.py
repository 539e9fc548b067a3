"""The quickstart agent: an AgentScope `Agent` that answers word problems with a calculator tool.

`run(task, model)` plays one episode and returns the reward: 1.0 when the final answer states the
right number; otherwise 0.2 when the agent at least ran the calculator successfully (a well-formed
tool call: partial credit that gives the learner a signal before it ever gets an answer right);
else 0.0.
"""

from __future__ import annotations

import ast
import json
import operator
import re

from agentscope.agent import Agent, InjectionConfig, ReActConfig
from agentscope.message import Msg, TextBlock, ToolCallBlock, ToolResultBlock, UserMsg
from agentscope.model import ChatModelBase
from agentscope.permission import PermissionBehavior, PermissionDecision
from agentscope.tool import FunctionTool, Toolkit

SYSTEM_PROMPT = "Solve the problem. Use the calculate tool, then give the number."
MAX_ITERS = 3
TOOL_CREDIT = 0.2
# Worked examples placed in the agent's memory before the question. SmolLM2-135M never writes a
# Hermes tool call from the schema alone; two demonstrations make it do so now and then, and
# reinforcement learning makes it reliable.
DEMOS = [("What is 12 * 34?", "12 * 34"), ("What is 950 - 120?", "950 - 120")]

_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}


def _eval(node: ast.AST) -> float:
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_eval(node.left), _eval(node.right))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_eval(node.operand)
    raise ValueError("only numbers and + - * / are allowed")


def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression.

    Args:
        expression: e.g. "12 * 34".
    """
    try:
        value = _eval(ast.parse(expression.replace("x", "*"), mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError, TypeError, RecursionError) as exc:
        return f"error: {exc}"
    return str(int(value)) if float(value).is_integer() else f"{value:.4g}"


_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def final_number(text: str) -> float | None:
    """The last number in `text` (thousands separators allowed), or None."""
    matches = _NUMBER.findall(text or "")
    if not matches:
        return None
    try:
        return float(matches[-1].replace(",", ""))
    except ValueError:
        return None


def score(answer_text: str, answer: int, ran_tool: bool = False) -> float:
    """1.0 when the last number in the answer equals the task's answer, else `TOOL_CREDIT` if
    the calculator ran, else 0.0."""
    if final_number(answer_text) == answer:
        return 1.0
    return TOOL_CREDIT if ran_tool else 0.0


def ran_calculator(messages: list[Msg]) -> bool:
    """Whether any `calculate` call in `messages` ran and returned a number."""
    for msg in messages:
        for block in msg.content if isinstance(msg.content, list) else []:
            if not isinstance(block, ToolResultBlock) or block.state != "success":
                continue
            output = block.output
            text = (
                output
                if isinstance(output, str)
                else "".join(b.text for b in output if isinstance(b, TextBlock))
            )
            if not text.startswith("error"):
                return True
    return False


def demo_messages(demos: list[tuple[str, str]] = DEMOS) -> list[Msg]:
    """The worked examples as the agent's earlier turns: question, tool call, result, answer."""
    messages: list[Msg] = []
    for i, (question, expression) in enumerate(demos):
        result = calculate(expression)
        call_id = f"demo_{i}"
        messages.append(UserMsg(name="user", content=question))
        messages.append(
            Msg(
                name="solver",
                role="assistant",
                content=[
                    ToolCallBlock(
                        id=call_id, name="calculate", input=json.dumps({"expression": expression})
                    ),
                    ToolResultBlock(id=call_id, name="calculate", output=result, state="success"),
                    TextBlock(text=result),
                ],
            )
        )
    return messages


def build_agent(model: ChatModelBase) -> Agent:
    allow = PermissionDecision(behavior=PermissionBehavior.ALLOW, message="calculator")
    return Agent(
        name="solver",
        system_prompt=SYSTEM_PROMPT,
        model=model,
        toolkit=Toolkit(tools=[FunctionTool(calculate, permission=allow)]),
        react_config=ReActConfig(max_iters=MAX_ITERS),
        injection_config=InjectionConfig(inject_runtime_state=False),
    )


async def run(task: dict, model: ChatModelBase) -> float:
    """One episode: the agent reads the question, may call `calculate`, and answers.

    Example:
        >>> task = {"question": "What is 12 * 34?", "answer": 408}
        >>> reward = await run(task, model)  # doctest: +SKIP
    """
    agent = build_agent(model)
    demos = demo_messages()
    agent.state.context.extend(demos)
    reply = await agent.reply(UserMsg(name="user", content=task["question"]))
    ran_tool = ran_calculator(agent.state.context[len(demos) :])
    return score(reply.get_text_content() or "", int(task["answer"]), ran_tool)
