"""Writing a small file whole or not at all."""

from __future__ import annotations

from pathlib import Path


def replace_text(path: Path, text: str) -> None:
    """Write `path` whole or not at all: a reader, or a full disk, never leaves half of it (nor
    the temporary file it is written to first).

    Example:
        >>> replace_text(sweep_dir / "summary.md", table)  # doctest: +SKIP
    """
    partial = path.with_name(path.name + ".tmp")
    try:
        partial.write_text(text)
        partial.replace(path)
    finally:
        partial.unlink(missing_ok=True)
