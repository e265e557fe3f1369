"""The README's tutorial, taken from the README itself, so that the tutorial users copy is the one the tests
run: its pipeline file (the ``<!-- tutorial:NAME -->`` block) and, for tests/test_tutorial.py, every step
of the section "Your own pipeline in five minutes" in order."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"
TUTORIAL_SECTION = "Your own pipeline in five minutes"


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


def section(title: str = TUTORIAL_SECTION, readme: Path = README) -> str:
    """The text of the README's ``## title`` section, up to the next ``## `` heading."""
    text = readme.read_text()
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, flags=re.S | re.M)
    assert match, f"{readme} has no section '## {title}'"
    return match.group(1)


@dataclass
class Command:
    """One shell command of a ```bash block: continuation lines joined, comments stripped. ``exit_code`` is
    what its comment announces (``# ... exits 2 ...``), else 0."""

    text: str
    exit_code: int = 0


@dataclass
class Step:
    """A step of the tutorial, in the README's order: ``commands`` of one ```bash block, with ``expected``
    the lines of the plain ``` block right after it (the output the README shows for its last command), or
    ``file``/``source``, a ``<!-- tutorial:NAME -->`` block (the editor step)."""

    commands: list[Command] = field(default_factory=list)
    expected: list[str] = field(default_factory=list)
    file: str | None = None
    source: str = ""


def strip_comment(line: str) -> tuple[str, str]:
    """``(code, comment)`` of a shell line: a ``#`` at the start or after a blank, outside quotes, starts the
    comment."""
    quote = None
    for i, char in enumerate(line):
        if quote:
            if char == quote:
                quote = None
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip(), line[i + 1:].strip()
    return line.rstrip(), ""


def shell_commands(block: str) -> list[Command]:
    """The commands of a ```bash block, in order."""
    commands: list[Command] = []
    pending: list[str] = []
    comments: list[str] = []
    for raw in block.splitlines():
        code, comment = strip_comment(raw)
        comments.append(comment)
        if not code.strip() and not pending:
            comments = []
            continue
        pending.append(code)
        if code.endswith("\\"):
            continue
        announced = re.search(r"\bexits (\d+)\b", " ".join(comments))
        commands.append(Command("\n".join(pending), int(announced.group(1)) if announced else 0))
        pending, comments = [], []
    assert not pending, f"a command ends in a line continuation: {pending}"
    return commands


def tutorial_steps(title: str = TUTORIAL_SECTION, readme: Path = README) -> list[Step]:
    """Every ```bash block, shown output and tutorial file of the section, in order."""
    text = section(title, readme)
    steps: list[Step] = []
    fence = re.compile(r"(?:<!-- tutorial:(?P<file>\S+) -->\n)?^```(?P<lang>\w*)\n(?P<body>.*?)^```\n", re.S | re.M)
    for match in fence.finditer(text):
        lang, body = match.group("lang"), match.group("body")
        if match.group("file"):
            steps.append(Step(file=match.group("file"), source=body))
        elif lang == "bash":
            steps.append(Step(commands=shell_commands(body)))
        elif lang == "" and steps and steps[-1].commands and not steps[-1].expected:
            steps[-1].expected = [line for line in body.splitlines() if line.strip()]
    return steps
