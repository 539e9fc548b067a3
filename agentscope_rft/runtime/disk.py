"""A run whose disk fills up: one error that names the folder, the space, and the fix.

Long runs fill disks with checkpoints, rollouts and buffers. A write that fails for want of space
stops the run with a `DiskFullError` (one line from the CLI, not a chain of tracebacks), and what
was stored before stays whole: a checkpoint is whole only once its `run_state.json` is written
(last), `state.json` is replaced atomically, and the JSONL files' readers skip a torn last line.
A checkpoint cut short is deleted at once: it can never be resumed, and it holds the space.
"""

from __future__ import annotations

import contextlib
import errno
import shutil
import traceback
from collections.abc import Iterator, Mapping
from pathlib import Path

from agentscope_rft.buffer.base import BufferFormatError
from agentscope_rft.buffer.config import BufferConfig
from agentscope_rft.buffer.schema import to_url
from agentscope_rft.runtime.best import RUN_STATE_FILE
from agentscope_rft.runtime.components import STATE_FILE, RunFolderError, read_state

FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
FULL_TEXTS = ("no space left on device", "os error 28", "disk quota exceeded", "disk is full")
"""How a full disk reads where a library drops the errno (safetensors, SQLite)."""
LOW_SPACE = 1 << 20
"""Free bytes under which a write that failed without saying why failed for want of space
(`torch.save` reports a full disk as `unexpected pos ...`)."""


