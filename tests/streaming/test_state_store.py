"""The state store behind the stateful queries (``state_store``): new queries get the configured one, and a
query keeps the store of its first run, so a home whose queries began on RocksDB goes on with its state after
the default changed to Spark's in-memory (``hdfs``) provider. (The suite's session is built with the default;
a query begun on RocksDB is one begun while the session said so.)"""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from sluice.config import Settings, load_settings
from sluice.runtime.context import open_run
from sluice.runtime.spark import STATE_STORE_PROVIDERS, spark_conf
from sluice.streaming.backfill import run_backfill
from support.lake import cycle, land, table

pytestmark = pytest.mark.spark

DAY = datetime(2024, 5, 1, tzinfo=UTC)
PIPELINE = "ad_clicks_hourly"  # 10-min watermark delays, 30-min join bound
PROVIDER = "spark.sql.streaming.stateStore.providerClass"


def at(hhmm: str) -> datetime:
    hours, minutes = hhmm.split(":")
    return DAY + timedelta(hours=int(hours), minutes=int(minutes))


def imp(i: str, hhmm: str, ad: str) -> dict[str, Any]:
    return {"impression_id": i, "ad_id": ad, "event_time": at(hhmm).isoformat()}


def click(k: str, impression: str, hhmm: str, ad: str) -> dict[str, Any]:
    return {"click_id": k, "impression_id": impression, "ad_id": ad, "event_time": at(hhmm).isoformat()}


def providers(settings: Settings) -> set[str]:
    """The state store each of the pipeline's queries recorded in its last planned micro-batch."""
    out = set()
    for output in ("ad_clicks_hourly", "unmatched_clicks_hourly"):
        offsets = settings.checkpoints / "pipelines" / PIPELINE / output / "offsets"
        last = max(offsets.glob("[0-9]*"), key=lambda p: int(p.name))
        metadata = json.loads(last.read_text().splitlines()[1])
        out.add(metadata["conf"][PROVIDER])
    return out


def gold(settings: Settings) -> list[tuple[Any, ...]]:
    return sorted(tuple(sorted(r.items())) for r in table(settings, f"gold/{PIPELINE}"))


def test_the_setting_picks_the_provider_of_every_session() -> None:
    assert load_settings({}).state_store == "hdfs"
    assert spark_conf(load_settings({}))[PROVIDER] == STATE_STORE_PROVIDERS["hdfs"]
    assert spark_conf(load_settings({"SLUICE_STATE_STORE": "rocksdb"}))[PROVIDER] == STATE_STORE_PROVIDERS["rocksdb"]


def test_a_query_begun_on_rocksdb_keeps_its_state_when_the_default_is_the_in_memory_store(
    spark: SparkSession, tmp_path: Path
) -> None:
    """The first cycle runs as an older sluice (RocksDB) ran it; the next ones on this session's default."""
    assert spark.conf.get(PROVIDER) == STATE_STORE_PROVIDERS["hdfs"]
    settings = replace(load_settings({}, home=tmp_path / "home"), catchup_min_windows=0, batch_close_rows=0)
    # W = 06:35: [05:00, 06:00) closes; i3 and its click k2 (06:48) stay in the queries' state.
    land(settings, "impressions", "i1.jsonl", [imp("i1", "05:10", "a1"), imp("i3", "06:45", "a2")], at("06:50"))
    land(settings, "clicks", "c1.jsonl", [click("k1", "i1", "05:20", "a1"), click("k2", "i3", "06:48", "a2")],
         at("06:50"))
    spark.conf.set(PROVIDER, STATE_STORE_PROVIDERS["rocksdb"])
    try:
        first = cycle(spark, settings, PIPELINE, at("06:55"))
    finally:
        spark.conf.set(PROVIDER, STATE_STORE_PROVIDERS["hdfs"])
    assert providers(first) == {STATE_STORE_PROVIDERS["rocksdb"]}

    # Under the default now: W = 07:35 closes [06:00, 07:00) from the state the first run kept.
    land(first, "impressions", "i2.jsonl", [imp("i5", "07:45", "a1")], at("07:50"))
    land(first, "clicks", "c2.jsonl", [click("k5", "i5", "07:45", "a1")], at("07:50"))
    second = cycle(spark, first, PIPELINE, at("07:55"))
    assert providers(second) == {STATE_STORE_PROVIDERS["rocksdb"]}
    rows = {(r["window_start"], r["ad_id"]): (r["impressions"], r["clicks"]) for r in table(second, f"gold/{PIPELINE}")}
    assert rows == {(at("05:00"), "a1"): (1, 1), (at("06:00"), "a2"): (1, 1)}
    before = gold(second)
    run_backfill(open_run(second, spark), PIPELINE, at("05:00"), at("07:00"), deliver_alerts=False)
    assert gold(second) == before

