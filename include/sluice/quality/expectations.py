"""The Great Expectations of a window's two suites: the built-in SPEC 5 checks (completeness, lateness, no
null keys, window length) and each output's declared checks, as GE expectations, each tagged with its
outcome's name and paired with the formatter of its observed value."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sluice.quality.frames import (
    BRONZE_SUFFIX,
    DLQ_SHARE_COLUMN,
    GOLD_SUFFIX,
    WINDOW_SECONDS_COLUMN,
    OutputFrame,
    frame_labels,
)
from sluice.quality.outcomes import LATENESS, NO_NULL_KEYS, OUTCOME_META, window_length_outcome
from sluice.quality.results import (
    Formatter,
    format_between,
    format_completeness,
    format_nulls,
    format_share,
    format_window_length,
)

if TYPE_CHECKING:  # GE takes seconds to import; only WindowValidator pays for it, at construction.
    from great_expectations.expectations import Expectation

# A suite's content: its expectations, the formatter of each outcome (in declared order) and its notes.
SuiteContent = tuple[list["Expectation"], dict[str, Formatter], list[str]]


def totals_expectations(names: list[str], lateness_threshold: float, *, per_row: bool = False) -> SuiteContent:
    """The window-level suite: the completeness checks ``names`` and lateness within ``lateness_threshold``.
    ``per_row``: the frame holds many windows' totals, a row each (see ``WindowValidator``'s ``*_together``)."""
    import great_expectations as gx

    expectations: list[Expectation] = []
    formatters: dict[str, Formatter] = {}
    for outcome, label in frame_labels(names).items():
        gold, bronze = f"{label}{GOLD_SUFFIX}", f"{label}{BRONZE_SUFFIX}"
        if per_row:
            # A suite parameter holds one window's count, so over many windows each gold total is held to the
            # bronze count of its own row.
            expectations.append(gx.expectations.ExpectColumnPairValuesToBeEqual(
                column_A=gold, column_B=bronze, meta={OUTCOME_META: outcome},
            ))
        else:
            # The gold total must equal the window's bronze count, passed per window as a suite parameter:
            # Data Docs then shows the gold total as the unexpected value and the bronze count as the
            # expected one, apart (a column pair's unexpected value renders as "4546" for 45 vs 46).
            expected = {"$PARAMETER": bronze}
            expectations.append(gx.expectations.ExpectColumnValuesToBeBetween(
                column=gold, min_value=expected, max_value=expected, meta={OUTCOME_META: outcome},
            ))
        formatters[outcome] = format_completeness
    expectations.append(gx.expectations.ExpectColumnValuesToBeBetween(
        column=DLQ_SHARE_COLUMN, min_value=0, max_value=lateness_threshold, meta={OUTCOME_META: LATENESS},
    ))
    formatters[LATENESS] = format_share
    notes = [
        "Completeness: each gold total equals the count of bronze records in the same window.",
        f"Lateness: the window's late (DLQ) records not in gold, as a share of all its records, is at most "
        f"{lateness_threshold:g}.",
    ]
    if per_row:
        notes.insert(0, "One row per window, validated together; a window that fails a check of its check step "
                        "is validated again on its own, and has its own page.")
    return expectations, formatters, notes


def gold_expectations(out: OutputFrame, window_seconds: int) -> SuiteContent:
    """An output's suite over its gold rows: no null keys, its declared checks, windows ``window_seconds`` long."""
    import great_expectations as gx

    from sluice.core.checks import Between, NotNull

    ex = gx.expectations
    no_nulls = out.prefix + NO_NULL_KEYS
    expectations: list[Expectation] = [
        ex.ExpectColumnValuesToNotBeNull(column=column, meta={OUTCOME_META: no_nulls})
        for column in (*out.keys, "window_start", "window_end")
    ]
    formatters: dict[str, Formatter] = {no_nulls: format_nulls}
    for check in out.checks:
        outcome = out.prefix + check.name
        if isinstance(check, Between):
            expectations.append(ex.ExpectColumnValuesToBeBetween(
                column=check.column, min_value=check.low, max_value=check.high, meta={OUTCOME_META: outcome},
            ))
            formatters[outcome] = format_between
        elif isinstance(check, NotNull):
            expectations.append(
                ex.ExpectColumnValuesToNotBeNull(column=check.column, meta={OUTCOME_META: outcome})
            )
            formatters[outcome] = format_nulls
    length = out.prefix + window_length_outcome(window_seconds)
    expectations.append(ex.ExpectColumnValuesToBeBetween(
        column=WINDOW_SECONDS_COLUMN, min_value=window_seconds, max_value=window_seconds,
        meta={OUTCOME_META: length},
    ))
    formatters[length] = format_window_length(window_seconds)
    notes = [
        f"Validity of the window's rows of gold/{out.name}: no null keys, the declared checks, and "
        "window_end - window_start equal to one window.",
        f"`{WINDOW_SECONDS_COLUMN}` is derived by sluice as window_end - window_start in seconds.",
    ]
    return expectations, formatters, notes
