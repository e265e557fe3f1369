"""Freshness (README "Operations > Freshness"): which window is judged, when it is due, and the ``stale``
alert of real pipelines on real Spark and Delta: a producer that lags, a stream that never sent a file, and
history replayed today."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from sluice.alerting.outbox import record_alerts
from sluice.config import Settings, load_settings
from sluice.core.model import PipelineDef
from sluice.core.windows import WindowSpec
from sluice.ingest.run import run_ingest
from sluice.ingest.state import BatchRow, StreamState
from sluice.quality.freshness import due_time, first_window_holding, oldest_open_window, stale_alerts
from sluice.runtime.context import open_run
from sluice.streaming.cycle import run_quality
from support.lake import cycle, land, table
from support.servers import WebhookServer, webhook_fixture  # noqa: F401 (pytest fixture ``webhook``)
from support.tutorial import write_tutorial
from support.two_streams import PIPELINE as TWO_STREAMS
from support.two_streams import reading as two_stream_reading
from support.two_streams import two_stream_home


def pipeline(size: str, hop: str | None = None, bound: timedelta = timedelta(0)) -> PipelineDef:
    def minutes(text: str) -> timedelta:
        return timedelta(minutes=int(text.rstrip("m")))

    return PipelineDef("p", ("s",), (), WindowSpec(minutes(size), minutes(hop) if hop else None), bound)


TODAY = datetime(2026, 11, 25, tzinfo=UTC)


def at(h: int, m: int = 0, s: int = 0) -> datetime:
    return datetime(2024, 5, 1, h, m, s, tzinfo=UTC)


def test_the_oldest_open_window_follows_the_closing_rule() -> None:
    hourly = pipeline("60m")
    # W >= end closes [10, 11) exactly at 11:00, so the oldest open one is then [11, 12).
    assert oldest_open_window(hourly, at(10, 59)) == (at(10), at(11))
    assert oldest_open_window(hourly, at(11)) == (at(11), at(12))
    joined = pipeline("60m", bound=timedelta(minutes=30))
    assert oldest_open_window(joined, at(11, 29)) == (at(10), at(11))
    assert oldest_open_window(joined, at(11, 30)) == (at(11), at(12))
    hopping = pipeline("15m", "5m")  # windows end every 5 minutes
    assert oldest_open_window(hopping, at(10, 7)) == (at(9, 55), at(10, 10))


def batch(event: datetime, arrival: datetime, batch_id: int = 0) -> BatchRow:
    return BatchRow("s", batch_id, max_event_time=event, max_arrival_time=arrival)


def test_a_window_is_due_a_grace_after_its_close_or_after_its_data_arrived_whichever_is_later() -> None:
    hopping = pipeline("15m", "5m", bound=timedelta(minutes=10))
    window = (at(9, 50), at(10, 5))
    assert first_window_holding(hopping, at(10)) == window
    assert first_window_holding(hopping, at(10, 4, 59)) == window
    assert first_window_holding(hopping, at(10, 5)) == (at(9, 55), at(10, 10))  # half-open: 10:05 is not in it
    # Live data (10:00 arrived at 10:01): end + bound + grace.
    live = StreamState([batch(at(10), at(10, 1))])
    assert due_time(hopping, window, [live]) == at(11, 15)
    # The same events landing two years later: one grace after they arrived.
    replayed = StreamState([batch(at(10), TODAY.replace(hour=13))])
    assert due_time(hopping, window, [replayed]) == TODAY.replace(hour=14)
    # What reached the window first decides, over every stream; data that ends before it and heartbeats do not.
    earlier = StreamState([batch(at(9, 40), at(9, 41)), BatchRow("s", 1, max_event_time=at(12), is_heartbeat=True),
                           batch(at(10, 30), at(12, 30), 2)])
    assert due_time(hopping, window, [earlier, replayed]) == at(13, 30)


# -- a real pipeline whose producer lags --------------------------------------------------------------------
def reading(i: int, event: datetime) -> dict[str, object]:
    return {"reading_id": f"r{i}", "device_id": "d1", "temp_c": 20.0, "event_time": event.isoformat()}


@pytest.mark.spark
def test_a_window_left_open_past_its_grace_raises_one_stale_alert_naming_the_stream(
    spark: SparkSession, tmp_path: Path, webhook: WebhookServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The producer keeps sending, but two hours behind: the stream is never idle, so no heartbeat helps,
    and the watermark holds every window open. The tutorial's windows are 15 min every 5 min, with a
    2-minute watermark delay and the default grace of 1 h."""
    monkeypatch.setenv("AIRFLOW_CONN_SLUICE_WEBHOOK", json.dumps({"conn_type": "http", "host": webhook.url}))
    home: Settings = load_settings({"SLUICE_PIPELINES": str(write_tutorial(tmp_path / "pipelines"))},
                                   home=tmp_path / "home")
    from sluice.streaming.cycle import run_cycle

    def run(now: datetime) -> None:
        from dataclasses import replace

        run_cycle(open_run(replace(home, now_override=now), spark), "device_temps")  # delivers, as `sluice run`

    # On time: data of 10:00-10:20 arriving as it happens closes windows, nothing is stale.
    for i, minute in enumerate((0, 10, 20)):
        land(home, "readings", f"a{i}.jsonl", [reading(i, at(10, minute))], at(10, minute + 1))
    run(at(10, 25))
    assert webhook.requests == []

    # Then the producer falls behind: at 12:00 it sends readings of 10:24 (W = 10:22).
    land(home, "readings", "late0.jsonl", [reading(10, at(10, 24))], at(12))
    run(at(12, 1))
    [post] = webhook.posts()
    assert post["event"] == "sluice.stale" and post["kind"] == "stale" and post["level"] == "error"
    # The oldest open window under W = 10:22 ends at 10:25; it was due closed at 11:25.
    assert (post["window_start"], post["window_end"]) == ("2024-05-01T10:10:00Z", "2024-05-01T10:25:00Z")
    assert post["failed"] == [{"expectation": "freshness:readings",
                               "observed_value": "watermark 2024-05-01T10:22:00Z, window due closed by "
                                                 "2024-05-01T11:25:00Z"}]
    # Issue 29 section 3: `sluice status` (text and JSON), the ledger page and the alert count the same
    # open windows, as windows of the pipeline: those holding data that W = 10:22 has not closed.
    from sluice.airflow.api import windows_data
    from sluice.reports.status import ledger_summary, status_data

    [counts] = [p for p in status_data(home)["pipelines"] if p["pipeline"] == "device_temps"]
    [page] = [p for p in windows_data(home, lambda page: page)["pipelines"] if p["pipeline"] == "device_temps"]
    open_cells = [w["window_start"] for w in page["windows"] if w["state"] == "open"]
    assert open_cells == ["2024-05-01T10:10:00Z", "2024-05-01T10:15:00Z", "2024-05-01T10:20:00Z"]
    assert counts["windows"]["open"] == len(open_cells)
    assert counts["oldest_open"] == open_cells[0] == post["window_start"]
    [summary] = [line.split() for line in ledger_summary(home).splitlines() if line.startswith("device_temps")]
    assert summary[1] == "3" and summary[-2:] == ["2024-05-01", "10:10:00Z"]

    # Still lagging ten minutes later: the next window is stale too, but one alert per grace is enough.
    land(home, "readings", "late1.jsonl", [reading(11, at(10, 29))], at(12, 9))
    run(at(12, 10))
    assert len(webhook.requests) == 1
    # An hour on, still stuck: alerted again, for the window now holding things up.
    land(home, "readings", "late2.jsonl", [reading(12, at(10, 31))], at(13, 9))
    run(at(13, 10))
    assert len(webhook.requests) == 2
    assert webhook.posts()[1]["window_end"] == "2024-05-01T10:30:00Z"
    stale = [r for r in table(home, "ops/alerts") if r["kind"] == "stale"]
    assert len(stale) == 2 and {r["channels"] for r in stale} == {"webhook"}


