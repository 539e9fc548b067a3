"""Generated ALFWorld households: deterministic, unseen test layouts, goals not met at start."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from environments.alfworld.games import game_data, goal_text, problem_pddl
from environments.alfworld.generate import generate
from environments.alfworld.household import ROOMS, SIZES, make_layout, mangle
from environments.alfworld.tasks import TASK_ROOMS, TASK_TYPES, load_tasks, make_household
from environments.jsonl import TaskFileError


def _fingerprint(name: str) -> tuple[str, ...]:
    return tuple(sorted(f"{r.cls}:{r.id}" for r in make_layout(name).receptacles))


def test_layouts_are_deterministic_sized_and_test_layouts_unseen() -> None:
    assert make_layout("kitchen-train-4") == make_layout("kitchen-train-4")
    assert [make_layout(f"bedroom-train-{i}").size for i in range(4)] == [*SIZES, "small"]
    train = {_fingerprint(f"{room}-train-{i}") for room in ROOMS for i in range(8)}
    test = {_fingerprint(f"{room}-test-{i}") for room in ROOMS for i in range(3)}
    assert len(train) == 32 and len(test) == 12 and not train & test
    kitchen = make_layout("kitchen-test-0")
    assert {"Fridge", "Microwave", "SinkBasin"} <= kitchen.classes()
    # Basins are named after their sink, as in ALFRED, so alfworld calls them "sinkbasin 1".
    assert all("_bar_SinkBasin" in r.id for r in kitchen.of_class("SinkBasin"))
    assert (
        mangle("Apple|-01.50|+00.93|+00.03")
        == "Apple_bar__minus_01_dot_50_bar__plus_00_dot_93_bar__plus_00_dot_03"
    )
    with pytest.raises(ValueError, match="unknown room 'garage'"):
        make_layout("garage-train-0")


@pytest.mark.parametrize("task_type", TASK_TYPES)
def test_every_task_type_has_its_ingredients_and_an_unmet_goal(task_type: str) -> None:
    for seed in range(6):
        room = TASK_ROOMS[task_type][seed % len(TASK_ROOMS[task_type])]
        try:
            household = make_household(task_type, f"{room}-train-{seed}", seed)
        except ValueError as error:
            assert "impossible" in str(error)  # e.g. a living room without a lamp holder
            continue
        assert household == make_household(task_type, f"{room}-train-{seed}", seed)
        layout = household.layout
        kinds = {r.id: r.cls for r in layout.receptacles}
        targets = [t for t in household.things if t.cls == household.object_target]
        assert len(targets) >= (2 if task_type == "pick_two_obj_and_place" else 1)
        assert all(kinds[t.receptacle] != household.parent_target for t in targets)
        if task_type == "look_at_obj_in_light":
            assert household.toggle_target == "DeskLamp" and layout.lamps
        appliance = {
            "pick_clean_then_place_in_recep": "SinkBasin",
            "pick_heat_then_place_in_recep": "Microwave",
            "pick_cool_then_place_in_recep": "Fridge",
        }.get(task_type)
        if appliance:
            assert layout.of_class(appliance) and household.parent_target != appliance
        problem = problem_pddl(household)
        assert problem.count("(") == problem.count(")")
        assert f"(objectType ?o {household.object_target}Type)" in problem or (
            f"(objectType ?o1 {household.object_target}Type)" in problem
        )


def test_goal_text_fills_alfworld_templates_into_the_grammar() -> None:
    household = make_household("pick_cool_then_place_in_recep", "kitchen-train-2", 5)
    goal = goal_text(household, 5)
    assert household.object_target.lower() in goal and household.parent_target.lower() in goal
    data = game_data(household, goal)
    assert "UNKNOWN GOAL" not in data["grammar"]
    assert f"Your task is to: {goal}." in data["grammar"]
    assert data["pddl_domain"].startswith(";; Specification in PDDL of the Alfred domain")


def test_unknown_task_type_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown ALFWorld task type 'pick_and_eat'; choose one"):
        make_household("pick_and_eat", "kitchen-train-0", 0)
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps({"id": "t", "task_type": "pick_and_eat", "layout": "x", "seed": 0}))
    with pytest.raises(ValueError, match="unknown ALFWorld task type 'pick_and_eat'"):
        load_tasks(path)
    path.write_text(json.dumps({"id": "t", "task_type": "pick_and_place_simple"}))
    with pytest.raises(
        TaskFileError, match="needs 'game_file', or 'task_type', 'layout' and 'seed'"
    ):
        load_tasks(path)
    with pytest.raises(ValueError, match="impossible in layout 'bathroom-train-0'"):
        make_household("pick_heat_then_place_in_recep", "bathroom-train-0", 0)
    # A negative count is an error, not an empty task file.
    with pytest.raises(ValueError, match=r"task counts must be >= 0, got \{'train': -1\}"):
        generate({"train": -1, "test": 1}, {"train": 8, "test": 80}, seed=0, oracle_check=False)


def test_committed_tasks_rebuild_to_what_was_checked() -> None:
    train, test = load_tasks("train"), load_tasks("test")
    assert {row["task_type"] for row in test} == set(TASK_TYPES)
    assert not {row["layout"] for row in train} & {row["layout"] for row in test}
    for row in train[::25] + test[::5]:
        household = make_household(row["task_type"], row["layout"], row["seed"])
        assert goal_text(household, row["seed"]) == row["goal"]
        assert len(household.layout.receptacles) == row["num_receptacles"]
        assert len(household.things) == row["num_objects"]
        assert len(row["expert_plan"]) == row["expert_steps"] > 0
