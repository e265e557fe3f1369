"""ad_clicks_hourly end to end through ``run_cycle`` (ingest, streaming aggregation, data quality), with real Spark
and real Delta tables under tmp_path: gold against an independent DuckDB oracle over bronze, the ledger against
gold, nothing emitted before the watermark passes window end + the 30 min join bound, nothing emitted twice,
heartbeats never counted.

Where things run: every Spark cycle runs in one module-scoped fixture, ``progressive``, which builds one lake
(generated data revealed file by file over several cycles, an idle period, then new traffic) and keeps a snapshot
after each cycle. The tests only read those snapshots and the final lake (delta-rs, DuckDB); none runs Spark."""

from __future__ import annotations

import glob
import json
import os
import shutil
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import duckdb
import duckdb_extension_delta
import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from sluice.config import Settings, load_settings
from sluice.config import load_settings as _load_settings
from sluice.ingest.state import load_state
from sluice.runtime.context import open_run
from sluice.streaming.cycle import run_cycle
from sluice.windows.ledger import LedgerRow, read_ledger
from sluice_tools.generate import GenerateOptions, Manifest, generate
from support.lake import read_rows

pytestmark = pytest.mark.spark

PIPELINE = "ad_clicks_hourly"
STREAMS = ("impressions", "clicks")
HOUR = timedelta(hours=1)
BOUND = timedelta(minutes=30)
HEARTBEAT = "__heartbeat__"

# Small, but with everything the join has to get right: disorder across files, duplicates, late and
# malformed lines, about one click per impression (so many impressions get several clicks), clicks
# outside the 30 min bound and clicks naming impressions that never existed.
OPTIONS = GenerateOptions(
    seed=23,
    hours=2,
    impressions_per_hour=70,
    click_rate=1.0,
    click_outside_share=0.15,
    click_unknown_share=0.1,
    ads=6,
    users=15,
    disorder=420,
    duplicate_share=0.05,
    late_share=0.03,
    malformed_share=0.02,
    streams=STREAMS,
)

AdRow = tuple[datetime, datetime, str, int, int, float | None]
UnmatchedRow = tuple[datetime, datetime, str, int]


# ------------------------------------------------------------------------------------------------ helpers
def _table(settings: Settings, name: str) -> list[dict[str, Any]]:
    path = settings.lake.local() / name
    if not DeltaTable.is_deltatable(str(path)):
        return []
    return read_rows(path)


def gold_ad(settings: Settings) -> list[AdRow]:
    return sorted(
        (r["window_start"], r["window_end"], r["ad_id"], r["impressions"], r["clicks"], r["ctr"])
        for r in _table(settings, "gold/ad_clicks_hourly")
    )


def gold_unmatched(settings: Settings) -> list[UnmatchedRow]:
    return sorted(
        (r["window_start"], r["window_end"], r["ad_id"], r["unmatched_clicks"])
        for r in _table(settings, "gold/unmatched_clicks_hourly")
    )


def _duckdb_extension() -> str:
    found = glob.glob(os.path.dirname(duckdb_extension_delta.__file__) + "/**/*.duckdb_extension", recursive=True)
    assert found, "duckdb_extension_delta ships no .duckdb_extension file"
    return found[0]


@dataclass
class Oracle:
    """The expected gold, computed with DuckDB straight from the bronze Delta tables (SPEC section 4)."""

    ad: list[AdRow]
    unmatched: list[UnmatchedRow]
    bronze_clicks: int
    matched_clicks: int
    clicks_per_impression: Counter[int] = field(default_factory=Counter)
    cross_hour_matches: int = 0  # matched clicks in another hour than their impression
    outside_bound: int = 0  # unmatched clicks whose impression exists (outside the 30 min bound)
    unknown_impression: int = 0  # unmatched clicks whose impression never existed
    heartbeats: dict[str, int] = field(default_factory=dict)


