"""The window data-quality suites (SPEC 5, checks declared per output as in SPEC 8) on real Great Expectations,
no Spark: a clean window passes, each kind of defect fails exactly its own outcome (in the pipeline's own output
and in a second, prefixed one), an empty window passes, and Data Docs land on disk."""

from __future__ import annotations

import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pandas as pd
import pytest

from sluice import checks
from sluice.quality.frames import OutputFrame
from sluice.quality.validator import WindowValidator
from support.dq_windows import (
    AD_CHECKS,
    ALL_NAMES,
    END,
    GOLD_NAMES,
    PIPELINE,
    PREFIX,
    START,
    TOTALS_NAMES,
    UNMATCHED,
    UNMATCHED_COMPLETENESS,
    UNMATCHED_NAMES,
    Window,
    by_name,
    clean_window,
    gold_rows,
    names,
    run,
    two_outputs,
    unmatched_rows,
    utc_series,
    with_gold,
)


@pytest.fixture
def validator(tmp_path: Path) -> WindowValidator:
    return WindowValidator(tmp_path / "data_docs")


def test_clean_window_passes(validator: WindowValidator) -> None:
    result = run(validator, clean_window())

    assert result.success, result.failed
    assert names(result.outcomes) == ALL_NAMES
    assert {o.expectation: o.observed_value for o in result.outcomes} == {
        "completeness:impressions": "gold=30 bronze=30",
        "completeness:clicks": "gold=3 bronze=3",
        "lateness:dlq_share_within_threshold": "0",
        "validity:no_null_keys": "0 nulls",
        # The null ctr of the ad without impressions is not checked by `between`.
        "validity:ctr_between_0_and_1": "0 outside [0, 1]",
        "validity:counts_non_negative": "0 outside [0, inf]",
        "validity:window_is_one_hour": "0 of 3 rows != 3600s",
    }
    assert result.pipeline == PIPELINE and result.window_start == START and result.window_end == END
    assert result.failed == []
    # Nothing failed: the page to look at is the totals suite's.
    assert result.docs_path is not None and result.docs_path.is_relative_to(validator.docs_dir)
    assert "window_totals" in result.docs_path.parts


CLEAN = clean_window()
DEFECTS = {
    "completeness:clicks": (
        replace(CLEAN, completeness={"completeness:impressions": (30, 30), "completeness:clicks": (3, 4)}),
        "gold=3 bronze=4",
    ),
    "validity:no_null_keys": (with_gold(CLEAN, ad_id=["ad-0", None, "ad-2"]), "1 null (ad_id: 1)"),
    "validity:ctr_between_0_and_1": (with_gold(CLEAN, ctr=[0.1, 1.5, None]), "1 outside [0, 1] (ctr: 1.5)"),
    "validity:counts_non_negative": (
        with_gold(CLEAN, clicks=pd.array([1, -2, 0], dtype="Int64"), ctr=[0.1, 0.0, None]),
        "1 outside [0, inf] (clicks: -2)",
    ),
    "validity:window_is_one_hour": (
        with_gold(CLEAN, window_end=utc_series([END, END + timedelta(hours=1), END])),
        "1 of 3 rows != 3600s (7200)",
    ),
    "lateness:dlq_share_within_threshold": (replace(CLEAN, late_rows=20, total_rows=1000), "0.02"),
}


@pytest.mark.parametrize("expectation", list(DEFECTS))
def test_each_defect_fails_exactly_its_expectation(validator: WindowValidator, expectation: str) -> None:
    window, observed = DEFECTS[expectation]

    result = run(validator, window)

    assert not result.success
    assert names(result.outcomes) == ALL_NAMES
    assert names(result.failed) == [expectation]
    assert by_name(result)[expectation].observed_value == observed
    # The page to look at is the one of the failing suite.
    suite = "window_totals" if expectation.startswith(("completeness", "lateness")) else "gold_rows"
    assert result.docs_path is not None and suite in result.docs_path.parts


