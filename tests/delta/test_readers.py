"""Tables as other readers see them: a real cycle's bronze, quarantine, ops and gold tables carry the table
properties sluice promises, use no table feature other readers lack, and a plain delta-spark session (batch and
streaming), Polars and DuckDB read them with the schemas sluice declares and the same rows as delta-rs."""

from __future__ import annotations

import glob
import json
import os
import re
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import duckdb
import duckdb_extension_delta
import polars as pl
import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from sluice.config import Settings
from sluice.ingest.run import run_ingest
from sluice.runtime.context import open_run
from sluice.storage import tables
from sluice.windows.ledger import WINDOW_LEDGER
from support.lake import cycle, land

pytestmark = pytest.mark.spark

T0 = datetime(2024, 5, 1, 10, 0, tzinfo=UTC)


def _duckdb_count(path: Path) -> int:
    [extension] = glob.glob(os.path.dirname(duckdb_extension_delta.__file__) + "/**/*.duckdb_extension",
                            recursive=True)[:1]
    con = duckdb.connect()
    try:
        con.execute(f"LOAD '{extension}'")
        row = con.execute(f"SELECT count(*) FROM delta_scan('{path}')").fetchone()
        assert row is not None
        return int(row[0])
    finally:
        con.close()


def _writers(path: Path) -> set[str]:
    """Who wrote each commit still in the log: delta-spark's ``engineInfo`` or delta-rs's ``clientVersion``."""
    out = set()
    for commit in sorted((path / "_delta_log").glob("*.json")):
        for line in commit.read_text().splitlines():
            info = json.loads(line).get("commitInfo") if line.strip() else None
            if info is not None:
                out.add(info.get("engineInfo") or info.get("clientVersion") or "unknown")
    return out


def test_tables_carry_their_properties_and_read_the_same_in_polars_and_duckdb(
    spark: SparkSession, settings: Settings
) -> None:
    for n in range(0, 55, 5):
        record = {"impression_id": f"i{n}", "ad_id": "a1", "event_time": (T0 + timedelta(minutes=n)).isoformat()}
        land(settings, "impressions", f"i{n:02d}.jsonl", [record, "not json"], T0 + timedelta(minutes=n + 1))
    land(settings, "clicks", "c.jsonl", [{"click_id": "c1", "impression_id": "i0", "ad_id": "a1",
                                          "event_time": (T0 + timedelta(minutes=1)).isoformat()}],
         T0 + timedelta(minutes=51))
    # Ingest takes one Spark batch per file, so that ops/ingest_batches passes its checkpoint interval in one
    # cycle. Only ingest: the aggregate reads bronze with the same setting, and one file per micro-batch there is
    # a dozen stateful batches that tell the readers nothing more.
    now = T0 + timedelta(hours=3)
    one_file_each = replace(settings, max_files_per_trigger=1, now_override=now)
    run_ingest(open_run(one_file_each, spark), ["impressions", "clicks"])
    done = cycle(spark, settings, "ad_clicks_hourly", now, quality=True)

    spec = done.stream("impressions")
    declared = {
        "bronze/impressions": tables.bronze(spec).schema,
        "quarantine/impressions": tables.quarantine(spec).schema,
        "dlq/impressions": tables.dlq(spec).schema,
        "ops/ingest_batches": tables.INGEST_BATCHES.schema,
        "ops/window_ledger": WINDOW_LEDGER.schema,
        "ops/dq_results": tables.DQ_RESULTS.schema,
    }
    names = ["bronze/impressions", "quarantine/impressions", "dlq/impressions", "ops/ingest_batches",
             "ops/window_ledger", "ops/dq_results", "gold/ad_clicks_hourly"]
    for name in names:
        path = done.lake.local() / name
        table = DeltaTable(str(path))
        config = table.metadata().configuration
        assert config == {
            "delta.deletedFileRetentionDuration": f"interval {done.vacuum_retention_hours} hours",
            "delta.logRetentionDuration": "interval 720 hours",
            "delta.checkpointInterval": "10",
        }, name
        rows = table.to_pyarrow_table().num_rows
        assert pl.read_delta(str(path)).height == rows, name
        assert _duckdb_count(path) == rows, name
        assert rows or name == "dlq/impressions", name
        # Nothing that deltalake, DuckDB or Polars could not read: no deletion vectors, no column mapping.
        protocol = table.protocol()
        assert (protocol.min_reader_version, protocol.reader_features or []) in ((1, []), (3, [])), (name, protocol)
        assert not {k for k in config if "deletionVectors" in k or "columnMapping" in k}, name
        # A plain delta-spark session: the schema sluice declares, the same rows, batch and streaming.
        frame = spark.read.format("delta").load(str(path))
        if name in declared:
            assert [(f.name, f.dataType) for f in frame.schema] == [
                (f.name, f.dataType) for f in declared[name].fields], name
        assert frame.count() == rows, name
        query = (spark.readStream.format("delta").load(str(path)).writeStream.format("memory")
                 .queryName(f"read_{name.replace('/', '_')}").trigger(availableNow=True).start())
        query.awaitTermination()
        assert spark.table(f"read_{name.replace('/', '_')}").count() == rows, name
        # One writing engine per table, from its creation on: delta-spark for every table Spark writes, delta-rs
        # for the ops tables the driver writes (SPEC 7).
        writers = _writers(path)
        if name.startswith("ops/"):
            assert writers and all(w.startswith("delta-rs") for w in writers), (name, writers)
        else:
            assert len(writers) == 1 and re.fullmatch(r"Apache-Spark/4\.2\.\d+ Delta-Lake/4\.4\.\d+", *writers), (
                name, writers)

    ops = DeltaTable(str(done.lake.local() / "ops/ingest_batches"))
    assert ops.version() >= 10
    log = done.lake.local("ops", "ingest_batches", "_delta_log")
    assert list(log.glob("*.checkpoint.parquet")), "no checkpoint written"
