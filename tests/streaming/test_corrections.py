"""Corrections of closed windows (README "Operations > Late data corrections"), on real Spark and Delta.

The README's tutorial pipeline (``device_temps``: 15-minute windows every 5 minutes, a 2-minute watermark
delay) gets readings in three cycles; in the third, a reading at 10:03 arrives after the watermark passed
10:27. Its three hopping windows are all closed by then; the first of them, [09:50, 10:05), closed two
cycles earlier. Under ``manual`` they are flagged (``late_waiting`` counts the reading, the state keeps the
window's data-quality outcome) and gold stays as it was; under ``auto`` the same cycle re-computes them with
it, re-validates them, records the gold versions before and after, and sends one correction notice per window
to a real webhook on 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from sluice.cli.main import build_parser, main
from sluice.config import Settings, load_settings
from sluice.core.windows import Window
from sluice.ingest.run import run_ingest
from sluice.runtime.context import open_run
from sluice.storage.dlq import dlq_paths
from sluice.storage.engines import engine_for
from sluice.streaming.backfill import run_backfill, validate_request
from sluice.streaming.cycle import CycleResult, run_cycle
from sluice.streaming.rewrite import input_spans
from sluice.windows.late import backfill_command, dlq_mark, scan_amendments, waiting_detail
from sluice.windows.ledger import LedgerRow, join_detail, parse_gold_versions, read_ledger, split_detail
from support.lake import cycle, land, read_rows, table
from support.servers import (
    WebhookServer,
    webhook_fixture,  # noqa: F401 (pytest fixture ``webhook``)
)
from support.tutorial import write_tutorial
from support.two_streams import PIPELINE as TWO_STREAMS
from support.two_streams import reading as two_stream_reading
from support.two_streams import two_stream_home, txn

PIPELINE = "device_temps"
GOLD = "gold/device_temps"
DAY = datetime(2024, 5, 1, tzinfo=UTC)
# Lateness is not what these tests are about: one late reading among a handful would fail the 1% check.
BASE_ENV = {"SLUICE_LATENESS_THRESHOLD": "1"}



def at(hhmm: str) -> datetime:
    hours, minutes = hhmm.split(":")
    return DAY + timedelta(hours=int(hours), minutes=int(minutes))


def win(start: str) -> Window:
    return (at(start), at(start) + timedelta(minutes=15))


def reading(i: int, device: str, hhmm: str, temp: float, battery: int) -> dict[str, Any]:
    return {"reading_id": f"r{i}", "device_id": device, "temp_c": temp, "battery": battery,
            "event_time": f"2024-05-01T{hhmm}:00Z"}


# (file, arrival, readings). Watermark after r2: 10:14 - 2 min = 10:12; after r3: 10:27.
ON_TIME = [
    ("r1.jsonl", "10:06", [reading(1, "d1", "10:00", 20.0, 90), reading(2, "d2", "10:02", 30.0, 80),
                           reading(3, "d1", "10:04", 22.0, 88)]),
    ("r2.jsonl", "10:16", [reading(4, "d1", "10:10", 24.0, 86), reading(5, "d2", "10:14", 31.0, 79)]),
    ("r3.jsonl", "10:31", [reading(6, "d1", "10:29", 25.0, 85)]),
]
# Late (10:03 < 10:27): in [09:50, 10:05), [09:55, 10:10) and [10:00, 10:15), all closed. Nothing else in
# the file, so no window closes in that cycle: gold's only commit then is the correction.
LATE = ("late.jsonl", "10:46", [reading(7, "d1", "10:03", 19.0, 50)])
LATE_WINDOWS = [win("09:50"), win("09:55"), win("10:00")]
FIRST_CLOSED = [win("09:50"), win("09:55")]  # closed by cycle 1 (watermark 10:12)
SECOND_CLOSED = [win("10:00"), win("10:05"), win("10:10")]  # closed by cycle 2 (watermark 10:27)


# ------------------------------------------------------------------------------------------------ helpers
def make_settings(tmp_path: Path, **env: str) -> Settings:
    folder = tmp_path / "team-pipelines"
    if not folder.exists():
        write_tutorial(folder)
    settings = load_settings({"SLUICE_PIPELINES": str(folder), **BASE_ENV, **env}, home=tmp_path / "home")
    assert settings.registry.errors == []
    return settings


def run_at(spark: SparkSession, settings: Settings, now: str, *, deliver: bool = False) -> CycleResult:
    result = run_cycle(open_run(replace(settings, now_override=at(now)), spark), PIPELINE, deliver_alerts=deliver)
    assert result.exit_code == 0, result.render()
    return result


def land_file(settings: Settings, file: tuple[str, str, list[dict[str, Any]]]) -> None:
    name, arrival, records = file
    land(settings, "readings", name, records, at(arrival))


def two_cycles(spark: SparkSession, settings: Settings) -> None:
    """Cycles 1 (10:20) and 2 (10:35): every window holding a reading up to 10:25 is closed and validated."""
    land_file(settings, ON_TIME[0])
    land_file(settings, ON_TIME[1])
    first = run_at(spark, settings, "10:20").aggregate
    assert first is not None and first.windows == FIRST_CLOSED
    land_file(settings, ON_TIME[2])
    second = run_at(spark, settings, "10:35").aggregate
    assert second is not None and second.windows == SECOND_CLOSED
    assert {r.state for r in read_ledger(settings, PIPELINE)} == {"validated"}


def ledger(settings: Settings) -> dict[Window, LedgerRow]:
    return {r.window: r for r in read_ledger(settings, PIPELINE)}


def gold(settings: Settings, version: int | None = None) -> dict[Window, dict[str, dict[str, Any]]]:
    """gold/device_temps (at ``version``): window -> device -> row."""
    path = settings.lake.local() / GOLD
    rows = read_rows(path, version)
    out: dict[Window, dict[str, dict[str, Any]]] = {}
    for r in rows:
        out.setdefault((r["window_start"], r["window_end"]), {})[r["device_id"]] = r
    return out


def versions(settings: Settings) -> dict[str, int | None]:
    """The Delta version of every table a cycle can write (None: not created)."""
    names = [GOLD, "ops/window_ledger", "ops/dq_results", "ops/alerts", "dlq/readings", "bronze/readings",
             "ops/ingest_batches"]
    uris = {n: settings.lake.table(n) for n in names}
    return {n: DeltaTable(uri).version() if DeltaTable.is_deltatable(uri) else None for n, uri in uris.items()}


def gold_version(settings: Settings) -> int:
    version = versions(settings)[GOLD]
    assert version is not None
    return version


def d1_readings(rows: dict[str, dict[str, Any]]) -> int:
    return int(rows["d1"]["readings"])


def status_json(settings: Settings, capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    capsys.readouterr()
    code = main(["--home", str(settings.home), "--pipelines", str(settings.pipelines_path), "status", *args,
                 "--json"])
    out = capsys.readouterr().out
    assert code == 0, out
    return dict(json.loads(out))


def backfill_from(command: str, settings: Settings, spark: SparkSession) -> None:
    """Run the ``sluice backfill`` command a ledger detail names, as the CLI would parse it."""
    argv = shlex.split(command)
    assert argv[:2] == ["sluice", "backfill"], command
    args = build_parser().parse_args(argv[1:])
    result = run_backfill(open_run(settings, spark), args.pipeline, args.start, args.end,
                          include_late=args.include_late, deliver_alerts=False)
    assert result.exit_code == 0, result.render()


@pytest.fixture
def webhook_env(monkeypatch: pytest.MonkeyPatch, webhook: WebhookServer) -> Iterator[WebhookServer]:
    for name in ("AIRFLOW_CONN_SLUICE_SMTP", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy",
                 "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AIRFLOW_CONN_SLUICE_WEBHOOK", json.dumps({"conn_type": "http", "host": webhook.url}))
    yield webhook


# ------------------------------------------------------------------------------------------------ no Spark
def test_input_spans_read_around_each_window_and_merge_overlaps() -> None:
    margin = timedelta(hours=1)
    hour = timedelta(hours=1)
    windows = [(DAY + 5 * hour, DAY + 6 * hour), (DAY, DAY + hour), (DAY + 2 * hour, DAY + 3 * hour),
               (DAY + 30 * hour, DAY + 31 * hour)]
    # 00-01 and 02-03 are within two margins of each other (their reads overlap): one span; 05-06 too (its
    # read starts at 04:00, where the 02-03 one ends); a window a day later is read on its own.
    assert input_spans(windows, margin) == [(DAY, DAY + 6 * hour), (DAY + 30 * hour, DAY + 31 * hour)]
    # 20 minutes: 00:00-01:20 and 01:40-03:20 do not meet.
    assert input_spans(windows, timedelta(minutes=20)) == [
        (DAY, DAY + hour), (DAY + 2 * hour, DAY + 3 * hour), (DAY + 5 * hour, DAY + 6 * hour),
        (DAY + 30 * hour, DAY + 31 * hour)]


def test_the_detail_names_a_backfill_command_that_selects_exactly_the_window(tmp_path: Path) -> None:
    manual = make_settings(tmp_path).pipeline(PIPELINE)
    row = LedgerRow(PIPELINE, *win("09:50"), "validated", at("10:12"), 3, 1, at("10:20"), at("10:50"),
                    late_waiting=1)
    command = backfill_command(manual, row.window)
    assert command == ("sluice backfill device_temps --start 2024-05-01T09:50:00Z --end 2024-05-01T09:55:00Z "
                       "--include-late")
    args = build_parser().parse_args(shlex.split(command)[1:])
    request = validate_request(make_settings(tmp_path), args.pipeline, args.start, args.end, args.include_late)
    assert (request.start, request.end, request.include_late) == (at("09:50"), at("09:55"), True)

    assert f"`{command}`" in waiting_detail(manual, row, at("10:50")) and "manual" in waiting_detail(
        manual, row, at("10:50"))
    auto = replace(manual, corrections="auto", correction_max_age=timedelta(minutes=40))
    assert "a cycle re-computes" in waiting_detail(auto, row, at("10:44"))  # ended 10:05 >= 10:44 - 40 min
    old = waiting_detail(auto, row, at("10:46"))
    assert "max_age (40m)" in old and f"`{command}`" in old


def test_a_detail_keeps_the_checks_findings_and_puts_the_late_data_text_after_them(tmp_path: Path) -> None:
    """A failed window with late data waiting says both: why it failed, then what brings its late records in."""
    manual = make_settings(tmp_path).pipeline(PIPELINE)
    row = LedgerRow(PIPELINE, *win("10:00"), "failed", at("10:27"), 2, 2, at("10:35"), at("10:50"),
                    late_waiting=1)
    findings = "lateness:dlq_share_within_threshold (0.166667); validity:between_avg_temp_c (2 rows)"
    for reprocessed in (False, True):
        waiting = waiting_detail(manual, row, at("10:50"), reprocessed=reprocessed)
        detail = join_detail(findings, waiting)
        assert detail == f"{findings}; {waiting}"
        assert split_detail(detail) == (findings, waiting)
        assert split_detail(waiting) == (None, waiting)
    assert split_detail(findings) == (findings, None) and join_detail(None, None) is None


# ------------------------------------------------------------------------------------------------ manual
@pytest.mark.spark
@pytest.mark.timeout(1200)
def test_manual_flags_late_data_waiting_and_leaves_gold_alone(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = make_settings(tmp_path)
    assert settings.pipeline(PIPELINE).corrections == "manual"  # the shipped default
    two_cycles(spark, settings)
    before = gold(settings)

    land_file(settings, LATE)
    third = run_at(spark, settings, "10:50")
    assert third.amended == LATE_WINDOWS
    assert third.corrected == []
    assert "late data waiting" in third.render()
    rows = ledger(settings)
    for w in LATE_WINDOWS:
        assert (rows[w].state, rows[w].late_waiting, rows[w].late_rows) == ("validated", 1, 1), rows[w]
        detail = rows[w].detail or ""
        assert "1 late record(s)" in detail and backfill_command(settings.pipeline(PIPELINE), w) in detail
    for w in set(rows) - set(LATE_WINDOWS):
        assert (rows[w].state, rows[w].late_waiting) == ("validated", 0), rows[w]
    assert gold(settings) == before, "manual corrections never touch gold"
    # The scan recorded how far it looked: the DLQ's version mark is the ledger's app transaction.
    engine = engine_for(spark, settings)
    mark = dlq_mark(dlq_paths(settings, settings.pipeline(PIPELINE)))
    assert engine.committed_version(settings.lake.local() / "ops/window_ledger", "sluice.amend.device_temps") == mark

    # Idempotent: the same cycle again commits nothing anywhere (the scan is skipped: no DLQ commit since).
    seen = versions(settings)
    again = run_at(spark, settings, "10:50")
    assert again.amended == [] and versions(settings) == seen

    status = status_json(settings, capsys, "--window", "2024-05-01T09:50:00Z", "--pipeline", PIPELINE)
    [flagged] = status["windows"]
    assert (flagged["state"], flagged["late_waiting"], flagged["gold_versions"], flagged["changes"]) == (
        "validated", 1, None, [])

    # A backfill without --include-late rewrites from bronze only: the late reading is still not in gold,
    # so the window keeps its count (and says what to run); SPEC 6 still marks it reprocessed.
    first = win("09:50")
    run_backfill(open_run(settings, spark), PIPELINE, first[0], first[0] + timedelta(minutes=5), deliver_alerts=False)
    row = ledger(settings)[first]
    assert (row.state, row.late_waiting, row.late_rows) == ("reprocessed", 1, 1)
    detail = row.detail or ""
    assert "without --include-late" in detail and "--include-late`" in detail
    assert gold(settings) == before

    # The command the detail names brings it in: late_waiting 0, and the versions before and after are
    # readable by time travel.
    backfill_from((rows[first].detail or "").split("`")[1], settings, spark)
    row = ledger(settings)[first]
    assert (row.state, row.late_waiting, row.late_rows) == ("reprocessed", 0, 1)
    (old, new), = parse_gold_versions(row.gold_versions).values()
    assert d1_readings(gold(settings, old)[first]) == 2 and d1_readings(gold(settings, new)[first]) == 3
    assert gold(settings)[first] == gold(settings, new)[first]
    others = {w: rows for w, rows in gold(settings).items() if w != first}
    assert others == {w: rows for w, rows in before.items() if w != first}, "only the backfilled window changed"

    # Another late reading (10:12: in [10:00, 10:15), [10:05, 10:20), [10:10, 10:25)) adds up; the window
    # just backfilled is not flagged again, though the scan counts its DLQ records once more.
    land_file(settings, ("late2.jsonl", "10:56", [reading(8, "d2", "10:12", 32.0, 70)]))
    fourth = run_at(spark, settings, "11:00")
    assert fourth.amended == [win("10:00"), win("10:05"), win("10:10")]
    rows = ledger(settings)
    assert {w: (r.state, r.late_waiting) for w, r in rows.items()} == {
        win("09:50"): ("reprocessed", 0), win("09:55"): ("validated", 1), win("10:00"): ("validated", 2),
        win("10:05"): ("validated", 1), win("10:10"): ("validated", 1)}

    # Issue 13: the scan reads only the DLQ files added since it last ran (a file's counts per time bucket
    # are kept): the DLQ files of 10:03 and 10:12 are made unreadable, and a reading at 10:21 still counts
    # exactly.
    dlq = settings.lake.local() / "dlq/readings"
    old_files = [Path(uri) for uri in DeltaTable(str(dlq)).file_uris()]
    land_file(settings, ("late3.jsonl", "11:06", [reading(9, "d1", "10:21", 26.0, 84)]))
    at_now = replace(settings, now_override=at("11:10"))
    run = open_run(at_now, spark)
    run_ingest(run, ["readings"])
    saved = {f: f.read_bytes() for f in old_files}
    try:
        for f in old_files:
            f.write_bytes(b"unreadable")
        assert scan_amendments(run.ledger(PIPELINE), run.engine, run.state, at_now.pipeline(PIPELINE)) == [win("10:10")]
    finally:
        for f, data in saved.items():
            f.write_bytes(data)
    assert {w: (r.state, r.late_waiting, r.late_rows) for w, r in ledger(settings).items()}[win("10:10")] == (
        "validated", 2, 2)


# ------------------------------------------------------------------------------------------------ lateness
# A reading of 10:11 that lands with the third on-time file is late (the watermark is 10:12 or more) for
# windows still open: each of [10:00, 10:15), [10:05, 10:20) and [10:10, 10:25) closes with one DLQ record
# among five or fewer, and fails the 1% lateness check (SPEC 5) at its first validation.
LATE_BEFORE_CLOSE = ("r3b.jsonl", "10:31", [reading(10, "d2", "10:11", 30.0, 78)])


@pytest.mark.spark
@pytest.mark.timeout(1200)
def test_late_data_waiting_keeps_a_failed_window_failed_until_a_backfill_with_it_passes_lateness(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 29: a window that failed its checks and then got a late record still reads ``failed``, with
    ``late_waiting`` 1 (SPEC 4); ``sluice backfill --include-late`` puts its DLQ records into gold, and the
    lateness check, which counts only DLQ records not in gold, passes again (SPEC 5)."""
    settings = make_settings(tmp_path, SLUICE_LATENESS_THRESHOLD="0.01")  # the shipped default

    def run(now: str) -> CycleResult:
        return run_cycle(open_run(replace(settings, now_override=at(now)), spark), PIPELINE, deliver_alerts=False)

    # One cycle takes the four files in arrival order (the reading of 10:11 after the watermark reached 10:27).
    for file in [*ON_TIME, LATE_BEFORE_CLOSE]:
        land_file(settings, file)
    first = run("10:35")
    failing = [win("10:00"), win("10:05"), win("10:10")]
    assert first.quality is not None and sorted(first.quality.failed) == failing
    assert {w: r.state for w, r in ledger(settings).items()} == {
        **dict.fromkeys(FIRST_CLOSED, "validated"), **dict.fromkeys(failing, "failed")}

    # After close, the 10:03 reading lands for [09:50, 10:05), [09:55, 10:10) (validated) and [10:00, 10:15)
    # (failed): each has late data waiting, and each keeps its data-quality outcome.
    land_file(settings, LATE)
    assert run("10:50").amended == LATE_WINDOWS
    rows = ledger(settings)
    assert {w: (rows[w].state, rows[w].late_waiting) for w in [*LATE_WINDOWS, *failing]} == {
        win("09:50"): ("validated", 1), win("09:55"): ("validated", 1), win("10:00"): ("failed", 1),
        win("10:05"): ("failed", 0), win("10:10"): ("failed", 0)}
    detail = rows[win("10:00")].detail or ""
    assert detail.startswith("lateness:dlq_share_within_threshold (") and "1 late record(s) landed" in detail
    status = status_json(settings, capsys)
    [counts] = [p["windows"] for p in status["pipelines"] if p["pipeline"] == PIPELINE]
    assert {k: counts[k] for k in ("validated", "failed", "reprocessed", "late_waiting")} == {
        "validated": 2, "failed": 3, "reprocessed": 0, "late_waiting": 3}
    assert {(w["window_start"], w["detail"]) for w in status["failed_windows"]} >= {
        ("2024-05-01T10:00:00Z", rows[win("10:00")].detail)}

    # The command the failed window's detail names: its two DLQ records (10:11 and 10:03) go into gold, and
    # none of them is late data any more. The backfill's range holds the three windows starting at 09:50,
    # 09:55 and 10:00: all three pass.
    backfill = run_backfill(open_run(settings, spark), PIPELINE, at("09:50"), at("10:05"), include_late=True,
                            deliver_alerts=False)
    assert backfill.windows == LATE_WINDOWS and backfill.quality is not None
    assert backfill.quality.failed == {}, backfill.quality.failed
    rows = ledger(settings)
    assert {w: (rows[w].state, rows[w].late_waiting, rows[w].detail) for w in LATE_WINDOWS} == dict.fromkeys(
        LATE_WINDOWS, ("reprocessed", 0, None))
    assert d1_readings(gold(settings)[win("10:00")]) == 4 and int(gold(settings)[win("10:00")]["d2"]["readings"]) == 3
    lateness = {(r["window_start"], r["observed_value"]) for r in table(settings, "ops/dq_results")
                if r["expectation"] == "lateness:dlq_share_within_threshold" and r["window_start"] == at("10:00")}
    assert lateness == {(at("10:00"), "0")}


