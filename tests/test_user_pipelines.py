"""SPEC 8 end to end on real Spark and Delta: a team's own pipeline, declared in a folder of its own with
only the public API, runs through ingest, streaming, the closing rule, data quality and backfills.

The pipeline is the README's tutorial (taken from the README itself), SPEC 8's example: ``device_temps``
filters on a non-time column (``temp_c``) before it aggregates, which Spark pushes below the watermark.
Heartbeats never reach user code, and the last windows still close when the stream goes idle."""

from __future__ import annotations

import textwrap
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from sluice.config import Settings, load_settings
from sluice.ingest.state import load_state
from sluice.runtime.context import open_run
from sluice.storage.state import lake_state
from sluice.streaming.backfill import run_backfill
from sluice.streaming.definitions import fingerprints, pipeline_definitions, recorded
from sluice.windows.ledger import read_ledger
from support.lake import cycle, land, table
from support.tutorial import write_tutorial

pytestmark = pytest.mark.spark

DAY = datetime(2024, 5, 1, tzinfo=UTC)

# A second pipeline on the same stream: the hottest reading per device per 15 minutes (tumbling).
DEVICE_MAX = '''
from pyspark.sql import functions as F
from sluice import Output, Pipeline, checks
from device_temps import readings  # the stream is shared, not declared twice

def device_max(inputs, window):
    return (inputs["readings"].groupBy(window.column("event_time"), "device_id")
            .agg(F.max("temp_c").alias("max_temp_c"), F.count("*").alias("readings")))

pipeline = Pipeline(
    name="device_max",
    streams=[readings],
    window="15m",
    outputs=[Output("device_max", device_max, key="device_id",
                    checks=[checks.completeness("readings", stream="readings")])],
)
'''


def at(hhmm: str) -> datetime:
    hours, minutes = hhmm.split(":")
    return DAY + timedelta(hours=int(hours), minutes=int(minutes))


def reading(i: int, device: str, hhmm: str, temp: float | None) -> dict[str, Any]:
    return {"reading_id": f"r{i}", "device_id": device, "temp_c": temp, "battery": 100 - i,
            "event_time": f"2024-05-01T{hhmm}:00Z"}


# (file, arrival, readings). d2's reading at 10:02 has no temperature: the transform filters it out.
FILES = [
    ("r1.jsonl", "10:06", [reading(1, "d1", "10:00", 20.0), reading(2, "d2", "10:02", None),
                           reading(3, "d1", "10:04", 22.0), reading(4, "d2", "10:05", 30.0)]),
    ("r2.jsonl", "10:16", [reading(5, "d1", "10:10", 24.0), reading(6, "d2", "10:12", 31.0),
                           reading(7, "d1", "10:14", 26.0)]),
]
RECORDS = [r for _f, _a, rs in FILES for r in rs]


def expected(window: tuple[datetime, datetime]) -> dict[str, tuple[int, float, int]]:
    """device -> (readings with a temperature, their average, the lowest battery) for one window, straight
    from the records."""
    out: dict[str, list[dict[str, Any]]] = {}
    for r in RECORDS:
        t = datetime.fromisoformat(r["event_time"].replace("Z", "+00:00"))
        if window[0] <= t < window[1] and r["temp_c"] is not None:
            out.setdefault(r["device_id"], []).append(r)
    return {d: (len(v), sum(r["temp_c"] for r in v) / len(v), min(r["battery"] for r in v)) for d, v in out.items()}


def observed(rows: dict[str, Any]) -> dict[str, tuple[int, float, int]]:
    return {d: (r["readings"], r["avg_temp_c"], r["min_battery"]) for d, r in rows.items()}


def hopping(first_end: str, last_end: str) -> list[tuple[datetime, datetime]]:
    end, stop = at(first_end), at(last_end)
    out = []
    while end <= stop:
        out.append((end - timedelta(minutes=15), end))
        end += timedelta(minutes=5)
    return out


def gold(settings: Settings, name: str = "device_temps") -> dict[tuple[datetime, datetime], dict[str, Any]]:
    out: dict[tuple[datetime, datetime], dict[str, Any]] = {}
    for r in table(settings, f"gold/{name}"):
        window = (r["window_start"], r["window_end"])
        assert r["device_id"] not in out.setdefault(window, {}), f"{window} {r['device_id']} written twice"
        out[window][r["device_id"]] = r
    return out


@pytest.fixture
def home(tmp_path: Path) -> Settings:
    folder = write_tutorial(tmp_path / "team-pipelines")
    settings = load_settings({"SLUICE_PIPELINES": str(folder)}, home=tmp_path / "home")
    assert settings.registry.errors == []
    return settings