def oracle(settings: Settings, before: datetime | None = None) -> Oracle:
    """The expected gold of bronze; with ``before``, of its records (heartbeats included) before that time only."""
    con = duckdb.connect()
    try:
        con.execute(f"LOAD '{_duckdb_extension()}'")
        con.execute("SET TimeZone = 'UTC'")
        cut = "" if before is None else f" WHERE event_time < TIMESTAMPTZ '{before.isoformat()}'"
        for stream in STREAMS:
            con.execute(
                f"CREATE VIEW raw_{stream} AS SELECT * FROM delta_scan('{settings.lake.local() / 'bronze' / stream}')"
                + cut
            )
        con.execute("CREATE VIEW imp AS SELECT impression_id, ad_id, event_time FROM raw_impressions "
                    "WHERE NOT is_heartbeat")
        con.execute("CREATE VIEW clk AS SELECT click_id, impression_id, ad_id, event_time FROM raw_clicks "
                    "WHERE NOT is_heartbeat")
        # Bronze is deduplicated by id; the oracle relies on it, so check it.
        for view, key in (("imp", "impression_id"), ("clk", "click_id")):
            [(n, distinct)] = con.execute(f"SELECT count(*), count(DISTINCT {key}) FROM {view}").fetchall()
            assert n == distinct, f"bronze {view} has duplicate ids"
        con.execute(
            """
            CREATE VIEW pairs AS
            SELECT c.click_id, c.event_time AS click_time, i.impression_id, i.event_time AS impression_time
            FROM clk c JOIN imp i
              ON c.impression_id = i.impression_id
             AND i.event_time <= c.event_time
             AND c.event_time <= i.event_time + INTERVAL 30 MINUTE
            """
        )
        ad = con.execute(
            """
            SELECT date_trunc('hour', i.event_time) AS ws, i.ad_id,
                   count(DISTINCT i.impression_id) AS impressions, count(DISTINCT p.click_id) AS clicks
            FROM imp i LEFT JOIN pairs p ON p.impression_id = i.impression_id
            GROUP BY ALL
            """
        ).fetchall()
        unmatched = con.execute(
            """
            SELECT date_trunc('hour', c.event_time) AS ws, c.ad_id, count(*) AS n
            FROM clk c WHERE c.click_id NOT IN (SELECT click_id FROM pairs)
            GROUP BY ALL
            """
        ).fetchall()
        [(bronze_clicks,)] = con.execute("SELECT count(*) FROM clk").fetchall()
        [(matched,)] = con.execute("SELECT count(DISTINCT click_id) FROM pairs").fetchall()
        per_impression = con.execute(
            "SELECT count(p.click_id) FROM imp i LEFT JOIN pairs p USING (impression_id) GROUP BY i.impression_id"
        ).fetchall()
        [(cross_hour,)] = con.execute(
            "SELECT count(*) FROM pairs WHERE date_trunc('hour', click_time) <> date_trunc('hour', impression_time)"
        ).fetchall()
        [(outside, unknown)] = con.execute(
            """
            SELECT count(*) FILTER (WHERE c.impression_id IN (SELECT impression_id FROM imp)),
                   count(*) FILTER (WHERE c.impression_id NOT IN (SELECT impression_id FROM imp))
            FROM clk c WHERE c.click_id NOT IN (SELECT click_id FROM pairs)
            """
        ).fetchall()
        heartbeats = {
            stream: con.execute(f"SELECT count(*) FROM raw_{stream} WHERE is_heartbeat").fetchall()[0][0]
            for stream in STREAMS
        }
    finally:
        con.close()

    def aware(ts: datetime) -> datetime:
        return ts.astimezone(UTC)

    return Oracle(
        ad=sorted(
            (aware(ws), aware(ws) + HOUR, ad_id, imps, clicks, clicks / imps) for ws, ad_id, imps, clicks in ad
        ),
        unmatched=sorted((aware(ws), aware(ws) + HOUR, ad_id, n) for ws, ad_id, n in unmatched),
        bronze_clicks=bronze_clicks,
        matched_clicks=matched,
        clicks_per_impression=Counter(n for (n,) in per_impression),
        cross_hour_matches=cross_hour,
        outside_bound=outside,
        unknown_impression=unknown,
        heartbeats=heartbeats,
    )


