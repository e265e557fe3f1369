"""Freshness: which window is the oldest open one, and when it is stale (pure time arithmetic)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sluice.core.model import PipelineDef
from sluice.core.windows import WindowSpec
from sluice.quality.freshness import oldest_open_window


def pipeline(size: str, hop: str | None = None, bound: timedelta = timedelta(0)) -> PipelineDef:
    def minutes(text: str) -> timedelta:
        return timedelta(minutes=int(text.rstrip("m")))

    return PipelineDef("p", ("s",), (), WindowSpec(minutes(size), minutes(hop) if hop else None), bound)


def at(h: int, m: int = 0) -> datetime:
    return datetime(2024, 5, 1, h, m, tzinfo=UTC)


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


# -- a real pipeline whose producer lags --------------------------------------------------------------------

import json  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
from pyspark.sql import SparkSession  # noqa: E402

from sluice.config import Settings, load_settings  # noqa: E402
from support.lake import land, table  # noqa: E402
from support.servers import WebhookServer, webhook_fixture  # noqa: E402,F401 (pytest fixture ``webhook``)
from support.tutorial import write_tutorial  # noqa: E402


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

        run_cycle(replace(home, now_override=now), "device_temps", spark=spark)  # delivers, as `sluice run`

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
