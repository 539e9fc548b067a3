"""Base models of the algorithm configs, and the did-you-mean messages for unknown names.

Every algorithm config is a small frozen pydantic model with `extra="forbid"`; unknown keys and
unknown algorithm names fail at config load with a suggestion instead of being ignored.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any

from pydantic import ConfigDict

from agentscope_rft.config_base import Section


def unknown_name_message(kind: str, name: object, known: Iterable[str]) -> str:
    """A one-line error for an unknown name, with the closest known name and the full list.

    Example:
        >>> unknown_name_message("advantage estimator", "rlo", ["grpo", "rloo"])
        "unknown advantage estimator 'rlo' (did you mean 'rloo'?); known: grpo, rloo"
    """
    names = sorted(known)
    close = difflib.get_close_matches(str(name), names, n=1, cutoff=0.5)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"unknown {kind} {name!r}{hint}; known: {', '.join(names)}"


class StrictModel(Section):
    """A frozen config model whose unknown keys fail with a did-you-mean message."""

    model_config = ConfigDict(frozen=True, validate_assignment=False)

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        cls.key_label = cls.__name__


class AdvantageConfigBase(StrictModel):
    """Settings of one advantage estimator; subclasses narrow `type` to their name."""

    type: str
    """Name of the estimator (a key of `ADVANTAGE_ESTIMATORS`)."""

    def uses_critic(self) -> bool:
        """Whether the estimator needs critic values (`AdvantageInputs.values`)."""
        return False

    def uses_group_baseline(self) -> bool:
        """Whether the baseline comes from the task group, so that a group whose rewards are all
        equal carries no signal and can be dropped before training."""
        return False


class PolicyLossConfigBase(StrictModel):
    """Settings of one policy loss; subclasses narrow `type` to their name."""

    type: str
    """Name of the loss (a key of `POLICY_LOSSES`)."""
