"""Windows for the data-quality suites (SPEC 5) as pipelines/ad_clicks_hourly.py declares them: gold rows, totals
and the checks of both outputs, plus helpers that validate them with a real :class:`WindowValidator` (no Spark)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

import pandas as pd

from sluice import checks
from sluice.checks import Check
from sluice.quality.frames import OutputFrame
from sluice.quality.outcomes import ExpectationOutcome, WindowValidation
from sluice.quality.validator import WindowValidator

START = datetime(2024, 5, 1, 12, tzinfo=UTC)
END = START + timedelta(hours=1)
PIPELINE = "ad_clicks_hourly"
UNMATCHED = "unmatched_clicks_hourly"
PREFIX = f"{UNMATCHED}:"

# As declared by pipelines/ad_clicks_hourly.py (completeness lives in the totals suite, so only the row checks
# reach an OutputFrame).
AD_CHECKS: tuple[Check, ...] = (
    checks.between("ctr", 0, 1),
    checks.between("impressions", 0, name="counts_non_negative"),
    checks.between("clicks", 0, name="counts_non_negative"),
)
UNMATCHED_CHECKS: tuple[Check, ...] = (checks.between("unmatched_clicks", 0, name="counts_non_negative"),)

TOTALS_NAMES = [
    "completeness:impressions",
    "completeness:clicks",
    "lateness:dlq_share_within_threshold",
]
GOLD_NAMES = [
    "validity:no_null_keys",
    "validity:ctr_between_0_and_1",
    "validity:counts_non_negative",
    "validity:window_is_one_hour",
]
ALL_NAMES = TOTALS_NAMES + GOLD_NAMES
UNMATCHED_COMPLETENESS = f"{PREFIX}completeness:unmatched_clicks"
UNMATCHED_NAMES = [
    f"{PREFIX}validity:no_null_keys",
    f"{PREFIX}validity:counts_non_negative",
    f"{PREFIX}validity:window_is_one_hour",
]


def utc_series(values: Sequence[datetime]) -> pd.Series:
    return pd.Series(list(values), dtype="datetime64[us, UTC]")


def gold_rows(start: datetime = START, n: int = 3) -> pd.DataFrame:
    """n clean ad_clicks_hourly rows; the last ad had no impressions, so its ctr is null."""
    impressions = [10 * (i + 1) for i in range(n - 1)] + [0]
    clicks = [i + 1 for i in range(n - 1)] + [0]
    return pd.DataFrame({
        "window_start": utc_series([start] * n),
        "window_end": utc_series([start + timedelta(hours=1)] * n),
        "ad_id": [f"ad-{i}" for i in range(n)],
        "impressions": pd.array(impressions, dtype="Int64"),
        "clicks": pd.array(clicks, dtype="Int64"),
        "ctr": [c / i if i else None for c, i in zip(clicks, impressions, strict=True)],
    })


def unmatched_rows(start: datetime = START, n: int = 2) -> pd.DataFrame:
    """n clean unmatched_clicks_hourly rows."""
    return pd.DataFrame({
        "window_start": utc_series([start] * n),
        "window_end": utc_series([start + timedelta(hours=1)] * n),
        "ad_id": [f"ad-{10 + i}" for i in range(n)],
        "unmatched_clicks": pd.array([i + 1 for i in range(n)], dtype="Int64"),
    })


def unmatched_output(gold: pd.DataFrame | None = None) -> OutputFrame:
    gold = unmatched_rows() if gold is None else gold
    return OutputFrame(name=UNMATCHED, gold=gold, keys=("ad_id",), checks=UNMATCHED_CHECKS, prefix=PREFIX)


@dataclass(frozen=True)
class Window:
    gold: pd.DataFrame
    completeness: Mapping[str, tuple[int, int]]
    late_rows: int = 0
    total_rows: int = 1000
    start: datetime = START
    end: datetime = END
    checks: tuple[Check, ...] = AD_CHECKS
    others: tuple[OutputFrame, ...] = ()  # further outputs of the pipeline, validated after its own


def clean_window(start: datetime = START, n: int = 3) -> Window:
    gold = gold_rows(start, n)
    impressions, clicks = int(gold["impressions"].sum()), int(gold["clicks"].sum())
    totals = {"completeness:impressions": (impressions, impressions), "completeness:clicks": (clicks, clicks)}
    return Window(gold, totals, start=start, end=start + timedelta(hours=1))


def two_outputs(w: Window | None = None, unmatched: pd.DataFrame | None = None,
                unmatched_totals: tuple[int, int] = (3, 3)) -> Window:
    """``w`` plus the unmatched_clicks_hourly output, with its own (prefixed) completeness check."""
    w = w or clean_window()
    return replace(w, completeness={**w.completeness, UNMATCHED_COMPLETENESS: unmatched_totals},
                   others=(unmatched_output(unmatched),))


def run(validator: WindowValidator, w: Window, pipeline: str = PIPELINE) -> WindowValidation:
    own = OutputFrame(name=pipeline, gold=w.gold, keys=("ad_id",), checks=w.checks)
    return validator.validate(pipeline, w.start, w.end, outputs=[own, *w.others], completeness=w.completeness,
                              late_rows=w.late_rows, total_rows=w.total_rows)


def by_name(result: WindowValidation) -> dict[str, ExpectationOutcome]:
    return {o.expectation: o for o in result.outcomes}


def names(outcomes: Sequence[ExpectationOutcome]) -> list[str]:
    return [o.expectation for o in outcomes]


def with_gold(w: Window, **columns: object) -> Window:
    gold = w.gold.copy()
    for column, values in columns.items():
        gold[column] = values
    return replace(w, gold=gold)


def run_together(validator: WindowValidator, windows: Sequence[Window],
                 pipeline: str = PIPELINE) -> dict[datetime, WindowValidation]:
    """Validate ``windows`` (one pipeline's, each with the same outputs) as a check step validates the windows
    it closes: every suite over all of them at once, where they pass. Keyed by window start."""
    by_window = {(w.start, w.end): w for w in windows}
    gold = validator.validate_outputs_together(pipeline, {
        key: [OutputFrame(name=pipeline, gold=w.gold, keys=("ad_id",), checks=w.checks), *w.others]
        for key, w in by_window.items()
    })
    totals = validator.validate_totals_together(
        pipeline, {key: (w.completeness, w.late_rows, w.total_rows) for key, w in by_window.items()})
    return {key[0]: validator.combine(pipeline, *key, [totals[key], *gold[key]]) for key in by_window}
