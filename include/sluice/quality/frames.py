"""The two small frames GE validates per window (see :mod:`sluice.quality.validator`): the one-row
``window_totals`` frame of window-level numbers, and each output's ``gold_rows`` frame, with the columns
sluice derives for them."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pandas as pd

from sluice.core.checks import Check
from sluice.quality.outcomes import COMPLETENESS_PREFIX

WINDOW_SECONDS_COLUMN = "window_seconds"
DLQ_SHARE_COLUMN = "dlq_share"
GOLD_SUFFIX, BRONZE_SUFFIX = "_gold_total", "_bronze_count"  # the totals frame's columns of a completeness check


@dataclass(frozen=True)
class OutputFrame:
    """The gold rows of one output for one window, with what to check on them. ``prefix`` qualifies the
    outcome names of an output that is not the pipeline's own (``<output>:validity:...``)."""

    name: str
    gold: pd.DataFrame
    keys: tuple[str, ...]
    checks: Sequence[Check] = ()
    prefix: str = ""


def gold_frame(gold: pd.DataFrame, *, keys: Sequence[str], columns: Sequence[str]) -> pd.DataFrame:
    """The columns the gold suite reads, plus the derived window length in seconds.

    A column missing from a non-empty frame is left missing, so its expectations fail with GE's
    "column does not exist"; an empty frame gets the columns it lacks, so zero rows validate cleanly.
    """
    wanted = list(dict.fromkeys([*keys, "window_start", "window_end", *columns]))
    if gold.empty:
        frame = gold.reindex(columns=wanted).reset_index(drop=True)
    else:
        frame = gold[[c for c in wanted if c in gold.columns]].reset_index(drop=True)
    if {"window_start", "window_end"} <= set(frame.columns):
        start, end = _utc(frame["window_start"]), _utc(frame["window_end"])
        frame[WINDOW_SECONDS_COLUMN] = (end - start).dt.total_seconds()
    return frame


def _utc(column: pd.Series) -> pd.Series:
    # The checker's gold rows hold UTC timestamps already; pd.to_datetime would still scan each window's column
    # to decide whether to cache its parse (a tenth of a data-quality step's time on windows of 30k rows).
    if isinstance(column.dtype, pd.DatetimeTZDtype):
        return column.dt.tz_convert("UTC")
    return pd.to_datetime(column, utc=True)


def frame_labels(outcomes: Sequence[str]) -> dict[str, str]:
    """Column-name-safe, distinct labels for completeness outcomes (``completeness:readings`` -> ``readings``,
    ``out:completeness:n`` -> ``out_n``)."""
    labels: dict[str, str] = {}
    for outcome in outcomes:
        label = re.sub(r"\W", "_", outcome.replace(COMPLETENESS_PREFIX, ""))
        while label in labels.values():
            label += "_"
        labels[outcome] = label
    return labels


def totals_frame(completeness: Mapping[str, tuple[int, int]], *, late_rows: int, total_rows: int) -> pd.DataFrame:
    row: dict[str, int | float] = {}
    labels = frame_labels(list(completeness))
    for outcome, (gold_total, bronze_count) in completeness.items():
        row[f"{labels[outcome]}{GOLD_SUFFIX}"] = int(gold_total)
        row[f"{labels[outcome]}{BRONZE_SUFFIX}"] = int(bronze_count)
    row["late_rows"] = int(late_rows)
    row["total_rows"] = int(total_rows)
    row[DLQ_SHARE_COLUMN] = int(late_rows) / max(int(total_rows), 1)
    return pd.DataFrame([row])
