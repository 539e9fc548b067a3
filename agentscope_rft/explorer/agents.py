"""Which agents of a multi-agent episode train (`explorer.agents`).

Every call of an episode is served by the policy and recorded under the AgentScope agent that
made it; this selection only decides which agents' calls become training samples. An agent left
out (a critic, an opponent, a user simulator sharing the policy) still talks to the policy, shows
in the rollout, the dashboard and `check_workflow`, and gives no sample, so it forms no advantage
group and weighs nothing in the loss.

An agent's context-compression calls (AgentScope's `Agent.compress_context`, which asks the model
for a summary of the agent's older context) are recorded as `<agent>/compress`. They train only
with `compression: true`, and then only for agents that train.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from pydantic import Field, field_validator, model_validator

from agentscope_rft.config_base import Section, did_you_mean

logger = logging.getLogger(__name__)

COMPRESS_SUFFIX = "/compress"
"""Appended to an agent's name for the calls its `compress_context` makes."""
UNNAMED = "-"
"""How a selection (and `check_workflow`) names calls made outside any agent's reply (the
workflow calling its `model` directly)."""


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
        >>> AgentsConfig().trains("solver/compress")
        False
    """

    key_label = "explorer.agents"

    train: list[str] | None = None
    """Names of the agents whose calls train (their AgentScope `Agent(name=...)`; `-`: calls made
    outside any agent's reply); null: every agent but those in `skip`."""
    skip: list[str] = Field(default_factory=list)
    """Names of agents whose calls do not train (a critic, an opponent, a user simulator that
    replies with the policy). Give `train` or `skip`, not both."""
    compression: bool = False
    """Whether an agent's context-compression calls (AgentScope's `compress_context`, recorded as
    `<agent>/compress`) train with the agent. Off by default: a summary is a different task
    from the agent's turns, it happens only in the episodes that grew long, and the episode
    reward says little about how good the summary was (see docs/workflows.md)."""

    @field_validator("train", "skip", mode="before")
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
            if name.endswith(COMPRESS_SUFFIX):
                raise ValueError(
                    f"explorer.agents names {name!r}: compression calls train with their agent "
                    f"when `explorer.agents.compression` is true; name the agent "
                    f"({name[: -len(COMPRESS_SUFFIX)]!r}) instead"
                )
        return self

    @property
    def names(self) -> list[str]:
        """The agent names this selection gives (trained or skipped)."""
        return [*(self.train or []), *self.skip]

    def trains(self, agent_name: str | None) -> bool:
        """Whether calls recorded under `agent_name` become training samples."""
        name = display_name(agent_name)
        if name.endswith(COMPRESS_SUFFIX) and agent_name is not None:
            return self.compression and self.trains(name[: -len(COMPRESS_SUFFIX)])
        if self.train is not None:
            return name in self.train
        return name not in self.skip

    def why_not(self, agent_name: str | None) -> str:
        """Why `agent_name`'s calls do not train (for reports)."""
        name = display_name(agent_name)
        if name.endswith(COMPRESS_SUFFIX) and agent_name is not None:
            if not self.compression:
                return "a compression call (explorer.agents.compression is false)"
            return self.why_not(name[: -len(COMPRESS_SUFFIX)])
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
        agents = {display_name(a).removesuffix(COMPRESS_SUFFIX) for a in seen}
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
