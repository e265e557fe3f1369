"""What a window's validation reports: the stable outcome names, one :class:`ExpectationOutcome` per name (a
row of ``ops/dq_results``), and the :class:`WindowValidation` of a whole window.

Every GE expectation carries its outcome's name in its ``meta`` (under :data:`OUTCOME_META`); several
expectations may share one name, and their results fold into one outcome (:mod:`sluice.quality.results`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

OUTCOME_META = "sluice_outcome"

COMPLETENESS_PREFIX = "completeness:"
NO_NULL_KEYS = "validity:no_null_keys"
LATENESS = "lateness:dlq_share_within_threshold"


def window_length_outcome(window_seconds: int) -> str:
    """The name of the window-length check: ``validity:window_is_one_hour`` for the SPEC's hour."""
    return "validity:window_is_one_hour" if window_seconds == 3600 else f"validity:window_is_{window_seconds}s"

@dataclass(frozen=True)
class ExpectationOutcome:
    """One row of ``ops/dq_results`` for a window: a stable name, what was seen, and the verdict."""

    expectation: str
    observed_value: str
    success: bool


@dataclass(frozen=True)
class WindowValidation:
    """Every outcome of one window's validation, plus the Data Docs page to look at."""

    pipeline: str
    window_start: datetime
    window_end: datetime
    outcomes: list[ExpectationOutcome]
    # The page of the first failing suite (totals before gold rows), else the totals page. It exists on
    # disk only after WindowValidator.build_docs().
    docs_path: Path | None = None

    @property
    def success(self) -> bool:
        return all(o.success for o in self.outcomes)

    @property
    def failed(self) -> list[ExpectationOutcome]:
        return [o for o in self.outcomes if not o.success]
