"""The processes a run started (vLLM servers, Ray, an app's environment servers): find and end them.

A stopping run closes its components, which stop their own processes; whatever is still alive
afterwards (a component that could not, an app's subprocess) is terminated here, so a preempted
job leaves no orphans on the node.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from collections.abc import Collection
from pathlib import Path

logger = logging.getLogger(__name__)


def _children_from_proc() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # gone meanwhile
            continue
        # Fields after the command name (which may contain spaces and parentheses).
        fields = stat[stat.rfind(")") + 2 :].split()
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    return children


def descendants(pid: int | None = None) -> list[int]:
    """Process ids of every live descendant of `pid` (default: this process), children first.

    Example:
        >>> descendants() == [] or all(p > 0 for p in descendants())
        True
    """
    root = os.getpid() if pid is None else pid
    try:
        import psutil

        return [p.pid for p in psutil.Process(root).children(recursive=True)]
    except ImportError:
        pass
    except Exception:  # the process is gone
        return []
    if not Path("/proc").is_dir():  # no psutil and no procfs: nothing we can find
        return []
    tree = _children_from_proc()
    found, todo = [], list(tree.get(root, []))
    while todo:
        pid_ = todo.pop(0)
        found.append(pid_)
        todo.extend(tree.get(pid_, []))
    return found


def alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie child of ours is reaped and counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie child counts as gone once reaped
        done, _ = os.waitpid(pid, os.WNOHANG)
        return done == 0
    except ChildProcessError:  # not our child: it is alive (its parent will reap it)
        return True


def kill_descendants(grace: float = 5.0, spare: Collection[int] = ()) -> list[int]:
    """Terminate this process's descendants: SIGTERM, then SIGKILL after `grace` seconds.

    Returns the ids that were still running. With `grace=0` they are killed at once. The ids in
    `spare` (and their descendants) are left running.
    """
    spared = set(spare)
    for pid in spare:
        spared.update(descendants(pid))
    pids = [p for p in descendants() if p not in spared]
    if not pids:
        return []
    first = signal.SIGKILL if grace <= 0 else signal.SIGTERM
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, first)
    if grace > 0:
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(alive(p) for p in pids):
            time.sleep(0.05)
        for pid in pids:
            if alive(pid):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
    for pid in pids:  # reap our own children so none is left a zombie
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
    return pids
