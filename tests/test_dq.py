"""The window data-quality suite (SPEC 5) on real Great Expectations, no Spark: a clean window passes, each
kind of defect fails exactly its own expectation, an empty window passes, and Data Docs land on disk."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pandas as pd
import pytest

from sluice.dq import ExpectationOutcome, WindowValidation, WindowValidator

START = datetime(2024, 5, 1, 12, tzinfo=UTC)
END = START + timedelta(hours=1)
PIPELINE = "ad_clicks_hourly"

ALL_NAMES = [
    "completeness:impressions",
    "completeness:clicks",
    "lateness:dlq_share_within_threshold",
    "validity:no_null_keys",
    "validity:ctr_between_0_and_1",
    "validity:counts_non_negative",
    "validity:window_is_one_hour",
]


def gold_rows(start: datetime = START, n: int = 3) -> pd.DataFrame:
    """n clean ad_clicks_hourly rows; the last ad had no impressions, so its ctr is null."""
    impressions = [10 * (i + 1) for i in range(n - 1)] + [0]
    clicks = [i + 1 for i in range(n - 1)] + [0]
    return pd.DataFrame({
        "window_start": pd.Series([start] * n, dtype="datetime64[us, UTC]"),
        "window_end": pd.Series([start + timedelta(hours=1)] * n, dtype="datetime64[us, UTC]"),
        "ad_id": [f"ad-{i}" for i in range(n)],
        "impressions": pd.array(impressions, dtype="Int64"),
        "clicks": pd.array(clicks, dtype="Int64"),
        "ctr": [c / i if i else None for c, i in zip(clicks, impressions, strict=True)],
    })


@dataclass(frozen=True)
class Window:
    gold: pd.DataFrame
    completeness: Mapping[str, tuple[int, int]]
    late_rows: int = 0
    total_rows: int = 1000
    start: datetime = START
    end: datetime = END
    count_columns: Sequence[str] = ("impressions", "clicks")


def clean_window(start: datetime = START, n: int = 3) -> Window:
    gold = gold_rows(start, n)
    impressions, clicks = int(gold["impressions"].sum()), int(gold["clicks"].sum())
    return Window(gold, {"impressions": (impressions, impressions), "clicks": (clicks, clicks)},
                  start=start, end=start + timedelta(hours=1))


def run(validator: WindowValidator, w: Window, pipeline: str = PIPELINE) -> WindowValidation:
    return validator.validate(pipeline, w.start, w.end, w.gold, key="ad_id", count_columns=w.count_columns,
                              completeness=w.completeness, late_rows=w.late_rows, total_rows=w.total_rows)


def by_name(result: WindowValidation) -> dict[str, ExpectationOutcome]:
    return {o.expectation: o for o in result.outcomes}


@pytest.fixture
def validator(tmp_path: Path) -> WindowValidator:
    return WindowValidator(tmp_path / "data_docs")


def test_clean_window_passes(validator: WindowValidator) -> None:
    result = run(validator, clean_window())

    assert result.success, result.failed
    assert [o.expectation for o in result.outcomes] == ALL_NAMES
    seen = by_name(result)
    assert seen["completeness:impressions"].observed_value == "gold=30 bronze=30"
    assert seen["lateness:dlq_share_within_threshold"].observed_value == "0"
    assert seen["validity:no_null_keys"].observed_value == "0 nulls"
    assert seen["validity:window_is_one_hour"].observed_value == "0 of 3 rows != 3600s"
    assert result.pipeline == PIPELINE and result.window_start == START and result.window_end == END
    assert result.docs_path is not None and result.docs_path.is_relative_to(validator.docs_dir)


def with_gold(w: Window, **columns: object) -> Window:
    gold = w.gold.copy()
    for column, values in columns.items():
        gold[column] = values
    return Window(gold, w.completeness, w.late_rows, w.total_rows)


CLEAN = clean_window()
DEFECTS = {
    "completeness:clicks": (
        Window(CLEAN.gold, {"impressions": (30, 30), "clicks": (3, 4)}),
        "gold=3 bronze=4",
    ),
    "validity:no_null_keys": (with_gold(CLEAN, ad_id=["ad-0", None, "ad-2"]), "1 null (ad_id: 1)"),
    "validity:ctr_between_0_and_1": (with_gold(CLEAN, ctr=[0.1, 1.5, None]), "1 outside [0, 1] (1.5); 0 null"
                                     " with impressions > 0"),
    "validity:counts_non_negative": (
        with_gold(CLEAN, clicks=pd.array([1, -2, 0], dtype="Int64"), ctr=[0.1, 0.0, None]),
        "1 negative (clicks: -2)",
    ),
    "validity:window_is_one_hour": (
        with_gold(CLEAN, window_end=pd.Series([END, END + timedelta(hours=1), END], dtype="datetime64[us, UTC]")),
        "1 of 3 rows != 3600s (7200)",
    ),
    "lateness:dlq_share_within_threshold": (
        Window(CLEAN.gold, CLEAN.completeness, late_rows=20, total_rows=1000),
        "0.02",
    ),
}


@pytest.mark.parametrize("expectation", list(DEFECTS))
def test_each_defect_fails_exactly_its_expectation(validator: WindowValidator, expectation: str) -> None:
    window, observed = DEFECTS[expectation]

    result = run(validator, window)

    assert not result.success
    assert [o.expectation for o in result.failed] == [expectation]
    assert by_name(result)[expectation].observed_value == observed
    # The page to look at is the one of the failing suite.
    suite = "window_totals" if expectation.startswith(("completeness", "lateness")) else "gold_rows"
    assert result.docs_path is not None and suite in result.docs_path.parts


def test_ctr_null_with_impressions_fails_ctr(validator: WindowValidator) -> None:
    result = run(validator, with_gold(CLEAN, ctr=[0.1, None, None]))

    assert [o.expectation for o in result.failed] == ["validity:ctr_between_0_and_1"]
    assert by_name(result)["validity:ctr_between_0_and_1"].observed_value == (
        "0 outside [0, 1]; 1 null with impressions > 0"
    )


def test_lateness_at_threshold_passes_and_threshold_is_configurable(tmp_path: Path) -> None:
    at_limit = Window(CLEAN.gold, CLEAN.completeness, late_rows=10, total_rows=1000)
    assert run(WindowValidator(tmp_path / "a"), at_limit).success

    strict = WindowValidator(tmp_path / "b", lateness_threshold=0.005)
    assert [o.expectation for o in run(strict, at_limit).failed] == ["lateness:dlq_share_within_threshold"]


def test_empty_window_validates_cleanly(validator: WindowValidator) -> None:
    empty = Window(gold_rows().iloc[0:0], {"impressions": (0, 0), "clicks": (0, 0)}, late_rows=0, total_rows=0)

    result = run(validator, empty)

    assert result.success, result.failed
    assert [o.expectation for o in result.outcomes] == ALL_NAMES


def test_empty_window_still_checks_completeness_and_lateness(validator: WindowValidator) -> None:
    # No gold rows at all (not even columns) while bronze saw 5 impressions, 1 of them late.
    empty = Window(pd.DataFrame(), {"impressions": (0, 5)}, late_rows=1, total_rows=5)

    result = run(validator, empty)

    assert [o.expectation for o in result.failed] == ["completeness:impressions", "lateness:dlq_share_within_threshold"]
    assert by_name(result)["lateness:dlq_share_within_threshold"].observed_value == "0.2"
    assert "validity:ctr_between_0_and_1" not in by_name(result)  # no ctr column, no ctr check


def test_missing_column_fails_with_an_error(validator: WindowValidator) -> None:
    result = run(validator, Window(CLEAN.gold.drop(columns=["clicks"]), CLEAN.completeness))

    failed = by_name(result)
    assert [o.expectation for o in result.failed] == ["validity:counts_non_negative"]
    assert failed["validity:counts_non_negative"].observed_value.startswith("error: ")
    assert "clicks" in failed["validity:counts_non_negative"].observed_value


def test_other_pipelines_and_window_lengths(tmp_path: Path) -> None:
    validator = WindowValidator(tmp_path / "docs", window_seconds=600)
    start = START
    gold = pd.DataFrame({
        "window_start": [start, start],
        "window_end": [start + timedelta(minutes=10), start + timedelta(minutes=10)],
        "user_id": ["u1", "u2"],
        "avg_events_per_10min": [1.5, 2.0],
    })

    result = validator.validate("user_activity_hourly", start, start + timedelta(minutes=10), gold, key="user_id",
                                count_columns=["avg_events_per_10min"], completeness={"events": (7, 7)},
                                late_rows=0, total_rows=7)

    assert result.success, result.failed
    assert [o.expectation for o in result.outcomes] == [
        "completeness:events",
        "lateness:dlq_share_within_threshold",
        "validity:no_null_keys",
        "validity:counts_non_negative",
        "validity:window_is_600s",
    ]


def test_results_are_deterministic(tmp_path: Path) -> None:
    window, _ = DEFECTS["validity:window_is_one_hour"]
    first = run(WindowValidator(tmp_path / "a"), window)
    second = run(WindowValidator(tmp_path / "b"), window)

    assert first.outcomes == second.outcomes


def test_data_docs_written_by_build_docs(validator: WindowValidator) -> None:
    passing = run(validator, clean_window())
    failing = run(validator, DEFECTS["validity:ctr_between_0_and_1"][0])
    assert failing.docs_path is not None and not failing.docs_path.exists()  # rendered by build_docs only

    index = validator.build_docs()

    assert index == validator.docs_dir / "index.html"
    html = index.read_text()
    assert f"{PIPELINE}.gold_rows" in html and f"{PIPELINE}.window_totals" in html
    for result in (passing, failing):
        assert result.docs_path is not None and result.docs_path.is_file()
    page = failing.docs_path.read_text()
    assert "ctr" in page and "window_seconds" in page and "impressions" in page
    suite_page = validator.docs_dir / "expectations" / PIPELINE / "window_totals.html"
    assert "impressions_gold_total" in suite_page.read_text()
    # Rebuilding with nothing new keeps every page.
    validator.build_docs()
    assert passing.docs_path is not None and passing.docs_path.is_file()


def test_data_docs_accumulate_across_validators(tmp_path: Path) -> None:
    """Each Airflow task is its own process with its own validator; the index must list them all."""
    docs = tmp_path / "data_docs"
    first = WindowValidator(docs)
    earlier = run(first, clean_window())
    first.build_docs()

    second = WindowValidator(docs)
    later = run(second, clean_window(START + timedelta(hours=1)), pipeline="unmatched_clicks_hourly")
    index = second.build_docs().read_text()

    assert earlier.docs_path is not None and earlier.docs_path.is_file()
    assert later.docs_path is not None and later.docs_path.is_file()
    assert "ad_clicks_hourly-20240501T120000Z" in index
    assert "unmatched_clicks_hourly-20240501T130000Z" in index


def test_suite_changed_by_another_validator_is_re_registered(tmp_path: Path) -> None:
    docs = tmp_path / "data_docs"
    first, second = WindowValidator(docs), WindowValidator(docs)
    assert run(first, clean_window()).success
    # The other validator rewrites the shared suite without the ctr check...
    no_ctr = Window(CLEAN.gold.drop(columns=["ctr"]), CLEAN.completeness)
    assert "validity:ctr_between_0_and_1" not in by_name(run(second, no_ctr))

    # ...and the first one still validates with its own suite.
    again = run(first, with_gold(CLEAN, ctr=[0.1, 1.5, None]))
    assert [o.expectation for o in again.failed] == ["validity:ctr_between_0_and_1"]


def test_many_windows_through_one_validator(validator: WindowValidator) -> None:
    windows = [clean_window(START + timedelta(hours=h), n=50) for h in range(24)]
    run(validator, windows[0])  # the first window registers the suites

    began = time.perf_counter()
    results = [run(validator, w) for w in windows[1:]]
    per_window = (time.perf_counter() - began) / len(results)
    began = time.perf_counter()
    validator.build_docs()
    docs_seconds = time.perf_counter() - began

    assert all(r.success for r in results)
    assert len({r.docs_path for r in results}) == len(results)
    print(f"\n{per_window * 1000:.0f} ms per window; build_docs for {len(windows)} windows: {docs_seconds:.2f} s")


def test_suite_follows_the_columns_of_each_window(validator: WindowValidator) -> None:
    no_ctr = Window(CLEAN.gold.drop(columns=["ctr"]), CLEAN.completeness)
    bad_ctr = with_gold(CLEAN, ctr=[0.1, 1.5, None])

    assert "validity:ctr_between_0_and_1" in by_name(run(validator, CLEAN))
    assert "validity:ctr_between_0_and_1" not in by_name(run(validator, no_ctr))
    assert [o.expectation for o in run(validator, bad_ctr).failed] == ["validity:ctr_between_0_and_1"]
