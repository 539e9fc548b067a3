"""What a GPU bundle carries: the large wheels the GPU check never imports left out, and the size
a copy of the working tree with the bundle comes to.

A lent GPU machine takes at most 64 MiB a call (the repository's files and the bundle together),
and AgentScope's dependencies include SDKs for model providers the check never calls (anthropic,
dashscope, cryptography: ~10 MiB of 45). `scripts/gpu_bundle.sh` runs the check's CPU dry run with
the `sitecustomize.py` of `--recorder DIR` on the path (every Python process of the run appends
its top-level modules to `$IMPORT_LOG` at exit), then calls this script on the wheels: a wheel
stays when its distribution was imported, when it is small (a module imported only on a CUDA path
costs little to carry), or when it is named in `--keep`.

    python scripts/gpu_bundle_size.py --recorder DIR      # write DIR/sitecustomize.py
    python scripts/gpu_bundle_size.py WHEELS LOG [--keep "a b"] [--small-kib 256]
    python scripts/gpu_bundle_size.py --travel OUT        # MiB a call carries, with OUT

Example:
    >>> normalize("Python_Engineio")
    'python-engineio'
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from importlib.metadata import packages_distributions
from pathlib import Path

CALL_LIMIT_MIB = 64
RECORDER = '''"""Appends the top-level modules to $IMPORT_LOG at exit (gpu_bundle_size.py)."""
import atexit
import os
import sys


def _record() -> None:
    with open(os.environ["IMPORT_LOG"], "a") as log:
        log.write("\\n".join(sorted({name.split(".")[0] for name in list(sys.modules)})) + "\\n")


if os.environ.get("IMPORT_LOG"):
    atexit.register(_record)
'''


def normalize(name: str) -> str:
    """A distribution's name as wheel files and `pip list` compare them."""
    return re.sub(r"[-_.]+", "-", name).lower()


def imported_distributions(modules: set[str]) -> set[str]:
    """The (normalized) distributions, in this environment, that provide `modules`."""
    providers = packages_distributions()
    return {normalize(dist) for module in modules for dist in providers.get(module, [])}


def unused_wheels(
    wheels: list[Path], used: set[str], keep: set[str], small_bytes: int
) -> list[Path]:
    """The wheels to leave out: not imported, not kept, and larger than `small_bytes`."""
    out = []
    for wheel in wheels:
        name = normalize(wheel.name.split("-")[0])
        if name not in used and name not in keep and wheel.stat().st_size > small_bytes:
            out.append(wheel)
    return out


def travel_bytes(root: Path, bundle: Path) -> tuple[int, int]:
    """Bytes a copy of the working tree at `root` carries (tracked files and untracked ones git
    does not ignore) apart from `bundle`, and the bytes of `bundle` (inside the tree or not)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\0")
    bundle = bundle.resolve()
    tree = 0
    for name in dict.fromkeys(listed):
        path = root / name
        if name and path.is_file() and not path.resolve().is_relative_to(bundle):
            tree += path.stat().st_size
    return tree, sum(p.stat().st_size for p in bundle.rglob("*") if p.is_file())


def prune(wheels: Path, log: Path, keep: str, small_kib: int) -> None:
    modules = set(log.read_text().split()) if log.exists() else set()
    if not modules:
        sys.exit(f"gpu_bundle: no imports recorded in {log}: the dry run ran no Python")
    used = imported_distributions(modules)
    keep_names = {normalize(k) for k in keep.split()}
    dropped = unused_wheels(sorted(wheels.glob("*.whl")), used, keep_names, small_kib * 1024)
    size = sum(w.stat().st_size for w in dropped) / 2**20
    for wheel in dropped:
        wheel.unlink()
    names = ", ".join(normalize(w.name.split("-")[0]) for w in dropped) or "none"
    print(
        f"[gpu_bundle] left out {len(dropped)} wheels the check never imports "
        f"({size:.1f} MiB): {names}"
    )


def report_travel(bundle: Path) -> None:
    tree, packed = travel_bytes(Path.cwd(), bundle)
    total = (tree + packed) / 2**20
    print(
        f"[gpu_bundle] a call carries {total:.1f} MiB: this working tree {tree / 2**20:.1f} MiB + "
        f"the bundle {packed / 2**20:.1f} MiB (a lent GPU machine takes {CALL_LIMIT_MIB} MiB)"
    )
    if total > CALL_LIMIT_MIB:
        print(
            f"[gpu_bundle] over {CALL_LIMIT_MIB} MiB for a lent GPU machine: leave out TRL "
            "(--no-trl), or run from a checkout without large untracked files",
            file=sys.stderr,
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("wheels", nargs="?", type=Path, help="the bundle's wheel folder")
    parser.add_argument("log", nargs="?", type=Path, help="the modules the dry run imported")
    parser.add_argument("--recorder", type=Path, help="write sitecustomize.py into this folder")
    parser.add_argument("--travel", type=Path, help="report what a call carries with this bundle")
    parser.add_argument("--keep", default="", help="names always packed (space-separated)")
    parser.add_argument("--small-kib", type=int, default=256, help="wheels this small stay")
    args = parser.parse_args(argv)
    if args.recorder is not None:
        args.recorder.mkdir(parents=True, exist_ok=True)
        (args.recorder / "sitecustomize.py").write_text(RECORDER)
    elif args.travel is not None:
        report_travel(args.travel)
    elif args.wheels is not None and args.log is not None:
        prune(args.wheels, args.log, args.keep, args.small_kib)
    else:
        parser.error("give WHEELS and LOG, --recorder DIR or --travel OUT")


if __name__ == "__main__":
    main()