def land_files(settings: Settings, files: list[tuple[str, str, list[dict[str, Any]]]]) -> None:
    for name, arrival, records in files:
        land(settings, "readings", name, records, at(arrival))


def test_own_pipeline_closes_every_window_even_when_its_filter_hides_the_heartbeat(
    spark: SparkSession, home: Settings
) -> None:
    land_files(home, FILES)
    # Cycle 1: the stream watermark is 10:14 - 2 min = 10:12, so windows ending at 10:05 and 10:10 are final.
    first = cycle(spark, home, "device_temps", at("10:20"), quality=True)
    assert load_state(first, "readings").watermark == at("10:12")
    assert sorted(gold(first)) == hopping("10:05", "10:10")

    # Cycle 2: the stream has been idle 44 min; its heartbeat at 10:30 moves the watermark to 10:28. The
    # transform's filter hides nothing from sluice: windows ending by 10:25 close now, whatever Spark's
    # own watermark (which never sees heartbeats) says.
    second = cycle(spark, home, "device_temps", at("11:00"), quality=True)
    assert load_state(second, "readings").watermark == at("10:28")
    windows = gold(second)
    assert sorted(windows) == [w for w in hopping("10:05", "10:25") if expected(w)]
    for window, rows in windows.items():
        assert observed(rows) == expected(window), window
    assert all(r["device_id"] in ("d1", "d2") for rows in windows.values() for r in rows.values())

    # The ledger has one row per window; DQ validated them. Completeness counts every accepted reading,
    # so exactly the windows holding d2's temperature-less reading fail, and are alerted.
    ledger = {(r.window_start, r.window_end): r for r in read_ledger(second, "device_temps")}
    assert sorted(ledger) == sorted(windows)
    with_null = {w for w in windows if w[0] <= at("10:02") < w[1]}
    assert {w for w, r in ledger.items() if r.state == "failed"} == with_null
    assert {r.state for w, r in ledger.items() if w not in with_null} == {"validated"}
    for w in ledger:
        assert ledger[w].closed_by_watermark is not None and ledger[w].closed_by_watermark >= w[1]
    # SPEC 9: every window names the definition that built it, kept readable beside the checkpoints.
    definitions = pipeline_definitions(spark, second, second.pipeline("device_temps"))
    assert {r.definition for r in ledger.values()} == {fingerprints(definitions)}
    assert recorded(lake_state(second), "device_temps") == definitions
    alerts = table(second, "ops/alerts")
    assert sorted((a["window_start"], a["window_end"]) for a in alerts) == sorted(with_null)
    dq = [r for r in table(second, "ops/dq_results") if (r["window_start"], r["window_end"]) in with_null]
    failed = {r["expectation"] for r in dq if not r["success"]}
    assert failed == {"completeness:readings"}

    # A third idle cycle changes nothing: every window was written exactly once.
    third = cycle(spark, home, "device_temps", at("11:30"))
    assert gold(third) == windows

    # Backfills of the same range reproduce the streaming result and are repeatable.
    before = sorted(map(str, table(third, "gold/device_temps")))
    for _ in range(2):
        result = run_backfill(open_run(third, spark), "device_temps", at("09:50"), at("10:15"), deliver_alerts=False)
        assert result.windows == [w for w in hopping("10:05", "10:25") if expected(w)]
        assert sorted(map(str, table(third, "gold/device_temps"))) == before
    assert {r.definition for r in read_ledger(third, "device_temps")} == {fingerprints(definitions)}


def test_typed_fields_keep_their_types_and_bad_values_are_quarantined(spark: SparkSession, home: Settings) -> None:
    land(home, "readings", "typed.jsonl", [
        reading(1, "d1", "10:00", 20.5),
        {**reading(2, "d1", "10:01", 21.0), "temp_c": "hot"},
        {**reading(3, "d1", "10:02", 21.0), "battery": "full"},
        {**reading(4, "d1", "10:03", 21.0), "battery": 7},
        reading(5, "d1", "10:04", None),
    ], at("10:05"))
    settings = cycle(spark, home, "device_temps", at("10:06"))
    bronze = {r["reading_id"]: r for r in table(settings, "bronze/readings") if not r["is_heartbeat"]}
    assert sorted(bronze) == ["r1", "r4", "r5"]
    assert bronze["r1"]["temp_c"] == 20.5 and bronze["r4"]["battery"] == 7 and bronze["r5"]["temp_c"] is None
    quarantine = table(settings, "quarantine/readings")
    quarantined = {r["raw"].split('"reading_id": "')[1].split('"')[0]: r for r in quarantine}
    assert {k: r["reason"] for k, r in quarantined.items()} == {"r2": "bad_type", "r3": "bad_type"}
    assert quarantined["r2"]["detail"] == "temp_c: hot is not a double"
    assert quarantined["r3"]["detail"] == "battery: full is not a long"


