"""Helper calls: model calls AgentScope components make for an agent that are not its turns (a
memory lookup, a model router's choice, a reranking of retrieved chunks). Given the trainable
model they go to the policy and are recorded as `<agent>/<kind>`; they train only when their kind
is in `explorer.agents.helpers`."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import httpx
import pytest
from agentscope.agent import Agent, InjectionConfig
from agentscope.credential import OpenAICredential
from agentscope.message import TextBlock, UserMsg
from agentscope.middleware import (
    AgenticMemoryMiddleware,
    ChatModelCandidate,
    Mem0Middleware,
    ModelRouterMiddleware,
    RAGMiddleware,
)
from agentscope.model import ChatModelBase, OpenAIChatModel
from agentscope.rag import Chunk, VectorSearchResult

import agentscope_rft
from agentscope_rft.explorer.agents import AgentsConfig
from agentscope_rft.integration.agentscope import own_provider
from agentscope_rft.testing import ScriptedEngine
from tests.integration.test_multi_agent_shapes import _tools


def _tool_call(name: str, arguments: dict) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def _reply(messages: list[dict], tools: list[dict] | None) -> str:
    """Answers the components' structured-output requests by their schema; the agent calls
    `recall` once, then answers."""
    names = [t["function"]["name"] for t in tools or []]
    if "generate_structured_output" in names:
        fields = tools[names.index("generate_structured_output")]["function"]["parameters"]
        properties = fields["properties"]
        if "choice" in properties:  # the router
            return _tool_call(names[0], {"choice": properties["choice"]["enum"][0]})
        if "selected_files" in properties:  # the agentic memory's recall
            return _tool_call(names[0], {"selected_files": ["facts.md"]})
        return _tool_call(names[0], {"ids": ["c2", "c1"]})  # the reranker
    if "recall" in names and not any(m["role"] == "tool" for m in messages):
        return _tool_call("recall", {})
    return "the answer is 5"


class _Notes:
    """A knowledge base (what `RAGMiddleware` searches): two fixed hits."""

    async def search(self, queries, top_k, score_threshold=None):
        return [
            VectorSearchResult(
                score=1.0 - k / 10,
                document_id=f"d{k}",
                chunk=Chunk(
                    content=TextBlock(text=f"note {k}"),
                    source="notes",
                    chunk_index=k,
                    total_chunks=2,
                ),
            )
            for k in range(2)
        ]


def _app(workdir: Path):
    async def helped_solver(task, model):
        """A solver whose middlewares call the policy: a model router whose classifier is the
        policy, an agentic memory that recalls with the agent's model, a reranking RAG."""
        (workdir / "Memory").mkdir(parents=True, exist_ok=True)
        (workdir / "Memory" / "facts.md").write_text("---\ndescription: sums\n---\n2+3=5\n")
        memory = AgenticMemoryMiddleware(workdir=str(workdir))

        async def recall() -> str:
            """Wait for the memory's recall."""
            if memory._retrieval_task is not None:  # the one started by this reply
                await asyncio.wait({memory._retrieval_task})
            return "recalled"

        solver = Agent(
            name="solver",
            system_prompt="SOLVER: answer.",
            model=model,
            toolkit=_tools(recall),
            injection_config=InjectionConfig(inject_runtime_state=False),
            middlewares=[
                ModelRouterMiddleware(model, [ChatModelCandidate("policy", model, "anything")]),
                memory,
                RAGMiddleware(
                    [_Notes()],
                    RAGMiddleware.Parameters(mode="static", persist_hint=True),
                    rerank_model=model,
                ),
            ],
        )
        await solver.reply(UserMsg(name="user", content="what is 2+3?"))
        agentscope_rft.emit_reward(0.5)  # the solver's latest turn, not a helper call
        return 1.0

    return helped_solver


async def test_middleware_calls_are_tagged_by_kind_and_train_only_when_asked(tmp_path):
    engine = ScriptedEngine(_reply)
    app = _app(tmp_path)
    report = await agentscope_rft.check_workflow(
        app, {"id": "t"}, engine=engine, timeout=60, show=False
    )
    assert report.rollout.ok, report.rollout.error
    names = [c.agent_name for c in report.rollout.calls]
    assert sorted(set(names)) == ["solver", "solver/memory", "solver/rerank", "solver/router"]
    assert names.count("solver") == 2  # its turns: the recall call, the answer
    assert {s.agent_name for s in report.samples} == {"solver"}
    assert report.samples[0].num_calls == 2
    assert sum(report.samples[-1].token_rewards or []) == 0.5  # emitted to its turn
    rendered = report.render()
    assert "agent solver/memory: 1 call(s), not trained: a memory helper call" in rendered
    assert "('router' is not in explorer.agents.helpers)" in rendered
    assert not report.warnings, report.warnings

    asked = await agentscope_rft.check_workflow(
        app,
        {"id": "t"},
        engine=engine,
        timeout=60,
        show=False,
        agents=AgentsConfig(helpers=["memory", "router"]),
    )
    assert {s.agent_name for s in asked.samples} == {"solver", "solver/memory", "solver/router"}
    assert "agent solver/rerank: 1 call(s), not trained" in asked.render()