def cycle(spark: SparkSession, settings: Settings, now: datetime, *, quality: bool = False) -> Settings:
    """One product cycle (ingest + aggregation, and the data-quality step when ``quality``) at ``now``."""
    at = replace(settings, now_override=now)
    run_cycle(open_run(at, spark), PIPELINE, check_quality=quality, deliver_alerts=False)
    return at


def reveal(staging: Path, landing: Path, upto: datetime) -> None:
    """Move generated files that have arrived by ``upto`` (their mtime) into the landing zone."""
    for file in sorted(staging.glob("*/*.json*")):
        if file.stat().st_mtime <= upto.timestamp():
            target = landing / file.parent.name / file.name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(file, target)  # keeps the mtime


def land(settings: Settings, stream: str, name: str, records: list[dict[str, Any]], arrival: datetime) -> None:
    folder = settings.landing_dir(stream)
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{name}.tmp"
    tmp.write_text("".join(json.dumps(r) + "\n" for r in records))
    final = folder / name
    tmp.rename(final)
    os.utime(final, (arrival.timestamp(), arrival.timestamp()))


def iso(ts: datetime) -> str:
    return ts.strftime("%Y-%m-%dT%H:%M:%SZ")


def watermark(settings: Settings) -> datetime:
    """The pipeline's input watermark: the smaller of its streams' ingest watermarks (Spark's min policy)."""
    marks = [load_state(settings, s).watermark for s in STREAMS]
    assert all(m is not None for m in marks)
    return min(m for m in marks if m is not None)


def windows_of(rows: list[AdRow] | list[UnmatchedRow]) -> set[tuple[datetime, datetime]]:
    return {(r[0], r[1]) for r in rows}


def failed_windows(settings: Settings) -> set[tuple[datetime, datetime]]:
    """The windows with a failed expectation in the data-quality results (ops/dq_results)."""
    return {(r["window_start"], r["window_end"]) for r in _table(settings, "ops/dq_results")
            if r["pipeline"] == PIPELINE and not r["success"]}


# ------------------------------------------------------------------------- the lake: progressive cycles
# New traffic after the streams went idle: it lands in the hour of an idle heartbeat (05:3x), after the
# watermark that heartbeat set (05:2x).
NEW_IMPRESSIONS = [
    ("x1", "ad-new", "05:40:00"),
    ("x2", "ad-new", "05:45:00"),
    ("x3", "ad-001", "05:50:00"),
]
NEW_CLICKS = [
    ("k1", "x1", "ad-new", "05:41:00"),
    ("k2", "x1", "ad-new", "05:44:00"),  # a second click on x1: still one impression
    ("k3", "x2", "ad-new", "05:52:00"),
    ("k4", "nope", "ad-new", "05:48:00"),  # unknown impression: unmatched
]
NEW_HOUR = (datetime(2024, 5, 1, 5, tzinfo=UTC), datetime(2024, 5, 1, 6, tzinfo=UTC))
NEW_ARRIVAL = datetime(2024, 5, 1, 5, 58, tzinfo=UTC)


def _at(clock: str) -> datetime:
    return datetime.fromisoformat(f"2024-05-01T{clock}+00:00")


@dataclass
class Snapshot:
    label: str
    now: datetime
    watermark: datetime
    ad: list[AdRow]
    unmatched: list[UnmatchedRow]
    ledger: list[LedgerRow]


@dataclass
class Progressive:
    settings: Settings
    manifest: Manifest  # of the generated data (the new traffic is not in it)
    snapshots: list[Snapshot]

    def at(self, label: str) -> Snapshot:
        return next(s for s in self.snapshots if s.label == label)