def test_checks_with_one_name_fold_into_one_outcome(validator: WindowValidator) -> None:
    """impressions and clicks are both checked under validity:counts_non_negative: one outcome, both columns."""
    result = run(validator, with_gold(CLEAN, impressions=pd.array([-1, 20, 0], dtype="Int64"),
                                      clicks=pd.array([1, -2, 0], dtype="Int64"), ctr=[0.1, 0.0, None]))

    assert names(result.outcomes) == ALL_NAMES  # still one outcome per name
    assert names(result.failed) == ["validity:counts_non_negative"]
    assert by_name(result)["validity:counts_non_negative"].observed_value == (
        "2 outside [0, inf] (impressions: -1, clicks: -2)"
    )


@pytest.mark.parametrize("case", ["between_with_other_bounds", "between_and_not_null"])
def test_checks_of_different_shape_under_one_name_report_the_offender(validator: WindowValidator, case: str) -> None:
    if case == "between_with_other_bounds":
        declared = (checks.between("impressions", 0, name="sane"), checks.between("ctr", 0, 1, name="sane"))
        shown = "[0, 1]"  # the bounds ctr broke, not the impressions ones
    else:
        declared = (checks.between("ctr", 0, 1, name="sane"), checks.not_null("ctr", name="sane"))
        shown = "1.5"  # not "0 nulls"
    window = with_gold(replace(CLEAN, checks=declared), ctr=[0.1, 1.5, 0.0])

    result = run(validator, window)

    assert names(result.failed) == ["validity:sane"]
    assert shown in by_name(result)["validity:sane"].observed_value


def test_between_quotes_at_most_three_offending_values(validator: WindowValidator) -> None:
    gold = gold_rows(n=5)
    gold["ctr"] = [0.5, 1.5, 2.0, -0.25, 3.0]
    result = run(validator, replace(CLEAN, gold=gold, completeness={}))

    assert names(result.failed) == ["validity:ctr_between_0_and_1"]
    observed = by_name(result)["validity:ctr_between_0_and_1"].observed_value
    assert observed == "4 outside [0, 1] (ctr: 1.5, 2, -0.25, ...)"


def test_between_with_one_bound(validator: WindowValidator) -> None:
    at_least = checks.between("impressions", 10)
    assert at_least.name == "validity:impressions_at_least_10"
    window = replace(CLEAN, checks=(at_least,))

    result = run(validator, window)

    assert names(result.outcomes) == [*TOTALS_NAMES, "validity:no_null_keys", "validity:impressions_at_least_10",
                                      "validity:window_is_one_hour"]
    assert names(result.failed) == ["validity:impressions_at_least_10"]
    assert by_name(result)["validity:impressions_at_least_10"].observed_value == "1 outside [10, inf] (impressions: 0)"


@pytest.mark.parametrize("case", ["check_on_an_earlier_column", "missing_column"])
def test_outcomes_keep_suite_order(validator: WindowValidator, case: str) -> None:
    if case == "check_on_an_earlier_column":
        # A not_null on ctr declared after the count checks: GE evaluates it together with the ctr range check.
        window = replace(CLEAN, checks=(*AD_CHECKS, checks.not_null("ctr")))
        expected = [*TOTALS_NAMES, *GOLD_NAMES[:-1], "validity:ctr_not_null", GOLD_NAMES[-1]]
    else:
        window = replace(CLEAN, gold=CLEAN.gold.drop(columns=["clicks"]))
        expected = ALL_NAMES

    assert names(run(validator, window).outcomes) == expected


def test_between_without_lower_bound(validator: WindowValidator) -> None:
    at_most = checks.between("ctr", high=1)
    assert at_most.name == "validity:ctr_at_most_1"

    result = run(validator, with_gold(replace(CLEAN, checks=(at_most,)), ctr=[0.1, 1.5, -2.0]))

    assert names(result.failed) == ["validity:ctr_at_most_1"]  # -2 is not below a bound that is not there
    assert by_name(result)["validity:ctr_at_most_1"].observed_value == "1 outside [-inf, 1] (ctr: 1.5)"


