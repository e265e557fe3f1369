"""Batch catch-up (sluice.aggregate): a fresh pipeline facing a backlog computes the closable windows in batch
and streams from there. What a user must not be able to tell: gold and the ledger are the same as if every
window had been streamed, in the cycle of the catch-up and in every cycle after it."""

from __future__ import annotations

import shutil
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from sluice.config import Settings, load_settings
from sluice.runtime.context import open_run
from sluice.streaming.batch import CatchUp
from sluice.streaming.cycle import run_cycle
from sluice_tools.generate import GenerateOptions, generate
from support.lake import read_rows

pytestmark = pytest.mark.spark

HOUR = timedelta(hours=1)
CASES = {
    "ad_clicks_hourly": GenerateOptions(
        seed=5, hours=7, impressions_per_hour=40, click_rate=0.6, click_outside_share=0.15,
        click_unknown_share=0.1, ads=4, users=10, disorder=300, duplicate_share=0.05, late_share=0.03,
        malformed_share=0.02, streams=("impressions", "clicks"),
    ),
    "user_activity_hourly": GenerateOptions(
        seed=6, hours=7, events_per_hour=60, users=6, disorder=200, duplicate_share=0.05, late_share=0.03,
        malformed_share=0.02, streams=("events",),
    ),
}
GOLD = {
    "ad_clicks_hourly": ("gold/ad_clicks_hourly", "gold/unmatched_clicks_hourly"),
    "user_activity_hourly": ("gold/user_activity_hourly",),
}


def _rows(settings: Settings, table: str, columns: tuple[str, ...] | None = None) -> list[tuple[Any, ...]]:
    path = settings.lake.local() / table
    if not DeltaTable.is_deltatable(str(path)):
        return []
    data = read_rows(path)
    return sorted(tuple(r[c] for c in (columns or tuple(r))) for r in data)


def _snapshot(settings: Settings, pipeline: str) -> dict[str, list[tuple[Any, ...]]]:
    out = {table: _rows(settings, table) for table in GOLD[pipeline]}
    # Which watermark closed a window legitimately differs (one batch vs. micro-batches); what closed and
    # with how many rows may not.
    out["ledger"] = _rows(settings, "ops/window_ledger", ("pipeline", "window_start", "window_end", "state", "rows",
                                                          "late_rows"))
    return out


def _reveal(staging: Path, landing: Path, upto: datetime) -> None:
    for file in sorted(staging.glob("*/*.json*")):
        if file.stat().st_mtime <= upto.timestamp():
            target = landing / file.parent.name / file.name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(file, target)  # keeps the mtime (= arrival time)


@pytest.mark.parametrize("pipeline", sorted(CASES))
def test_catch_up_gives_the_same_tables_as_streaming(
    spark: SparkSession, tmp_path: Path, pipeline: str
) -> None:
    options = CASES[pipeline]
    staging = tmp_path / "staging"
    manifest = generate(staging, options)
    assert manifest.last_arrival is not None
    # Cycle 1 sees the first 5 hours (a backlog of 4+ closable windows); cycle 2 the rest, then idle.
    plan = [options.start + 5 * HOUR + timedelta(minutes=5), manifest.last_arrival + 3 * HOUR]

    homes = {"catch-up": 2, "streaming": 0}  # catchup_min_windows
    snapshots: dict[str, list[dict[str, list[tuple[Any, ...]]]]] = {}
    for label, minimum in homes.items():
        # batch_close_rows=0: the cycles after the catch-up run the streaming queries, the path compared here.
        settings = replace(load_settings({}, home=tmp_path / label), catchup_min_windows=minimum, batch_close_rows=0)
        snapshots[label] = []
        for now in plan:
            _reveal(staging, settings.landing.local(), now)
            at = replace(settings, now_override=now)
            run_cycle(open_run(at, spark), pipeline, check_quality=False, deliver_alerts=False)
            snapshots[label].append(_snapshot(at, pipeline))
        marker = settings.checkpoints / "pipelines" / pipeline / "catchup.json"
        if minimum:
            catchup = CatchUp.from_json(marker.read_text())
            assert catchup.done
            # The batch closed several windows in cycle 1, and the stream closed more in cycle 2.
            first = {(r[1], r[2]) for r in snapshots[label][0]["ledger"]}
            later = {(r[1], r[2]) for r in snapshots[label][1]["ledger"]} - first
            assert len(first) >= 3 and all(end <= catchup.boundary for _start, end in first)
            assert later and all(end > catchup.boundary for _start, end in later)
        else:
            assert not marker.exists()

    for cycle, (caught_up, streamed) in enumerate(zip(snapshots["catch-up"], snapshots["streaming"], strict=True)):
        for table in streamed:
            assert caught_up[table] == streamed[table], (cycle, table)
    assert any(snapshots["streaming"][0][t] for t in GOLD[pipeline]), "cycle 1 closed nothing: a weak test"


def test_no_catch_up_below_the_threshold_or_once_streaming(spark: SparkSession, tmp_path: Path) -> None:
    options = CASES["user_activity_hourly"]
    settings = replace(load_settings({}, home=tmp_path / "home"), catchup_min_windows=50, batch_close_rows=0)
    generate(settings.landing.local(), options)
    run_cycle(open_run(replace(settings, now_override=options.start + 8 * HOUR), spark), "user_activity_hourly",
              check_quality=False, deliver_alerts=False)
    marker = settings.checkpoints / "pipelines" / "user_activity_hourly" / "catchup.json"
    assert not marker.exists()  # 7 windows < 50
    assert _rows(settings, "gold/user_activity_hourly")  # streamed instead

    # The query has started now: a later backlog is streamed, whatever the threshold.
    later = replace(settings, catchup_min_windows=1, now_override=options.start + 30 * HOUR)
    run_cycle(open_run(later, spark), "user_activity_hourly", check_quality=False, deliver_alerts=False)
    assert not marker.exists()


def test_catch_up_setting_is_validated() -> None:
    from sluice.config import ConfigError

    assert load_settings({"SLUICE_CATCHUP_MIN_WINDOWS": "0"}, home="/tmp/x").catchup_min_windows == 0
    with pytest.raises(ConfigError, match="SLUICE_CATCHUP_MIN_WINDOWS"):
        load_settings({"SLUICE_CATCHUP_MIN_WINDOWS": "-1"}, home="/tmp/x")
