"""ALFWorld's six task types, sampled over generated layouts.

A task is a layout plus object placements plus a goal. It is a pure function of
`(task_type, layout name, seed)`, which is what a task row stores.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from alfworld.gen import constants

from environments.alfworld.household import (
    CAN_CONTAIN,
    ROOM_OBJECTS,
    Layout,
    Thing,
    hide_probability,
    holders_of,
    make_layout,
    mangle,
    place,
)
from environments.jsonl import TaskFileError, read_jsonl

TASK_TYPES = (
    "pick_and_place_simple",
    "look_at_obj_in_light",
    "pick_clean_then_place_in_recep",
    "pick_heat_then_place_in_recep",
    "pick_cool_then_place_in_recep",
    "pick_two_obj_and_place",
)
# Rooms where ALFRED has each task (alfworld.gen.constants.GOALS_VALID).
TASK_ROOMS: dict[str, tuple[str, ...]] = {
    "pick_and_place_simple": ("kitchen", "livingroom", "bedroom", "bathroom"),
    "look_at_obj_in_light": ("livingroom", "bedroom"),
    "pick_clean_then_place_in_recep": ("kitchen", "bathroom"),
    "pick_heat_then_place_in_recep": ("kitchen",),
    "pick_cool_then_place_in_recep": ("kitchen",),
    "pick_two_obj_and_place": ("kitchen", "livingroom", "bedroom", "bathroom"),
}
# The appliance a task needs, and the property the object must have.
_STATE_CHANGE = {
    "pick_clean_then_place_in_recep": ("SinkBasin", "Cleanable"),
    "pick_heat_then_place_in_recep": ("Microwave", "Heatable"),
    "pick_cool_then_place_in_recep": ("Fridge", "Coolable"),
}


def check_task_type(task_type: str) -> str:
    """Returns `task_type` if it is one of ALFWorld's six, else raises a clear ValueError."""
    if task_type not in TASK_TYPES:
        raise ValueError(
            f"unknown ALFWorld task type {task_type!r}; choose one of: {', '.join(TASK_TYPES)}"
        )
    return task_type


@dataclass(frozen=True)
class Household:
    """One generated task: the room, where everything starts, and the goal.

    Attributes:
        task_type: One of `TASK_TYPES`.
        layout: The room's furniture.
        things: Movable objects (lamps included), each in a receptacle.
        object_target: ALFRED class of the object to handle, e.g. `Apple`.
        parent_target: Class of the receptacle to put it in (`""` for look tasks).
        toggle_target: Class of the lamp (`"DeskLamp"` for look tasks, else `""`).
    """

    task_type: str
    layout: Layout
    things: tuple[Thing, ...]
    object_target: str
    parent_target: str
    toggle_target: str


def _goal(task_type: str, layout: Layout, rng: random.Random) -> tuple[str, str, str] | None:
    """(object class, receptacle class, lamp class) for a task in this layout, or None."""
    objects = ROOM_OBJECTS[layout.room]
    if task_type == "look_at_obj_in_light":
        if not layout.lamps:
            return None
        candidates = [cls for cls in objects if holders_of(layout, cls)]
        return (rng.choice(candidates), "", layout.lamps[0].cls) if candidates else None
    appliance, ability = _STATE_CHANGE.get(task_type, ("", ""))
    if appliance and not layout.of_class(appliance):
        return None
    able = constants.VAL_ACTION_OBJECTS[ability] if ability else set(objects)
    pairs = [
        (cls, receptacle_cls)
        for cls in objects
        if cls in able
        for receptacle_cls in sorted(layout.classes())
        if receptacle_cls != appliance
        and cls in CAN_CONTAIN.get(receptacle_cls, ())
        # Somewhere else to start, so the goal is not met before the first step.
        and any(r.cls != receptacle_cls for r in holders_of(layout, cls))
    ]
    if not pairs:
        return None
    cls, receptacle_cls = rng.choice(pairs)
    return cls, receptacle_cls, ""


def make_household(task_type: str, layout_name: str, seed: int) -> Household:
    """Builds the task `(task_type, layout_name, seed)`; the same arguments, the same task.

    Args:
        task_type: One of `TASK_TYPES`.
        layout_name: A layout name, e.g. `kitchen-train-3` (see `make_layout`).
        seed: Chooses the goal and the object placements.

    Returns:
        The household.

    Raises:
        ValueError: If the task type is unknown, or impossible in this room (e.g. heating in a
            bathroom, or no lamp).

    Example:
        >>> household = make_household("pick_heat_then_place_in_recep", "kitchen-train-0", 1)
        >>> household.layout.room
        'kitchen'
    """
    check_task_type(task_type)
    layout = make_layout(layout_name)
    rng = random.Random(f"task-{task_type}-{layout_name}-{seed}")
    goal = _goal(task_type, layout, rng)
    if goal is None:
        raise ValueError(f"task type {task_type!r} is impossible in layout {layout_name!r}")
    object_target, parent_target, toggle_target = goal
    avoid = {parent_target} if parent_target else set()
    copies = rng.randint(2, 3) if task_type == "pick_two_obj_and_place" else rng.randint(1, 2)
    hide = hide_probability(layout)
    coordinates_rng = random.Random(f"things-{layout_name}-{seed}")
    things: list[Thing] = list(layout.lamps)
    used_ids = {thing.id for thing in things}

    def add(cls: str, receptacle_id: str) -> None:
        while True:
            xyz = "|".join(f"{coordinates_rng.uniform(-3.5, 3.5):+06.2f}" for _ in range(3))
            thing_id = f"{cls}|{xyz}"
            if thing_id not in used_ids:
                break
        used_ids.add(thing_id)
        things.append(Thing(mangle(thing_id), cls, receptacle_id))

    for _ in range(copies):
        add(object_target, place(layout, rng, object_target, avoid, hide).id)
    clutter = [cls for cls in ROOM_OBJECTS[layout.room] if holders_of(layout, cls)]
    for _ in range(round(len(layout.receptacles) * rng.uniform(0.8, 1.5))):
        cls = rng.choice(clutter)
        # Clutter of the target class must not already satisfy the goal.
        options = [r for r in holders_of(layout, cls) if cls != object_target or r.cls not in avoid]
        if options:
            add(cls, rng.choice(options).id)
    return Household(task_type, layout, tuple(things), object_target, parent_target, toggle_target)


DATA_DIR = Path(__file__).parent / "data"
"""The committed task sets (`train.jsonl`, `test.jsonl`); their games are rebuilt from the rows."""


def load_tasks(split_or_path: str | Path = "test") -> list[dict[str, Any]]:
    """ALFWorld task rows: `"train"`/`"test"` for the shipped sets, or a JSONL path.

    A row is either generated (`task_type`, `layout`, `seed`) or points at a game file
    (`game_file`, e.g. from `environments.alfworld.real.find_games`).

    Raises:
        TaskFileError: On a broken line or a row with neither form.
        ValueError: On an unknown task type.

    Example:
        >>> rows = load_tasks("test")
        >>> sorted(rows[0])[:3]
        ['expert_plan', 'expert_steps', 'goal']
    """
    path = (
        DATA_DIR / f"{split_or_path}.jsonl" if split_or_path in ("train", "test") else split_or_path
    )
    rows = read_jsonl(path)
    for row in rows:
        if "game_file" not in row and not {"task_type", "layout", "seed"} <= set(row):
            raise TaskFileError(
                f"{path}: task {row['id']!r} needs 'game_file', or 'task_type', 'layout' and 'seed'"
            )
        if "task_type" in row:
            check_task_type(row["task_type"])
    return rows