# -- a stream that has never received a file (SPEC 3) -------------------------------------------------------


def stale_rows(home: Settings) -> list[dict[str, object]]:
    return [r for r in table(home, "ops/alerts") if r["kind"] == "stale"]


def ingest_and_check(spark: SparkSession, home: Settings, pipeline: str, now: datetime) -> Settings:
    """What the pipeline's DAG runs around its aggregation: ingest of its streams, then the scheduled check
    (``check_quality``), which judges freshness."""
    at_now = replace(home, now_override=now)
    run_ingest(open_run(at_now, spark), list(at_now.pipeline(pipeline).streams))
    run_quality(open_run(at_now, spark), pipeline, deliver_alerts=False)
    return at_now


@pytest.mark.spark
def test_a_stream_that_never_received_a_file_is_named_once_its_first_window_is_due(
    spark: SparkSession, tmp_path: Path
) -> None:
    """``readings`` is live from 10:00, ``txns`` never sends a file: it has no watermark, so it holds every
    window open. The oldest window the readings fill is [09:50, 10:05) (windows of 15 min every 5, a 10-min
    join bound); it is due closed at 10:05 + 10 min + 1 h of grace."""
    home = two_stream_home(tmp_path)
    land(home, "readings", "r1.jsonl", [two_stream_reading("r1", at(10)), two_stream_reading("r2", at(10, 3))],
         at(10, 1))
    land(home, "readings", "r2.jsonl", [two_stream_reading("r3", at(10, 20))], at(10, 21))
    ingest_and_check(spark, home, TWO_STREAMS, at(11, 14))
    assert stale_rows(home) == []

    # 11:20: readings went idle (a heartbeat took its watermark to 10:48), txns still has nothing.
    ingest_and_check(spark, home, TWO_STREAMS, at(11, 20))
    [alert] = stale_rows(home)
    assert (alert["window_start"], alert["window_end"]) == (at(9, 50), at(10, 5))
    assert json.loads(str(alert["failed_expectations"])) == [
        {"expectation": "freshness:txns",
         "observed_value": "no file received yet, so no watermark, window due closed by 2024-05-01T11:15:00Z"}]
    assert "freshness:txns (no file received yet" in str(alert["message"])

    # Still nothing from txns hours later: the same window, the same alert, recorded once.
    later = replace(home, now_override=at(13))
    assert [a.window_start for a in stale_alerts(later, later.pipeline(TWO_STREAMS))] == [at(9, 50)]
    assert record_alerts(later, stale_alerts(later, later.pipeline(TWO_STREAMS))) == []