@pytest.fixture(scope="module")
def progressive(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Progressive]:
    """The lake of every test: the generated data revealed file by file over several cycles, with repeated
    ``now``s, an idle period that closes the rest of it, and new traffic afterwards, which the last cycle closes
    too. A snapshot of gold, ledger and watermark after every cycle."""
    root = tmp_path_factory.mktemp("ad-progressive")
    settings = load_settings({}, home=root / "home")
    staging = root / "staging"
    manifest = generate(staging, OPTIONS, specs=settings.streams)
    assert manifest.last_arrival is not None
    last = manifest.last_arrival
    assert OPTIONS.start + 2 * HOUR <= last < OPTIONS.start + 2 * HOUR + timedelta(minutes=5)
    plan: list[tuple[str, datetime]] = [
        # Files up to 01:25 have arrived: the watermark is past 01:00 but not 01:30.
        ("early", OPTIONS.start + timedelta(minutes=85)),
        ("all-data", last + timedelta(minutes=5)),  # everything landed, not idle: closes 00:00 only
        ("all-data-again", last + timedelta(minutes=5)),  # the same now, nothing new
        ("idle", last + timedelta(hours=3)),  # heartbeat at 04:3x closes the last hour of data
        ("idle-later", last + timedelta(hours=4)),  # heartbeat at 05:3x; no data, nothing closable
        ("new-data", last + timedelta(hours=6)),  # new traffic in 05:00; heartbeat at 07:3x closes 04:00, 05:00
    ]
    snapshots = []
    for label, now in plan:
        reveal(staging, settings.landing.local(), now)
        if label == "new-data":
            land(settings, "impressions", "new.jsonl",
                 [{"impression_id": i, "ad_id": a, "event_time": iso(_at(t))} for i, a, t in NEW_IMPRESSIONS],
                 NEW_ARRIVAL)
            land(settings, "clicks", "new.jsonl",
                 [{"click_id": c, "impression_id": i, "ad_id": a, "event_time": iso(_at(t))}
                  for c, i, a, t in NEW_CLICKS],
                 NEW_ARRIVAL)
        # The full product cycle here, data quality included: its ledger updates must not double rows either.
        at = cycle(spark, settings, now, quality=True)
        snapshots.append(
            Snapshot(label, now, watermark(at), gold_ad(at), gold_unmatched(at), read_ledger(at, PIPELINE))
        )
    assert not list(staging.glob("*/*.json*")), "every generated file was revealed"
    yield Progressive(settings, manifest, snapshots)


# ------------------------------------------------------------------------------------------ gold vs oracle
def test_gold_matches_an_independent_oracle(progressive: Progressive) -> None:
    """Gold after the idle cycle is the oracle of the generated data, gold after the last cycle that of all of
    bronze (the new traffic included)."""
    manifest = progressive.manifest
    # The generated data alone: every record of it comes before the new traffic's hour.
    generated = oracle(progressive.settings, before=NEW_HOUR[0])
    expected = oracle(progressive.settings)

    # The data exercises what it is meant to (otherwise the comparisons below prove little). On the generated
    # data alone: the new traffic has impressions with 0 and 2 clicks and a click on an unknown impression too.
    for stream in STREAMS:
        assert manifest.streams[stream].duplicates > 0 and manifest.streams[stream].late > 0
        assert manifest.streams[stream].quarantined_total > 0
    assert max(generated.clicks_per_impression) >= 3, generated.clicks_per_impression
    assert generated.clicks_per_impression[0] > 0 and generated.clicks_per_impression[2] > 0
    assert generated.cross_hour_matches > 0
    assert generated.outside_bound > 0 and generated.unknown_impression > 0
    assert generated.bronze_clicks == manifest.streams["clicks"].accepted
    assert all(n > 0 for n in generated.heartbeats.values())
    assert len(windows_of(generated.ad)) == 2 and len(generated.ad) >= 10

    # Exactly the oracle, every window, every row; ctr compared exactly as float division. The cycle in which
    # the streams went idle closed every window of the generated data that was still open.
    idle, final = progressive.at("idle"), progressive.snapshots[-1]
    assert idle.ad == generated.ad
    assert idle.unmatched == generated.unmatched
    # The last cycle leaves no window of bronze open, and what several cycles wrote once is what the data says.
    assert final.ad == expected.ad
    assert final.unmatched == expected.unmatched

    # Nothing lost: every bronze click is counted once, either matched or unmatched.
    matched = sum(r[4] for r in final.ad)
    unmatched = sum(r[3] for r in final.unmatched)
    assert matched == expected.matched_clicks
    assert matched + unmatched == expected.bronze_clicks


