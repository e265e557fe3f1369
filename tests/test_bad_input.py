"""Bad input as producers send it (issue 14, SPEC section 2): it never blocks a stream, never loses a
record and never changes a value. Each class is tried on two streams with different fields, among good
lines, with real Spark and real Delta tables."""

from __future__ import annotations

import base64
import gzip
import json
import os
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, QueryBuilder
from pyspark.sql import SparkSession

from sluice.config import Settings
from sluice.ingest.files import source_key
from sluice.ingest.run import run_ingest
from sluice.ingest.state import load_state
from sluice.reports.status import render_status
from sluice.runtime.context import open_run
from sluice.storage.engines import engine_for
from sluice.windows.ledger import read_ledger
from support import lake, two_streams
from support.lake import read_arrow, read_rows, table
from support.servers import WebhookServer, webhook_fixture  # noqa: F401 (pytest fixture ``webhook``)

pytestmark = pytest.mark.spark

T0 = datetime(2024, 5, 1, 10, 0, tzinfo=UTC)
STREAMS = ["impressions", "events"]


def ts(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def record(stream: str, record_id: Any, minutes: float = 1, **override: Any) -> dict[str, Any]:
    """A valid record of ``stream`` (its own id and required fields), with fields overridden."""
    when = ts(minutes).strftime("%Y-%m-%dT%H:%M:%SZ")
    base = (
        {"impression_id": record_id, "ad_id": "a1", "user_id": "u1", "event_time": when}
        if stream == "impressions"
        else {"event_id": record_id, "user_id": "u1", "event_type": "view", "event_time": when}
    )
    return {**base, **override}


def id_field(stream: str) -> str:
    return "impression_id" if stream == "impressions" else "event_id"


def line(stream: str, record_id: Any, minutes: float = 1, **override: Any) -> str:
    return json.dumps(record(stream, record_id, minutes, **override))


def land_bytes(settings: Settings, stream: str, name: str, data: bytes, arrival_minutes: float) -> Path:
    folder = settings.landing_dir(stream)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_bytes(data)
    os.utime(path, (ts(arrival_minutes).timestamp(), ts(arrival_minutes).timestamp()))
    return path


def ingest(spark: SparkSession, settings: Settings, now_minutes: float, stream: str) -> Settings:
    settings = replace(settings, now_override=ts(now_minutes))
    run_ingest(open_run(settings, spark), [stream])
    return settings


def bronze_ids(settings: Settings, stream: str) -> list[Any]:
    return sorted(r[id_field(stream)] for r in table(settings, f"bronze/{stream}") if not r["is_heartbeat"])


def balanced(settings: Settings, stream: str) -> dict[str, int]:
    totals = load_state(settings, stream).totals()
    assert totals["lines"] == totals["accepted"] + totals["quarantined"] + totals["late"] + totals["duplicates"]
    return totals


@pytest.mark.parametrize("stream", STREAMS)
def test_an_unreadable_gzip_is_quarantined_whole_and_the_stream_goes_on(
    spark: SparkSession, settings: Settings, stream: str
) -> None:
    whole = gzip.compress("".join(line(stream, f"t{i}") + "\n" for i in range(200)).encode())
    land_bytes(settings, stream, "corrupt.jsonl.gz", b"this is not gzip data", 2)
    land_bytes(settings, stream, "truncated.jsonl.gz", whole[: len(whole) // 2], 2)
    lake.land(settings, stream, "good.jsonl", [line(stream, "good")], ts(2))
    done = ingest(spark, settings, 3, stream)

    # The good file is ingested; nothing Spark could read from the truncated file's start is a record.
    assert bronze_ids(done, stream) == ["good"]
    quarantine = {Path(source_key(r["source_file"])).name: r for r in table(done, f"quarantine/{stream}")}
    assert sorted(quarantine) == ["corrupt.jsonl.gz", "truncated.jsonl.gz"]
    assert {r["reason"] for r in quarantine.values()} == {"unreadable_file"}
    assert quarantine["corrupt.jsonl.gz"]["raw"] is None
    assert "Not a gzipped file" in quarantine["corrupt.jsonl.gz"]["detail"]
    assert "ended before the end-of-stream marker" in quarantine["truncated.jsonl.gz"]["detail"]
    # One ops row per unreadable file (it counts as one line), and the accounting balances.
    batches = {Path(source_key(r.source_file or "")).name: r for r in load_state(done, stream).rows}
    assert (batches["corrupt.jsonl.gz"].lines, batches["corrupt.jsonl.gz"].quarantined) == (1, 1)
    assert balanced(done, stream) == {"lines": 3, "accepted": 1, "quarantined": 2, "late": 0, "duplicates": 0}
    assert "truncated.jsonl.gz" in render_status(done) and "unreadable landing files" in render_status(done)

    # The stream is not blocked: the next cycle ingests new files and quarantines nothing twice.
    lake.land(settings, stream, "later.jsonl", [line(stream, "later", 20)], ts(21))
    later = ingest(spark, settings, 22, stream)
    assert bronze_ids(later, stream) == ["good", "later"]
    assert len(table(later, f"quarantine/{stream}")) == 2
    balanced(later, stream)


@pytest.mark.parametrize("stream", STREAMS)
def test_file_names_with_colons_percent_hash_spaces_and_unicode_are_read(
    spark: SparkSession, settings: Settings, stream: str
) -> None:
    names = [f"{stream}-2024-05-01T10:02:00Z.jsonl", "p%20q.jsonl", "h#x.jsonl", "with space.jsonl", "ünïcödé.jsonl"]
    for i, name in enumerate(names):
        lake.land(settings, stream, name, [line(stream, f"n{i}")], ts(2))
    done = ingest(spark, settings, 3, stream)
    assert bronze_ids(done, stream) == [f"n{i}" for i in range(len(names))]
    folder = settings.landing_dir(stream)
    recorded = sorted(source_key(r.source_file or "") for r in load_state(done, stream).rows if not r.is_heartbeat)
    assert recorded == sorted(str(folder / name) for name in names)

    # Each name is recognised as ingested: a later cycle reads only the new file, nothing twice.
    lake.land(settings, stream, "next:file.jsonl", [line(stream, "next", 20)], ts(21))
    later = ingest(spark, settings, 22, stream)
    assert bronze_ids(later, stream) == sorted([f"n{i}" for i in range(len(names))] + ["next"])
    assert balanced(later, stream)["duplicates"] == 0


@pytest.mark.parametrize("stream", STREAMS)
def test_rfc3339_lower_case_t_and_z(spark: SparkSession, settings: Settings, stream: str) -> None:
    lake.land(settings, stream, "f.jsonl", [line(stream, "lower", event_time="2024-05-01t10:01:00z")], ts(2))
    done = ingest(spark, settings, 3, stream)
    [row] = [r for r in table(done, f"bronze/{stream}") if not r["is_heartbeat"]]
    assert row["event_time"] == ts(1)


@pytest.mark.parametrize("stream", STREAMS)
def test_event_times_before_1970_are_quarantined_not_lost(
    spark: SparkSession, settings: Settings, stream: str
) -> None:
    """In a stream's first file nothing is late yet, so a year-1 time (Go's zero time) used to reach bronze
    and then no window at all. Now it is a bad_timestamp, whatever file it comes in."""
    lake.land(settings, stream, "first.jsonl", [
        line(stream, "year1", event_time="0001-01-01T00:00:00Z"),
        line(stream, "year1969", event_time="1969-12-31T23:59:59Z"),
        line(stream, "epoch", event_time="1970-01-01T00:00:00Z"),
        line(stream, "ok"),
    ], ts(2))
    done = ingest(spark, settings, 3, stream)
    assert bronze_ids(done, stream) == ["epoch", "ok"]
    quarantine = {json.loads(r["raw"])[id_field(stream)]: r for r in table(done, f"quarantine/{stream}")}
    assert {k: r["reason"] for k, r in quarantine.items()} == {"year1": "bad_timestamp", "year1969": "bad_timestamp"}
    assert quarantine["year1"]["detail"] == (
        "event_time: 0001-01-01T00:00:00Z is before 1970-01-01T00:00:00Z, the earliest event time sluice accepts"
    )
    balanced(done, stream)


@pytest.mark.parametrize("stream", STREAMS)
def test_lines_that_are_not_utf8_are_quarantined_with_their_bytes(
    spark: SparkSession, settings: Settings, stream: str
) -> None:
    garbage = b"\xff\xfe\x00 not text at all"
    # Otherwise a valid record, with one Latin-1 byte inside a string value: it must not become U+FFFD.
    latin1 = json.dumps(record(stream, "caf\u00e9"), ensure_ascii=False).encode("latin-1")
    good = line(stream, "good").encode()
    land_bytes(settings, stream, "mixed.jsonl", b"\n".join([garbage, latin1, good]) + b"\n", 2)
    done = ingest(spark, settings, 3, stream)

    assert bronze_ids(done, stream) == ["good"]
    # The table stays readable by any Delta reader (no invalid UTF-8 in a string column) ...
    # (delta-rs's own reader: DataFusion, in Rust; not to_pyarrow_table's Python-backed file system)
    quarantine = DeltaTable(str(done.lake.local() / f"quarantine/{stream}"))
    rows = pa.table(QueryBuilder().register("q", quarantine).execute("SELECT * FROM q").read_all()).to_pylist()
    assert {r["reason"] for r in rows} == {"bad_encoding"}
    assert {r["detail"] for r in rows} == {"line is not valid UTF-8; raw holds its bytes base64-encoded"}
    # ... and the bytes are kept losslessly.
    assert sorted(base64.b64decode(r["raw"], validate=True) for r in rows) == sorted([garbage, latin1])
    assert balanced(done, stream)["quarantined"] == 2


@pytest.mark.parametrize("stream", STREAMS)
def test_wrong_json_types_are_bad_type_and_numbers_keep_their_canonical_text(
    spark: SparkSession, settings: Settings, stream: str
) -> None:
    key = id_field(stream)
    rest = '"user_id": "u1", "ad_id": "a1", "event_time": "2024-05-01T10:01:00Z"'
    raw = [
        # Written as JSON text: json.dumps would not keep 1.5e3 or a 20-digit integer as they are.
        f'{{"{key}": 1.5e3, {rest}}}',
        f'{{"{key}": 12345678901234567890, {rest}}}',
        f'{{"{key}": 7, {rest}}}',
        line(stream, {"a": 1}),
        line(stream, ["x"]),
        line(stream, True),
        line(stream, "ok", user_id=42.0),  # a number for a string field: its canonical text, "42"
        line(stream, "obj_user", user_id={"id": 1}),
        line(stream, "1500"),  # the same id as 1.5e3 once canonical: a duplicate
    ]
    lake.land(settings, stream, "types.jsonl", raw, ts(2))
    done = ingest(spark, settings, 3, stream)

    bronze = {r[key]: r for r in table(done, f"bronze/{stream}") if not r["is_heartbeat"]}
    assert sorted(bronze) == ["12345678901234567890", "1500", "7", "ok"]
    assert bronze["ok"]["user_id"] == "42"
    details = sorted((r["reason"], r["detail"]) for r in table(done, f"quarantine/{stream}"))
    assert details == sorted([
        ("bad_type", f'{key}: {{"a":1}} is not a string'),
        ("bad_type", f'{key}: ["x"] is not a string'),
        ("bad_type", f"{key}: true is not a string"),
        ("bad_type", 'user_id: {"id":1} is not a string'),
    ])
    assert balanced(done, stream) == {"lines": 9, "accepted": 4, "quarantined": 4, "late": 0, "duplicates": 1}


@pytest.mark.parametrize(
    ("stream", "pipeline"), [("impressions", "ad_clicks_hourly"), ("events", "user_activity_hourly")]
)
def test_data_quality_catches_accepted_records_that_no_window_can_hold(
    spark: SparkSession, settings: Settings, stream: str, pipeline: str, webhook: WebhookServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Bronze written before the rule above (or by another tool) may hold a year-1 record. No window,
    ledger row or completeness check would ever see it; the DQ step finds it from the Delta log, fails a
    window for it and alerts once."""
    from sluice.storage import tables
    from sluice.streaming.cycle import run_quality

    lake.land(settings, stream, "f.jsonl", [line(stream, "ok")], ts(2))
    done = ingest(spark, settings, 3, stream)
    bronze = tables.bronze(done.stream(stream))
    year1 = datetime(1, 1, 1, tzinfo=UTC)
    values = {**record(stream, "year1"), "event_time": year1}
    row = (*(values.get(f) for f in done.stream(stream).fields), ts(2), "file:/old.jsonl", 99, False,
           year1.date(), 0)
    engine_for(spark, done).append_rows([row], bronze.schema, bronze.path(done), app_id="another-tool", version=0)

    monkeypatch.setenv("AIRFLOW_CONN_SLUICE_WEBHOOK", json.dumps({"conn_type": "http", "host": webhook.url}))
    report = run_quality(open_run(done, spark), pipeline)
    window = (year1, datetime(1970, 1, 1, tzinfo=UTC))
    assert report.failed == {window: [(f"coverage:{stream}", f"1 accepted record(s) in bronze/{stream} before "
                                       "1970-01-01T00:00:00Z reach no window; move them out of bronze (a backfill "
                                       "cannot place them)")]}
    [ledger] = [r for r in read_ledger(done, pipeline) if r.window_start == year1]
    assert ledger.state == "failed" and f"coverage:{stream}" in (ledger.detail or "")
    [alert] = webhook.posts()
    assert alert["pipeline"] == pipeline and alert["failed"][0]["expectation"] == f"coverage:{stream}"

    # Raised once: the next DQ step knows the window has failed.
    assert run_quality(open_run(done, spark), pipeline).failed == {}
    assert len(webhook.requests) == 1


def test_a_crash_between_an_unreadable_files_two_commits_is_completed_on_the_rerun(tmp_path: Path) -> None:
    """SIGKILL right after the ops row of an unreadable file, before its quarantine row: the rerun finishes
    the quarantine, exactly once, and ingests the rest."""
    import subprocess
    import sys

    home = tmp_path / "home"
    folder = home / "landing" / "impressions"
    folder.mkdir(parents=True)
    (folder / "broken.jsonl.gz").write_bytes(b"not gzip")
    (folder / "good.jsonl").write_text(line("impressions", "good") + "\n")
    for f in folder.iterdir():
        os.utime(f, (ts(2).timestamp(), ts(2).timestamp()))

    def ingest_cli(**env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "sluice.cli", "ingest", "impressions"],
            env={**os.environ, "SLUICE_HOME": str(home), "SLUICE_NOW": ts(3).isoformat(),
                 "PYSPARK_PYTHON": sys.executable, **env},
            capture_output=True, text=True, timeout=600,
        )

    killed = ingest_cli(SLUICE_KILL_AFTER_COMMIT="ops/ingest_batches:1")
    assert killed.returncode == -9, killed.stderr[-2000:]
    quarantine_table = home / "lake/quarantine/impressions"
    assert not DeltaTable.is_deltatable(str(quarantine_table)) or not read_arrow(quarantine_table).num_rows
    rerun = ingest_cli()
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    quarantine = read_rows(home / "lake/quarantine/impressions")
    assert [(Path(source_key(r["source_file"])).name, r["reason"]) for r in quarantine] == [
        ("broken.jsonl.gz", "unreadable_file")]
    assert "Not a gzipped file" in quarantine[0]["detail"]
    bronze = read_rows(home / "lake/bronze/impressions")
    assert [r["impression_id"] for r in bronze if not r["is_heartbeat"]] == ["good"]


def test_a_cycle_that_quarantines_an_unreadable_file_alerts(
    spark: SparkSession, settings: Settings, webhook: WebhookServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sluice.quality.checker import deliver_pending_alerts
    from sluice.streaming.cycle import run_cycle

    monkeypatch.setenv("AIRFLOW_CONN_SLUICE_WEBHOOK", json.dumps({"conn_type": "http", "host": webhook.url}))
    land_bytes(settings, "events", "broken.jsonl.gz", b"not gzip", 2)
    lake.land(settings, "events", "good.jsonl", [line("events", "good")], ts(2))
    # As the DAG runs it: the cycle leaves the alert pending, the alert task delivers it.
    run_cycle(open_run(replace(settings, now_override=ts(3)), spark), "user_activity_hourly",
              check_quality=False, deliver_alerts=False)
    assert webhook.requests == []
    [pending] = table(settings, "ops/alerts")
    assert pending["window_start"] is None and pending["channels"] == "pending"
    [sent] = deliver_pending_alerts(settings, "user_activity_hourly")
    [post] = webhook.posts()
    path = str(settings.landing_dir("events") / "broken.jsonl.gz")
    assert post["event"] == "sluice.unreadable_file" and post["window_start"] is None
    assert post["failed"] == [{"expectation": "unreadable_file:events", "observed_value": path}]
    assert sent == post["message"] == (
        "sluice: user_activity_hourly: 1 landing file could not be read and was quarantined whole "
        f"(unreadable_file): unreadable_file:events ({path})"
    )
    assert deliver_pending_alerts(settings, "user_activity_hourly") == []

    # Raised once: the next cycle finds nothing new to quarantine and alerts nobody.
    run_cycle(open_run(replace(settings, now_override=ts(20)), spark), "user_activity_hourly", check_quality=False)
    assert len(webhook.requests) == 1


def test_sluice_ingest_waits_for_the_stream_lock_a_cycle_holds(tmp_path: Path) -> None:
    """`sluice ingest` beside `sluice run` used to fail with "Concurrent transaction failed": both wrote the
    stream's tables. Ingest now takes the stream's lock, which a cycle holds while it ingests that stream."""
    import subprocess
    import sys
    import threading
    import time

    from sluice.config import load_settings
    from sluice.storage.locks import stream_lock

    home = tmp_path / "home"
    settings = load_settings({}, home=home)
    lake.land(settings, "impressions", "f.jsonl", [line("impressions", "a")], ts(2))
    with stream_lock(settings, "impressions", purpose="a cycle in another process"):
        proc = subprocess.Popen(
            [sys.executable, "-m", "sluice.cli", "ingest", "impressions"],
            env={**os.environ, "SLUICE_HOME": str(home), "SLUICE_NOW": ts(3).isoformat(),
                 "PYSPARK_PYTHON": sys.executable},
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        # It says that it waits (on stderr) as soon as it finds the lock taken, and then it must stay put.
        assert proc.stderr is not None
        said: list[str] = []
        reader = threading.Thread(target=lambda: said.extend(proc.stderr), daemon=True)  # type: ignore[arg-type]
        reader.start()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None and not any("waiting" in s for s in said):
            time.sleep(0.2)
        assert any("waiting for the stream lock held by pid" in s for s in said), "".join(said)[-2000:]
        time.sleep(5)  # a run that ignored the lock would be writing bronze by now, or have failed
        assert proc.poll() is None, "sluice ingest did not wait for the stream lock"
        assert not DeltaTable.is_deltatable(str(settings.lake.local() / "bronze/impressions"))
    assert proc.wait(timeout=600) == 0
    reader.join(timeout=10)
    err = "".join(said)
    assert proc.returncode == 0, err[-2000:]
    assert "waiting for the stream lock held by pid" in err and "a cycle in another process" in err
    assert bronze_ids(settings, "impressions") == ["a"]


# -- A team's own two streams: readings (event time `event_time`) and txns (event time declared as `ts`) ------
TWO = two_streams.STREAMS


def two_home(tmp_path: Path) -> Settings:
    return two_streams.two_stream_home(tmp_path)


def two_line(stream: str, rid: str, minutes: float = 1, **override: Any) -> str:
    return json.dumps(two_streams.record(stream, rid, ts(minutes), **override))


def two_ids(settings: Settings, stream: str) -> list[str]:
    key = two_streams.ID_FIELD[stream]
    return sorted(r[key] for r in table(settings, f"bronze/{stream}") if not r["is_heartbeat"])


@pytest.mark.parametrize("stream", TWO)
def test_a_line_with_content_after_its_json_object_is_malformed_and_kept_whole(
    spark: SparkSession, tmp_path: Path, stream: str
) -> None:
    """Spark's try_parse_json reads the first JSON value of a line and ignores the rest, so
    ``{a}{b}`` used to give one accepted record and lose ``b`` without a trace."""
    settings = two_home(tmp_path)
    a, b = two_line(stream, "a"), two_line(stream, "b")
    nested = json.dumps({**two_streams.record(stream, "n", ts(1)), "meta": {"tags": ["x}", "{y"], "q": '"}'}})
    bad = [a + b, a + " xyz", a + "\0", a + "}", a + ' "tail"', nested + " {}", nested + nested]
    good = [two_line(stream, "g1"), nested, a.replace("{", " {", 1) + " \t\r"]
    lake.land(settings, stream, "mixed.jsonl", [good[0], *bad, good[1], good[2]], ts(2))
    done = ingest_two(spark, settings, 3, stream)

    assert two_ids(done, stream) == ["a", "g1", "n"]
    quarantine = table(done, f"quarantine/{stream}")
    assert sorted(r["raw"] for r in quarantine) == sorted(bad)  # the raw text is kept whole
    assert {r["reason"] for r in quarantine} == {"malformed_json"}
    assert balanced(done, stream) == {"lines": 10, "accepted": 3, "quarantined": 7, "late": 0, "duplicates": 0}


@pytest.mark.parametrize("stream", TWO)
def test_blank_text_in_an_optional_number_or_boolean_is_bad_type_not_null(
    spark: SparkSession, tmp_path: Path, stream: str
) -> None:
    """SPEC 2: text where a number or boolean is declared is bad_type; a value is never silently changed.
    Blank text counts as missing only for a required field."""
    settings = two_home(tmp_path)
    optional = ["temp_c", "seq", "ok"] if stream == "readings" else ["amount"]
    required_text = "device_id"
    lines = [two_line(stream, f"blank-{f}", **{f: ""}) for f in optional]
    lines += [two_line(stream, "spaces", **{optional[0]: "  "}), two_line(stream, "no-device", **{required_text: " "}),
              two_line(stream, "null-ok", **{optional[0]: None}), two_line(stream, "fine")]
    lake.land(settings, stream, "blank.jsonl", lines, ts(2))
    done = ingest_two(spark, settings, 3, stream)

    assert two_ids(done, stream) == ["fine", "null-ok"]
    reasons = {json.loads(r["raw"])[two_streams.ID_FIELD[stream]]: (r["reason"], r["detail"])
               for r in table(done, f"quarantine/{stream}")}
    kinds = {"temp_c": "double", "seq": "long", "ok": "boolean", "amount": "double"}
    assert reasons == {
        **{f"blank-{f}": ("bad_type", f"{f}:  is not a {kinds[f]}") for f in optional},
        "spaces": ("bad_type", f"{optional[0]}:    is not a {kinds[optional[0]]}"),
        "no-device": ("missing_field", "missing: device_id"),
    }
    balanced(done, stream)


def test_a_renamed_event_time_is_event_time_in_bronze_and_the_dlq_and_its_declared_name_in_user_code(
    spark: SparkSession, tmp_path: Path
) -> None:
    """README "Tables": a stream's event time is stored as ``event_time`` whatever its declared name, so
    every stream's tables share one time column; build functions see the declared name (``ts``)."""
    from sluice.streaming.batch import batch_inputs

    settings = two_home(tmp_path)
    lake.land(settings, "txns", "t1.jsonl", [two_line("txns", "t1", 30)], ts(31))
    lake.land(settings, "txns", "t2.jsonl", [two_line("txns", "late", 1)], ts(32))
    ingest_two(spark, settings, 33, "readings")
    done = ingest_two(spark, settings, 33, "txns")
    [bronze] = [r for r in table(done, "bronze/txns") if not r["is_heartbeat"]]
    assert bronze["event_time"] == ts(30) and "ts" not in bronze
    [late] = table(done, "dlq/txns")
    assert late["event_time"] == ts(1) and "ts" not in late and json.loads(late["raw"])["ts"]
    pipeline = done.pipeline(two_streams.PIPELINE)
    frame = batch_inputs(done, engine_for(spark, done), pipeline, None, ts(60))["txns"]
    assert frame.columns == ["txn_id", "device_id", "amount", "ts"]
    assert [r["ts"].astimezone(UTC) for r in frame.collect()] == [ts(30)]


def ingest_two(spark: SparkSession, settings: Settings, now_minutes: float, stream: str) -> Settings:
    return ingest(spark, settings, now_minutes, stream)


@pytest.mark.parametrize("stream", TWO)
def test_glob_characters_in_file_names_read_every_file_once(spark: SparkSession, tmp_path: Path, stream: str) -> None:
    """SPARK-58518: a file named with ``[ ] { } * ? \\`` in a trigger made Spark read the trigger's other files
    once more per such name; sluice counted the copies as duplicates (``lines=4`` for a 2-line file)."""
    settings = two_home(tmp_path)
    names = ["a.jsonl", "r-[1]{a,b}*?.jsonl", "x*.jsonl", "q?.jsonl", "b[ac].jsonl", "back\\slash.jsonl",
             "{a,b}.jsonl", "empty[1].jsonl"]
    for i, name in enumerate(names):
        lines = [] if name.startswith("empty") else [two_line(stream, f"n{i}-1"), two_line(stream, f"n{i}-2")]
        lake.land(settings, stream, name, lines, ts(2))
    # A file in a subfolder is not a landing file (and never was).
    lake.land(settings, f"{stream}/sub", "nested.jsonl", [two_line(stream, "nested")], ts(2))
    done = ingest_two(spark, settings, 3, stream)

    assert two_ids(done, stream) == sorted(f"n{i}-{k}" for i in range(len(names) - 1) for k in (1, 2))
    per_file = {Path(source_key(r.source_file or "")).name: (r.lines, r.accepted, r.duplicates)
                for r in load_state(done, stream).rows if not r.is_heartbeat}
    assert per_file == {name: (2, 2, 0) for name in names[:-1]}
    assert balanced(done, stream) == {"lines": 14, "accepted": 14, "quarantined": 0, "late": 0, "duplicates": 0}

    # The next cycle reads only its new file, once, next to a glob-named one.
    lake.land(settings, stream, "later.jsonl", [two_line(stream, "later", 20)], ts(21))
    lake.land(settings, stream, "later[2].jsonl", [two_line(stream, "later2", 20)], ts(21))
    later = ingest_two(spark, settings, 22, stream)
    assert balanced(later, stream) == {"lines": 16, "accepted": 16, "quarantined": 0, "late": 0, "duplicates": 0}


def test_every_class_of_bad_input_on_two_streams_balances_to_the_lines_landed_and_reaches_gold(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Issue 25's accounting: every class of bad input, among good lines, on both streams, over three cycles,
    each cycle run twice. Every landed line ends in exactly one place (bronze, quarantine, the DLQ or the
    duplicate count; an unreadable file counts as one line), and every accepted record is counted in each
    of the three 15-minute windows that hold it, once the streams go idle."""
    from sluice.windows.ledger import read_ledger

    settings = replace(two_home(tmp_path), catchup_min_windows=0)
    landed = {s: 0 for s in TWO}

    def land(stream: str, name: str, lines: list[str], arrival: float) -> None:
        lake.land(settings, stream, name, lines, ts(arrival))
        landed[stream] += len(lines)

    def bad_lines(stream: str, tag: str, minutes: float) -> list[str]:
        good = two_line(stream, f"{tag}-ok", minutes)
        key = two_streams.ID_FIELD[stream]
        optional = "temp_c" if stream == "readings" else "amount"
        return [
            good,
            good + two_line(stream, f"{tag}-glued", minutes),  # content after the object
            good[:-1] + ', "x": 1} trailing',
            "not json at all",
            json.dumps({key: f"{tag}-nokey"}),  # required fields missing
            two_line(stream, f"{tag}-badts", minutes, **{two_streams.TIME_FIELD[stream]: "yesterday"}),
            two_line(stream, f"{tag}-blank", minutes, **{optional: ""}),
            two_line(stream, f"{tag}-early", minutes + 60),
            two_line(stream, f"{tag}-obj", minutes, device_id={"a": 1}),
            good,  # a duplicate within the file
        ]

    for cycle_no, base in enumerate((0, 20, 40)):
        for stream in TWO:
            land(stream, f"c{cycle_no}-[{stream}]{{x}}.jsonl", bad_lines(stream, f"c{cycle_no}", base + 1), base + 2)
            # Exactly at the watermark the file before it left (its max event time base + 1, minus the 2-min delay).
            if cycle_no:
                land(stream, f"c{cycle_no}-at-wm.jsonl", [two_line(stream, f"c{cycle_no}-at-wm", base - 1),
                                                          two_line(stream, f"c{cycle_no}-late", base - 30)], base + 3)
            land_bytes(settings, stream, f"c{cycle_no}-bad.jsonl.gz", b"not gzip", base + 3)
            landed[stream] += 1
        for _rerun in range(2):
            lake.cycle(spark, settings, two_streams.PIPELINE, ts(base + 5))

    idle = lake.cycle(spark, settings, two_streams.PIPELINE, ts(200), quality=True)
    for stream, output, metric in (("readings", two_streams.READINGS_OUT, "readings"),
                                   ("txns", two_streams.TXNS_OUT, "txns")):
        totals = balanced(idle, stream)
        assert totals["lines"] == landed[stream], stream
        accepted = two_ids(idle, stream)
        assert totals["accepted"] == len(accepted) == 5  # one good line per cycle, and the two at the watermark
        assert totals["late"] == len(table(idle, f"dlq/{stream}")) == 2
        # Per cycle: 8 bad lines and the unreadable file; the one duplicate is the good line's copy.
        assert totals["quarantined"] == len(table(idle, f"quarantine/{stream}")) == 3 * 9
        assert totals["duplicates"] == 3
        assert sum(r[metric] for r in table(idle, f"gold/{output}")) == 3 * len(accepted), output
    # Completeness holds in every window; the late records make some fail their lateness check, as they should.
    results = table(idle, "ops/dq_results")
    assert {r["success"] for r in results if "completeness" in r["expectation"]} == {True}
    assert {r.state for r in read_ledger(idle, two_streams.PIPELINE)} <= {"validated", "failed"}
