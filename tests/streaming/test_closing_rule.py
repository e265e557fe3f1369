"""The closing rule, the same on every path (SPEC 4): a window [start, end) is written once, in the cycle
after which the pipeline watermark W (the minimum of the stored per-stream watermarks) satisfies
W >= end + lateness_bound. Streaming, batch catch-up, the batch close and backfills agree on it, including
for a window that lies exactly on the boundary, and whatever Spark's own watermark does after a restart."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from sluice.config import Settings, load_settings
from sluice.ingest import load_state
from sluice.storage.ledger import read_ledger
from sluice.streaming.backfill import run_backfill
from support.lake import cycle, land, table
from support.logs import logged

pytestmark = pytest.mark.spark

DAY = datetime(2024, 5, 1, tzinfo=UTC)
PIPELINE = "ad_clicks_hourly"  # 10-min watermark delays, 30-min join bound


def at(hhmm: str) -> datetime:
    hours, minutes = hhmm.split(":")
    return DAY + timedelta(hours=int(hours), minutes=int(minutes))


def iso(hhmm: str) -> str:
    return at(hhmm).isoformat().replace("+00:00", "Z")


def imp(i: str, hhmm: str, ad: str = "a1") -> dict[str, Any]:
    return {"impression_id": i, "ad_id": ad, "event_time": iso(hhmm)}


def click(k: str, impression: str, hhmm: str, ad: str = "a1") -> dict[str, Any]:
    return {"click_id": k, "impression_id": impression, "ad_id": ad, "event_time": iso(hhmm)}


def gold(settings: Settings, name: str = PIPELINE) -> list[tuple[Any, ...]]:
    return sorted(tuple(sorted(r.items())) for r in table(settings, f"gold/{name}"))


def windows(settings: Settings) -> list[tuple[datetime, datetime]]:
    return sorted({(r["window_start"], r["window_end"]) for r in table(settings, f"gold/{PIPELINE}")})


def home(tmp_path: Path, name: str, catchup_min_windows: int) -> Settings:
    return replace(load_settings({}, home=tmp_path / name), catchup_min_windows=catchup_min_windows)


def land_boundary_data(settings: Settings) -> None:
    """Impressions up to 06:45 (watermark 06:35), clicks up to 06:40 (watermark 06:30): W = 06:30 exactly,
    which is the end of [05:00, 06:00) plus the 30-min join bound."""
    land(settings, "impressions", "i0.jsonl", [imp("i0", "04:20")], at("04:30"))
    land(settings, "impressions", "i1.jsonl", [imp("i1", "05:10"), imp("i2", "05:50"), imp("i3", "06:45", "a2")],
         at("06:50"))
    land(settings, "clicks", "c1.jsonl", [click("k1", "i2", "06:20"), click("k2", "i3", "06:40", "a2")], at("06:50"))


@pytest.mark.parametrize("catchup_min_windows", [0, 1], ids=["streaming", "catch-up"])
def test_a_window_whose_end_plus_bound_equals_the_watermark_closes_on_every_path(
    spark: SparkSession, tmp_path: Path, catchup_min_windows: int
) -> None:
    settings = home(tmp_path, "home", catchup_min_windows)
    land_boundary_data(settings)
    after = cycle(spark, settings, PIPELINE, at("06:55"))
    caught_up = (after.checkpoints / "pipelines" / PIPELINE / "catchup.json").exists()
    assert caught_up == bool(catchup_min_windows), "the catch-up path must be the one under test"
    assert min(load_state(after, s).watermark for s in ("impressions", "clicks")) == at("06:30")
    # [05:00, 06:00) ends exactly at W - 30 min: final (">="); [06:00, 07:00) is not.
    assert windows(after) == [(at("04:00"), at("05:00")), (at("05:00"), at("06:00"))]
    rows = {(r["window_start"], r["ad_id"]): (r["impressions"], r["clicks"]) for r in table(after, f"gold/{PIPELINE}")}
    assert rows == {(at("04:00"), "a1"): (1, 0), (at("05:00"), "a1"): (2, 1)}
    ledger = read_ledger(after, PIPELINE)
    assert [(r.window_start, r.closed_by_watermark) for r in ledger] == [(at("04:00"), at("06:30")),
                                                                          (at("05:00"), at("06:30"))]

    # A backfill of the same range reproduces it exactly.
    before = gold(after)
    run_backfill(after, PIPELINE, at("04:00"), at("06:00"), spark=spark, deliver_alerts=False)
    assert gold(after) == before


def test_streaming_and_catch_up_homes_agree_on_the_boundary(spark: SparkSession, tmp_path: Path) -> None:
    homes = [home(tmp_path, f"home{n}", n) for n in (0, 1)]
    for settings in homes:
        land_boundary_data(settings)
        cycle(spark, settings, PIPELINE, at("06:55"))
    assert gold(homes[0]) == gold(homes[1])
    assert gold(homes[0], "unmatched_clicks_hourly") == gold(homes[1], "unmatched_clicks_hourly")


def test_a_window_closes_in_the_cycle_where_the_minimum_of_the_stored_watermarks_passes_it(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Issue 10, finding 2: after a restart, one stream idle and the other with nothing new. Spark's own
    watermark would stay behind (an input without rows in a batch); sluice's closing does not depend on it."""
    settings = home(tmp_path, "home", 0)
    land(settings, "impressions", "i1.jsonl", [imp("i1", "05:10"), imp("i2", "05:50"), imp("i3", "06:45", "a2")],
         at("06:50"))
    land(settings, "clicks", "c1.jsonl", [click("k1", "i2", "06:20")], at("06:30"))

    first = cycle(spark, settings, PIPELINE, at("06:55"))  # W = min(06:35, 06:10): nothing closes
    assert windows(first) == []
    second = cycle(spark, settings, PIPELINE, at("07:00"))  # clicks heartbeat at 06:30: W = 06:20
    assert load_state(second, "clicks").watermark == at("06:20") and windows(second) == []
    # Clicks heartbeat at 06:40: W = min(06:35, 06:30) = 06:30. Impressions get nothing at all this cycle.
    third = cycle(spark, settings, PIPELINE, at("07:10"))
    assert load_state(third, "impressions").watermark == at("06:35")
    assert load_state(third, "clicks").watermark == at("06:30")
    assert windows(third) == [(at("05:00"), at("06:00"))]
    rows = [(r["ad_id"], r["impressions"], r["clicks"], r["ctr"]) for r in table(third, f"gold/{PIPELINE}")]
    assert rows == [("a1", 2, 1, 0.5)]
    assert [r.closed_by_watermark for r in read_ledger(third, PIPELINE)] == [at("06:30")]


