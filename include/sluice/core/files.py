"""Small state files beside the checkpoints (markers and plans), written so that a crash leaves either the
old content or the new, never half a file."""

from __future__ import annotations

from pathlib import Path


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to a temporary file beside ``path``, then rename it over ``path`` (atomic on a local
    file system)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(path)
