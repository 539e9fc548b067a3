"""Installing the redirect and the agent tagging is idempotent (every episode installs it)."""

from agentscope.agent import Agent

from agentscope_rft.integration.agentscope import install


def test_installing_again_and_again_adds_no_layer():
    install()
    hook = Agent.__dict__["__init_subclass__"]
    for _ in range(3000):  # more episodes than Python's recursion limit
        install()
    assert Agent.__dict__["__init_subclass__"] is hook

    class Mine(Agent):  # subclassing still works (it hit the recursion limit)
        async def reply(self, *args, **kwargs):
            return None

    assert getattr(Mine.__dict__["reply"], "__agentscope_rft_wrapped__", False)


def test_the_helper_calls_are_wrapped_once():
    from agentscope.middleware import ModelRouterMiddleware
    from agentscope.middleware import _rag as rag

    install()
    route, rerank = ModelRouterMiddleware._route, rag._rerank_results
    install()
    assert ModelRouterMiddleware._route is route and rag._rerank_results is rerank
    assert not hasattr(route.__wrapped__, "__wrapped__")  # one layer over AgentScope's own
