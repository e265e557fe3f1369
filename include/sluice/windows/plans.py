"""What backfills and corrections share about the windows they rewrite: how a window is written in a plan,
the app transactions their commits carry, and the plan files they keep with the pipeline's checkpoints.

A plan is written before a rewrite's first commit and marked done after its last, so a rerun after a crash
finishes exactly what the first run began (:mod:`sluice.streaming.backfill`, :mod:`sluice.streaming.corrections`).
Each plan is one object under ``<lake>/_checkpoints/pipelines/<pipeline>/``, replaced whole in one write.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sluice.core.windows import Window
from sluice.storage.state import LakeState

#: A window's bounds as gold, the ledger and Spark's window frames name them.
WINDOW_COLUMNS = ["window_start", "window_end"]


def window_key(window: Window) -> str:
    """A window in a plan (JSON): ``<start>/<end>`` in ISO 8601."""
    return f"{window[0].isoformat()}/{window[1].isoformat()}"


def window_of(key: str) -> Window:
    start, end = key.split("/")
    return (datetime.fromisoformat(start), datetime.fromisoformat(end))


@dataclass(frozen=True)
class Commits:
    """The app transactions a backfill commits under: gold ``<prefix>.<output>`` at ``version`` (None: the
    next free version of each table, so every run is a new write), the ledger under ``ledger_app``."""

    prefix: str = "sluice.backfill"
    ledger_app: str = "sluice.ledger.backfill"
    version: int | None = None


class PlanFile:
    """One plan of one pipeline among the lake's state objects (``pipelines/<pipeline>/<name>``)."""

    def __init__(self, state: LakeState, pipeline: str, name: str) -> None:
        self.state = state
        self.parts = ("pipelines", pipeline, name)

    def load(self) -> str | None:
        return self.state.read(*self.parts)

    def save(self, text: str) -> None:
        self.state.write(text, *self.parts)