class _Mem0:
    """A mem0 client (what `Mem0Middleware` takes as `client=`) that extracts facts with an
    AgentScope chat model the way mem0's AgentScope adapter does: from a worker thread, on an
    event loop of its own; or, like a memory backend built on AgentScope, with an agent of its
    own."""

    def __init__(self, model: ChatModelBase, with_agent: bool) -> None:
        self.model = model
        self.with_agent = with_agent
        self.facts: list[str] = []

    async def search(self, query, **kwargs):
        return {"results": [{"memory": fact} for fact in self.facts]}

    async def add(self, messages, **kwargs):
        if self.with_agent:
            extractor = Agent(name="extractor", system_prompt="EXTRACT facts.", model=self.model)
            reply = await extractor.reply(UserMsg(name="user", content=str(messages)))
            self.facts.append(reply.get_text_content() or "")
            return {"results": []}

        def extract() -> object:
            return asyncio.run(self.model([UserMsg(name="user", content=str(messages))]))

        response = await asyncio.to_thread(extract)
        self.facts.append(str(response.content))
        return {"results": []}


@pytest.mark.parametrize("with_agent", [False, True], ids=["thread", "agent"])
async def test_mem0_write_backs_through_the_policy_are_memory_calls(with_agent):
    async def app(task, model):
        client = _Mem0(model, with_agent)
        memory = Mem0Middleware(user_id="u", client=client, mode="static_control")
        solver = Agent(
            name="solver",
            system_prompt="SOLVER: answer.",
            model=model,
            injection_config=InjectionConfig(inject_runtime_state=False),
            middlewares=[memory],
        )
        for question in ("what is 2+3?", "and 3+2?"):
            await solver.reply(UserMsg(name="user", content=question))
        return 1.0

    report = await agentscope_rft.check_workflow(
        app, {"id": "t"}, engine=ScriptedEngine(_reply), timeout=60, show=False
    )
    assert report.rollout.ok, report.rollout.error
    names = [c.agent_name for c in report.rollout.calls]
    assert names.count("solver/memory") == 2 and names.count("solver") == 2, names
    assert {s.agent_name for s in report.samples} == {"solver"}


@pytest.mark.parametrize(
    ("selection", "message"),
    [
        ({"helpers": ["memroy"]}, "unknown kind of helper call 'memroy'; did you mean 'memory'?"),
        ({"skip": ["solver/router"]}, "name the agent ('solver') and add 'router' to helpers"),
        ({"compression": True}, "replace `compression: true` with `helpers: [compress]`"),
    ],
)
def test_a_bad_helper_selection_says_how_to_fix_it(selection, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        AgentsConfig.model_validate(selection)


def _provider(requests: list[dict]) -> httpx.AsyncClient:
    """Another provider's endpoint, in process: answers a routing question with `policy`."""

    def answer(request: httpx.Request) -> httpx.Response:
        requests.append(json.loads(request.content))
        call = {"name": "generate_structured_output", "arguments": '{"choice": "policy"}'}
        message = {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c0", "type": "function", "function": call}],
        }
        return httpx.Response(
            200,
            json={
                "id": "x",
                "object": "chat.completion",
                "created": 0,
                "model": "gpt-4o-mini",
                "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            },
        )

    return httpx.AsyncClient(transport=httpx.MockTransport(answer))


async def test_a_helper_model_marked_own_provider_stays_with_its_provider():
    requests: list[dict] = []

    async def app(task, model):
        classifier = own_provider(
            OpenAIChatModel(
                credential=OpenAICredential(api_key="k", base_url="http://provider.invalid/v1"),
                model="gpt-4o-mini",
                stream=False,
                client_kwargs={"http_client": _provider(requests)},
            )
        )
        solver = Agent(
            name="solver",
            system_prompt="SOLVER: answer.",
            model=model,
            injection_config=InjectionConfig(inject_runtime_state=False),
            middlewares=[
                ModelRouterMiddleware(classifier, [ChatModelCandidate("policy", model, "any")])
            ],
        )
        await solver.reply(UserMsg(name="user", content="what is 2+3?"))
        return 1.0

    report = await agentscope_rft.check_workflow(
        app, {"id": "t"}, engine=ScriptedEngine(_reply), timeout=60, show=False
    )
    assert report.rollout.ok, report.rollout.error
    assert [c.agent_name for c in report.rollout.calls] == ["solver"]  # no solver/router
    assert len(requests) == 1 and requests[0]["model"] == "gpt-4o-mini"


def test_own_provider_refuses_the_episodes_model():
    from agentscope_rft.integration.agentscope import RolloutScope, rollout_model

    model = rollout_model(RolloutScope("r", "http://gateway.invalid/v1", "k"), "policy")
    with pytest.raises(ValueError, match="given the episode's `model`"):
        own_provider(model)