def test_not_null_check(validator: WindowValidator) -> None:
    ctr_not_null = checks.not_null("ctr")
    assert ctr_not_null.name == "validity:ctr_not_null"
    window = replace(CLEAN, checks=(AD_CHECKS[0], ctr_not_null, *AD_CHECKS[1:]))
    outcome_names = [*TOTALS_NAMES, *GOLD_NAMES[:2], "validity:ctr_not_null", *GOLD_NAMES[2:]]

    # The clean window's last ad has no impressions, so a null ctr: only the declared not_null check fails.
    failing = run(validator, window)
    assert names(failing.outcomes) == outcome_names
    assert names(failing.failed) == ["validity:ctr_not_null"]
    assert by_name(failing)["validity:ctr_not_null"].observed_value == "1 null (ctr: 1)"
    assert failing.docs_path is not None and "gold_rows" in failing.docs_path.parts

    passing = run(validator, with_gold(window, ctr=[0.1, 0.1, 0.0]))
    assert passing.success, passing.failed
    assert by_name(passing)["validity:ctr_not_null"].observed_value == "0 nulls"


def test_not_null_check_with_its_own_name_and_composite_keys(validator: WindowValidator) -> None:
    gold = CLEAN.gold.assign(campaign=["c-1", None, "c-1"], ctr=[0.1, None, None])
    frame = OutputFrame(name=PIPELINE, gold=gold, keys=("campaign", "ad_id"),
                        checks=(checks.not_null("ctr", name="ctr_known"),))

    result = validator.validate(PIPELINE, START, END, outputs=[frame], completeness={}, late_rows=0, total_rows=3)

    assert names(result.outcomes) == ["lateness:dlq_share_within_threshold", "validity:no_null_keys",
                                      "validity:ctr_known", "validity:window_is_one_hour"]
    assert names(result.failed) == ["validity:no_null_keys", "validity:ctr_known"]
    assert by_name(result)["validity:no_null_keys"].observed_value == "1 null (campaign: 1)"
    assert by_name(result)["validity:ctr_known"].observed_value == "2 nulls (ctr: 2)"


def test_lateness_at_threshold_passes_and_threshold_is_configurable(tmp_path: Path) -> None:
    at_limit = replace(CLEAN, late_rows=10, total_rows=1000)
    assert run(WindowValidator(tmp_path / "a"), at_limit).success

    strict = WindowValidator(tmp_path / "b", lateness_threshold=0.005)
    assert names(run(strict, at_limit).failed) == ["lateness:dlq_share_within_threshold"]


def test_empty_window_validates_cleanly(validator: WindowValidator) -> None:
    empty = Window(gold_rows().iloc[0:0], {"completeness:impressions": (0, 0), "completeness:clicks": (0, 0)},
                   late_rows=0, total_rows=0)

    result = run(validator, empty)

    assert result.success, result.failed
    assert names(result.outcomes) == ALL_NAMES
    assert by_name(result)["validity:window_is_one_hour"].observed_value == "0 of 0 rows != 3600s"


def test_empty_window_still_checks_completeness_and_lateness(validator: WindowValidator) -> None:
    # No gold rows at all (not even columns) in either output, while bronze saw 5 impressions, 1 of them late.
    empty = two_outputs(Window(pd.DataFrame(), {"completeness:impressions": (0, 5)}, late_rows=1, total_rows=5),
                        unmatched=pd.DataFrame(), unmatched_totals=(0, 0))

    result = run(validator, empty)

    assert names(result.outcomes) == [
        "completeness:impressions", UNMATCHED_COMPLETENESS, "lateness:dlq_share_within_threshold",
        *GOLD_NAMES, *UNMATCHED_NAMES,
    ]
    assert names(result.failed) == ["completeness:impressions", "lateness:dlq_share_within_threshold"]
    assert by_name(result)["completeness:impressions"].observed_value == "gold=0 bronze=5"
    assert by_name(result)["lateness:dlq_share_within_threshold"].observed_value == "0.2"
    # The declared checks still run (on zero rows), even though the frame has none of their columns.
    assert by_name(result)["validity:ctr_between_0_and_1"].observed_value == "0 outside [0, 1]"


