"""Ingest against SPEC sections 2-3, with real Spark and real Delta tables under tmp_path."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from sluice.config import Settings
from sluice.core.lake import Lake, parse_root
from sluice.ingest import microbatch as landing
from sluice.ingest.run import run_ingest
from sluice.ingest.state import load_state
from sluice.ingest.time_rules import file_watermarks
from sluice.runtime.context import open_run
from support import lake
from support.lake import table

pytestmark = pytest.mark.spark

T0 = datetime(2024, 5, 1, 10, 0, tzinfo=UTC)


def ts(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def iso(minutes: float) -> str:
    return ts(minutes).strftime("%Y-%m-%dT%H:%M:%SZ")


def imp(i: str, minutes: float, ad: str = "a1", **extra: Any) -> str:
    return json.dumps({"impression_id": i, "ad_id": ad, "event_time": iso(minutes), **extra})


def land(settings: Settings, stream: str, name: str, lines: list[str], arrival_minutes: float) -> Path:
    """A landing file (see ``support.lake.land``) arriving ``arrival_minutes`` after T0."""
    return lake.land(settings, stream, name, lines, ts(arrival_minutes))


def ingest(spark: SparkSession, settings: Settings, now_minutes: float, *streams: str) -> Settings:
    settings = replace(settings, now_override=ts(now_minutes))
    run_ingest(open_run(settings, spark), streams or ("impressions",))
    return settings


def test_each_quarantine_reason(spark: SparkSession, settings: Settings) -> None:
    land(
        settings,
        "impressions",
        "f1.jsonl",
        [
            imp("ok", 0),
            "this is not json",
            '{"impression_id": "trunc", "ad_id": ',
            "[1, 2, 3]",
            json.dumps({"impression_id": "m1", "event_time": iso(1)}),  # no ad_id
            json.dumps({"impression_id": "m2", "ad_id": "a1"}),  # no event_time
            json.dumps({"impression_id": "b1", "ad_id": "a1", "event_time": "yesterday"}),
            json.dumps({"impression_id": "b2", "ad_id": "a1", "event_time": "2024-13-45T99:00:00Z"}),
            json.dumps({"impression_id": "b3", "ad_id": "a1", "event_time": "2024-05-01 10:00:00"}),  # no zone
            imp("e1", 20),  # arrival is 10:12, so 10:20 is 8 min ahead > 5 min tolerance
            imp("e_ok", 16),  # 4 min ahead: within tolerance, accepted
        ],
        arrival_minutes=12,
    )
    ingest(spark, settings, 13)
    reasons = {r["raw"]: r["reason"] for r in table(settings, "quarantine/impressions")}
    assert sorted(reasons.values()) == sorted(
        ["malformed_json"] * 3 + ["missing_field"] * 2 + ["bad_timestamp"] * 3 + ["early"]
    )
    assert reasons[imp("e1", 20)] == "early"
    assert reasons["this is not json"] == "malformed_json"
    q = table(settings, "quarantine/impressions")
    assert all(r["source_file"].endswith("f1.jsonl") for r in q)
    assert {r["impression_id"] for r in table(settings, "bronze/impressions")} == {"ok", "e_ok"}


def test_rfc3339_lower_case_separators_and_offsets_are_accepted(spark: SparkSession, settings: Settings) -> None:
    """RFC 3339 allows 't' and 'z'; offsets are normalised to UTC; a zoneless time is still bad_timestamp."""
    lines = [
        json.dumps({"impression_id": "lower", "ad_id": "a1", "event_time": "2024-05-01t10:01:00z"}),
        json.dumps({"impression_id": "offset", "ad_id": "a1", "event_time": "2024-05-01T12:02:00+02:00"}),
        json.dumps({"impression_id": "nozone", "ad_id": "a1", "event_time": "2024-05-01T10:03:00"}),
    ]
    land(settings, "impressions", "f1.jsonl", lines, arrival_minutes=5)
    ingest(spark, settings, 6)
    bronze = {r["impression_id"]: r["event_time"] for r in table(settings, "bronze/impressions")}
    assert bronze == {"lower": ts(1), "offset": ts(2)}
    assert [r["reason"] for r in table(settings, "quarantine/impressions")] == ["bad_timestamp"]


def test_early_records_do_not_advance_the_watermark(spark: SparkSession, settings: Settings) -> None:
    land(settings, "impressions", "f1.jsonl", [imp("a", 0), imp("early", 300)], arrival_minutes=5)
    ingest(spark, settings, 6)
    state = load_state(settings, "impressions")
    assert state.watermark == ts(0) - timedelta(minutes=10)


def test_watermark_rule_across_batches_and_restarts(spark: SparkSession, settings: Settings) -> None:
    # Batch 1 accepts up to 10:30 -> watermark 10:20 applies to LATER batches only.
    land(settings, "impressions", "f1.jsonl", [imp("a", 30), imp("b", 5)], arrival_minutes=31)
    ingest(spark, settings, 32)
    assert load_state(settings, "impressions").watermark == ts(20)
    # A restart (new query from the same checkpoint): the watermark is still 10:20.
    land(settings, "impressions", "f2.jsonl", [imp("c", 21), imp("d", 19), imp("e", 25)], arrival_minutes=33)
    ingest(spark, settings, 34)
    state = load_state(settings, "impressions")
    f2 = next(r for r in state.rows if r.source_file and r.source_file.endswith("f2.jsonl"))
    assert f2.watermark_before == ts(20)
    assert (f2.accepted, f2.late) == (2, 1)
    # Max accepted is still 10:30, so the watermark does not move, and never moves backwards.
    assert f2.watermark_after == ts(20)
    land(settings, "impressions", "f3.jsonl", [imp("f", 50)], arrival_minutes=51)
    ingest(spark, settings, 52)
    assert load_state(settings, "impressions").watermark == ts(40)
    marks = [r.watermark_after for r in load_state(settings, "impressions").rows]
    assert marks == sorted(marks)


def test_late_records_go_to_dlq_with_the_watermark_they_missed(
    spark: SparkSession, settings: Settings
) -> None:
    land(settings, "impressions", "f1.jsonl", [imp("a", 60)], arrival_minutes=61)
    land(settings, "impressions", "f2.jsonl", [imp("late1", 30), imp("edge", 50), imp("ok", 55)], 62)
    ingest(spark, settings, 63)
    dlq = table(settings, "dlq/impressions")
    assert [(r["impression_id"], r["watermark"]) for r in dlq] == [("late1", ts(50))]
    assert dlq[0]["event_time"] == ts(30)
    # event_time == watermark is not below it: accepted.
    assert {r["impression_id"] for r in table(settings, "bronze/impressions")} == {"a", "edge", "ok"}


def test_lateness_is_judged_file_by_file_whatever_the_trigger_size(
    spark: SparkSession, settings: Settings
) -> None:
    land(settings, "impressions", "f1.jsonl", [imp("a", 60)], arrival_minutes=61)
    land(settings, "impressions", "f2.jsonl", [imp("b", 30)], arrival_minutes=62)
    for files_per_trigger, home in ((1000, "big"), (1, "small")):
        s = replace(settings, lake=Lake(parse_root(settings.home / home, "lake")),
                    max_files_per_trigger=files_per_trigger)
        ingest(spark, s, 63)
        assert [r["impression_id"] for r in table(s, "dlq/impressions")] == ["b"]
        # The counts agree: with both files in one trigger, f2 is judged against the watermark f1 moved.
        counts = sorted((r["source_file"].rsplit("/", 1)[-1], r["accepted"], r["late"], r["watermark_before"])
                        for r in table(s, "ops/ingest_batches") if not r["is_heartbeat"])
        assert counts == [("f1.jsonl", 1, 0, None), ("f2.jsonl", 0, 1, ts(50))], files_per_trigger


def test_idle_heartbeat_advances_the_watermark(spark: SparkSession, settings: Settings) -> None:
    land(settings, "impressions", "f1.jsonl", [imp("a", 0)], arrival_minutes=1)
    ingest(spark, settings, 20)  # 19 min since the last arrival: not idle yet
    state = load_state(settings, "impressions")
    assert not any(r.is_heartbeat for r in state.rows)
    assert state.watermark == ts(-10)
    ingest(spark, settings, 31)  # 30 min since the last arrival: idle
    state = load_state(settings, "impressions")
    heartbeats = [r for r in state.rows if r.is_heartbeat]
    assert len(heartbeats) == 1
    assert heartbeats[0].max_event_time == ts(1)  # now - idle_timeout
    assert state.watermark == ts(1) - timedelta(minutes=10)
    bronze = table(settings, "bronze/impressions")
    hb = [r for r in bronze if r["is_heartbeat"]]
    assert len(hb) == 1 and hb[0]["event_time"] == ts(1)
    assert all(r["impression_id"] for r in bronze)  # heartbeats carry non-null sentinel keys
    # Same now again: nothing new to say, no second heartbeat.
    ingest(spark, settings, 31)
    assert sum(r.is_heartbeat for r in load_state(settings, "impressions").rows) == 1
    # A record that the heartbeat's watermark has passed is late.
    land(settings, "impressions", "f2.jsonl", [imp("old", -15)], arrival_minutes=40)
    ingest(spark, settings, 41)
    assert [r["impression_id"] for r in table(settings, "dlq/impressions")] == ["old"]


def test_a_stream_that_never_received_a_file_gets_no_heartbeat_so_its_history_is_not_late(
    spark: SparkSession, settings: Settings
) -> None:
    """Issue 29, the watermark trap (SPEC 3): a run before the landing folder exists used to write a heartbeat
    at wall-clock now - idle_timeout, and the history the producer landed next (event times of days before)
    all went to the DLQ. A stream that has never received a file has no watermark and gets no heartbeat."""
    ingest(spark, settings, 3 * 24 * 60, "clicks")  # no landing folder: not an error, and no clock yet
    assert load_state(settings, "clicks").rows == []
    assert load_state(settings, "clicks").watermark is None
    (settings.landing_dir("clicks")).mkdir(parents=True)
    ingest(spark, settings, 3 * 24 * 60 + 1, "clicks")  # an empty folder: the same
    assert load_state(settings, "clicks").rows == []
    # The producer's history arrives days later than its event times: accepted, not late.
    old = [{"click_id": f"k{i}", "impression_id": "i", "ad_id": "a", "event_time": ts(i).isoformat()} for i in range(3)]
    land(settings, "clicks", "history.jsonl", [json.dumps(r) for r in old], arrival_minutes=3 * 24 * 60 + 2)
    ingest(spark, settings, 3 * 24 * 60 + 3, "clicks")
    assert load_state(settings, "clicks").totals()["accepted"] == 3
    # From then on the stream has a clock, and idleness gives heartbeats as before.
    ingest(spark, settings, 3 * 24 * 60 + 40, "clicks")
    assert [r.is_heartbeat for r in load_state(settings, "clicks").rows] == [False, True]


def test_a_file_whose_lines_are_all_late_is_a_warning_in_the_run_and_in_status(
    spark: SparkSession, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    from sluice.reports.status import render_status

    land(settings, "impressions", "now.jsonl", [imp("a", 100)], arrival_minutes=101)
    land(settings, "impressions", "replay.jsonl", [imp(f"r{i}", i) for i in range(3)], arrival_minutes=102)
    with caplog.at_level("WARNING", logger="sluice.ingest"):
        done = ingest(spark, settings, 103)
    message = ("file replay.jsonl: 3 of 3 lines late (watermark 2024-05-01T11:30:00Z); "
               "is the producer replaying history?")
    assert message in caplog.text
    assert message in render_status(done)


def test_offset_timestamps_are_normalised_to_utc(spark: SparkSession, settings: Settings) -> None:
    line = json.dumps({"impression_id": "tz", "ad_id": "a", "event_time": "2024-05-01T12:07:30.250+02:00"})
    land(settings, "impressions", "f1.jsonl", [line], arrival_minutes=10)
    ingest(spark, settings, 11)
    [row] = table(settings, "bronze/impressions")
    assert row["event_time"] == datetime(2024, 5, 1, 10, 7, 30, 250000, tzinfo=UTC)
    assert (row["event_date"].isoformat(), row["event_hour"]) == ("2024-05-01", 10)


@pytest.mark.parametrize("broadcast", [True, False], ids=["batch-ids-broadcast", "batch-ids-shuffled"])
def test_duplicates_within_a_file_across_files_and_across_runs(
    spark: SparkSession, settings: Settings, monkeypatch: pytest.MonkeyPatch, broadcast: bool
) -> None:
    # The dedup look-up broadcasts a small batch's ids and shuffles a large one's: both count the same.
    if not broadcast:
        monkeypatch.setattr(landing, "BROADCAST_BATCH_BYTES", 0)
    land(settings, "impressions", "f1.jsonl", [imp("x", 0), imp("x", 0), imp("y", 1)], arrival_minutes=2)
    land(settings, "impressions", "f2.jsonl", [imp("y", 1), imp("z", 3)], arrival_minutes=4)
    ingest(spark, settings, 5)
    land(settings, "impressions", "f3.jsonl", [imp("x", 0), imp("z", 3), imp("w", 5)], arrival_minutes=6)
    ingest(spark, settings, 7)
    bronze = sorted(r["impression_id"] for r in table(settings, "bronze/impressions"))
    assert bronze == ["w", "x", "y", "z"]
    per_file = {Path(r.source_file).name: r.duplicates for r in load_state(settings, "impressions").rows}
    assert per_file == {"f1.jsonl": 1, "f2.jsonl": 1, "f3.jsonl": 2}


@pytest.mark.parametrize("writer", ["driver", "spark"])
def test_a_batchs_quarantined_and_late_lines_are_stored_the_same_whoever_writes_them(
    spark: SparkSession, settings: Settings, monkeypatch: pytest.MonkeyPatch, writer: str
) -> None:
    # A batch's few rejected lines are collected and written by the driver; many are written by Spark jobs.
    if writer == "spark":
        monkeypatch.setattr(landing, "DRIVER_WRITE_ROWS", 0)
    land(settings, "impressions", "f1.jsonl", [imp("a", 60)], arrival_minutes=61)
    ingest(spark, settings, 62)
    no_ad = json.dumps({"impression_id": "n", "event_time": iso(59)})
    lines = [imp("late2", 20), "{not json", imp("ok", 59), imp("late1", 30, ad="a2"), no_ad, "[1]"]
    land(settings, "impressions", "f2.jsonl", lines, arrival_minutes=63)
    ingest(spark, settings, 64)
    arrival = ts(63)
    quarantine = [(r["raw"], r["reason"], r["detail"], r["arrival_time"], r["ingest_batch_id"], r["line_number"])
                  for r in table(settings, "quarantine/impressions")]
    # In (batch, line) order, each with its line and, for malformed_json, what the JSON parser said about it.
    assert quarantine == [
        ("{not json", "malformed_json", "Expecting property name enclosed in double quotes at column 2", arrival, 1, 2),
        (no_ad, "missing_field", "missing: ad_id", arrival, 1, 5),
        ("[1]", "malformed_json", "a JSON array, not an object", arrival, 1, 6),
    ]
    dlq = [(r["impression_id"], r["ad_id"], r["event_time"], r["watermark"], r["arrival_time"], r["ingest_batch_id"],
            r["raw"]) for r in table(settings, "dlq/impressions")]
    assert dlq == [
        ("late1", "a2", ts(30), ts(50), arrival, 1, imp("late1", 30, ad="a2")),
        ("late2", "a1", ts(20), ts(50), arrival, 1, imp("late2", 20)),
    ]
    assert all(r["source_file"].endswith("/f2.jsonl") for r in table(settings, "dlq/impressions"))


def test_a_duplicate_of_a_dead_lettered_record_counts_once(spark: SparkSession, settings: Settings) -> None:
    land(settings, "impressions", "f1.jsonl", [imp("a", 60)], arrival_minutes=61)
    land(settings, "impressions", "f2.jsonl", [imp("old", 0)], arrival_minutes=62)
    land(settings, "impressions", "f3.jsonl", [imp("old", 0)], arrival_minutes=63)
    ingest(spark, settings, 64)
    totals = load_state(settings, "impressions").totals()
    assert (totals["late"], totals["duplicates"]) == (1, 1)


def test_in_flight_and_foreign_files_are_ignored(spark: SparkSession, settings: Settings) -> None:
    land(settings, "impressions", "f1.jsonl", [imp("a", 0)], arrival_minutes=1)
    folder = settings.landing_dir("impressions")
    (folder / ".f2.jsonl").write_text(imp("dot", 0) + "\n")
    (folder / "_f3.jsonl").write_text(imp("underscore", 0) + "\n")
    (folder / "notes.txt").write_text("not an event file\n")
    ingest(spark, settings, 2)
    assert [r["impression_id"] for r in table(settings, "bronze/impressions")] == ["a"]
    assert load_state(settings, "impressions").totals()["lines"] == 1


def test_gzip_files_are_read(spark: SparkSession, settings: Settings) -> None:
    import gzip

    folder = settings.landing_dir("impressions")
    folder.mkdir(parents=True)
    with gzip.open(folder / "f1.jsonl.gz", "wt") as fh:
        fh.write(imp("gz", 0) + "\n")
    ingest(spark, settings, 1)
    assert [r["impression_id"] for r in table(settings, "bronze/impressions")] == ["gz"]


def test_unknown_fields_are_ignored(spark: SparkSession, settings: Settings) -> None:
    land(settings, "impressions", "f1.jsonl", [imp("a", 0, extra={"nested": [1]}, colour="red")], 1)
    ingest(spark, settings, 2)
    [row] = table(settings, "bronze/impressions")
    assert "colour" not in row and row["impression_id"] == "a"


def test_file_watermarks_rule() -> None:
    delay = timedelta(minutes=10)
    marks = file_watermarks([(0, ts(30)), (1, None), (2, ts(10)), (3, ts(45))], ts(0), delay)
    assert marks == {
        0: (ts(0), ts(20)),
        1: (ts(20), ts(20)),
        2: (ts(20), ts(20)),  # never backwards
        3: (ts(20), ts(35)),
    }


def test_a_quarantined_copy_does_not_make_the_valid_record_a_duplicate(
    spark: SparkSession, settings: Settings
) -> None:
    # The same id first arrives with a bad timestamp (quarantined), then valid: the valid record is the
    # only one that counts, so it is accepted - whether both files land in one trigger or in two.
    land(settings, "impressions", "f1.jsonl", [imp("a", 0, event_time="yesterday")], arrival_minutes=1)
    land(settings, "impressions", "f2.jsonl", [imp("a", 0)], arrival_minutes=2)
    for files_per_trigger, home in ((1000, "big"), (1, "small")):
        s = replace(settings, lake=Lake(parse_root(settings.home / home, "lake")),
                    max_files_per_trigger=files_per_trigger)
        ingest(spark, s, 3)
        assert [r["impression_id"] for r in table(s, "bronze/impressions")] == ["a"], files_per_trigger
        assert [r["reason"] for r in table(s, "quarantine/impressions")] == ["bad_timestamp"]
        assert load_state(s, "impressions").totals()["duplicates"] == 0


def _last_stage_id(spark: SparkSession) -> int:
    """The id of the last stage so far: that of a trivial job run now (it has no job group)."""
    spark.sparkContext.parallelize([1], 1).count()
    tracker = spark.sparkContext.statusTracker()
    job = tracker.getJobInfo(max(tracker.getJobIdsForGroup(None)))
    assert job is not None
    return max(job.stageIds)


def test_a_many_file_batch_is_listed_in_a_few_tasks_also_when_the_next_cycle_restarts(
    spark: SparkSession, settings: Settings
) -> None:
    """Spark's file source lists each batch's files, and on restart its checkpoint's last batch again; by
    default that is a job with one task per file (seconds per cycle after a catch-up of hundreds of files)."""
    files = 40  # above Spark's 32-path threshold for a listing job
    for i in range(files):
        land(settings, "impressions", f"f{i:02d}.jsonl", [imp(f"i{i}", i / 10)], arrival_minutes=5 + i / 100)
    first = _last_stage_id(spark)
    ingest(spark, settings, 10)
    land(settings, "impressions", "next.jsonl", [imp("next", 6)], arrival_minutes=7)
    ingest(spark, settings, 10)
    last = _last_stage_id(spark)
    tracker = spark.sparkContext.statusTracker()
    stages = [s for s in (tracker.getStageInfo(i) for i in range(first + 1, last)) if s is not None]
    assert stages, "no stage of the two cycles is known to the status tracker"
    assert max(s.numTasks for s in stages) < files, sorted((s.numTasks, s.name) for s in stages)[-3:]
    assert len(table(settings, "bronze/impressions")) == files + 1


def test_streams_write_fewest_new_bytes_first_and_a_failure_stops_the_streams_after_it(
    spark: SparkSession, settings: Settings
) -> None:
    """run_ingest's write order: the stream with fewer new bytes writes first, whatever the order given, and a
    stream that fails stops every stream after it before its first write; the rerun ingests them all."""
    from sluice.ingest.run import IngestAborted
    from sluice.storage import tables

    land(settings, "impressions", "i1.jsonl", [imp(f"i{n}", 1) for n in range(40)], 2)
    click = json.dumps({"click_id": "c1", "impression_id": "i1", "ad_id": "a1", "event_time": iso(1)})
    land(settings, "clicks", "c1.jsonl", [click], 2)
    # The smaller stream (clicks) cannot make its DLQ table: a file stands where its folder goes.
    blocker = Path(tables.dlq(settings.stream("clicks")).path(settings))
    blocker.parent.mkdir(parents=True, exist_ok=True)
    blocker.write_text("not a table\n")
    with pytest.raises(Exception) as failure:
        ingest(spark, settings, 5, "impressions", "clicks")
    assert not isinstance(failure.value, IngestAborted)  # the first failure is the one reported
    # impressions comes after clicks in the write order (more new bytes), so it wrote nothing.
    assert load_state(settings, "impressions").rows == []
    assert load_state(settings, "clicks").rows == []
    blocker.unlink()
    ingest(spark, settings, 6, "impressions", "clicks")
    assert [(r.lines, r.accepted) for r in load_state(settings, "clicks").rows] == [(1, 1)]
    assert [(r.lines, r.accepted) for r in load_state(settings, "impressions").rows] == [(40, 40)]