# -- history: the first run over a backlog of old events -----------------------------------------------------
def today(h: int, m: int = 0) -> datetime:
    return TODAY.replace(hour=h, minute=m)


@pytest.mark.spark
def test_history_is_not_stale_on_its_first_run_nor_while_the_replay_moves_but_a_stuck_replay_is(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A producer replays readings of 2024 today. Judged against the wall clock every window would have been
    due in 2024; each window is due one grace (1 h) after the first data reaching it arrived instead."""
    home: Settings = load_settings({"SLUICE_PIPELINES": str(write_tutorial(tmp_path / "pipelines"))},
                                   home=tmp_path / "home")
    land(home, "readings", "h1.jsonl", [reading(i, at(10, 3 * i)) for i in range(10)], today(13))
    cycle(spark, home, "device_temps", today(13, 5), quality=True)
    assert stale_rows(home) == [], "the first run over history"

    # An hour on, the replay has moved on to 12:00-12:30: the window it now holds open got its data at 14:05.
    land(home, "readings", "h2.jsonl", [reading(20 + i, at(12, 3 * i)) for i in range(11)], today(14, 5))
    cycle(spark, home, "device_temps", today(14, 6), quality=True)
    assert stale_rows(home) == [], "a replay that moves"

    # Then it sticks: files keep coming, but for 12:29 (the watermark stays at 12:28). [12:15, 12:30) got its
    # first data at 14:05, so it was due closed at 15:05.
    land(home, "readings", "h3.jsonl", [reading(40, at(12, 29))], today(15, 8))
    cycle(spark, home, "device_temps", today(15, 10), quality=True)
    [alert] = stale_rows(home)
    assert json.loads(str(alert["failed_expectations"])) == [
        {"expectation": "freshness:readings",
         "observed_value": "watermark 2024-05-01T12:28:00Z, window due closed by 2026-11-25T15:05:00Z"}]
