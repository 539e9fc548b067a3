"""agentscope-rft: train existing AgentScope agent apps in place with reinforcement fine-tuning.

The public API for agent developers:

    import agentscope_rft

    @agentscope_rft.workflow
    async def run(task: dict, model) -> float: ...

    agentscope_rft.emit_reward(0.5)            # a reward during the episode
    agentscope_rft.emit_state(observation)     # the state of the next call (GiGPO anchors)
    await agentscope_rft.check_workflow(run, task)   # run one episode, see what is captured
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agentscope_rft.types import Reward

__version__ = "0.1.0"

if TYPE_CHECKING:
    from agentscope_rft.api import Workflow, emit_reward, emit_state, workflow
    from agentscope_rft.check import CheckReport, check_workflow

_LAZY = {
    "workflow": "agentscope_rft.api",
    "Workflow": "agentscope_rft.api",
    "emit_reward": "agentscope_rft.api",
    "emit_state": "agentscope_rft.api",
    "check_workflow": "agentscope_rft.check",
    "CheckReport": "agentscope_rft.check",
}


def __getattr__(name: str) -> Any:
    # Importing AgentScope takes a second or two; load it only when the API is used.
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'agentscope_rft' has no attribute {name!r}")


__all__ = [
    "CheckReport",
    "Reward",
    "Workflow",
    "__version__",
    "check_workflow",
    "emit_reward",
    "emit_state",
    "workflow",
]
