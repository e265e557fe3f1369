"""Substreams (issue 55, SPEC 3) on SPEC 8's pipeline, with real Spark and Delta: device d3's clock runs 2 hours
behind d1's and d2's.

Without substreams, d3's readings go to the DLQ once the stream's watermark has passed them (today's rule, kept).
With ``substream="device_id", skew_tolerance="3h"`` they are accepted, and d3's windows are written on its own
clock; a reading below d3's own ``W_k`` goes to the DLQ with that watermark and its key; a new device below the
floor ``F`` goes to the DLQ; a new device above it is accepted. ``sluice status`` and the ledger page count the
substreams and name those furthest behind; devices silent past ``idle_timeout`` while others send raise one
``silent_substream`` alert. Once idle heartbeats move ``F`` past every
window, each is closed and checked: completeness passes, gold equals an oracle computed here from the readings
the rule accepts, and a backfill of the whole range gives the same gold.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from sluice.airflow.api import windows_data
from sluice.config import Settings, load_settings
from sluice.ingest import substreams
from sluice.reports.status import render_status, status_data
from sluice.runtime.context import open_run
from sluice.streaming.backfill import run_backfill
from sluice.streaming.cycle import run_cycle
from sluice.windows.ledger import read_ledger
from support.lake import land, table, table_snapshot
from support.shell import user_shell
from support.spec_example import SPEC_EXAMPLE

SUBSTREAMS = SPEC_EXAMPLE.replace('watermark_delay="2m",', 'watermark_delay="2m", substream="device_id", '
                                  'skew_tolerance="3h",')


def at(hhmm: str) -> datetime:
    return datetime.fromisoformat(f"2024-05-01T{hhmm}:00+00:00")


def utc(value: datetime) -> datetime:
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def reading(device: str, hhmm: str, temp: float, rid: str | None = None) -> dict[str, Any]:
    return {"reading_id": rid or f"{device}-{hhmm}", "device_id": device, "temp_c": temp,
            "event_time": f"2024-05-01T{hhmm}:00Z"}


def minutes(start: str, n: int) -> list[str]:
    first = at(start)
    return [(first + timedelta(minutes=i)).strftime("%H:%M") for i in range(n)]


# Three files, ten minutes each: d1 and d2 on time, d3 two hours behind. The third adds d3's reading below its own
# watermark (08:17 then), a new device below the floor (10:19 - 3h = 07:19) and one above it.
FILES = [
    (f"r{i}.jsonl", at(arrival), [reading(d, m, 20.0 + i + k)
                                  for k, d in enumerate(("d1", "d2")) for m in minutes(start, 10)]
     + [reading("d3", m, 15.0 + i) for m in minutes(behind, 10)])
    for i, (arrival, start, behind) in enumerate((("10:10", "10:00", "08:00"), ("10:20", "10:10", "08:10"),
                                                  ("10:30", "10:20", "08:20")))
]
FILES[2][2].extend([reading("d3", "08:05", 99.0, "d3-again"), reading("d4", "07:00", 30.0),
                    reading("d5", "07:30", 31.0)])
RUNS = ("10:11", "10:21", "10:31")


def home(tmp_path: Path, name: str, source: str) -> Settings:
    folder = tmp_path / f"{name}-pipelines"
    folder.mkdir()
    (folder / "device_temps.py").write_text(source)
    settings = load_settings({"SLUICE_PIPELINES": str(folder)}, home=tmp_path / name)
    assert settings.registry.errors == []
    return settings


def run(spark: SparkSession, settings: Settings, hhmm: str) -> Any:
    return run_cycle(open_run(replace(settings, now_override=at(hhmm)), spark), "device_temps",
                     deliver_alerts=False)


def oracle(accepted: list[dict[str, Any]]) -> dict[tuple[datetime, datetime, str], tuple[int, float]]:
    groups: dict[tuple[datetime, datetime, str], list[float]] = {}
    for r in accepted:
        t = datetime.fromisoformat(r["event_time"].replace("Z", "+00:00"))
        first = t - (t - at("00:00")) % timedelta(minutes=5)
        for k in range(3):
            start = first - k * timedelta(minutes=5)
            groups.setdefault((start, start + timedelta(minutes=15), r["device_id"]), []).append(r["temp_c"])
    return {key: (len(temps), round(sum(temps) / len(temps), 9)) for key, temps in groups.items()}


def gold(settings: Settings) -> dict[tuple[datetime, datetime, str], tuple[int, float]]:
    return {(utc(r["window_start"]), utc(r["window_end"]), r["device_id"]): (r["readings"], round(r["avg_temp_c"], 9))
            for r in table(settings, "gold/device_temps")}


@pytest.mark.spark
@pytest.mark.slow
def test_a_device_two_hours_behind_is_late_without_substreams_and_on_its_own_clock_with_them(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The substream state collapses to one row per key from its second file on: every later group is judged by
    # collapsed rows and the rows of the group before it.
    monkeypatch.setattr(substreams, "COMPACT_FILES", 2)
    # The (key, file) pairs that can hold a late record join the records without the broadcast hint here, as in a
    # batch with many of them (the randomized differential's small batches take the hint).
    monkeypatch.setattr(substreams, "BROADCAST_PAIRS", 0)
    plain = home(tmp_path, "plain", SPEC_EXAMPLE)
    keyed = home(tmp_path, "keyed", SUBSTREAMS)
    for settings in (plain, keyed):
        for (name, arrival, records), now in zip(FILES, RUNS, strict=True):
            land(settings, "readings", name, records, arrival)
            run(spark, settings, now)

    # Without substreams: once the stream's watermark passed 10:07, every later reading of d3 is late.
    late = {r["reading_id"] for r in table(plain, "dlq/readings")}
    assert {r["reading_id"] for _n, _a, records in FILES[1:] for r in records if r["device_id"] == "d3"} <= late
    assert {r["reading_id"] for r in table(plain, "bronze/readings")} & {"d5-07:30", "d4-07:00"} == set()

    # With them: d3 is on time; its reading below its own watermark, and d4 below the floor, are late, with the
    # E_k they missed and their key.
    held = {r["reading_id"]: (utc(r["watermark"]), r["substream"]) for r in table(keyed, "dlq/readings")}
    assert held == {"d3-again": (at("08:17"), "d3"), "d4-07:00": (at("07:19"), "d4")}
    for batch in table(keyed, "ops/ingest_batches"):
        assert batch["lines"] == batch["accepted"] + batch["quarantined"] + batch["late"] + batch["duplicates"]
    accepted = [r for _n, _a, records in FILES for r in records if r["reading_id"] not in held]
    state = table(keyed, "substreams/readings")
    assert sorted((r["substream"], utc(r["max_event_time"]), r["ingest_batch_id"]) for r in state) == [
        ("d1", at("10:19"), 1), ("d1", at("10:29"), 2), ("d2", at("10:19"), 1), ("d2", at("10:29"), 2),
        ("d3", at("08:19"), 1), ("d3", at("08:29"), 2), ("d5", at("07:30"), 2)]
    assert {r["reading_id"] for r in table(keyed, "bronze/readings") if not r["is_heartbeat"]} == {
        r["reading_id"] for r in accepted}

    # Each device's rows are in gold once its own E_k passes a window's end: d1 and d2 up to 10:27 - their windows
    # ending by 10:25 -, d3 up to 08:27, d5 not yet (E = F = 07:29); no window is closed as a whole (F = 07:29).
    expected = oracle(accepted)
    ends = {"d1": at("10:27"), "d2": at("10:27"), "d3": at("08:27"), "d5": at("07:29")}
    assert gold(keyed) == {k: v for k, v in expected.items() if k[1] <= ends[k[2]]}
    assert read_ledger(keyed, "device_temps") == []

    # `sluice status` (text and --json) and the ledger page: how many substreams, F, and who lags furthest behind.
    text = render_status(keyed)
    assert "readings: 4 substream(s) of device_id; largest event time 2024-05-01 10:29:00Z, F 2024-05-01 " \
           "07:29:00Z" in text, text
    # The oldest window not closed as a whole, [07:15, 07:30), is final for every device but d5 (E = 07:29).
    assert "device_temps: window 2024-05-01 07:15-07:30 (the oldest not closed) is final for 3 of 4 " \
           "substream(s)" in text, text
    [doc] = status_data(keyed)["substreams"]
    assert doc["next_windows"] == [{"pipeline": "device_temps", "window_start": "2024-05-01T07:15:00Z",
                                    "window_end": "2024-05-01T07:30:00Z", "final_substreams": 3}]
    assert (doc["substreams"], doc["floor"]) == (4, "2024-05-01T07:29:00Z")
    assert [(k["key"], k["watermark"], k["behind_seconds"]) for k in doc["lagging"]][:2] == [
        ("d5", "2024-05-01T07:28:00Z", 179 * 60.0), ("d3", "2024-05-01T08:27:00Z", 120 * 60.0)]
    [page] = windows_data(keyed, str)["pipelines"]
    assert page["substreams"] == [doc]

    # d1 and d2 go on; d3 and d5 fall silent: past idle_timeout, while the stream is live, one alert names them,
    # and the next cycle does not name them again.
    more = [reading(d, m, 24.0 + k) for k, d in enumerate(("d1", "d2")) for m in minutes("10:30", 10)]
    land(keyed, "readings", "r3.jsonl", more, at("11:00"))
    accepted += more
    expected = oracle(accepted)
    run(spark, keyed, "11:01")
    run(spark, keyed, "11:02")
    silent = [r for r in table(keyed, "ops/alerts") if r["kind"] == "silent_substream"]
    assert len(silent) == 1, silent
    assert {(i["expectation"], i["observed_value"]) for i in json.loads(silent[0]["failed_expectations"])} == {
        ("freshness:readings/d3", "silent since 2024-05-01T10:30:00Z"),
        ("freshness:readings/d5", "silent since 2024-05-01T10:30:00Z")}

    # Idle: the heartbeat at 12:30 moves F to 09:30, then at 15:30 to 12:30: every window closes, and is checked.
    run(spark, keyed, "13:00")
    assert {(utc(r.window_start), utc(r.window_end)) for r in read_ledger(keyed, "device_temps")} == {
        k[:2] for k in expected if k[1] <= at("09:30")}
    run(spark, keyed, "16:00")
    assert gold(keyed) == expected
    ledger = read_ledger(keyed, "device_temps")
    assert {(utc(r.window_start), utc(r.window_end)) for r in ledger} == {k[:2] for k in expected}
    # The three windows holding d3's late reading fail their lateness check (the DLQ share), as they should.
    failed = {(s, s + timedelta(minutes=15)) for s in (at("07:55"), at("08:00"), at("08:05"))}
    assert {(utc(r.window_start), utc(r.window_end)) for r in ledger if r.state == "failed"} == failed
    assert {r.state for r in ledger} == {"validated", "failed"}
    results = table(keyed, "ops/dq_results")
    assert results and all(r["success"] for r in results if "completeness" in r["expectation"])

    # A backfill of the whole range recomputes the same gold.
    before = gold(keyed)
    run_backfill(open_run(replace(keyed, now_override=at("16:00")), spark), "device_temps", at("06:45"),
                 at("10:30"), deliver_alerts=False)
    assert gold(keyed) == before


# Killed right after round two's bronze commit (its substream state not written yet), after its DLQ commit, and
# after its substream state commit (its gold not written yet), each in the run that recovers from the one before.
CRASHES = ("bronze/readings:1", "dlq/readings:1", "substreams/readings:1")


@pytest.mark.spark
@pytest.mark.slow
def test_sigkill_anywhere_in_a_substream_cycle_then_rerun_equals_an_uninterrupted_one(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Round two lands two files at once (one micro-batch group: d3's running maximum over the group's first file
    makes its 08:05 reading late in the second); a replay of that group must judge it by the state of the batches
    before it, whatever was committed when the process died."""
    homes = {name: home(tmp_path, name, SUBSTREAMS) for name in ("clean", "crash")}
    for settings in homes.values():
        name, arrival, records = FILES[0]
        land(settings, "readings", name, records, arrival)
        run(spark, settings, RUNS[0])
        for name, arrival, records in FILES[1:]:
            land(settings, "readings", name, records, arrival)
    run(spark, homes["clean"], RUNS[2])
    crash = homes["crash"]
    for kill_after in CRASHES:
        shell = {**user_shell(), "SLUICE_HOME": str(crash.home), "SLUICE_KILL_AFTER_COMMIT": kill_after,
                 "SLUICE_PIPELINES": str(tmp_path / "crash-pipelines")}
        command = [sys.executable, "-m", "sluice.cli", "run", "device_temps", "--now", at(RUNS[2]).isoformat()]
        done = subprocess.run(command, env=shell, capture_output=True, text=True, timeout=600)
        assert done.returncode == -9, f"no SIGKILL after {kill_after}: exit {done.returncode}, {done.stderr[-3000:]}"
    run(spark, crash, RUNS[2])
    clean, crashed = table_snapshot(homes["clean"].home), table_snapshot(crash.home)
    assert clean.keys() == crashed.keys() and "substreams/readings" in clean
    for name in clean:
        assert crashed[name] == clean[name], name
    held = {r["reading_id"]: utc(r["watermark"]) for r in table(crash, "dlq/readings")}
    assert held == {"d3-again": at("08:17"), "d4-07:00": at("07:19")}