def test_missing_column_fails_with_an_error(validator: WindowValidator) -> None:
    result = run(validator, replace(CLEAN, gold=CLEAN.gold.drop(columns=["clicks"])))

    failed = by_name(result)
    # Every outcome is still there (GE lists the erroring expectation first: see test_outcomes_keep_suite_order).
    assert sorted(names(result.outcomes)) == sorted(ALL_NAMES)
    assert names(result.failed) == ["validity:counts_non_negative"]
    assert failed["validity:counts_non_negative"].observed_value.startswith("error: ")
    assert "clicks" in failed["validity:counts_non_negative"].observed_value


def test_missing_key_column_fails_no_null_keys_with_an_error(validator: WindowValidator) -> None:
    result = run(validator, replace(CLEAN, gold=CLEAN.gold.drop(columns=["ad_id"])))

    assert names(result.failed) == ["validity:no_null_keys"]
    observed = by_name(result)["validity:no_null_keys"].observed_value
    assert observed.startswith("error: ") and "ad_id" in observed


def test_second_output_is_prefixed_and_validated(validator: WindowValidator) -> None:
    result = run(validator, two_outputs())

    assert result.success, result.failed
    assert names(result.outcomes) == [
        "completeness:impressions", "completeness:clicks", UNMATCHED_COMPLETENESS,
        "lateness:dlq_share_within_threshold", *GOLD_NAMES, *UNMATCHED_NAMES,
    ]
    seen = by_name(result)
    assert seen[UNMATCHED_COMPLETENESS].observed_value == "gold=3 bronze=3"
    assert seen[f"{PREFIX}validity:no_null_keys"].observed_value == "0 nulls"
    assert seen[f"{PREFIX}validity:counts_non_negative"].observed_value == "0 outside [0, inf]"
    assert seen[f"{PREFIX}validity:window_is_one_hour"].observed_value == "0 of 2 rows != 3600s"
    assert result.docs_path is not None and "window_totals" in result.docs_path.parts


UNMATCHED_CLEAN = unmatched_rows()
UNMATCHED_DEFECTS = {
    UNMATCHED_COMPLETENESS: (two_outputs(unmatched_totals=(3, 2)), "gold=3 bronze=2"),
    f"{PREFIX}validity:no_null_keys": (
        two_outputs(unmatched=UNMATCHED_CLEAN.assign(ad_id=[None, "ad-11"])), "1 null (ad_id: 1)",
    ),
    f"{PREFIX}validity:counts_non_negative": (
        two_outputs(unmatched=UNMATCHED_CLEAN.assign(unmatched_clicks=pd.array([-3, 2], dtype="Int64"))),
        "1 outside [0, inf] (unmatched_clicks: -3)",
    ),
    f"{PREFIX}validity:window_is_one_hour": (
        two_outputs(unmatched=UNMATCHED_CLEAN.assign(window_start=utc_series([START, START + timedelta(minutes=30)]))),
        "1 of 2 rows != 3600s (1800)",
    ),
}


@pytest.mark.parametrize("expectation", list(UNMATCHED_DEFECTS))
def test_defect_in_second_output_fails_only_its_outcome(validator: WindowValidator, expectation: str) -> None:
    window, observed = UNMATCHED_DEFECTS[expectation]

    result = run(validator, window)

    assert not result.success
    assert names(result.failed) == [expectation]
    assert by_name(result)[expectation].observed_value == observed
    # The pipeline's own output is untouched by the other output's defect.
    assert all(by_name(result)[name].success for name in GOLD_NAMES)
    assert result.docs_path is not None
    if expectation == UNMATCHED_COMPLETENESS:
        assert "window_totals" in result.docs_path.parts
    else:  # the second output's own suite page, <output>.gold_rows
        assert {UNMATCHED, "gold_rows"} <= set(result.docs_path.parts)
        assert PIPELINE not in result.docs_path.parts


def test_defects_in_both_outputs_point_at_the_first_failing_suite(validator: WindowValidator) -> None:
    window, _ = UNMATCHED_DEFECTS[f"{PREFIX}validity:counts_non_negative"]
    window = with_gold(window, ctr=[0.1, 1.5, None])

    result = run(validator, window)

    assert names(result.failed) == ["validity:ctr_between_0_and_1", f"{PREFIX}validity:counts_non_negative"]
    assert result.docs_path is not None and {PIPELINE, "gold_rows"} <= set(result.docs_path.parts)


