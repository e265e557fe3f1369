"""Hopping windows configured through ``Settings.windows``, end to end through ``run_cycle``: overlapping windows
(size 1 h, hop 30 min) and windows with gaps (size 30 min, hop 1 h, records in the gaps fall in no window),
against small hand-computed expectations for user_activity_hourly and ad_clicks_hourly."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import pytest
from pyspark.sql import SparkSession

from sluice.config import Settings
from sluice.config import load_settings as _load_settings
from sluice.ingest.state import load_state
from sluice.windows.ledger import read_ledger
from support import lake
from support.lake import table

pytestmark = pytest.mark.spark

OVERLAP = (timedelta(hours=1), timedelta(minutes=30))
GAPS = (timedelta(minutes=30), timedelta(hours=1))
ARRIVAL = "11:35:00"  # every file arrives then; the cycles run long after, so idle heartbeats close everything
NOW = "14:00:00"


def at(clock: str) -> datetime:
    return datetime.fromisoformat(f"2024-05-01T{clock}+00:00")


def w(start: str, end: str) -> tuple[datetime, datetime]:
    return at(start), at(end)


def land(settings: Settings, stream: str, records: list[dict[str, Any]]) -> None:
    """One landing file ``<stream>-1.jsonl`` of ``records`` (event times given as clocks on 2024-05-01),
    arriving at ARRIVAL."""
    lake.land(settings, stream, f"{stream}-1.jsonl",
              [{**r, "event_time": f"2024-05-01T{r['event_time']}Z"} for r in records], at(ARRIVAL))


def cycle(spark: SparkSession, settings: Settings, pipeline: str) -> Settings:
    return lake.cycle(spark, settings, pipeline, at(NOW))


def rows(settings: Settings, name: str, *columns: str) -> list[tuple[Any, ...]]:
    return sorted((r["window_start"], r["window_end"], *(r[c] for c in columns)) for r in table(settings, name))


def check_ledger(settings: Settings, pipeline: str, gold_windows: set[tuple[datetime, datetime]]) -> None:
    ledger = read_ledger(settings, pipeline)
    assert [(r.window_start, r.window_end) for r in ledger] == sorted(gold_windows)
    bound = _load_settings({}).pipeline(pipeline).lateness_bound
    for row in ledger:
        assert row.closed_by_watermark is not None and row.closed_by_watermark >= row.window_end + bound
    streams = ("events",) if pipeline == "user_activity_hourly" else ("impressions", "clicks")
    assert all(load_state(settings, s).totals()["accepted"] > 0 for s in streams)


# user_activity: u1 has 3, 4, 2 and 7 events in the 10-min windows starting 10:00, 10:20, 10:40 and 11:10;
# u2 has 6 in the one starting 10:30.
EVENT_COUNTS = {("u1", "10:00"): 3, ("u1", "10:20"): 4, ("u1", "10:40"): 2, ("u1", "11:10"): 7, ("u2", "10:30"): 6}


def land_events(settings: Settings) -> None:
    records = []
    for (user, bucket), n in EVENT_COUNTS.items():
        for k in range(n):
            t = at(f"{bucket}:00") + timedelta(seconds=k * 599 // max(n - 1, 1))  # first and last second
            records.append({"event_id": f"{user}-{bucket}-{k}", "user_id": user, "event_time": f"{t:%H:%M:%S}"})
    land(settings, "events", records)


# ad_clicks: impressions i1 (ad A, 10:10), i2 (A, 10:40), i3 (B, 10:50), i4 (B, 11:20); clicks c1 on i1 at
# 10:15, c2 and c3 on i2 at 10:45 and 11:05 (25 min after it: matched), c4 on i3 at 11:30 (40 min after:
# unmatched, exactly on a window boundary) and c5 on an unknown impression (ad A, 10:20).
IMPRESSIONS = [("i1", "A", "10:10:00"), ("i2", "A", "10:40:00"), ("i3", "B", "10:50:00"), ("i4", "B", "11:20:00")]
CLICKS = [
    ("c1", "i1", "A", "10:15:00"),
    ("c2", "i2", "A", "10:45:00"),
    ("c3", "i2", "A", "11:05:00"),
    ("c4", "i3", "B", "11:30:00"),
    ("c5", "nope", "A", "10:20:00"),
]


def land_ad_traffic(settings: Settings) -> None:
    land(settings, "impressions", [{"impression_id": i, "ad_id": a, "event_time": t} for i, a, t in IMPRESSIONS])
    land(settings, "clicks",
         [{"click_id": c, "impression_id": i, "ad_id": a, "event_time": t} for c, i, a, t in CLICKS])


# -------------------------------------------------------------------------------------- overlapping windows
def test_overlapping_windows_user_activity(spark: SparkSession, settings: Settings) -> None:
    settings = replace(settings, windows={"user_activity_hourly": OVERLAP})
    land_events(settings)
    done = cycle(spark, settings, "user_activity_hourly")
    # Each 10-min window counts in the two 1 h windows that contain it; the average is over those that have
    # events.
    expected = [
        (*w("09:30:00", "10:30:00"), "u1", 3.5),  # 3, 4
        (*w("10:00:00", "11:00:00"), "u1", 3.0),  # 3, 4, 2
        (*w("10:00:00", "11:00:00"), "u2", 6.0),
        (*w("10:30:00", "11:30:00"), "u1", 4.5),  # 2, 7
        (*w("10:30:00", "11:30:00"), "u2", 6.0),
        (*w("11:00:00", "12:00:00"), "u1", 7.0),
    ]
    assert rows(done, "gold/user_activity_hourly", "user_id", "avg_events_per_10min") == expected
    check_ledger(done, "user_activity_hourly", {(r[0], r[1]) for r in expected})


def test_overlapping_windows_ad_clicks(spark: SparkSession, settings: Settings) -> None:
    settings = replace(settings, windows={"ad_clicks_hourly": OVERLAP})
    land_ad_traffic(settings)
    done = cycle(spark, settings, "ad_clicks_hourly")
    # Impressions fall in both windows containing their event time, each with its matched clicks.
    expected = [
        (*w("09:30:00", "10:30:00"), "A", 1, 1, 1.0),  # i1 + c1
        (*w("10:00:00", "11:00:00"), "A", 2, 3, 1.5),  # i1 + c1, i2 + c2 c3
        (*w("10:00:00", "11:00:00"), "B", 1, 0, 0.0),  # i3
        (*w("10:30:00", "11:30:00"), "A", 1, 2, 2.0),  # i2 + c2 c3
        (*w("10:30:00", "11:30:00"), "B", 2, 0, 0.0),  # i3, i4
        (*w("11:00:00", "12:00:00"), "B", 1, 0, 0.0),  # i4
    ]
    assert rows(done, "gold/ad_clicks_hourly", "ad_id", "impressions", "clicks", "ctr") == expected
    # Unmatched clicks in the windows of their own event time: c5 (10:20), c4 (11:30, half-open bounds).
    unmatched = [
        (*w("09:30:00", "10:30:00"), "A", 1),
        (*w("10:00:00", "11:00:00"), "A", 1),
        (*w("11:00:00", "12:00:00"), "B", 1),
        (*w("11:30:00", "12:30:00"), "B", 1),
    ]
    assert rows(done, "gold/unmatched_clicks_hourly", "ad_id", "unmatched_clicks") == unmatched
    check_ledger(done, "ad_clicks_hourly", {(r[0], r[1]) for r in expected + unmatched})


# ---------------------------------------------------------------------------------------- windows with gaps

def test_windows_with_gaps_user_activity(spark: SparkSession, settings: Settings) -> None:
    settings = replace(settings, windows={"user_activity_hourly": GAPS})
    land_events(settings)
    done = cycle(spark, settings, "user_activity_hourly")
    # Windows [10:00, 10:30) and [11:00, 11:30); u1's 10:40 window and all of u2 (10:30) lie in the gaps.
    expected = [
        (*w("10:00:00", "10:30:00"), "u1", 3.5),  # 3, 4
        (*w("11:00:00", "11:30:00"), "u1", 7.0),
    ]
    assert rows(done, "gold/user_activity_hourly", "user_id", "avg_events_per_10min") == expected
    check_ledger(done, "user_activity_hourly", {(r[0], r[1]) for r in expected})


def test_windows_with_gaps_ad_clicks(spark: SparkSession, settings: Settings) -> None:
    settings = replace(settings, windows={"ad_clicks_hourly": GAPS})
    land_ad_traffic(settings)
    done = cycle(spark, settings, "ad_clicks_hourly")
    # i2 and i3 (10:40, 10:50) lie in the gap, and so do their clicks' counts; c4 at 11:30 is just past
    # [11:00, 11:30): in the gap too.
    expected = [
        (*w("10:00:00", "10:30:00"), "A", 1, 1, 1.0),  # i1 + c1
        (*w("11:00:00", "11:30:00"), "B", 1, 0, 0.0),  # i4
    ]
    assert rows(done, "gold/ad_clicks_hourly", "ad_id", "impressions", "clicks", "ctr") == expected
    unmatched = [(*w("10:00:00", "10:30:00"), "A", 1)]  # c5
    assert rows(done, "gold/unmatched_clicks_hourly", "ad_id", "unmatched_clicks") == unmatched
    check_ledger(done, "ad_clicks_hourly", {(r[0], r[1]) for r in expected + unmatched})