def _query_batches(settings: Settings) -> dict[str, int]:
    """How many micro-batches each output's stateful query has planned (its checkpoint's offsets)."""
    root = settings.checkpoints / "pipelines" / PIPELINE
    return {output: len(list((root / output / "offsets").glob("[0-9]*")))
            for output in ("ad_clicks_hourly", "unmatched_clicks_hourly")}


def test_a_cycle_that_cannot_close_a_window_leaves_its_rows_to_the_cycle_that_can(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Issue 13: most scheduled cycles cannot close a window; they skip the stateful queries, whose next
    run takes the deferred rows. The window they close is the one a backfill computes."""
    settings = home(tmp_path, "home", 0)
    land_boundary_data(settings)
    first = cycle(spark, settings, PIPELINE, at("06:55"))
    assert windows(first) == [(at("04:00"), at("05:00")), (at("05:00"), at("06:00"))]
    ran = _query_batches(first)
    assert all(ran.values()), ran

    # W = min(06:40, 06:45) = 06:40: the closing boundary 06:10 is short of [06:00, 07:00)'s end.
    land(settings, "impressions", "i2.jsonl", [imp("i4", "06:50", "a2")], at("07:00"))
    land(settings, "clicks", "c2.jsonl", [click("k3", "i3", "06:55", "a2"), click("k4", "i0", "06:52")], at("07:00"))
    second = cycle(spark, settings, PIPELINE, at("07:05"))
    assert load_state(second, "impressions").watermark == at("06:40")
    assert _query_batches(second) == ran, "the stateful queries must not run when no window can close"
    assert windows(second) == windows(first)

    # W = 07:35: [06:00, 07:00) closes, with the rows the second cycle left in bronze.
    land(settings, "impressions", "i3.jsonl", [imp("i5", "07:45")], at("07:50"))
    land(settings, "clicks", "c3.jsonl", [click("k5", "i5", "07:45")], at("07:50"))
    with logged("sluice.aggregate") as said:
        third = cycle(spark, settings, PIPELINE, at("07:55"))
    assert all(n > ran[o] for o, n in _query_batches(third).items())
    # Both outputs' queries wrote [06:00, 07:00), the only window final now: the batch close has nothing to do
    # and is skipped (it would read bronze and run the transforms to find no window left).
    assert any("no batch close needed" in m for m in said), said
    assert not any("in batch up to" in m for m in said), said
    assert windows(third)[-1] == (at("06:00"), at("07:00"))
    rows = {r["ad_id"]: (r["impressions"], r["clicks"])
            for r in table(third, f"gold/{PIPELINE}") if r["window_start"] == at("06:00")}
    assert rows == {"a2": (2, 1)}  # i3 clicked twice (k2, k3) is one clicked impression; i4 none
    unmatched = {(r["window_start"], r["ad_id"]): r["unmatched_clicks"]
                 for r in table(third, "gold/unmatched_clicks_hourly")}
    assert unmatched[(at("06:00"), "a1")] == 1  # k4: i0 is 2.5 h older, outside the join bound

    before = (gold(third), gold(third, "unmatched_clicks_hourly"))
    run_backfill(third, PIPELINE, at("06:00"), at("07:00"), spark=spark, deliver_alerts=False)
    assert (gold(third), gold(third, "unmatched_clicks_hourly")) == before
