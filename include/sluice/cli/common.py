"""What the command modules share: exit codes, a command's :class:`Output`, warnings and the settings of
an invocation."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import Any

from sluice.config import Settings, load_settings

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_DQ_FAILED = 2
EXIT_USAGE = 64  # sysexits.h EX_USAGE: the command line itself is wrong
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report Ctrl-C


@dataclass
class Output:
    """What a command prints: ``text`` for people, ``data`` with ``--json``; and its exit code."""

    code: int
    text: str
    data: dict[str, Any]


def warn(message: str) -> None:
    print(f"sluice: warning: {message}", file=sys.stderr)


def settings_of(args: argparse.Namespace, *, writes: bool | None = None) -> Settings:
    """The settings of this invocation. ``writes`` (True: the command writes the home and the lake; False: it
    only reads them) checks those folders first, so a wrong SLUICE_HOME fails before any Spark work."""
    settings = load_settings(
        home=getattr(args, "home", None), now=getattr(args, "now", None), pipelines=getattr(args, "pipelines", None)
    )
    if writes is not None:
        settings.check_roots(writable=writes)
    return settings