# ------------------------------------------------------------------------------------------- ledger vs gold
def test_ledger_has_one_row_per_gold_window_with_its_quality_verdict(progressive: Progressive) -> None:
    """After every cycle: one ledger row per window in gold, with that window's gold rows (both outputs) and the
    verdict of the data-quality step of the cycle that closed it, checked once (later cycles must not check it
    again). Which watermark closed each window: test_nothing_is_emitted_before_its_time."""
    failing = failed_windows(progressive.settings)
    for snap in progressive.snapshots:
        per_window = Counter((r[0], r[1]) for r in [*snap.ad, *snap.unmatched])
        assert sorted(r.window for r in snap.ledger) == sorted(per_window), snap.label
        for row in snap.ledger:
            assert row.rows == per_window[row.window], (snap.label, row)
            assert row.attempt == 1, (snap.label, row)
            assert row.state == ("failed" if row.window in failing else "validated"), (snap.label, row)
    # Both verdicts occur (the generated data's first hour is too late, the new traffic's ctr of 1.5 invalid).
    assert {r.state for r in progressive.snapshots[-1].ledger} == {"validated", "failed"}


# ----------------------------------------------------------------------- closing, emitting once, heartbeats
def test_nothing_is_emitted_before_its_time(progressive: Progressive) -> None:
    bound = _load_settings({}).pipeline(PIPELINE).lateness_bound
    assert bound == BOUND
    first_seen: dict[tuple[datetime, datetime], Snapshot] = {}
    for snap in progressive.snapshots:
        gold_windows = windows_of(snap.ad) | windows_of(snap.unmatched)
        # Every window in gold after this cycle was closable: the watermark had passed its end + 30 min.
        for start, end in gold_windows:
            assert end + bound <= snap.watermark, (snap.label, start, snap.watermark)
            first_seen.setdefault((start, end), snap)
        # The ledger says which watermark closed each window; it is past end + bound, and not ahead of what
        # ingest had seen when the window first appeared.
        assert {(r.window_start, r.window_end) for r in snap.ledger} == gold_windows
        for row in snap.ledger:
            assert row.closed_by_watermark is not None
            assert row.closed_by_watermark >= row.window_end + bound, row
            assert row.closed_by_watermark <= first_seen[(row.window_start, row.window_end)].watermark, row

    # The early cycle: the watermark has passed the end of the first hour, but not the join bound, so
    # nothing is emitted yet.
    early = progressive.at("early")
    first_hour = (OPTIONS.start, OPTIONS.start + HOUR)
    assert first_hour[1] <= early.watermark < first_hour[1] + bound, early.watermark
    assert early.ad == [] and early.unmatched == [] and early.ledger == []

    # Once all files are in (not idle yet) the first hour is closable and is emitted; the second is not.
    second_hour = (first_hour[1], first_hour[1] + HOUR)
    all_data = progressive.at("all-data")
    assert first_hour[1] + bound <= all_data.watermark < second_hour[1] + bound
    assert windows_of(all_data.ad) == {first_hour}
    assert windows_of(all_data.unmatched) == {first_hour}
    # Only the idle heartbeats close the second hour.
    idle = progressive.at("idle")
    assert windows_of(idle.ad) == {first_hour, second_hour}
    assert windows_of(idle.unmatched) == {first_hour, second_hour}
    # The hour of the new traffic is emitted in the cycle that both ingests it and passes its bound.
    assert NEW_HOUR in windows_of(progressive.at("new-data").ad)


