"""What makes ALFWorld splits honest: a held-out game's room and goal never occur in training.

Two games share a *room* when their layouts have the same receptacles (the same room type and
the same count of every receptacle class: `receptacle_set`); the objects' placements and the
furniture's coordinates do not count, a model could not tell them apart from the text. Two games
share a *goal* when they have the same task type, object class and target (receptacle class, or
the lamp for `look_at_obj_in_light`: `goal_key`). The generator (`generate.py`) draws the
validation games in rooms and goals that training never has, and the test games in rooms and
goals that neither training nor validation has; `overlaps` checks any set of split files.

Both keys are recomputed from `(task_type, layout, seed)`, not read from the rows, so a row that
carries a wrong `receptacle_set` or `goal_key` cannot hide an overlap.

Example:
    >>> from environments.alfworld.tasks import make_household
    >>> household = make_household("pick_and_place_simple", "bedroom-train-0", 3)
    >>> receptacle_set(household.layout)
    'bedroom: Bed x1, Cabinet x1, Drawer x2, SideTable x1'
    >>> goal_key(household)
    'pick_and_place_simple/CellPhone/Drawer'
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from environments.alfworld.household import Layout, make_layout
from environments.alfworld.tasks import Household, make_household


def receptacle_set(layout: Layout) -> str:
    """The room as a model sees it: the room type and how many receptacles of each class."""
    counts = Counter(receptacle.cls for receptacle in layout.receptacles)
    return f"{layout.room}: " + ", ".join(f"{cls} x{n}" for cls, n in sorted(counts.items()))


def goal_key(household: Household) -> str:
    """The goal as a combination: task type, object class and target class."""
    target = household.parent_target or household.toggle_target
    return f"{household.task_type}/{household.object_target}/{target}"


def row_keys(row: Mapping[str, Any]) -> tuple[str, str]:
    """(receptacle set, goal key) of a generated task row, rebuilt from its task_type, layout
    and seed."""
    household = make_household(row["task_type"], row["layout"], row["seed"])
    return receptacle_set(household.layout), goal_key(household)


@dataclass
class Seen:
    """The rooms (receptacle sets) and goals of the splits drawn so far."""

    rooms: set[str] = field(default_factory=set)
    goals: set[str] = field(default_factory=set)

    def add(self, rows: Iterable[Mapping[str, Any]]) -> None:
        """Counts the rooms and goals of these rows as seen."""
        for row in rows:
            room, goal = row_keys(row)
            self.rooms.add(room)
            self.goals.add(goal)

    def has_room(self, layout_name: str) -> bool:
        """Whether a layout's receptacle set has been seen."""
        return receptacle_set(make_layout(layout_name)) in self.rooms


def overlaps(splits: Mapping[str, Iterable[Mapping[str, Any]]]) -> list[str]:
    """Every room or goal that two splits share, as readable lines (empty: disjoint).

    Example:
        >>> from environments.alfworld.tasks import load_tasks
        >>> overlaps({"train": [], "test": load_tasks("test")[:3]})
        []
    """
    keys = {name: [row_keys(row) for row in rows] for name, rows in splits.items()}
    problems: list[str] = []
    names = list(keys)
    for i, first in enumerate(names):
        for second in names[i + 1 :]:
            for kind, index in (("room", 0), ("goal", 1)):
                shared = {k[index] for k in keys[first]} & {k[index] for k in keys[second]}
                problems += [
                    f"{first} and {second} share the {kind} {key!r}" for key in sorted(shared)
                ]
    return problems


def split_summary(rows: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """How many games, distinct rooms (receptacle sets), layouts and goals a split has."""
    rows = list(rows)
    keys = [row_keys(row) for row in rows]
    return {
        "games": len(rows),
        "rooms": len({room for room, _ in keys}),
        "layouts": len({row["layout"] for row in rows}),
        "goals": len({goal for _, goal in keys}),
    }
