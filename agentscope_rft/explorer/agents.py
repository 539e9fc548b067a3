"""Which agents of a multi-agent episode train (`explorer.agents`).

Every call of an episode is served by the policy and recorded under the AgentScope agent that
made it; this selection only decides which agents' calls become training samples. An agent left
out (a critic, an opponent, a user simulator sharing the policy) still talks to the policy, shows
in the rollout, the dashboard and `check_workflow`, and gives no sample, so it forms no advantage
group and weighs nothing in the loss.

Calls an AgentScope component makes for an agent but that are not the agent's own turns (helper
calls: a context summary, a memory lookup, a router's choice of model, a reranking of retrieved
chunks) are recorded as `<agent>/<kind>` (see `HELPER_KINDS`). They train only when their kind is
listed in `helpers`, and then only for agents that train.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from pydantic import Field, field_validator, model_validator

from agentscope_rft.config_base import Section, did_you_mean

logger = logging.getLogger(__name__)

HELPER_KINDS: dict[str, str] = {
    "compress": "context compression: `Agent.compress_context` summarises the agent's older "
    "context",
    "memory": "long-term memory: AgenticMemoryMiddleware choosing memory files to recall, "
    "Mem0Middleware's and ReMeMiddleware's memory searches and write-backs",
    "router": "ModelRouterMiddleware's classifier choosing the model of a reply",
    "rerank": "RAGMiddleware reranking retrieved chunks",
}
"""The kinds of helper calls the integration tags, recorded as `<agent>/<kind>` (e.g.
`solver/memory`), and what makes them."""
UNNAMED = "-"
"""How a selection (and `check_workflow`) names calls made outside any agent's reply (the
workflow calling its `model` directly)."""


def helper_name(agent_name: str | None, kind: str) -> str:
    """The name a helper call of `kind` made for `agent_name` is recorded under.

    Example:
        >>> helper_name("solver", "memory"), helper_name(None, "router")
        ('solver/memory', '-/router')
    """
    return f"{display_name(agent_name)}/{kind}"


def split_helper(agent_name: str | None) -> tuple[str | None, str | None]:
    """`(agent, kind)` of a helper call's name; `(agent_name, None)` for an agent's own turns.

    Example:
        >>> split_helper("solver/memory"), split_helper("solver"), split_helper("-/router")
        (('solver', 'memory'), ('solver', None), (None, 'router'))
    """
    if agent_name is not None:
        agent, sep, kind = agent_name.rpartition("/")
        if sep and agent and kind in HELPER_KINDS:
            return (None if agent == UNNAMED else agent), kind
    return agent_name, None


def agent_of(agent_name: str | None) -> str:
    """The display name of the agent a call belongs to (a helper call's agent for a helper).

    Example:
        >>> agent_of("solver/compress"), agent_of(None)
        ('solver', '-')
    """
    return display_name(split_helper(agent_name)[0])


def display_name(agent_name: str | None) -> str:
    """The name a selection matches: the agent's name, `-` for a call outside any agent.

    Example:
        >>> display_name("solver"), display_name(None)
        ('solver', '-')
    """
    return agent_name if agent_name is not None else UNNAMED


class AgentsConfig(Section):
    """Which agents' calls train (all are served by the policy and recorded either way).

    An agent that does not train gives no samples: no advantage group, no weight in the loss.

    Example:
        >>> AgentsConfig(skip=["critic"]).trains("critic"), AgentsConfig().trains("solver")
        (False, True)
        >>> AgentsConfig().trains("solver/compress"), AgentsConfig(helpers=["memory"]).trains(
        ...     "solver/memory"
        ... )
        (False, True)
    """

    key_label = "explorer.agents"

    train: list[str] | None = None
    """Names of the agents whose calls train (their AgentScope `Agent(name=...)`; `-`: calls made
    outside any agent's reply); null: every agent but those in `skip`."""
    skip: list[str] = Field(default_factory=list)
    """Names of agents whose calls do not train (a critic, an opponent, a user simulator that
    replies with the policy). Give `train` or `skip`, not both."""
    helpers: list[str] = Field(default_factory=list)
    """Kinds of helper calls that train with their agent: `compress` (context summaries),
    `memory` (long-term memory lookups and write-backs), `router` (a model router's choice),
    `rerank` (reranking retrieved chunks). Such calls are recorded as `<agent>/<kind>` either
    way; none trains by default: a helper call is a different task from the agent's turns and
    the episode reward says little about how well it was done (see docs/workflows.md)."""

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: Any) -> Any:
        if isinstance(data, dict) and "compression" in data:
            fix = (
                "replace `compression: true` with `helpers: [compress]`"
                if data["compression"]
                else "remove `compression: false` (no helper call trains by default)"
            )
            raise ValueError(
                "explorer.agents.compression is now explorer.agents.helpers, the kinds of helper "
                f"calls that train: {fix}"
            )
        return data

    @field_validator("train", "skip", "helpers", mode="before")
    @classmethod
    def _one_name(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value  # `skip: critic` is one agent

    @model_validator(mode="after")
    def _check(self) -> AgentsConfig:
        if self.train is not None and not self.train:
            raise ValueError(
                "explorer.agents.train is empty, so no agent would train: name the agents that "
                "train (e.g. [solver]), or remove the key to train every agent"
            )
        if self.train is not None and self.skip:
            raise ValueError(
                "give explorer.agents.train or explorer.agents.skip, not both: `train` names "
                "the only agents that train, `skip` the agents that do not"
            )
        for name in self.names:
            if not isinstance(name, str) or not name.strip():
                raise ValueError(f"explorer.agents: {name!r} is not an agent name")
            agent, kind = split_helper(name)
            if kind is not None:
                raise ValueError(
                    f"explorer.agents names {name!r}: helper calls train with their agent when "
                    f"their kind is in explorer.agents.helpers; name the agent "
                    f"({display_name(agent)!r}) and add {kind!r} to helpers instead"
                )
        for kind in self.helpers:
            if kind not in HELPER_KINDS:
                raise ValueError(
                    f"explorer.agents.helpers: unknown kind of helper call {kind!r}"
                    f"{did_you_mean(kind, HELPER_KINDS)} (known: {', '.join(HELPER_KINDS)})"
                )
        return self

    @property
    def names(self) -> list[str]:
        """The agent names this selection gives (trained or skipped)."""
        return [*(self.train or []), *self.skip]

    def trains(self, agent_name: str | None) -> bool:
        """Whether calls recorded under `agent_name` become training samples."""
        agent, kind = split_helper(agent_name)
        if kind is not None:
            return kind in self.helpers and self.trains(agent)
        name = display_name(agent_name)
        if self.train is not None:
            return name in self.train
        return name not in self.skip

    def why_not(self, agent_name: str | None) -> str:
        """Why `agent_name`'s calls do not train (for reports)."""
        agent, kind = split_helper(agent_name)
        if kind is not None:
            if kind not in self.helpers:
                return f"a {kind} helper call ({kind!r} is not in explorer.agents.helpers)"
            return self.why_not(agent)
        if self.train is not None:
            return "not in explorer.agents.train"
        return "in explorer.agents.skip"


class UnseenAgentWarning:
    """Warns once per run when the selection names an agent no episode of a batch had."""

    def __init__(self, selection: AgentsConfig) -> None:
        self.selection = selection
        self.warned = False

    def check(self, seen: Iterable[str | None]) -> None:
        """Warn (once) about configured names none of `seen` (a batch's agent names) has."""
        if self.warned or not self.selection.names:
            return
        agents = {agent_of(a) for a in seen}
        if not agents:
            return
        unknown = [n for n in self.selection.names if n not in agents]
        if not unknown:
            return
        self.warned = True
        trained = [a for a in sorted(agents) if self.selection.trains(a)]
        logger.warning(
            "explorer.agents names %s, but no episode of this batch had such an agent (agents "
            "seen: %s; %s). Use the names the app gives its agents (`Agent(name=...)`; `-` for "
            "calls outside any agent)",
            ", ".join(_with_suggestion(n, agents) for n in unknown),
            ", ".join(sorted(agents)),
            f"training: {', '.join(trained)}" if trained else "NONE of them trains",
        )


def _with_suggestion(name: str, known: Iterable[str]) -> str:
    """`'Solver' (did you mean 'solver'?)`, or `'x'` when no known name is close."""
    hint = did_you_mean(name, known)  # "; did you mean 'y'?" or ""
    return f"{name!r} ({hint[2:]})" if hint else repr(name)
