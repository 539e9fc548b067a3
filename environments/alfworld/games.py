"""ALFWorld game files from generated households: PDDL problem, goal text, `traj_data.json`.

The game is what alfworld's own `alfworld-generate` writes (`game.tw-pddl`: the shipped
`alfred.pddl` domain, the `alfred.twl2` grammar with the goal text filled in, and the problem),
so it loads through TextWorld's `PddlEnv` and alfworld's wrappers exactly like downloaded games.
"""

from __future__ import annotations

import functools
import json
import random
from pathlib import Path
from typing import Any

from alfworld.gen import constants, goal_library
from alfworld.info import ALFRED_PDDL_PATH, ALFRED_TWL2_PATH

from environments.alfworld.household import CAN_CONTAIN, OPENABLE
from environments.alfworld.tasks import Household

# Types the domain's actions name as constants; the problem must declare them.
_DOMAIN_RTYPES = ("Fridge", "Microwave", "SinkBasin")
_DOMAIN_OTYPES = ("ButterKnife", "Knife")
_PROPERTIES = {
    "cleanable": "Cleanable",
    "heatable": "Heatable",
    "coolable": "Coolable",
    "sliceable": "Sliceable",
}


@functools.cache
def alfred_logic() -> tuple[str, str]:
    """alfworld's shipped PDDL domain and TextWorld grammar (read once)."""
    return Path(ALFRED_PDDL_PATH).read_text(), Path(ALFRED_TWL2_PATH).read_text()


def goal_text(household: Household, seed: int) -> str:
    """The goal sentence, from alfworld's own templates ("put a hot apple in fridge").

    Example:
        >>> from environments.alfworld.tasks import make_household
        >>> goal_text(make_household("pick_heat_then_place_in_recep", "kitchen-train-0", 1), 0)
        'heat some bread and put it in countertop'
    """
    templates = goal_library.gdict[household.task_type]["templates"]
    template = random.Random(f"goal-{seed}").choice(templates)
    return template.format(
        obj=household.object_target.lower(),
        recep=household.parent_target.lower(),
        toggle=household.toggle_target.lower(),
        mrecep="",
    )


def goal_pddl(household: Household) -> str:
    """The `(:goal ...)` block (plus the problem's closing parenthesis), from alfworld."""
    template = goal_library.gdict[household.task_type]["pddl"]
    return template.format(
        obj=household.object_target,
        recep=household.parent_target,
        toggle=household.toggle_target,
        mrecep="",
    ).replace("#", "-")


def problem_pddl(household: Household) -> str:
    """The PDDL problem, in the shape of ALFWorld's `initial_state.pddl`."""
    layout = household.layout
    where = {receptacle.id: receptacle for receptacle in layout.receptacles}
    object_classes = sorted({thing.cls for thing in household.things} | set(_DOMAIN_OTYPES))
    receptacle_classes = sorted(layout.classes() | set(_DOMAIN_RTYPES))
    locations = [receptacle.location for receptacle in layout.receptacles] + [layout.start]
    objects = [
        "agent1 - agent",
        *(f"{cls}Type - otype" for cls in object_classes),
        *(f"{cls}Type - rtype" for cls in receptacle_classes),
        *(f"{thing.id} - object" for thing in household.things),
        *(f"{receptacle.id} - receptacle" for receptacle in layout.receptacles),
        *(f"{location} - location" for location in locations),
    ]
    init = [f"(receptacleType {r.id} {r.cls}Type)" for r in layout.receptacles]
    init += [f"(objectType {thing.id} {thing.cls}Type)" for thing in household.things]
    present = sorted({thing.cls for thing in household.things})
    init += [
        f"(canContain {receptacle_cls}Type {cls}Type)"
        for receptacle_cls in sorted(layout.classes())
        for cls in present
        if cls in CAN_CONTAIN.get(receptacle_cls, ())
    ]
    for thing in household.things:
        if thing.cls in constants.VAL_ACTION_OBJECTS["Toggleable"]:
            init.append(f"(toggleable {thing.id})")
            continue
        init.append(f"(pickupable {thing.id})")
        if thing.cls in constants.MOVABLE_RECEPTACLES_SET:
            init.append(f"(isReceptacleObject {thing.id})")
        for predicate, ability in _PROPERTIES.items():
            if thing.cls in constants.VAL_ACTION_OBJECTS[ability]:
                init.append(f"({predicate} {thing.id})")
    init += [f"(openable {r.id})" for r in layout.receptacles if r.cls in OPENABLE]
    init.append(f"(atLocation agent1 {layout.start})")
    init += [f"(receptacleAtLocation {r.id} {r.location})" for r in layout.receptacles]
    for thing in household.things:
        receptacle = where[thing.receptacle]
        init.append(f"(inReceptacle {thing.id} {receptacle.id})")
        init.append(f"(objectAtLocation {thing.id} {receptacle.location})")
        if receptacle.cls == "Fridge" and thing.cls in constants.VAL_ACTION_OBJECTS["Coolable"]:
            init.append(f"(isCool {thing.id})")  # as in ALFRED: what is in the fridge is cold
    indent = "\n        "
    return (
        f"(define (problem plan_{layout.name})\n"
        "    (:domain alfred)\n"
        f"    (:objects{indent}{indent.join(objects)}\n    )\n"
        f"    (:init{indent}{indent.join(init)}\n    )\n"
        f"{goal_pddl(household)}\n"
    )


def game_data(household: Household, goal: str) -> dict[str, Any]:
    """The content of a `game.tw-pddl` file for a household and its goal sentence."""
    domain, grammar = alfred_logic()
    return {
        "pddl_domain": domain,
        "grammar": grammar.replace("UNKNOWN GOAL", goal),
        "pddl_problem": problem_pddl(household),
        "solvable": True,
        "walkthrough": None,
    }


def traj_data(household: Household, goal: str, task_id: str) -> dict[str, Any]:
    """The `traj_data.json` that alfworld's tools read next to a game file."""
    return {
        "task_id": task_id,
        "task_type": household.task_type,
        "pddl_params": {
            "object_target": household.object_target,
            "parent_target": household.parent_target,
            "toggle_target": household.toggle_target,
            "mrecep_target": "",
            "object_sliced": False,
        },
        "scene": {"floor_plan": household.layout.name, "room": household.layout.room},
        "turk_annotations": {"anns": [{"task_desc": goal, "high_descs": [], "votes": []}]},
    }


def write_game_dir(
    folder: str | Path, household: Household, goal: str, task_id: str, walkthrough: list[str]
) -> Path:
    """Writes `game.tw-pddl`, `initial_state.pddl` and `traj_data.json` as ALFWorld lays them out.

    Returns:
        The path of `game.tw-pddl`.

    Example:
        >>> write_game_dir("/tmp/g", household, goal, "t0", plan)  # doctest: +SKIP
        PosixPath('/tmp/g/game.tw-pddl')
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    data = game_data(household, goal) | {"walkthrough": walkthrough}
    (folder / "game.tw-pddl").write_text(json.dumps(data))
    (folder / "initial_state.pddl").write_text(data["pddl_problem"])
    traj = traj_data(household, goal, task_id)
    (folder / "traj_data.json").write_text(json.dumps(traj, indent=2))
    return folder / "game.tw-pddl"