def test_completeness_of_equal_name_in_two_outputs_are_kept_apart(validator: WindowValidator) -> None:
    window = replace(two_outputs(), completeness={
        "completeness:clicks": (3, 3),
        f"{PREFIX}completeness:clicks": (5, 7),
    })

    result = run(validator, window)

    assert names(result.failed) == [f"{PREFIX}completeness:clicks"]
    assert by_name(result)["completeness:clicks"].observed_value == "gold=3 bronze=3"
    assert by_name(result)[f"{PREFIX}completeness:clicks"].observed_value == "gold=5 bronze=7"


def test_other_pipelines_and_window_lengths(tmp_path: Path) -> None:
    validator = WindowValidator(tmp_path / "docs", window_seconds=600)
    start = START
    gold = pd.DataFrame({
        "window_start": [start, start],
        "window_end": [start + timedelta(minutes=10), start + timedelta(minutes=10)],
        "user_id": ["u1", "u2"],
        "avg_events_per_10min": [1.5, 2.0],
    })
    output = OutputFrame(name="user_activity_hourly", gold=gold, keys=("user_id",),
                         checks=(checks.between("avg_events_per_10min", 1),))

    result = validator.validate("user_activity_hourly", start, start + timedelta(minutes=10), outputs=[output],
                                completeness={"completeness:users": (2, 2)}, late_rows=0, total_rows=7)

    assert result.success, result.failed
    assert names(result.outcomes) == [
        "completeness:users",
        "lateness:dlq_share_within_threshold",
        "validity:no_null_keys",
        "validity:avg_events_per_10min_at_least_1",
        "validity:window_is_600s",
    ]
    assert by_name(result)["validity:window_is_600s"].observed_value == "0 of 2 rows != 600s"

    # Hour-long rows are wrong for a 10-minute validator.
    hourly = replace(output, gold=gold.assign(window_end=[start + timedelta(hours=1)] * 2))
    wrong = validator.validate("user_activity_hourly", start, start + timedelta(minutes=10), outputs=[hourly],
                               completeness={"completeness:users": (2, 2)}, late_rows=0, total_rows=7)
    assert names(wrong.failed) == ["validity:window_is_600s"]
    assert by_name(wrong)["validity:window_is_600s"].observed_value == "2 of 2 rows != 600s (3600, 3600)"


def test_invalid_validator_settings_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="lateness_threshold"):
        WindowValidator(tmp_path / "a", lateness_threshold=1.5)
    with pytest.raises(ValueError, match="window_seconds"):
        WindowValidator(tmp_path / "b", window_seconds=0)


def test_results_are_deterministic(tmp_path: Path) -> None:
    window = with_gold(UNMATCHED_DEFECTS[f"{PREFIX}validity:window_is_one_hour"][0],
                       window_end=DEFECTS["validity:window_is_one_hour"][0].gold["window_end"])
    run_time = datetime(2024, 5, 1, 14, tzinfo=UTC)
    first = run(WindowValidator(tmp_path / "a", run_time=run_time), window)
    second = run(WindowValidator(tmp_path / "b", run_time=run_time), window)

    assert first.outcomes == second.outcomes
    assert names(first.failed) == ["validity:window_is_one_hour", f"{PREFIX}validity:window_is_one_hour"]
    # With one injected run time, the page path does not depend on the wall clock either.
    assert first.docs_path is not None and second.docs_path is not None
    assert first.docs_path.relative_to(tmp_path / "a") == second.docs_path.relative_to(tmp_path / "b")