def test_no_window_is_emitted_twice(progressive: Progressive) -> None:
    snaps = {s.label: s for s in progressive.snapshots}
    # The same now again, or a later now without new files and nothing newly closable: nothing changes.
    for first, again in (("all-data", "all-data-again"), ("idle", "idle-later")):
        assert snaps[again].ad == snaps[first].ad
        assert snaps[again].unmatched == snaps[first].unmatched
        assert [(r.window_start, r.window_end, r.rows) for r in snaps[again].ledger] == [
            (r.window_start, r.window_end, r.rows) for r in snaps[first].ledger
        ]
    # Gold only ever grows: every row written by an earlier cycle is still there, unchanged.
    for earlier, later in zip(progressive.snapshots, progressive.snapshots[1:], strict=False):
        assert set(earlier.ad) <= set(later.ad)
        assert set(earlier.unmatched) <= set(later.unmatched)

    final = progressive.snapshots[-1]
    settings = progressive.settings
    for rows in (final.ad, final.unmatched):
        keys = [(r[0], r[1], r[2]) for r in rows]
        assert len(keys) == len(set(keys)), [k for k, n in Counter(keys).items() if n > 1]
    ledger = read_ledger(settings)
    ledger_keys = [r.key for r in ledger]
    assert len(ledger_keys) == len(set(ledger_keys))
    assert {r.pipeline for r in ledger} == {PIPELINE}
    assert {r.state for r in ledger} <= {"closed", "validated", "failed"}
    # That what several cycles wrote once is exactly what the data says: test_gold_matches_an_independent_oracle.


def test_heartbeats_never_count(progressive: Progressive) -> None:
    settings = progressive.settings
    final = progressive.snapshots[-1]
    # Heartbeats were stored, and one of them sits in the hour of the new traffic, with real records.
    for stream in STREAMS:
        beats = [r for r in _table(settings, f"bronze/{stream}") if r["is_heartbeat"]]
        assert beats, stream
        assert any(NEW_HOUR[0] <= r["event_time"] < NEW_HOUR[1] for r in beats), stream
    assert not any(r[2].startswith(HEARTBEAT) for r in final.ad)
    assert not any(r[2].startswith(HEARTBEAT) for r in final.unmatched)
    # The heartbeat's hour holds exactly the new records: x1 (2 clicks) and x2 (1 click) on ad-new, x3 on ad-001
    # without clicks, and the click on an unknown impression.
    assert [r for r in final.ad if (r[0], r[1]) == NEW_HOUR] == [
        (*NEW_HOUR, "ad-001", 1, 0, 0.0),
        (*NEW_HOUR, "ad-new", 2, 3, 1.5),
    ]
    assert [r for r in final.unmatched if (r[0], r[1]) == NEW_HOUR] == [(*NEW_HOUR, "ad-new", 1)]
    # Windows holding nothing but heartbeats (the idle hours) produce no rows at all.
    beat_hours = {
        (r["event_time"].replace(minute=0, second=0, microsecond=0), r["event_time"].replace(
            minute=0, second=0, microsecond=0) + HOUR)
        for stream in STREAMS for r in _table(settings, f"bronze/{stream}") if r["is_heartbeat"]
    } - {NEW_HOUR}
    closed = {w for w in beat_hours if w[1] + BOUND <= final.watermark}
    assert closed, "some heartbeat-only hour was closed"
    assert not closed & (windows_of(final.ad) | windows_of(final.unmatched))
    # Impressions in gold are exactly the real (non-heartbeat) impressions of the closed windows.
    real = [r for r in _table(settings, "bronze/impressions") if not r["is_heartbeat"]]
    gold_windows = windows_of(final.ad)
    in_closed = [r for r in real if any(s <= r["event_time"] < e for s, e in gold_windows)]
    assert sum(r[3] for r in final.ad) == len(in_closed)