@pytest.mark.spark
@pytest.mark.timeout(1200)
def test_retry_re_checks_then_recomputes_exactly_the_failed_windows(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 29 section 5: ``sluice retry`` finds the failed windows itself (like ``dbt retry``): ``--check-only``
    re-validates them as they stand (a new round, alerted again); ``--include-late`` recomputes them with their
    DLQ records in one backfill per run of consecutive windows, and leaves the windows that passed alone. A run
    that records alerts with no channel configured says so in one line."""
    settings = make_settings(tmp_path, SLUICE_LATENESS_THRESHOLD="0.01")
    for name in ("AIRFLOW_CONN_SLUICE_WEBHOOK", "AIRFLOW_CONN_SLUICE_SMTP"):
        monkeypatch.delenv(name, raising=False)
    for file in [*ON_TIME, LATE_BEFORE_CLOSE]:
        land_file(settings, file)
    first = run_cycle(open_run(replace(settings, now_override=at("10:35")), spark), PIPELINE, deliver_alerts=True)
    failing = [win("10:00"), win("10:05"), win("10:10")]
    assert first.quality is not None and sorted(first.quality.failed) == failing
    assert "3 alerts recorded, no channel configured (sluice_webhook, sluice_smtp)" in first.render()
    assert (first.alerts.unrouted, first.alerts.sent, first.alerts.pending) == (3, 0, 0)

    def retry(*args: str) -> dict[str, Any]:
        capsys.readouterr()
        code = main(["--home", str(settings.home), "--pipelines", str(settings.pipelines_path), "retry", PIPELINE,
                     "--now", "2024-05-01T10:40:00Z", "--no-deliver", *args, "--json"])
        doc = dict(json.loads(capsys.readouterr().out))
        assert code == doc["exit_code"]
        return doc

    monkeypatch.setenv("SLUICE_LATENESS_THRESHOLD", "0.01")
    checked = retry("--check-only")
    assert (checked["exit_code"], checked["action"], checked["backfills"]) == (2, "check", [])
    assert [w["window_start"] for w in checked["windows"]] == ["2024-05-01T10:00:00Z", "2024-05-01T10:05:00Z",
                                                               "2024-05-01T10:10:00Z"]
    assert checked["alerts"] == {"sent": 0, "no_channel": 0, "pending": 3}  # round 2 of each, alerted again
    assert {w: (r.state, r.attempt) for w, r in ledger(settings).items() if w in failing} == dict.fromkeys(
        failing, ("failed", 2))
    gold_before = gold(settings)

    healed = retry("--include-late")
    assert (healed["exit_code"], healed["outcome"], healed["action"]) == (0, "passed", "recompute")
    assert healed["backfills"] == [{"start": "2024-05-01T10:00:00Z", "end": "2024-05-01T10:15:00Z"}]
    rows = ledger(settings)
    assert {w: rows[w].state for w in failing} == dict.fromkeys(failing, "reprocessed")
    assert {w: rows[w].state for w in FIRST_CLOSED} == dict.fromkeys(FIRST_CLOSED, "validated")  # not rewritten
    after = gold(settings)
    assert {w: after[w] for w in FIRST_CLOSED} == {w: gold_before[w] for w in FIRST_CLOSED}
    assert int(after[win("10:10")]["d2"]["readings"]) == int(gold_before[win("10:10")]["d2"]["readings"]) + 1
    assert retry()["windows"] == []  # nothing failed any more

    # `sluice backfill --check-only` (the sluice_backfill DAG's check_only, the ledger page's re-check)
    # re-validates the closed windows of a range as they stand: a new round, gold not rewritten.
    gold_version = versions(settings)[GOLD]
    capsys.readouterr()
    code = main(["--home", str(settings.home), "--pipelines", str(settings.pipelines_path), "backfill", PIPELINE,
                 "--start", "2024-05-01T09:55:00Z", "--end", "2024-05-01T10:10:00Z", "--check-only",
                 "--now", "2024-05-01T10:40:00Z", "--no-deliver", "--json"])
    rechecked = json.loads(capsys.readouterr().out)
    assert (code, rechecked["outcome"], rechecked["action"]) == (0, "passed", "check"), rechecked["quality"]
    assert [w["window_start"] for w in rechecked["windows"]] == [
        "2024-05-01T09:55:00Z", "2024-05-01T10:00:00Z", "2024-05-01T10:05:00Z"]
    assert versions(settings)[GOLD] == gold_version
    rows = ledger(settings)
    assert {w: (rows[w].state, rows[w].attempt) for w in (win("09:55"), win("10:00"))} == {
        win("09:55"): ("validated", 2), win("10:00"): ("reprocessed", 4)}


# ------------------------------------------------------------------------------------------------ no-op
def lake_versions(settings: Settings) -> dict[str, int]:
    """The Delta version of every table under lake/ (ops/* included)."""
    return {str(log.parent.relative_to(settings.lake.local())): DeltaTable(str(log.parent)).version()
            for log in sorted(settings.lake.local().glob("**/_delta_log"))}


@pytest.mark.spark
@pytest.mark.timeout(900)
def test_a_cycle_with_nothing_new_commits_nothing(spark: SparkSession, tmp_path: Path) -> None:
    """Issue 25, hole 7: a rerun with no new landing file, at the same ``now`` or at a later one that closes
    nothing, commits no table (the amendment scan of an unchanged DLQ used to rewrite the ledger)."""
    settings = two_stream_home(tmp_path)
    land(settings, "readings", "r1.jsonl", [two_stream_reading("r1", at("10:00")),
                                            two_stream_reading("r2", at("10:03"), "d2"),
                                            two_stream_reading("r3", at("10:21"))], at("10:22"))
    land(settings, "txns", "t1.jsonl", [txn("t1", at("10:01")), txn("t2", at("10:22"))], at("10:23"))
    cycle(spark, settings, TWO_STREAMS, at("10:25"), quality=True)
    assert {r.state for r in read_ledger(settings, TWO_STREAMS)} == {"validated"}
    seen = lake_versions(settings)
    assert {"ops/window_ledger", "ops/dq_results", "dlq/readings", "dlq/txns"} <= set(seen)
    # 10:30 is before any idle heartbeat (30 min after the last file) and any freshness deadline.
    for now in ("10:25", "10:30"):
        cycle(spark, settings, TWO_STREAMS, at(now), quality=True)
        assert lake_versions(settings) == seen, now


# ------------------------------------------------------------------------------------------------ auto
@pytest.mark.spark
@pytest.mark.timeout(1200)
def test_auto_corrects_in_the_same_cycle_and_sends_one_notice_per_window(
    spark: SparkSession, tmp_path: Path, webhook_env: WebhookServer, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = make_settings(tmp_path, SLUICE_DEVICE_TEMPS_CORRECTIONS="auto")
    assert settings.pipeline(PIPELINE).corrections == "auto"
    two_cycles(spark, settings)
    before = gold(settings)
    version = gold_version(settings)
    attempts = {w: r.attempt for w, r in ledger(settings).items()}
    assert webhook_env.requests == []

    land_file(settings, LATE)
    third = run_at(spark, settings, "10:50", deliver=True)
    assert third.amended == LATE_WINDOWS and third.corrected == LATE_WINDOWS
    assert third.quality is not None and sorted(third.quality.checked) == LATE_WINDOWS and not third.quality.failed
    assert "corrected 3 window(s)" in third.render()

    # One atomic replace for all three windows: gold moved by exactly one version.
    assert gold_version(settings) == version + 1
    now = gold(settings)
    rows = ledger(settings)
    for w in LATE_WINDOWS:
        row = rows[w]
        assert (row.state, row.late_waiting, row.late_rows) == ("reprocessed", 0, 1), row
        assert row.attempt == attempts[w] + 1  # one more validation round
        assert parse_gold_versions(row.gold_versions) == {GOLD: (version, version + 1)}
        assert d1_readings(now[w]) == d1_readings(before[w]) + 1
        assert now[w]["d1"]["min_battery"] == 50  # the late reading's battery
        assert now[w]["d2"] == before[w]["d2"]
        assert gold(settings, version)[w] == before[w]
    assert {w: r for w, r in now.items() if w not in LATE_WINDOWS} == {
        w: r for w, r in before.items() if w not in LATE_WINDOWS}

    # One notice per corrected window, level info, with each measure before -> after.
    posts = webhook_env.posts()
    assert sorted((p["window_start"], p["kind"], p["level"]) for p in posts) == [
        (f"2024-05-01T{s}:00Z", "correction", "info") for s in ("09:50", "09:55", "10:00")]
    first = next(p for p in posts if p["window_start"] == "2024-05-01T09:50:00Z")
    assert first["attempt"] == attempts[win("09:50")] + 1
    measures = {f["expectation"]: f["observed_value"] for f in first["failed"]}
    assert measures == {"gold/device_temps.rows": "2 -> 2", "gold/device_temps.readings": "3 -> 4",
                        "gold/device_temps.avg_temp_c": f"51 -> {format(61 / 3 + 30, '.10g')}",
                        "gold/device_temps.min_battery": "168 -> 130"}
    alerts = [a for a in table(settings, "ops/alerts") if a["kind"] == "correction"]
    assert len(alerts) == 3 and {a["level"] for a in alerts} == {"info"}
    assert {a["channels"] for a in alerts} == {"webhook"}

    # Rerunning the cycle changes nothing and notifies nobody again.
    seen = versions(settings)
    again = run_at(spark, settings, "10:50", deliver=True)
    assert again.amended == [] and again.corrected == []
    assert versions(settings) == seen
    assert len(webhook_env.requests) == 3

    # `sluice status --window` shows what changed, by time travel.
    status = status_json(settings, capsys, "--window", "2024-05-01T09:50:00Z")
    [corrected] = status["windows"]
    assert (corrected["pipeline"], corrected["state"], corrected["late_waiting"]) == (PIPELINE, "reprocessed", 0)
    assert corrected["gold_versions"] == {GOLD: {"before": version, "after": version + 1}}
    [change] = corrected["changes"]
    assert (change["added"], change["removed"], change["unchanged"], change["error"]) == ([], [], 1, None)
    [d1] = change["changed"]
    assert d1["key"] == {"device_id": "d1"}
    assert d1["columns"]["readings"] == {"before": 2, "after": 3}
    assert d1["columns"]["min_battery"] == {"before": 88, "after": 50}
    capsys.readouterr()
    assert main(["--home", str(settings.home), "--pipelines", str(settings.pipelines_path), "status", "--window",
                 "2024-05-01T09:50:00Z", "--pipeline", PIPELINE]) == 0
    text = capsys.readouterr().out
    assert f"{GOLD}: version {version} -> {version + 1}" in text
    assert "~ device_id=d1: " in text and "readings 2 -> 3" in text


@pytest.mark.spark
@pytest.mark.timeout(1500)
def test_auto_respects_max_age_and_corrects_at_most_n_oldest_first(spark: SparkSession, tmp_path: Path) -> None:
    # The global max_corrections_per_run (the per-pipeline key trips over Settings.pipeline for now).
    settings = make_settings(tmp_path, SLUICE_DEVICE_TEMPS_CORRECTIONS="auto", SLUICE_DEVICE_TEMPS_MAX_AGE="40m",
                             SLUICE_MAX_CORRECTIONS_PER_RUN="1")
    definition = settings.pipeline(PIPELINE)
    assert (definition.correction_max_age, definition.max_corrections_per_run) == (timedelta(minutes=40), 1)
    two_cycles(spark, settings)
    before = gold(settings)

    # At 10:50, [09:50, 10:05) ended more than 40 min ago: flagged only. Of the two due, the older one now.
    land_file(settings, LATE)
    third = run_at(spark, settings, "10:50")
    assert third.amended == LATE_WINDOWS
    assert third.corrected == [win("09:55")]
    assert third.corrections is not None
    assert (third.corrections.deferred, third.corrections.too_old) == ([win("10:00")], [win("09:50")])
    rows = ledger(settings)
    assert {w: (rows[w].state, rows[w].late_waiting) for w in LATE_WINDOWS} == {
        win("09:50"): ("validated", 1), win("09:55"): ("reprocessed", 0), win("10:00"): ("validated", 1)}
    old = rows[win("09:50")].detail
    command = backfill_command(definition, win("09:50"))
    assert old is not None and "max_age (40m)" in old and f"`{command}`" in old
    assert gold(settings)[win("09:50")] == before[win("09:50")]
    assert d1_readings(gold(settings)[win("09:55")]) == d1_readings(before[win("09:55")]) + 1

    # The next cycle corrects the rest; the too-old window stays flagged.
    fourth = run_at(spark, settings, "10:55")
    assert fourth.amended == [] and fourth.corrected == [win("10:00")]
    assert fourth.corrections is not None and fourth.corrections.deferred == []
    assert fourth.corrections.too_old == [win("09:50")]
    rows = ledger(settings)
    assert (rows[win("10:00")].state, rows[win("10:00")].late_waiting) == ("reprocessed", 0)
    assert (rows[win("09:50")].state, rows[win("09:50")].late_waiting) == ("validated", 1)
    assert d1_readings(gold(settings)[win("10:00")]) == d1_readings(before[win("10:00")]) + 1

    # Then nothing is left to do: another cycle commits nothing.
    seen = versions(settings)
    assert run_at(spark, settings, "10:55").corrected == []
    assert versions(settings) == seen

    # The named command corrects the old window by hand.
    backfill_from(command, settings, spark)
    row = ledger(settings)[win("09:50")]
    assert (row.state, row.late_waiting) == ("reprocessed", 0)
    assert d1_readings(gold(settings)[win("09:50")]) == d1_readings(before[win("09:50")]) + 1


# ------------------------------------------------------------------------------------------------ crashes
def _sluice_run(settings: Settings, now: str, **env: str) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("SLUICE_", "AIRFLOW_CONN_"))}
    full.update(SLUICE_HOME=str(settings.home), SLUICE_PIPELINES=str(settings.pipelines_path),
                SLUICE_NOW=at(now).isoformat(), PYSPARK_PYTHON=sys.executable, TZ="UTC", **BASE_ENV,
                SLUICE_DEVICE_TEMPS_CORRECTIONS="auto", **env)
    return subprocess.run([sys.executable, "-m", "sluice.cli", "run", PIPELINE, "--no-deliver"], env=full,
                          capture_output=True, text=True, timeout=900, check=False)


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_a_sigkill_after_the_dlq_commit_loses_nothing(
    spark: SparkSession, tmp_path: Path, webhook_env: WebhookServer
) -> None:
    settings = make_settings(tmp_path, SLUICE_DEVICE_TEMPS_CORRECTIONS="auto")
    two_cycles(spark, settings)
    before = gold(settings)
    version = gold_version(settings)
    land_file(settings, LATE)

    # Killed right after ingest committed the late reading to the DLQ, before the amendment scan.
    crashed = _sluice_run(settings, "10:50", SLUICE_KILL_AFTER_COMMIT="dlq/readings:1")
    assert crashed.returncode == -9, crashed.stderr[-3000:]
    assert len(table(settings, "dlq/readings")) == 1
    assert {r.state for r in read_ledger(settings, PIPELINE)} == {"validated"}

    # (A kill right after the correction's gold replace, then a rerun that finishes the correction without
    # replacing gold again, is tests/test_object_storage.py's correction step: the same pipeline, late reading and
    # kill point, with every table and alert id compared to an uninterrupted run. One cold process less here.)
    # The rerun finds the amendment and corrects: one replace, the totals from before it, one notice per window.
    done = run_at(spark, settings, "10:50", deliver=True)
    assert done.corrected == LATE_WINDOWS
    assert gold_version(settings) == version + 1
    rows = ledger(settings)
    for w in LATE_WINDOWS:
        assert (rows[w].state, rows[w].late_waiting, rows[w].late_rows) == ("reprocessed", 0, 1)
        assert parse_gold_versions(rows[w].gold_versions) == {GOLD: (version, version + 1)}
        assert d1_readings(gold(settings)[w]) == d1_readings(before[w]) + 1
    posts = webhook_env.posts()
    assert sorted(p["window_start"] for p in posts) == [f"2024-05-01T{s}:00Z" for s in ("09:50", "09:55", "10:00")]
    first = next(p for p in posts if p["window_start"] == "2024-05-01T09:50:00Z")
    assert {f["expectation"]: f["observed_value"] for f in first["failed"]}["gold/device_temps.readings"] == "3 -> 4"
    assert run_at(spark, settings, "10:50", deliver=True).corrected == []
    assert len(webhook_env.requests) == 3
