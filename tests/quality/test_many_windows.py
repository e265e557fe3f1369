"""Many windows validated at once (``WindowValidator.validate_*_together``, what a catch-up or a backfill does):
each window's outcomes are exactly what validating it alone gives, the passing windows share one Data Docs page,
a failing window has its own, and a validation of many windows that failed leaves no page behind. Real Great
Expectations, no Spark."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path

import pandas as pd

from sluice.quality.outcomes import WindowValidation
from sluice.quality.validator import WindowValidator
from support.dq_windows import START, Window, clean_window, run, run_together, two_outputs, with_gold

HOUR = timedelta(hours=1)


def day(n: int = 10) -> list[Window]:
    return [two_outputs(clean_window(START + h * HOUR, n=3 + h % 4)) for h in range(n)]


def alone(tmp_path: Path, windows: list[Window]) -> dict[datetime, WindowValidation]:
    validator = WindowValidator(tmp_path / "alone" / "docs")
    return {w.start: run(validator, w) for w in windows}


def outcomes(results: dict[datetime, WindowValidation]) -> dict[datetime, list[tuple[str, str, bool]]]:
    return {start: [(o.expectation, o.observed_value, o.success) for o in r.outcomes]
            for start, r in results.items()}


def pages(validator: WindowValidator) -> str:
    """The Data Docs index's text after a build."""
    return validator.build_docs().read_text()


def stored_runs(tmp_path: Path) -> dict[tuple[str, str], bool]:
    """(suite, run name) -> success of every validation result in the together validator's store."""
    runs = {}
    for path in (tmp_path / "together" / "gx_store").rglob("*.json"):
        result = json.loads(path.read_text())
        if "results" in result and "meta" in result:
            runs[(result["suite_name"], result["meta"]["run_id"]["run_name"])] = result["success"]
    return runs


def test_passing_windows_report_what_each_reports_alone_on_one_page(tmp_path: Path) -> None:
    windows = day()
    validator = WindowValidator(tmp_path / "together" / "docs")

    together = run_together(validator, windows)

    assert outcomes(together) == outcomes(alone(tmp_path, windows))
    assert all(r.success for r in together.values())
    # One page for the step: the totals suite's validation of all ten windows.
    assert len({r.docs_path for r in together.values()}) == 1
    index = pages(validator)
    assert "ad_clicks_hourly-20240501T120000Z-20240501T210000Z-10-windows" in index
    page = next(iter(together.values())).docs_path
    assert page is not None and page.is_file() and "totals_per_window" in page.parts


def test_a_failing_window_is_validated_alone_and_the_others_together(tmp_path: Path) -> None:
    windows = day()
    bad_ctr, incomplete, late = 2, 5, 7
    windows[bad_ctr] = with_gold(windows[bad_ctr], ctr=[0.1, 1.5, None, 0.2, 0.3][: len(windows[bad_ctr].gold)])
    windows[incomplete] = replace(windows[incomplete], completeness={
        **windows[incomplete].completeness, "completeness:clicks": (3, 4)})
    windows[late] = replace(windows[late], late_rows=20, total_rows=1000)
    validator = WindowValidator(tmp_path / "together" / "docs")

    together = run_together(validator, windows)

    assert outcomes(together) == outcomes(alone(tmp_path, windows))
    failing = {windows[i].start for i in (bad_ctr, incomplete, late)}
    assert {start for start, r in together.items() if not r.success} == failing
    # Each failing window has its own page (its failing suite's, under its own run), the others share theirs.
    own = {start: together[start].docs_path for start in failing}
    assert len(set(own.values())) == 3
    assert {r.docs_path for start, r in together.items() if start not in failing} - set(own.values())
    assert "ad_clicks_hourly-20240501T140000Z" in pages(validator)  # the bad ctr's own run
    # The validations of many windows that are kept: the totals of the 8 windows that passed, the gold rows of
    # the 9 and the second output's gold rows of all 10; the failed ones of all ten were removed.
    together_runs = {key: ok for key, ok in stored_runs(tmp_path).items() if key[1].endswith("-windows")}
    assert together_runs == {
        ("ad_clicks_hourly.totals_per_window", "ad_clicks_hourly-20240501T120000Z-20240501T210000Z-8-windows"): True,
        ("ad_clicks_hourly.gold_rows", "ad_clicks_hourly-20240501T120000Z-20240501T210000Z-9-windows"): True,
        ("unmatched_clicks_hourly.gold_rows", "ad_clicks_hourly-20240501T120000Z-20240501T210000Z-10-windows"): True,
    }


def test_an_expectation_that_cannot_run_sends_every_window_alone(tmp_path: Path) -> None:
    windows = [replace(w, gold=w.gold.drop(columns=["clicks"])) for w in day(4)]
    validator = WindowValidator(tmp_path / "together" / "docs")

    together = run_together(validator, windows)

    assert outcomes(together) == outcomes(alone(tmp_path, windows))
    assert all(r.failed and all(o.observed_value.startswith("error: ") for o in r.failed)
               for r in together.values())


def test_windows_without_gold_rows_validate_with_the_others(tmp_path: Path) -> None:
    windows = day(4)
    windows[1] = replace(windows[1], gold=windows[1].gold.iloc[0:0],
                         completeness={k: (0, 0) for k in windows[1].completeness})
    windows[3] = with_gold(windows[3], impressions=pd.array([1, 2, 3, 4, 5, 6][: len(windows[3].gold)],
                                                             dtype="Int64"))
    validator = WindowValidator(tmp_path / "together" / "docs")

    together = run_together(validator, windows)

    assert outcomes(together) == outcomes(alone(tmp_path, windows))
