"""The README's tutorial pipeline, taken from the README itself, so that the tutorial users copy is the one
the tests run."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def tutorial_files() -> dict[str, str]:
    """``{file name: python source}`` for every ``<!-- tutorial:NAME -->`` block of the README."""
    text = README.read_text()
    found = re.findall(r"<!-- tutorial:(\S+) -->\n```python\n(.*?)```", text, flags=re.S)
    assert found, "the README has no tutorial block"
    return dict(found)


def write_tutorial(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, source in tutorial_files().items():
        (folder / name).write_text(source)
    return folder
