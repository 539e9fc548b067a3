"""A small AgentScope calculator app used by integration tests, and its scripted episode."""

from __future__ import annotations

from agentscope.agent import Agent, InjectionConfig
from agentscope.credential import OpenAICredential
from agentscope.message import UserMsg
from agentscope.model import OpenAIChatModel
from agentscope.permission import PermissionBehavior, PermissionDecision
from agentscope.tool import FunctionTool, Toolkit

SYSTEM_PROMPT = "You are a calculator. Use the tools."
QUESTION = "What is (2+3)*4?"
SCRIPT = [
    '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>',
    'Now multiply.\n<tool_call>\n{"name": "multiply", "arguments": {"a": 5, "b": 4}}\n</tool_call>',
    "The answer is 20.",
]


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a * b


def build_agent(model: OpenAIChatModel, name: str = "calc") -> Agent:
    allow = PermissionDecision(behavior=PermissionBehavior.ALLOW, message="allowed in tests")
    toolkit = Toolkit(
        tools=[FunctionTool(add, permission=allow), FunctionTool(multiply, permission=allow)]
    )
    return Agent(
        name=name,
        system_prompt=SYSTEM_PROMPT,
        model=model,
        toolkit=toolkit,
        injection_config=InjectionConfig(inject_runtime_state=False),
    )


def build_model(base_url: str, stream: bool, seed: int | None = None) -> OpenAIChatModel:
    return OpenAIChatModel(
        credential=OpenAICredential(api_key="test-key", base_url=base_url),
        model="calc-model",
        stream=stream,
        parameters=OpenAIChatModel.Parameters(max_tokens=64, temperature=0.0),
        extra_body={"seed": seed} if seed is not None else None,
    )


async def run_episode(base_url: str, stream: bool = False) -> str:
    agent = build_agent(build_model(base_url, stream))
    reply = await agent.reply(UserMsg(name="user", content=QUESTION))
    return reply.get_text_content() or ""
