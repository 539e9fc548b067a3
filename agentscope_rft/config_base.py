"""The base of every config section: strict keys with did-you-mean errors, documented fields.

Component configs (algorithms, buffer, monitor, trainers) subclass `Section` where they live;
`agentscope_rft.config` composes them into the run config.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, model_validator


def did_you_mean(word: object, known: Iterable[str]) -> str:
    """`; did you mean 'x'?` for the closest known name, or "" when none is close.

    Example:
        >>> did_you_mean("lrr", ["lr", "betas"])
        "; did you mean 'lr'?"
    """
    close = difflib.get_close_matches(str(word), sorted(known), n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def unknown_key_message(key: object, known: Iterable[str], label: str = "") -> str:
    """`unknown <label> key 'x'; did you mean 'y'? (known keys: ...)`.

    Example:
        >>> unknown_key_message("lrr", ["lr", "betas"])
        "unknown key 'lrr'; did you mean 'lr'? (known keys: betas, lr)"
    """
    names = sorted(known)
    what = f"{label} key" if label else "key"
    return f"unknown {what} {key!r}{did_you_mean(key, names)} (known keys: {', '.join(names)})"


class Section(BaseModel):
    """A config section: unknown keys are errors that suggest the closest known key."""

    model_config = ConfigDict(
        extra="forbid", validate_assignment=True, use_attribute_docstrings=True
    )
    key_label: ClassVar[str] = ""
    """How error messages name this section's keys (e.g. `buffer` -> "unknown buffer key")."""

    @model_validator(mode="before")
    @classmethod
    def _did_you_mean(cls, data: Any) -> Any:
        if isinstance(data, dict):
            known = set(cls.model_fields) | {f.alias for f in cls.model_fields.values() if f.alias}
            for key in data:
                if key not in known:
                    raise ValueError(unknown_key_message(key, cls.model_fields, cls.key_label))
        return data
