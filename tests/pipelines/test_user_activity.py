"""user_activity_hourly end to end through ``run_cycle``, with real Spark and real Delta tables under tmp_path:
the seed vector of the brief, averages over the 10-min windows that have events only, idle heartbeats
closing the last hour, and heartbeats never counted."""

from __future__ import annotations

import json
import random
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
from pyspark.sql import SparkSession

from sluice.config import Settings
from sluice.ingest.state import load_state
from sluice.windows.ledger import read_ledger
from support import lake
from support.lake import table

pytestmark = pytest.mark.spark

PIPELINE = "user_activity_hourly"
HEARTBEAT = "__heartbeat__"
TEN = timedelta(minutes=10)
H10 = datetime(2024, 5, 1, 10, tzinfo=UTC)
H11 = H10 + timedelta(hours=1)
H12 = H10 + timedelta(hours=2)

Event = tuple[str, str, datetime]  # (event_id, user_id, event_time)


def at(clock: str) -> datetime:
    return datetime.fromisoformat(f"2024-05-01T{clock}+00:00")


def spread(user: str, bucket: datetime, n: int) -> list[Event]:
    """``n`` events of ``user`` spread over the 10-min bucket starting at ``bucket`` (the first exactly on
    its start, the last before its end)."""
    return [
        (f"{user}-{bucket:%H%M}-{k:02d}", user, bucket + timedelta(seconds=k * 600 // n)) for k in range(n)
    ]


def land(settings: Settings, name: str, events: list[Event], arrival: datetime, extra: list[str] = ()) -> None:
    """A landing file of events, lines in a shuffled (deterministic) order, with its arrival mtime."""
    lines = [
        json.dumps({"event_id": i, "user_id": u, "event_type": "view", "event_time": t.strftime("%Y-%m-%dT%H:%M:%SZ")})
        for i, u, t in events
    ]
    lines += list(extra)
    random.Random(name).shuffle(lines)
    lake.land(settings, "events", name, lines, arrival)


def land_buckets(settings: Settings, events: list[Event]) -> datetime:
    """One file per 10-min bucket, arriving a minute after the bucket ends (as a producer flushing every
    10 min would). Returns the last arrival."""
    by_bucket: dict[datetime, list[Event]] = {}
    for event in events:
        t = event[2]
        by_bucket.setdefault(t.replace(minute=t.minute - t.minute % 10, second=0, microsecond=0), []).append(event)
    last = datetime.min.replace(tzinfo=UTC)
    for bucket, chunk in sorted(by_bucket.items()):
        arrival = bucket + TEN + timedelta(minutes=1)
        land(settings, f"events-{bucket:%H%M}.jsonl", chunk, arrival)
        last = max(last, arrival)
    return last


def cycle(spark: SparkSession, settings: Settings, now: datetime) -> Settings:
    """One product cycle at ``now``: ingest + aggregation (the data-quality step is tested elsewhere and
    only changes ledger states)."""
    return lake.cycle(spark, settings, PIPELINE, now)


def gold(settings: Settings) -> list[tuple[datetime, datetime, str, float]]:
    return sorted(
        (r["window_start"], r["window_end"], r["user_id"], r["avg_events_per_10min"])
        for r in table(settings, "gold/user_activity_hourly")
    )


def heartbeats(settings: Settings) -> list[datetime]:
    return sorted(r["event_time"] for r in table(settings, "bronze/events") if r["is_heartbeat"])


# ------------------------------------------------------------------------------------------ 2. seed vector
SEED = {"u1": (12, 8, 5, 15, 9, 11), "u2": (7, 16, 10, 6, 19, 17)}


def test_seed_vector_and_average_over_windows_with_events(spark: SparkSession, settings: Settings) -> None:
    events: list[Event] = []
    for user, counts in SEED.items():
        for k, n in enumerate(counts):
            events += spread(user, H10 + k * TEN, n)
    # u3 is active in only 2 of the six 10-min windows of 11:00, with events right on the hour and on the
    # last second of it: 4 and 7 events average to 5.5 (not 11 / 6).
    events += [(f"u3-a{k}", "u3", t) for k, t in enumerate(map(at, ("11:00:00", "11:03:00", "11:06:00", "11:09:59")))]
    events += [
        (f"u3-b{k}", "u3", t)
        for k, t in enumerate(map(at, ("11:50:00", "11:52:00", "11:54:00", "11:56:00", "11:58:00", "11:59:30",
                                       "11:59:59")))
    ]
    assert Counter(u for _, u, t in events if t < H11) == {"u1": 60, "u2": 75}
    # A byte-identical copy of one line, in its own file arriving just before the original's: one of the
    # two is a duplicate and must not count twice.
    dup = json.dumps({"event_id": "u1-1000-00", "user_id": "u1", "event_type": "view",
                      "event_time": "2024-05-01T10:00:00Z"})
    last = land_buckets(settings, events)
    land(settings, "events-dup.jsonl", [], H10 + TEN + timedelta(seconds=30), extra=[dup])

    done = cycle(spark, settings, last + timedelta(hours=3))

    assert gold(done) == [
        (H10, H11, "u1", 10.0),
        (H10, H11, "u2", 12.5),
        (H11, H12, "u3", 5.5),
    ]
    assert load_state(done, "events").totals()["duplicates"] == 1
    ledger = read_ledger(done, PIPELINE)
    assert [(r.window_start, r.window_end, r.rows, r.state) for r in ledger] == [
        (H10, H11, 2, "closed"),
        (H11, H12, 1, "closed"),
    ]
    assert all(r.closed_by_watermark is not None and r.closed_by_watermark >= r.window_end for r in ledger)


# ----------------------------------------------------------------------- 3. idle heartbeats close the hour
def test_idle_heartbeats_close_the_last_hour(spark: SparkSession, settings: Settings) -> None:
    events = spread("u1", H10, 3) + spread("u1", H10 + 3 * TEN, 5) + spread("u2", H10 + 5 * TEN, 4)
    events.append(("u2-last", "u2", at("10:59:30")))
    last = land_buckets(settings, events)
    assert last == at("11:01:00")

    # 19 min after the last arrival: not idle, no heartbeat; the watermark (10:54:30) has not passed 11:00.
    s = cycle(spark, settings, at("11:20:00"))
    assert heartbeats(s) == []
    assert load_state(s, "events").watermark == at("10:54:30")
    assert gold(s) == [] and read_ledger(s, PIPELINE) == []

    # 31 min: idle, a heartbeat at now - 30 min = 11:02, which moves the watermark to 10:57 only; the hour
    # still stays open (a heartbeat closes windows through the watermark, like any record).
    s = cycle(spark, settings, at("11:32:00"))
    assert heartbeats(s) == [at("11:02:00")]
    assert load_state(s, "events").watermark == at("10:57:00")
    assert gold(s) == [] and read_ledger(s, PIPELINE) == []

    # 38 min: heartbeat at 11:09, watermark 11:04 > 11:00: the last hour is emitted.
    s = cycle(spark, settings, at("11:39:00"))
    assert heartbeats(s) == [at("11:02:00"), at("11:09:00")]
    wm = load_state(s, "events").watermark
    assert wm == at("11:04:00")
    # u1: 3 and 5 events in two windows -> 4.0; u2: 4 + 1 events in [10:50, 11:00) -> 5.0.
    assert gold(s) == [(H10, H11, "u1", 4.0), (H10, H11, "u2", 5.0)]
    [row] = read_ledger(s, PIPELINE)
    assert (row.pipeline, row.window_start, row.window_end, row.state, row.rows) == (PIPELINE, H10, H11, "closed", 2)
    assert row.closed_by_watermark is not None
    assert H11 <= row.closed_by_watermark <= wm


# ------------------------------------------------------------------------------- 7. heartbeats never count
def test_heartbeats_never_count(spark: SparkSession, settings: Settings) -> None:
    last = land_buckets(settings, spread("u1", H10, 2) + spread("u1", H10 + 5 * TEN, 4))
    # Idle: heartbeat at 11:10:00, watermark 11:05.
    s = cycle(spark, settings, last + timedelta(minutes=39))
    assert heartbeats(s) == [at("11:10:00")]
    assert gold(s) == [(H10, H11, "u1", 3.0)]

    # New traffic in the heartbeat's own 10-min window [11:10, 11:20) and the next one.
    land(settings, "events-late-traffic.jsonl",
         [("n1", "u1", at("11:12:00")), ("n2", "u1", at("11:15:00")), ("n3", "u1", at("11:25:00")),
          ("n4", "u9", at("11:10:00"))],
         at("11:30:00"))
    s = cycle(spark, settings, at("13:00:00"))
    assert heartbeats(s) == [at("11:10:00"), at("12:30:00")]
    assert load_state(s, "events").totals()["late"] == 0
    rows = gold(s)
    assert not any(r[2].startswith(HEARTBEAT) for r in rows)
    # u1: 2 and 1 events -> 1.5 (the heartbeat in [11:10, 11:20) is not an event of anyone); u9: 1.
    assert rows == [(H10, H11, "u1", 3.0), (H11, H12, "u1", 1.5), (H11, H12, "u9", 1.0)]
    assert [(r.window_start, r.rows) for r in read_ledger(s, PIPELINE)] == [(H10, 1), (H11, 2)]