class DiskFullError(RunFolderError):
    """The disk (or quota) of a run folder filled up while the run wrote to it."""


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """`exc` and the exceptions it was raised from (or while handling)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def is_disk_full(exc: BaseException) -> bool:
    """Whether `exc`, or an exception it was raised from, is the disk or the quota being full.

    Example:
        >>> is_disk_full(OSError(errno.ENOSPC, "No space left on device"))
        True
    """
    return any(
        (isinstance(error, OSError) and error.errno in FULL_ERRNOS)
        or any(text in str(error).lower() for text in FULL_TEXTS)
        for error in _chain(exc)
    )


def disk_usage(path: Path) -> tuple[int, int] | None:
    """(free bytes for this user, size) of the file system of `path` (or of its nearest existing
    parent); None where it cannot be read."""
    for folder in (path, *path.parents):
        if folder.exists():
            try:
                usage = shutil.disk_usage(folder)
            except OSError:
                return None
            return usage.free, usage.total
    return None


def free_bytes(path: Path) -> int | None:
    """Free bytes (for this user) on the file system of `path` (or of its nearest parent)."""
    usage = disk_usage(path)
    return None if usage is None else usage[0]


def folder_bytes(folder: Path) -> int:
    """The bytes of the files under `folder` (0 when it does not exist)."""
    if not folder.is_dir():
        return 0
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file() and not f.is_symlink())


def size_text(count: int) -> str:
    """`count` bytes for a person: `512 KB`, `37.2 MB`, `14.9 GB`.

    Example:
        >>> size_text(39_000_000)
        '39.0 MB'
    """
    if count < 1000:
        return f"{count} bytes"
    value = count / 1000
    for unit in ("KB", "MB", "GB"):
        if value < 1000 or unit == "GB":
            break
        value /= 1000
    return f"{value:.1f} {unit}"


@contextlib.contextmanager
def saving_checkpoint(run_dir: Path, target: Path, keep_checkpoints: int) -> Iterator[None]:
    """Save the checkpoint folder `target` under this: a save that runs out of space deletes what
    it wrote and raises `DiskFullError`, saying what a checkpoint takes, what is free, and what a
    resume starts from; other failures pass through as they are.

    Example:
        >>> target = run_dir / "checkpoints/step-000004"  # doctest: +SKIP
        >>> with saving_checkpoint(run_dir, target, keep_checkpoints=2):  # doctest: +SKIP
        ...     trainer.save(target)
    """
    if not run_dir.is_dir():  # (saving would make it again, holding this checkpoint alone)
        raise folder_gone(run_dir)
    try:
        yield
    except Exception as exc:
        free = free_bytes(target)
        if not (is_disk_full(exc) or (free is not None and free < LOW_SPACE)):
            raise
        written = folder_bytes(target)
        # The writer that failed (torch.save's) holds its file open from the traceback's frames:
        # the space comes back only once it is closed, and the run's last writes need it.
        for error in _chain(exc):
            traceback.clear_frames(error.__traceback__)
        # run_state.json comes last, so this folder is no whole checkpoint; it holds the space
        shutil.rmtree(target, ignore_errors=True)
        raise DiskFullError(_checkpoint_full(run_dir, target, keep_checkpoints, written)) from exc


def _checkpoint_full(run_dir: Path, target: Path, keep: int, written: int) -> str:
    whole = sorted(
        f for f in target.parent.glob("step-*") if (f / RUN_STATE_FILE).is_file() and f != target
    )
    size = folder_bytes(whole[-1]) if whole else 0
    needs = (
        f"a checkpoint of this run takes {size_text(size)}"
        if size
        else f"it had written {size_text(written)} when the disk filled"
    )
    usage = disk_usage(run_dir)
    space = f", on a disk of {size_text(usage[1])}" if usage is not None else ""
    try:
        resume = (
            "the checkpoints saved before it are intact: once there is room, resume from step "
            f"{int(read_state(run_dir)['step'])} ({STATE_FILE}) with `agentscope-rft train "
            f"--resume {run_dir}`"
        )
    except (RunFolderError, KeyError, ValueError, TypeError):
        resume = (
            "no checkpoint was saved before it: once there is room, start the run again (--set "
            "run.overwrite=true)"
        )
    return (
        f"no space left on the disk of {run_dir}: saving checkpoint {target} failed and was "
        f"deleted ({needs}{space}); {resume}. Make room: keep fewer checkpoints "
        f"(run.keep_checkpoints: {keep}; the disk holds {keep + 1} while a new one is saved), "
        "delete other runs' folders, or move the run folder to a disk with room and resume it "
        "there"
    )


def disk_full_error(
    run_dir: Path, exc: BaseException, others: Mapping[Path, str] | None = None
) -> DiskFullError:
    """The `DiskFullError` of a run (folder `run_dir`) whose write `exc` found a disk full: the
    disk named is the one of the file written (the error's, else the one of `others` (files
    outside the run folder, by the setting that names them) or `run_dir` with no room left).

    Example:
        >>> error = disk_full_error(run_dir, exc, {Path("/d/b.db"): "buffer.url"})  # doctest: +SKIP
    """
    named = [Path(f) for f in filenames(exc)]
    full = next(
        (p for p in (*named, *(others or {}), run_dir) if (free_bytes(p) or 0) < LOW_SPACE),
        None,
    )
    where = full or (named[0] if named else run_dir)
    usage = disk_usage(where)
    space = f" (a disk of {size_text(usage[1])}, {size_text(usage[0])} free)" if usage else ""
    resume = (
        f"`agentscope-rft train --resume {run_dir}`"
        if (run_dir / STATE_FILE).is_file()
        else "start the run again (--set run.overwrite=true: it saved no checkpoint yet)"
    )
    if where != run_dir and run_dir not in where.parents:
        name = others.get(where) if others else None
        setting = f" and point {name} at it" if name else ""
        return DiskFullError(
            f"no space left on the disk of {where}{space}: {exc}. The run folder {run_dir} is "
            f"intact: make room there, or move {where.name} to a disk with room{setting}, then "
            f"{resume}"
        )
    return DiskFullError(
        f"no space left on the disk of {run_dir}{space}: {exc}. What was written before is "
        "intact (a torn last line of a .jsonl file is skipped by its readers). Make room (fewer "
        "run.keep_checkpoints, other runs' folders deleted, or the run folder moved to a disk "
        f"with room), then {resume}"
    )


def filenames(exc: BaseException) -> Iterator[str]:
    """The files named by `exc` and the errors it came from.

    Example:
        >>> list(filenames(FileNotFoundError(2, "No such file or directory", "runs/a/x.jsonl")))
        ['runs/a/x.jsonl']
    """
    for error in _chain(exc):
        for name in (getattr(error, "filename", None), getattr(error, "filename2", None)):
            if isinstance(name, str) and name:
                yield name


def write_failure(exc: OSError, source: Path) -> str:
    """Why copying the folder `source` failed, in one line: the first error of a `copytree`
    (not the list of every file's), and on a full disk what the copy takes and what to do.

    Example:
        >>> write_failure(OSError(errno.EACCES, "Permission denied"), Path("m"))
        'Permission denied'
    """
    errors = exc.args[0] if isinstance(exc, shutil.Error) and exc.args else None
    if isinstance(errors, list) and errors and len(errors[0]) == 3:
        why = str(errors[0][2])
    else:
        why = exc.strerror or str(exc)
    if not is_disk_full(exc):
        return why
    return (
        f"{why} (the copy takes {size_text(folder_bytes(source))}); nothing was left there: "
        "make room, or give --out a folder on a disk with room"
    )


def sqlite_files(buffer: BufferConfig) -> dict[Path, str]:
    """The SQLite file of a `sql` buffer given a `url` (which may be on another disk than the
    run folder); none for another buffer or database.

    Example:
        >>> sqlite_files(BufferConfig(type="sql", url="sqlite:////data/buffer.db"))
        {PosixPath('/data/buffer.db'): 'buffer.url'}
    """
    if buffer.type != "sql" or buffer.url is None:
        return {}
    try:
        url = to_url(buffer.url)
    except BufferFormatError:
        return {}
    if url.get_backend_name() != "sqlite" or not url.database:
        return {}
    return {Path(url.database): "buffer.url"}


def folder_gone(run_dir: Path) -> RunFolderError:
    """The error of a run whose folder was deleted (or its disk unmounted) while it ran.

    Example:
        >>> if not run_dir.is_dir():  # doctest: +SKIP
        ...     raise folder_gone(run_dir)
    """
    return RunFolderError(
        f"the run folder {run_dir} is gone (deleted, moved, or its disk unmounted while the run "
        "wrote to it): the run cannot go on without it. Put it back and `agentscope-rft train "
        f"--resume {run_dir}`, or start the run again"
    )


def explore_disk_full(out_dir: Path, exc: BaseException) -> DiskFullError:
    """The `DiskFullError` of an `explore` into `out_dir` whose write found the disk full.

    Example:
        >>> raise explore_disk_full(Path("runs/x/explore-test"), exc) from exc  # doctest: +SKIP
    """
    usage = disk_usage(out_dir)
    space = f" (a disk of {size_text(usage[1])}, {size_text(usage[0])} free)" if usage else ""
    return DiskFullError(
        f"no space left on the disk of {out_dir}{space}: {exc}. Make room, or explore into a "
        "folder on a disk with room (--set run.dir=<folder>), and run the command again"
    )