def test_a_shared_stream_is_ingested_once_and_every_pipeline_sees_every_record(
    spark: SparkSession, home: Settings
) -> None:
    (home.pipelines_path / "device_max.py").write_text(textwrap.dedent(DEVICE_MAX))
    home = load_settings({"SLUICE_PIPELINES": str(home.pipelines_path)}, home=home.home)
    assert sorted(home.registry.pipelines) == ["device_max", "device_temps"]
    land_files(home, FILES[:1])
    # device_temps' cycle ingests the first file; device_max's finds it already in bronze.
    cycle(spark, home, "device_temps", at("10:20"))
    cycle(spark, home, "device_max", at("10:20"))
    land_files(home, FILES[1:])
    # The other order for the second file: device_max ingests it, device_temps reads it from bronze.
    cycle(spark, home, "device_max", at("11:00"))
    last = cycle(spark, home, "device_temps", at("11:00"))

    batches = [r for r in table(last, "ops/ingest_batches") if not r["is_heartbeat"]]
    assert sorted(Path(r["source_file"]).name for r in batches) == ["r1.jsonl", "r2.jsonl"]
    assert sum(r["accepted"] for r in batches) == len(RECORDS)

    temps = gold(last)
    assert sorted(temps) == [w for w in hopping("10:05", "10:25") if expected(w)]
    for window, rows in temps.items():
        assert observed(rows) == expected(window)
    maxima = gold(last, "device_max")
    assert sorted(maxima) == [(at("09:45"), at("10:00")), (at("10:00"), at("10:15"))] or sorted(maxima) == [
        (at("10:00"), at("10:15"))]
    rows = maxima[(at("10:00"), at("10:15"))]
    assert {d: (r["readings"], r["max_temp_c"]) for d, r in rows.items()} == {"d1": (4, 26.0), "d2": (3, 31.0)}


RENAMED = '''
from pyspark.sql import functions as F
from sluice import Output, Pipeline, Stream, checks

orders = Stream(name="orders", fields={"order_no": "long", "shop": "string", "paid": "boolean", "ts": "timestamp"},
                id="order_no", event_time="ts", watermark_delay="1m")

def per_shop(inputs, window):
    o = inputs["orders"]
    return (o.groupBy(window.column("ts"), "shop")
             .agg(F.count("*").alias("orders"), F.sum(F.col("paid").cast("long")).alias("paid")))

pipeline = Pipeline(name="shop_orders", streams=[orders], window="30m", outputs=[
    Output("shop_orders", per_shop, key="shop", checks=[checks.completeness("orders", stream="orders")])])
'''


def test_another_event_time_field_and_numeric_ids(spark: SparkSession, tmp_path: Path) -> None:
    folder = tmp_path / "shop-pipelines"
    folder.mkdir()
    (folder / "shop_orders.py").write_text(textwrap.dedent(RENAMED))
    settings = load_settings({"SLUICE_PIPELINES": str(folder)}, home=tmp_path / "home")
    assert settings.registry.errors == []
    orders = [{"order_no": n, "shop": shop, "paid": n % 2 == 0, "ts": f"2024-05-01T10:{m:02d}:00Z"}
              for n, shop, m in [(1, "s1", 0), (2, "s1", 5), (3, "s2", 10), (4, "s1", 40)]]
    land(settings, "orders", "o1.jsonl", [*orders, orders[0], {"order_no": 5, "shop": "s1", "paid": "yes",
                                                            "ts": "2024-05-01T10:41:00Z"}], at("10:45"))
    done = cycle(spark, settings, "shop_orders", at("12:00"), quality=True)
    gold = {(r["window_start"], r["shop"]): (r["orders"], r["paid"]) for r in table(done, "gold/shop_orders")}
    assert gold == {(at("10:00"), "s1"): (2, 1), (at("10:00"), "s2"): (1, 0), (at("10:30"), "s1"): (1, 1)}
    bronze = [r for r in table(done, "bronze/orders") if not r["is_heartbeat"]]
    assert sorted(r["order_no"] for r in bronze) == [1, 2, 3, 4]  # a long id, deduplicated
    assert {r["reason"] for r in table(done, "quarantine/orders")} == {"bad_type"}  # "yes" is not a boolean
    assert {r.state for r in read_ledger(done, "shop_orders")} == {"validated"}
