"""Why a step explored no training samples, said so the user can fix it."""

from __future__ import annotations

from pathlib import Path


def why_no_samples(metrics: dict[str, float], rollouts: Path) -> str:
    """What left a step without samples: the data operators, an agent selection that trains none
    of the agents that made calls, or the episodes themselves (`rollouts`: where they are logged).

    Example:
        >>> why_no_samples({"trajectory/untrained_calls": 4.0}, Path("run/rollouts.jsonl"))[:53]
        'no agent that made calls trains (explorer.agents): 4 '
    """
    dropped = {
        key.split("/")[1]: int(value)
        for key, value in metrics.items()
        if key.startswith("data/") and key.endswith("/episodes_dropped") and value > 0
    }
    if dropped:
        counts = ", ".join(f"{name}: {count}" for name, count in dropped.items())
        return (
            f"data.operators dropped every episode ({counts} dropped); loosen or remove them, "
            f"the dropped episodes are in {rollouts}"
        )
    untrained = int(metrics.get("trajectory/untrained_calls", 0))
    if untrained and not metrics.get("trajectory/samples"):
        return (
            f"no agent that made calls trains (explorer.agents): {untrained} call(s) of agents "
            f"that do not train; name the agents the app has (their calls are in {rollouts})"
        )
    return f"every episode failed or made no model call; the errors are in {rollouts}"