def test_data_docs_written_by_build_docs(validator: WindowValidator) -> None:
    passing = run(validator, two_outputs())
    failing = run(validator, two_outputs(DEFECTS["validity:ctr_between_0_and_1"][0]))
    other_failing = run(validator, UNMATCHED_DEFECTS[f"{PREFIX}validity:counts_non_negative"][0])
    assert failing.docs_path is not None and not failing.docs_path.exists()  # rendered by build_docs only

    index = validator.build_docs()

    assert index == validator.docs_dir / "index.html"
    html = index.read_text()
    for suite in (f"{PIPELINE}.gold_rows", f"{PIPELINE}.window_totals", f"{UNMATCHED}.gold_rows"):
        assert suite in html
    for result in (passing, failing, other_failing):
        assert result.docs_path is not None and result.docs_path.is_file()
    assert failing.docs_path is not None and other_failing.docs_path is not None
    page = failing.docs_path.read_text()
    assert "ctr" in page and "window_seconds" in page and "clicks" in page
    assert "unmatched_clicks" in other_failing.docs_path.read_text()
    totals_page = validator.docs_dir / "expectations" / PIPELINE / "window_totals.html"
    totals_html = totals_page.read_text()
    assert "impressions_gold_total" in totals_html and "unmatched_clicks_gold_total" in totals_html
    assert "unmatched_clicks" in (validator.docs_dir / "expectations" / UNMATCHED / "gold_rows.html").read_text()
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
    later = run(second, clean_window(START + timedelta(hours=1)), pipeline=UNMATCHED)
    index = second.build_docs().read_text()

    assert earlier.docs_path is not None and earlier.docs_path.is_file()
    assert later.docs_path is not None and later.docs_path.is_file()
    assert "ad_clicks_hourly-20240501T120000Z" in index
    assert "unmatched_clicks_hourly-20240501T130000Z" in index


def test_suite_changed_by_another_validator_is_re_registered(tmp_path: Path) -> None:
    docs = tmp_path / "data_docs"
    first, second = WindowValidator(docs), WindowValidator(docs)
    assert run(first, clean_window()).success
    # The other validator rewrites the shared suite file with other checks (no ctr check)...
    no_ctr = replace(CLEAN, checks=AD_CHECKS[1:])
    assert "validity:ctr_between_0_and_1" not in by_name(run(second, no_ctr))

    # ...and the first one still validates with its own suite,
    again = run(first, with_gold(CLEAN, ctr=[0.1, 1.5, None]))
    assert names(again.outcomes) == ALL_NAMES
    assert names(again.failed) == ["validity:ctr_between_0_and_1"]
    # as does the other one once the first has written its suite back.
    other = run(second, with_gold(no_ctr, ctr=[0.1, 1.5, None]))
    assert other.success and "validity:ctr_between_0_and_1" not in by_name(other)


def test_many_windows_through_one_validator(validator: WindowValidator) -> None:
    windows = [two_outputs(clean_window(START + timedelta(hours=h), n=50)) for h in range(24)]
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


def test_suite_follows_the_checks_of_each_window(validator: WindowValidator) -> None:
    no_ctr = replace(CLEAN, checks=AD_CHECKS[1:])
    bad_ctr = with_gold(CLEAN, ctr=[0.1, 1.5, None])

    assert "validity:ctr_between_0_and_1" in by_name(run(validator, CLEAN))
    assert "validity:ctr_between_0_and_1" not in by_name(run(validator, no_ctr))
    assert names(run(validator, bad_ctr).failed) == ["validity:ctr_between_0_and_1"]
    # The bad ctr goes unnoticed by a window that does not declare the check.
    assert run(validator, replace(bad_ctr, checks=AD_CHECKS[1:])).success


def test_data_docs_show_a_failed_completeness_as_gold_total_against_the_bronze_count(
    validator: WindowValidator,
) -> None:
    """Issue 29 section 4: a column pair's unexpected value rendered as "4546" for a gold total of 45 against a
    bronze count of 46. The page now shows the expected count in the expectation and the gold total alone as
    the unexpected value."""
    import re

    start, end = datetime(2024, 5, 1, tzinfo=UTC), datetime(2024, 5, 1, 1, tzinfo=UTC)
    run_ = validator.validate_totals("p", start, end, completeness={"completeness:users": (45, 46)}, late_rows=0,
                                     total_rows=46)
    result = validator.combine("p", start, end, [run_])
    assert [(o.expectation, o.observed_value) for o in result.failed] == [("completeness:users", "gold=45 bronze=46")]
    validator.build_docs()
    assert result.docs_path is not None
    text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", result.docs_path.read_text()))
    section = text[text.index("users_gold_total Status"):]
    assert "greater than or equal to 46" in section and "less than or equal to 46" in section
    assert re.search(r"Unexpected Value Count 45 1\b", section), section[:400]
    assert "4546" not in text
