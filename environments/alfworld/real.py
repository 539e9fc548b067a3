"""Real ALFWorld data: task rows for downloaded games, and export of generated games.

With the data that `alfworld-download` fetches (`$ALFWORLD_DATA/json_2.1.1/<split>/...`), each
game folder holds `game.tw-pddl` and `traj_data.json`; `find_games` turns them into task rows
that `AlfworldEnv` plays unchanged. `export_games` writes generated tasks in the same layout, so
alfworld's own tools (`alfworld-play-tw`, `AlfredTWEnv`) run them too.

    python -m environments.alfworld.real --split valid_unseen --out alfworld_valid_unseen.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from environments.alfworld.games import goal_text, write_game_dir
from environments.alfworld.tasks import TASK_TYPES, check_task_type, make_household
from environments.jsonl import write_jsonl

SPLITS = ("train", "valid_seen", "valid_unseen")


def data_root(data_dir: str | Path | None = None) -> Path:
    """The ALFWorld data folder: `data_dir`, else `$ALFWORLD_DATA`.

    Raises:
        FileNotFoundError: If neither is set, or the folder has no `json_2.1.1`.
    """
    root = data_dir or os.environ.get("ALFWORLD_DATA")
    if not root:
        raise FileNotFoundError(
            "ALFWORLD_DATA is not set; point it at the folder `alfworld-download` fills "
            "(the one that contains json_2.1.1/), or use the generated tasks"
        )
    # Absolute, so that the rows' `game_file` paths hold from any working directory.
    root = Path(root).expanduser().resolve()
    if not (root / "json_2.1.1").is_dir():
        raise FileNotFoundError(
            f"{root}: no json_2.1.1/ folder; ALFWORLD_DATA must point at downloaded ALFWorld data"
        )
    return root


def find_games(
    split: str = "valid_unseen",
    data_dir: str | Path | None = None,
    task_types: Iterable[str] = TASK_TYPES,
) -> list[dict[str, Any]]:
    """Task rows for the solvable games of one ALFWorld split, as alfworld itself selects them.

    Args:
        split: `train`, `valid_seen` (ALFWorld's in-distribution eval) or `valid_unseen`
            (out-of-distribution: unseen rooms).
        data_dir: The data folder; default `$ALFWORLD_DATA`.
        task_types: Keep only these task types.

    Returns:
        Rows `{"id", "source", "split", "task_type", "goal", "game_file"}`, sorted by path.

    Raises:
        FileNotFoundError: If there is no data, or the split has no games (the message counts
            the game folders left out, by reason).
        ValueError: On an unknown split or task type, or a game folder whose `traj_data.json`
            or `game.tw-pddl` is not a JSON object, or whose `traj_data.json` lacks its task
            type or has malformed annotations (the file is named).

    Example:
        >>> rows = find_games("valid_unseen")  # doctest: +SKIP
        >>> len(rows)  # doctest: +SKIP
        134
    """
    if split not in SPLITS:
        raise ValueError(f"unknown ALFWorld split {split!r}; choose one of {', '.join(SPLITS)}")
    wanted = {check_task_type(task_type) for task_type in task_types}
    base = data_root(data_dir) / "json_2.1.1" / split
    if not base.is_dir():
        present = sorted(p.name for p in base.parent.iterdir() if p.is_dir())
        raise FileNotFoundError(
            f"{base}: no such folder (json_2.1.1 has: {', '.join(present) or 'nothing'}); "
            "`alfworld-download` fetches train, valid_seen and valid_unseen"
        )
    rows = []
    skipped: Counter[str] = Counter()
    for traj_path in sorted(base.rglob("traj_data.json")):
        folder = traj_path.parent
        game_path = folder / "game.tw-pddl"
        # The same filters as alfworld's AlfredTWEnv.collect_game_files.
        if "movable" in str(folder) or "Sliced" in str(folder):
            skipped["movable or sliced (alfworld skips them)"] += 1
            continue
        if not game_path.is_file():
            skipped["without game.tw-pddl"] += 1
            continue
        traj = _read_object(traj_path)
        if not isinstance(traj.get("task_type"), str):
            raise ValueError(
                f"{traj_path}: no 'task_type' text; an ALFWorld traj_data.json names its task "
                "type: re-download the game folder or remove it"
            )
        if traj["task_type"] not in wanted:
            skipped["of other task types"] += 1
            continue
        if not _read_object(game_path).get("solvable"):
            skipped["not marked solvable"] += 1
            continue
        rows.append(
            {
                "id": f"alfworld-{split}-{folder.parent.name}-{folder.name}",
                "source": "alfworld",
                "split": split,
                "task_type": traj["task_type"],
                "goal": _annotated_goal(traj, traj_path),
                "game_file": str(game_path),
            }
        )
    if not rows:
        found = sum(skipped.values())
        why = ", ".join(f"{count} {reason}" for reason, count in sorted(skipped.items()))
        hint = (
            "; game.tw-pddl files come with the games `alfworld-download` fetches"
            if skipped["without game.tw-pddl"]
            else ""
        )
        raise FileNotFoundError(
            f"{base}: no solvable games of types {sorted(wanted)} in {found} game folders"
            f"{f' ({why})' if why else ''}{hint}"
        )
    return rows


def _annotated_goal(traj: dict[str, Any], path: Path) -> str:
    """The first annotator's `task_desc` of a `traj_data.json` ("" without annotations)."""
    annotations = traj.get("turk_annotations", {"anns": []})
    anns = annotations.get("anns") if isinstance(annotations, dict) else None
    if not isinstance(anns, list) or not all(isinstance(ann, dict) for ann in anns):
        raise ValueError(
            f'{path}: \'turk_annotations\' must be {{"anns": [{{"task_desc": ...}}, ...]}}, '
            f"got {json.dumps(annotations)[:80]}; re-download the game folder or remove it"
        )
    if not anns:
        return ""
    goal = anns[0].get("task_desc")
    if not isinstance(goal, str):
        raise ValueError(
            f"{path}: the first of 'turk_annotations.anns' has no 'task_desc' text; re-download "
            "the game folder or remove it"
        )
    return goal


def _read_object(path: Path) -> dict[str, Any]:
    """A JSON object file of a game folder, or a ValueError naming the file."""
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(
            f"{path}: not readable JSON ({exc}); re-download the game folder or remove it"
        ) from exc
    if not isinstance(data, dict):
        raise ValueError(
            f"{path}: expected a JSON object, got {type(data).__name__}; re-download the game "
            "folder or remove it"
        )
    return data


def export_games(tasks: Iterable[dict[str, Any]], out: str | Path, split: str) -> list[Path]:
    """Writes generated tasks as ALFWorld game folders under `out/json_2.1.1/<split>/`.

    Args:
        tasks: Generated task rows (`task_type`, `layout`, `seed`; `expert_plan` if present
            becomes the game's walkthrough).
        out: The data root to write (use it as `ALFWORLD_DATA`).
        split: One of `SPLITS`.

    Returns:
        The written `game.tw-pddl` paths.

    Example:
        >>> from environments.alfworld.tasks import load_tasks
        >>> tasks = load_tasks("test")[:2]
        >>> paths = export_games(tasks, "/tmp/alfworld", "valid_unseen")  # doctest: +SKIP
    """
    if split not in SPLITS:
        raise ValueError(f"unknown ALFWorld split {split!r}; choose one of {', '.join(SPLITS)}")
    paths = []
    for task in tasks:
        household = make_household(task["task_type"], task["layout"], task["seed"])
        folder = Path(out) / "json_2.1.1" / split / f"{task['task_type']}-{task['layout']}"
        folder /= f"trial_{task['id']}"
        goal = goal_text(household, task["seed"])
        plan = list(task.get("expert_plan") or [])
        paths.append(write_game_dir(folder, household, goal, str(task["id"]), plan))
    return paths


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point: write task rows for a downloaded ALFWorld split."""
    parser = argparse.ArgumentParser(description="Task rows for downloaded ALFWorld games.")
    parser.add_argument("--split", default="valid_unseen", choices=SPLITS)
    parser.add_argument("--data", help="ALFWorld data folder (default: $ALFWORLD_DATA)")
    parser.add_argument("--out", type=Path, required=True, help="JSONL file to write")
    args = parser.parse_args(argv)
    try:
        rows = find_games(args.split, args.data)
    except (ValueError, FileNotFoundError) as error:  # no data folder, no games, a broken file
        parser.exit(2, f"error: {error}\n")
    print(f"{write_jsonl(args.out, rows)} games -> {args.out}")


if __name__ == "__main__":
    main()
