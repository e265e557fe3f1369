"""The engine contract, on real Spark with delta-spark and real Delta tables: idempotent appends, crash safety
(real child processes killed with SIGKILL mid-write and right after a commit), atomic partition replace,
partition pruning, streaming reads, interop with deltalake and DuckDB's delta reader, empty tables, one writing
engine per table, and the driver-side writes of the ops tables (delta-rs)."""

from __future__ import annotations

import datetime as dt
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import duckdb
import duckdb_extension_delta
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    DateType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from sluice.config import Settings
from sluice.storage import tables
from sluice.storage.engine import DeltaEngine
from sluice.storage.spark_engine import SparkDeltaEngine
from support.lake import read_rows

pytestmark = pytest.mark.spark

UTC = dt.UTC
D1 = dt.date(2024, 5, 1)
D2 = dt.date(2024, 5, 2)
PARTS = ("event_date", "event_hour")
SCHEMA = StructType(
    [
        StructField("id", LongType(), True),
        StructField("name", StringType(), True),
        StructField("event_time", TimestampType(), True),
        StructField("event_date", DateType(), True),
        StructField("event_hour", IntegerType(), True),
    ]
)


# -- helpers ------------------------------------------------------------------------------------------
def _row(i: int, hour: int | None, day: dt.date = D1) -> tuple[Any, ...]:
    ts = dt.datetime(day.year, day.month, day.day, hour or 0, i % 60, i % 60, 1000 * i, tzinfo=UTC)
    return (i, f"n{i}" if i % 4 else None, ts, day, hour)


def _dicts(rows: Iterable[tuple[Any, ...]], schema: StructType = SCHEMA) -> list[dict[str, Any]]:
    return _sorted(dict(zip(schema.names, row, strict=True)) for row in rows)


def _norm(value: Any) -> Any:
    # Aware timestamps are compared as UTC instants; a naive one keeps no tzinfo and so never matches.
    if isinstance(value, dt.datetime) and value.tzinfo is not None:
        return value.astimezone(UTC)
    return value


def _sorted(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    normed = [{k: _norm(v) for k, v in r.items()} for r in records]
    return sorted(normed, key=lambda r: repr(sorted(r.items())))


def _spark_rows(df: DataFrame) -> list[dict[str, Any]]:
    return _sorted(df.toArrow().to_pylist())


def _delta_rows(path: Path) -> list[dict[str, Any]]:
    return _sorted(read_rows(path))


def _duckdb_extension() -> str:
    found = glob.glob(
        os.path.dirname(duckdb_extension_delta.__file__) + "/**/*.duckdb_extension", recursive=True
    )
    assert found, "duckdb_extension_delta ships no .duckdb_extension file"
    return found[0]


def _duckdb_rows(path: Path) -> list[dict[str, Any]]:
    con = duckdb.connect()
    try:
        con.execute(f"LOAD '{_duckdb_extension()}'")
        return _sorted(con.execute(f"SELECT * FROM delta_scan('{path}')").to_arrow_table().to_pylist())
    finally:
        con.close()


def _version(path: Path) -> int:
    return DeltaTable(str(path)).version()


def _log(path: Path, version: int) -> list[dict[str, Any]]:
    text = (Path(path) / "_delta_log" / f"{version:020d}.json").read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _actions(path: Path, version: int, kind: str) -> list[dict[str, Any]]:
    return [entry[kind] for entry in _log(path, version) if kind in entry]


def _live_files(path: Path) -> set[str]:
    """Absolute paths of the data files the current snapshot references."""
    out = set()
    for uri in DeltaTable(str(path)).file_uris():
        out.add(str(Path(uri.removeprefix("file://"))))
    return out


def _parquet_on_disk(path: Path) -> set[str]:
    return {str(p) for p in Path(path).rglob("*.parquet") if "_delta_log" not in p.parts}


@pytest.fixture
def engine(spark: SparkSession) -> DeltaEngine:
    """The engine behind the seam: delta-spark for the tables Spark writes, delta-rs for ``ops/*``."""
    return SparkDeltaEngine(spark)


@pytest.fixture
def events(engine: DeltaEngine, tmp_path: Path) -> Path:
    path = tmp_path / "events"
    engine.ensure_table(path, SCHEMA, PARTS)
    return path


def _df(spark: SparkSession, rows: list[tuple[Any, ...]], schema: StructType = SCHEMA) -> DataFrame:
    return spark.createDataFrame(rows, schema)


# -- 1. append + idempotent retry -------------------------------------------------------------------
def test_append_is_idempotent_per_app_transaction(
    spark: SparkSession, engine: DeltaEngine, events: Path
) -> None:
    first = [_row(1, 10), _row(2, 11), _row(3, 11, D2)]
    second = [_row(4, 12), _row(5, 10)]
    start = _version(events)
    assert engine.committed_version(events, "ingest") is None

    meta = {"batch": 7, "stream": "clicks", "counts": {"accepted": 3, "late": 0}}
    assert engine.append(_df(spark, first), events, app_id="ingest", version=7, metadata=meta) is True
    assert _version(events) == start + 1
    assert engine.committed_version(events, "ingest") == 7
    assert engine.history_metadata(events) == [meta]
    txns = _actions(events, start + 1, "txn")
    assert [(t["appId"], t["version"]) for t in txns] == [("ingest", 7)]
    assert _delta_rows(events) == _dicts(first)

    # A retried batch (same version, even with different rows) and an older one commit nothing.
    for retry in (7, 3):
        assert engine.append(_df(spark, second), events, app_id="ingest", version=retry) is False
        assert _version(events) == start + 1
        assert engine.committed_version(events, "ingest") == 7
        assert _delta_rows(events) == _dicts(first)

    # Another writer's transactions are tracked separately.
    assert engine.append(_df(spark, [_row(9, 13)]), events, app_id="backfill", version=1) is True
    assert _version(events) == start + 2
    assert engine.committed_version(events, "backfill") == 1
    assert engine.committed_version(events, "ingest") == 7

    assert (
        engine.append(_df(spark, second), events, app_id="ingest", version=8, metadata={"batch": 8}) is True
    )
    assert _version(events) == start + 3
    assert engine.committed_version(events, "ingest") == 8
    assert engine.history_metadata(events, limit=3) == [{"batch": 8}, {}, meta]
    assert _delta_rows(events) == _dicts([*first, _row(9, 13), *second])
    assert _spark_rows(engine.read(events)) == _dicts([*first, _row(9, 13), *second])


def _commit_shape(path: Path, version: int) -> dict[str, Any]:
    """What one commit holds, without what differs between any two commits (file names, times, sizes)."""
    (info,) = _actions(path, version, "commitInfo")
    return {
        "commitInfo": {k: info.get(k) for k in ("operation", "operationParameters", "userMetadata",
                                                  "isBlindAppend", "engineInfo", "isolationLevel", "readVersion")},
        "txn": [(t["appId"], t["version"]) for t in _actions(path, version, "txn")],
        "add": sorted((json.dumps(a["partitionValues"], sort_keys=True), a["dataChange"],
                       json.loads(a["stats"])["numRecords"]) for a in _actions(path, version, "add")),
        "remove": sorted((json.dumps(r["partitionValues"], sort_keys=True), r["dataChange"])
                         for r in _actions(path, version, "remove")),
        "kinds": sorted({k for entry in _log(path, version) for k in entry}),
    }


def test_commits_are_those_of_delta_sparks_idempotent_writer_options(
    spark: SparkSession, engine: DeltaEngine, tmp_path: Path
) -> None:
    """The engine runs delta-spark's own write command one step at a time (the app transaction is looked up by
    delta-rs): each of its commits, an append and a replaceWhere overwrite, holds what
    ``df.write.option("txnAppId", ...).option("txnVersion", ...)`` commits, and the rows are the same."""
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    for path in (ours, theirs):
        engine.ensure_table(path, SCHEMA, PARTS)
    batches = [[_row(1, 10), _row(2, 11), _row(3, 11, D2)], [_row(4, 11), _row(5, 12)]]
    meta = {"batch": 1, "stream": "events"}

    def options(version: int, meta: dict[str, Any]) -> Any:
        return (_df(spark, batches[version - 1]).write.format("delta").option("txnAppId", "ingest")
                .option("txnVersion", str(version)).option("userMetadata", json.dumps(meta, sort_keys=True)))

    for version in (1, 2):
        assert engine.append(_df(spark, batches[version - 1]), ours, app_id="ingest", version=version,
                             metadata={**meta, "batch": version})
        options(version, {**meta, "batch": version}).mode("append").save(str(theirs))
    hour_11 = "(`event_date` = '2024-05-01' AND `event_hour` = '11')"
    replacement = [_row(6, 11), _row(7, 11)]
    assert engine.replace(_df(spark, replacement), ours, keep=lambda df: df.filter(F.col("id") == 2),
                          files=lambda v: v["event_date"] == D1 and v["event_hour"] == 11, app_id="backfill",
                          version=1, metadata={"op": "backfill"})
    kept = spark.read.format("delta").load(str(theirs)).where(hour_11).filter(F.col("id") == 2)
    (kept.unionByName(_df(spark, replacement)).localCheckpoint().write.format("delta")
     .option("txnAppId", "backfill").option("txnVersion", "1").option("userMetadata", '{"op": "backfill"}')
     .mode("overwrite").option("replaceWhere", hour_11).save(str(theirs)))

    assert _version(ours) == _version(theirs) == 3
    for version in (1, 2, 3):
        assert _commit_shape(ours, version) == _commit_shape(theirs, version), version
    assert _commit_shape(ours, 3)["commitInfo"]["operationParameters"]["predicate"]  # the replaceWhere
    assert _delta_rows(ours) == _delta_rows(theirs) == _dicts([_row(1, 10), _row(2, 11), _row(3, 11, D2),
                                                               _row(5, 12), *replacement])


def test_a_commit_of_the_same_app_id_after_the_read_version_fails_the_append(
    spark: SparkSession, engine: DeltaEngine, events: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Delta's conflict check still guards the app transaction: another writer commits the same (app id,
    version) after this append's transaction read the table and before it commits (here: while the engine
    looks the version up), and the append fails instead of committing the batch a second time."""
    from delta.exceptions import ConcurrentTransactionException

    from sluice.storage import snapshots

    looked_up = snapshots.app_version

    def racing_lookup(path: str, app_id: str, at: int | None = None) -> int | None:
        answer = looked_up(path, app_id, at)  # what the table held at the transaction's read version: nothing
        monkeypatch.setattr(snapshots, "app_version", looked_up)  # the other writer appends normally
        assert engine.append(_df(spark, [_row(2, 11)]), events, app_id="ingest", version=1)
        return answer

    monkeypatch.setattr(snapshots, "app_version", racing_lookup)
    with pytest.raises(ConcurrentTransactionException):
        engine.append(_df(spark, [_row(1, 10)]), events, app_id="ingest", version=1)
    assert engine.committed_version(events, "ingest") == 1
    assert _delta_rows(events) == _dicts([_row(2, 11)])


# -- 2. crashes -------------------------------------------------------------------------------------
_CHILD = textwrap.dedent(
    """
    import datetime
    import json
    import os
    import signal
    import sys
    from pathlib import Path

    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    from sluice.config import load_settings
    from sluice.storage.spark_engine import SparkDeltaEngine
    from sluice.runtime.spark import get_spark

    home, table, mode, out, app_id, version = sys.argv[1:7]
    spark = get_spark(load_settings({{}}, home=Path(home)), master="local[1]")
    engine = SparkDeltaEngine(spark)
    schema = StructType.fromJson(json.loads({schema!r}))
    if mode == "big":
        # Millions of rows over a day of hourly partitions: seconds of writing files before the commit, in
        # which the parent kills this process.
        event_time = F.timestamp_seconds(F.lit(1714521600) + F.col("id") % 86400)
        df = spark.range(0, 6_000_000, numPartitions=4).select(
            F.col("id"), F.lit("big").alias("name"), event_time.alias("event_time"),
            F.to_date(event_time).alias("event_date"), F.hour(event_time).alias("event_hour"))
    else:
        df = spark.createDataFrame({rows!r}, schema)
    committed = engine.append(df, Path(table), app_id=app_id, version=int(version), metadata={{"child": True}})
    Path(out).write_text(json.dumps({{"survived": committed}}))
    """
)


def _run_child(
    tmp_path: Path,
    table: Path,
    mode: str,
    rows: list[tuple[Any, ...]],
    *,
    app_id: str,
    version: int,
    env: dict[str, str] | None = None,
    kill_when: Callable[[], bool] | None = None,
) -> tuple[int, Path, str]:
    script = tmp_path / f"child_{mode}.py"
    script.write_text(_CHILD.format(rows=rows, schema=SCHEMA.json()))
    out = tmp_path / f"child_{mode}.json"
    log_file = tmp_path / f"child_{mode}.log"
    child_env = {
        k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK_GATEWAY", "SLUICE_KILL_AFTER"))
    }
    child_env.update(env or {})
    args = [str(tmp_path / "child-home"), str(table), mode, str(out), app_id, str(version)]
    with log_file.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, str(script), *args], stdout=log, stderr=subprocess.STDOUT, env=child_env
        )
        try:
            if kill_when is not None:
                deadline = time.monotonic() + 180
                while proc.poll() is None and not kill_when() and time.monotonic() < deadline:
                    time.sleep(0.02)
                if proc.poll() is None:
                    proc.send_signal(signal.SIGKILL)
            code = proc.wait(timeout=180)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise
    return code, out, log_file.read_text(errors="replace")[-3000:]


@pytest.mark.slow
def test_crash_while_writing_files_leaves_them_invisible(
    spark: SparkSession,
    engine: DeltaEngine,
    settings: Settings,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A writer SIGKILLed after its first data files reached the table, before its commit: no reader sees
    them, and the restarted writer commits its batch exactly once."""
    monkeypatch.delenv("SLUICE_KILL_AFTER_COMMIT", raising=False)
    table = settings.lake.local() / "bronze" / "events"
    engine.ensure_table(table, SCHEMA, PARTS)
    committed = [_row(1, 10), _row(2, 11)]
    assert engine.append(_df(spark, committed), table, app_id="ingest", version=1) is True
    before, live_before = _version(table), _parquet_on_disk(table)

    def writing() -> bool:
        return bool(_parquet_on_disk(table) - live_before)

    code, out, log = _run_child(tmp_path, table, "big", [], app_id="ingest", version=2, kill_when=writing)
    assert code == -signal.SIGKILL, log
    assert not out.exists(), "the child finished its append before it was killed"
    assert _version(table) == before, "the child committed before the kill: the test proves nothing"
    orphans = _parquet_on_disk(table) - live_before
    assert orphans, "the child wrote no data file before it was killed"
    assert not orphans & _live_files(table)

    expected = _dicts(committed)
    assert engine.committed_version(table, "ingest") == 1
    assert _delta_rows(table) == expected
    assert _spark_rows(engine.read(table)) == expected
    assert _duckdb_rows(table) == expected

    # The restarted writer's batch commits exactly once.
    retried = [_row(10, 11), _row(11, 12), _row(12, 13, D2)]
    assert engine.append(_df(spark, retried), table, app_id="ingest", version=2) is True
    assert engine.append(_df(spark, retried), table, app_id="ingest", version=2) is False
    assert _version(table) == before + 1
    assert engine.committed_version(table, "ingest") == 2
    expected = _dicts([*committed, *retried])
    assert _delta_rows(table) == expected
    assert _spark_rows(engine.read(table)) == expected
    assert _duckdb_rows(table) == expected


@pytest.mark.slow
def test_crash_right_after_commit_keeps_the_commit_once(
    spark: SparkSession,
    engine: DeltaEngine,
    settings: Settings,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("SLUICE_KILL_AFTER_COMMIT", raising=False)
    table = settings.lake.local() / "bronze" / "events"
    engine.ensure_table(table, SCHEMA, PARTS)
    committed = [_row(1, 10)]
    assert engine.append(_df(spark, committed), table, app_id="ingest", version=1) is True
    before = _version(table)

    batch = [_row(20, 11), _row(21, 12, D2)]
    code, out, log = _run_child(
        tmp_path,
        table,
        "append",
        batch,
        app_id="ingest",
        version=2,
        env={"SLUICE_KILL_AFTER_COMMIT": "bronze/events:1"},
    )
    assert code == -signal.SIGKILL, log
    assert not out.exists(), "the child survived its commit: the kill hook did not fire"

    assert _version(table) == before + 1
    assert engine.committed_version(table, "ingest") == 2
    assert engine.history_metadata(table) == [{"child": True}]
    expected = _dicts([*committed, *batch])
    assert _delta_rows(table) == expected
    assert _spark_rows(engine.read(table)) == expected

    # The restarted writer re-runs the batch: a no-op.
    assert engine.append(_df(spark, batch), table, app_id="ingest", version=2) is False
    assert _version(table) == before + 1
    assert _delta_rows(table) == expected


# -- 3. replace -------------------------------------------------------------------------------------
def _click(i: int, hour: int, day: dt.date = D1, batch: int = 1) -> tuple[Any, ...]:
    ts = dt.datetime(day.year, day.month, day.day, hour, i % 60, tzinfo=UTC)
    return (
        f"c{i}",
        f"i{i}",
        f"a{i % 3}",
        None if i % 5 == 0 else f"u{i}",
        ts,
        ts + dt.timedelta(minutes=2),
        f"landing/clicks/{batch}.jsonl",
        batch,
        False,
        day,
        hour,
    )


def _partition(rows: list[dict[str, Any]], day: dt.date, hour: int) -> list[dict[str, Any]]:
    return [r for r in rows if (r["event_date"], r["event_hour"]) == (day, hour)]


def _outside(rows: list[dict[str, Any]], day: dt.date, hour: int) -> list[dict[str, Any]]:
    return [r for r in rows if (r["event_date"], r["event_hour"]) != (day, hour)]


@pytest.fixture
def clicks(spark: SparkSession, engine: DeltaEngine, settings: Settings) -> tuple[Path, StructType]:
    table = tables.bronze(settings.stream("clicks"))
    path = table.path(settings)
    engine.ensure_table(path, table.schema, table.partition_by)
    first = [_click(i, h) for i, h in [(1, 10), (2, 10), (3, 11), (4, 11), (5, 12)]] + [_click(6, 11, D2)]
    second = [_click(7, 11, batch=2), _click(8, 10, batch=2), _click(9, 11, D2, batch=2)]
    assert engine.append(_df(spark, first, table.schema), path, app_id="ingest", version=1)
    assert engine.append(_df(spark, second, table.schema), path, app_id="ingest", version=2)
    return path, table.schema


def test_replace_swaps_chosen_partitions_in_one_commit(
    spark: SparkSession, engine: DeltaEngine, clicks: tuple[Path, StructType]
) -> None:
    path, schema = clicks
    before_rows = _delta_rows(path)
    before_version = _version(path)
    adds = pa.table(DeltaTable(str(path)).get_add_actions(flatten=False)).to_pylist()
    victims = {a["path"] for a in adds if a["partition"] == {"event_date": D1, "event_hour": 11}}
    assert len(victims) >= 2  # both appends wrote into that partition

    seen: list[dict[str, Any]] = []

    def chosen(values: dict[str, Any]) -> bool:
        seen.append(dict(values))
        return values["event_date"] == D1 and values["event_hour"] == 11

    fresh = [_click(30, 11, batch=9), _click(31, 11, batch=9)]
    meta = {"op": "dedup", "hour": "2024-05-01T11"}
    assert engine.replace(
        _df(spark, fresh, schema),
        path,
        keep=lambda df: df.filter(F.lit(False)),
        files=chosen,
        app_id="compact",
        version=1,
        metadata=meta,
    )
    # The predicate is offered every partition that holds files, with typed values (per file or per
    # partition: that is the engine's business).
    assert {tuple(sorted(v.items())) for v in seen} == {tuple(sorted(a["partition"].items())) for a in adds}

    # Exactly one new Delta version holding the removes, the adds and the app transaction.
    assert _version(path) == before_version + 1
    removes = _actions(path, before_version + 1, "remove")
    assert {r["path"] for r in removes} == victims
    assert all(r["dataChange"] is True for r in removes)
    new_adds = _actions(path, before_version + 1, "add")
    assert new_adds
    assert all(a["partitionValues"] == {"event_date": "2024-05-01", "event_hour": "11"} for a in new_adds)
    assert [(t["appId"], t["version"]) for t in _actions(path, before_version + 1, "txn")] == [("compact", 1)]
    assert engine.committed_version(path, "compact") == 1
    assert engine.committed_version(path, "ingest") == 2
    assert engine.history_metadata(path) == [meta]

    after = _delta_rows(path)
    assert _outside(after, D1, 11) == _outside(before_rows, D1, 11)
    assert _partition(after, D1, 11) == _dicts(fresh, schema)
    assert _spark_rows(engine.read(path)) == after

    # The previous snapshot is intact (time travel): the replace is one atomic step.
    old = read_rows(path, before_version)
    assert _sorted(old) == before_rows

    # Re-running (or running an older) version of the replace is a no-op.
    for retry in (1, 0):
        assert not engine.replace(
            _df(spark, [_click(40, 11)], schema),
            path,
            keep=lambda df: df,
            files=chosen,
            app_id="compact",
            version=retry,
        )
        assert _version(path) == before_version + 1
        assert _delta_rows(path) == after


def test_replace_keep_retains_part_of_a_replaced_partition(
    spark: SparkSession, engine: DeltaEngine, clicks: tuple[Path, StructType]
) -> None:
    path, schema = clicks
    before_rows = _delta_rows(path)
    before_version = _version(path)

    fresh = [_click(50, 10, batch=5)]
    assert engine.replace(
        _df(spark, fresh, schema),
        path,
        keep=lambda df: df.filter(F.col("click_id") != "c2"),
        files=lambda v: v["event_date"] == D1 and v["event_hour"] == 10,
        app_id="compact",
        version=3,
    )
    assert _version(path) == before_version + 1
    after = _delta_rows(path)
    assert _outside(after, D1, 10) == _outside(before_rows, D1, 10)
    kept = [r for r in _partition(before_rows, D1, 10) if r["click_id"] != "c2"]
    assert {r["click_id"] for r in kept} == {"c1", "c8"}
    assert _partition(after, D1, 10) == _sorted([*kept, *_dicts(fresh, schema)])
    assert _spark_rows(engine.read(path)) == after
    assert _duckdb_rows(path) == after


# -- 4. partition pruning ---------------------------------------------------------------------------
def test_read_prunes_partitions_with_typed_values(
    spark: SparkSession, engine: DeltaEngine, events: Path
) -> None:
    rows = [_row(1, 10), _row(2, 11), _row(3, 11), _row(4, 12), _row(5, 11, D2), _row(6, 10, D2)]
    assert engine.append(_df(spark, rows), events, app_id="ingest", version=1)

    seen: list[dict[str, Any]] = []

    def hour_11(values: dict[str, Any]) -> bool:
        seen.append(dict(values))
        return values["event_hour"] == 11

    df = engine.read(events, files=hour_11)
    assert _spark_rows(df) == _dicts([r for r in rows if r[4] == 11])
    assert len(seen) == len(DeltaTable(str(events)).file_uris())  # asked once per file
    assert {(v["event_date"], v["event_hour"]) for v in seen} == {(r[3], r[4]) for r in rows}
    for values in seen:
        assert type(values["event_date"]) is dt.date
        assert type(values["event_hour"]) is int
    # Pruned at the file level, not filtered after a full scan.
    files = df.inputFiles()
    assert files
    assert all("/event_hour=11/" in f for f in files)

    nothing = engine.read(events, files=lambda v: False)
    assert nothing.count() == 0
    assert nothing.schema.names == SCHEMA.names

    by_date = engine.read(events, files=lambda v: v["event_date"] == D2)
    assert _spark_rows(by_date) == _dicts([r for r in rows if r[3] == D2])


# -- 5. interop -------------------------------------------------------------------------------------
def test_engine_written_table_reads_identically_everywhere(
    spark: SparkSession, engine: DeltaEngine, events: Path
) -> None:
    epoch_edge = (7, "edge", dt.datetime(1969, 12, 31, 23, 59, 59, 500000, tzinfo=UTC), D2, 11)
    batches = [
        [_row(1, 10), _row(2, 11), _row(3, None)],
        [_row(4, 11, D2), epoch_edge, (8, None, None, None, 12)],
        [_row(5, 12), _row(6, 11)],
    ]
    for n, batch in enumerate(batches, start=1):
        assert engine.append(_df(spark, batch), events, app_id="ingest", version=n)
    all_rows = [r for batch in batches for r in batch]

    replacement = [_row(40, 11), _row(41, 11)]
    assert engine.replace(
        _df(spark, replacement),
        events,
        keep=lambda df: df.filter(F.col("id") != 2),
        files=lambda v: v["event_date"] == D1 and v["event_hour"] == 11,
        app_id="fixup",
        version=1,
    )
    expected = _dicts([r for r in all_rows if r[0] != 2] + replacement)
    assert len(expected) == len(all_rows) + 1

    via_deltalake = _delta_rows(events)
    assert via_deltalake == expected
    assert _duckdb_rows(events) == expected
    assert _spark_rows(engine.read(events)) == expected
    # Same instants, explicitly: microseconds since the epoch as Spark computes them in the JVM.
    epoch = dt.datetime(1970, 1, 1, tzinfo=UTC)
    micros = sorted(
        (
            r["id"],
            None if r["event_time"] is None else (r["event_time"] - epoch) // dt.timedelta(microseconds=1),
        )
        for r in via_deltalake
    )
    spark_micros = engine.read(events).select("id", F.unix_micros("event_time").alias("us")).collect()
    assert micros == sorted((r["id"], r["us"]) for r in spark_micros)
    assert DeltaTable(str(events)).schema().to_arrow().field("event_time").type == pa.timestamp("us", "UTC")


def _dl_table(ids: list[int], regions: list[str | None]) -> pa.Table:
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "region": pa.array(regions, pa.string()),
            "bucket": pa.array([i % 3 for i in ids], pa.int32()),
            "ts": pa.array(
                [dt.datetime(2024, 5, 1, i % 24, i % 60, 7, 123, tzinfo=UTC) for i in ids],
                pa.timestamp("us", tz="UTC"),
            ),
        }
    )


_ESCAPED_SCHEMA = StructType(
    [
        StructField("id", LongType()),
        StructField("region", StringType()),
        StructField("bucket", IntegerType()),
        StructField("ts", TimestampType()),
    ]
)


@pytest.mark.parametrize(("writer", "partition"),
                         [("deltalake", "region"), ("deltalake", "bucket"), ("delta-spark", "region")])
def test_engine_reads_and_appends_to_tables_other_writers_made(
    spark: SparkSession, engine: DeltaEngine, tmp_path: Path, writer: str, partition: str
) -> None:
    """A team's own Delta table (written by deltalake, or by a plain delta-spark job) reads and takes appends."""
    path = tmp_path / f"by_{partition}"
    first = _dl_table([1, 2, 3, 4], ["eu", "us", "eu", None])
    second = _dl_table([5, 6], ["apac", "us"])
    for mode, data in (("append", first), ("append", second)):
        if writer == "deltalake":
            write_deltalake(str(path), data, mode=mode, partition_by=[partition])
        else:
            frame = spark.createDataFrame(data.to_pylist(), _ESCAPED_SCHEMA)
            frame.write.format("delta").mode(mode).partitionBy(partition).save(str(path))
    expected = _sorted([*first.to_pylist(), *second.to_pylist()])

    df = engine.read(path)
    assert df.schema.names == ["id", "region", "bucket", "ts"]
    assert isinstance(df.schema["ts"].dataType, TimestampType)
    assert _spark_rows(df) == expected

    pruned = engine.read(path, files=lambda v: v[partition] == first.column(partition)[0].as_py())
    assert _spark_rows(pruned) == [r for r in expected if r[partition] == first.column(partition)[0].as_py()]

    extra = _dl_table([7, 8], ["eu", "latam"])
    more = spark.createDataFrame(extra.to_pylist(), engine.schema(path))
    assert engine.append(more, path, app_id="spark", version=1) is True
    assert engine.append(more, path, app_id="spark", version=1) is False
    expected = _sorted([*expected, *extra.to_pylist()])
    assert _delta_rows(path) == expected
    assert _spark_rows(engine.read(path)) == expected
    assert _duckdb_rows(path) == expected


@pytest.mark.parametrize("writer", ["engine", "deltalake"])
def test_read_partition_values_that_need_escaping(
    spark: SparkSession, engine: DeltaEngine, tmp_path: Path, writer: str
) -> None:
    path = tmp_path / "escaped"
    table = _dl_table([1, 2, 3, 4], ["a b", "c:d", "x/y", "plain"])
    if writer == "deltalake":
        write_deltalake(str(path), table, partition_by=["region"])
    else:
        engine.ensure_table(path, _ESCAPED_SCHEMA, ["region"])
        df = spark.createDataFrame(table.to_pylist(), _ESCAPED_SCHEMA)
        assert engine.append(df, path, app_id="w", version=1)
    expected = _sorted(table.to_pylist())
    assert _delta_rows(path) == expected  # delta-rs itself handles the escaping
    assert _spark_rows(engine.read(path)) == expected


def test_replace_partition_values_that_need_escaping(
    spark: SparkSession, engine: DeltaEngine, tmp_path: Path
) -> None:
    path = tmp_path / "escaped"
    table = _dl_table([1, 2, 3], ["c:d", "c:d", "plain"])
    engine.ensure_table(path, _ESCAPED_SCHEMA, ["region"])
    assert engine.append(
        spark.createDataFrame(table.to_pylist(), _ESCAPED_SCHEMA), path, app_id="w", version=1
    )
    fresh = _dl_table([9], ["c:d"])
    assert engine.replace(
        spark.createDataFrame(fresh.to_pylist(), _ESCAPED_SCHEMA),
        path,
        keep=lambda df: df.filter(F.col("id") != 1),
        files=lambda v: v["region"] == "c:d",
        app_id="fix",
        version=1,
    )
    expected = _sorted([r for r in table.to_pylist() if r["id"] != 1] + fresh.to_pylist())
    assert _delta_rows(path) == expected
    assert _spark_rows(engine.read(path)) == expected


# -- 6. streaming reads ----------------------------------------------------------------------------
def _drain(engine: DeltaEngine, path: Path, sink: Path, **options: Any) -> list[dict[str, Any]]:
    """Run a restartable ``availableNow`` query from ``path`` into a Parquet sink (exactly-once through its
    metadata log) and return every row the sink holds so far."""
    query = (engine.read_stream(path, **options).writeStream.format("parquet")
             .option("path", str(sink)).option("checkpointLocation", str(sink) + "-checkpoint")
             .trigger(availableNow=True).start())
    query.awaitTermination()
    return _spark_rows(engine.spark.read.schema(SCHEMA).parquet(str(sink)))


def test_read_stream_is_exactly_once_across_restarts_and_skips_compaction(
    spark: SparkSession, engine: DeltaEngine, events: Path, tmp_path: Path
) -> None:
    """Pipelines stream bronze with Delta's own source: each commit's rows once, across restarts of the query;
    a compaction (dataChange=false) re-emits nothing; a commit made between runs is picked up."""
    sink = tmp_path / "sink"
    first = [[_row(1, 10)], [_row(2, 11), _row(3, 11, D2)]]
    for version, rows in enumerate(first, 1):
        engine.append(_df(spark, rows), events, app_id="ingest", version=version)
    assert _drain(engine, events, sink) == _dicts([r for rows in first for r in rows])
    assert _drain(engine, events, sink) == _dicts([r for rows in first for r in rows])  # restarted: nothing new

    engine.append(_df(spark, [_row(4, 10)]), events, app_id="ingest", version=3)
    assert engine.compact(events) >= 2
    assert _drain(engine, events, sink) == _dicts([*first[0], *first[1], _row(4, 10)])


def test_read_stream_skips_the_partitions_before_min_event_time(
    spark: SparkSession, engine: DeltaEngine, events: Path, tmp_path: Path
) -> None:
    rows = [_row(1, 10), _row(2, 23), _row(3, 0, D2), _row(4, 5, D2)]
    engine.append(_df(spark, rows), events, app_id="ingest", version=1)
    since = dt.datetime(2024, 5, 2, 0, 30, tzinfo=UTC)
    # Whole event days before the one ``since`` falls in are skipped; rows are the caller's to filter.
    assert _drain(engine, events, tmp_path / "sink", min_event_time=since) == _dicts(rows[2:])


# -- 7. empty tables --------------------------------------------------------------------------------
def test_empty_table_reads_as_empty_frame_with_table_schema(
    engine: DeltaEngine, settings: Settings
) -> None:
    table = tables.bronze(settings.stream("clicks"))
    path = table.path(settings)
    engine.ensure_table(path, table.schema, table.partition_by)
    engine.ensure_table(path, table.schema, table.partition_by)  # idempotent
    assert _version(path) == 0

    df = engine.read(path)
    assert df.count() == 0
    assert df.collect() == []
    assert df.schema == table.schema
    assert engine.schema(path) == table.schema
    timestamps = [f.name for f in df.schema.fields if isinstance(f.dataType, TimestampType)]
    assert timestamps == ["event_time", "arrival_time"]
    assert not any(isinstance(f.dataType, TimestampNTZType) for f in df.schema.fields)
    assert DeltaTable(str(path)).metadata().partition_columns == list(table.partition_by)
    assert engine.read(path, files=lambda v: True).count() == 0


def test_a_table_an_older_sluice_created_gains_the_columns_added_since_and_keeps_its_rows(
    spark: SparkSession, engine: DeltaEngine, settings: Settings
) -> None:
    table = tables.bronze(settings.stream("clicks"))
    path = table.path(settings)
    older = StructType([f for f in table.schema.fields if f.name != "is_heartbeat"])
    engine.ensure_table(path, older, table.partition_by)
    row = _click(1, 10)
    kept = tuple(v for f, v in zip(table.schema.fields, row, strict=True) if f.name != "is_heartbeat")
    assert engine.append(spark.createDataFrame([kept], older), path, app_id="ingest", version=1)

    engine.ensure_table(path, table.schema, table.partition_by)
    assert _version(path) == 2  # one metadata-only commit
    assert engine.schema(path).names == [*older.names, "is_heartbeat"]
    (read,) = engine.read(path).collect()
    assert read["click_id"] == row[table.schema.names.index("click_id")] and read["is_heartbeat"] is None
    engine.ensure_table(path, table.schema, table.partition_by)
    assert _version(path) == 2  # nothing left to add: no commit


# -- driver-side writes of small tables (ops rows, heartbeats, ledger, DQ results) -----------------------
def test_append_rows_lands_in_the_same_layout_spark_writes(
    spark: SparkSession, engine: DeltaEngine, events: Path
) -> None:
    spark_rows = [_row(1, 10), _row(2, 11, D2)]
    driver_rows = [_row(3, 10), _row(4, None), _row(5, 7, D2)]
    assert engine.append(_df(spark, spark_rows), events, app_id="a", version=0)
    assert engine.append_rows(driver_rows, SCHEMA, events, app_id="a", version=1, metadata={"k": "v"})
    # A retry of the same version is a no-op, like append.
    assert not engine.append_rows(driver_rows, SCHEMA, events, app_id="a", version=1)

    expected = _dicts(spark_rows + driver_rows)
    assert _delta_rows(events) == expected
    assert _spark_rows(engine.read(events)) == expected
    assert _duckdb_rows(events) == expected
    # Hive-style partition directories, the null hour in Spark's sentinel directory, pruning works.
    adds = _actions(events, _version(events), "add")
    assert sorted(a["path"].rsplit("/", 1)[0] for a in adds) == [
        "event_date=2024-05-01/event_hour=10",
        "event_date=2024-05-01/event_hour=__HIVE_DEFAULT_PARTITION__",
        "event_date=2024-05-02/event_hour=7",
    ]
    assert all(json.loads(a["stats"])["numRecords"] == 1 for a in adds)
    assert engine.history_metadata(events)[0] == {"k": "v"}
    pruned = engine.read(events, files=lambda v: v["event_date"] == D2)
    assert _spark_rows(pruned) == _dicts([_row(2, 11, D2), _row(5, 7, D2)])


SMALL = StructType(
    [
        StructField("pipeline", StringType(), True),
        StructField("window_start", TimestampType(), True),
        StructField("n", LongType(), True),
    ]
)


def test_replace_rows_swaps_selected_rows_sorted_in_one_commit(engine: DeltaEngine, tmp_path: Path) -> None:
    path = tmp_path / "ops" / "ledger"  # replace_rows is for the small ops tables
    engine.ensure_table(path, SMALL)
    h = [dt.datetime(2024, 5, 1, i, tzinfo=UTC) for i in range(4)]
    engine.replace_rows([("b", h[1], 1), ("a", h[2], 2), ("a", h[0], 3)], SMALL, path,
                        drop=lambda r: False, order_by=("pipeline", "window_start"), app_id="w", version=0)
    before = _version(path)
    # Replace a's 02:00 row, add b's 03:00: one commit, every other row kept, the file sorted.
    assert engine.replace_rows([("b", h[3], 4), ("a", h[2], 20)], SMALL, path,
                               drop=lambda r: (r["pipeline"], r["window_start"]) == ("a", h[2]),
                               order_by=("pipeline", "window_start"), app_id="w", version=1)
    assert _version(path) == before + 1
    assert not engine.replace_rows([("z", h[0], 0)], SMALL, path, drop=lambda r: True,
                                   order_by=("pipeline",), app_id="w", version=1)  # retried: no-op
    files = sorted(_live_files(path))
    assert len(files) == 1
    content = pq.read_table(files[0]).to_pylist()
    assert [(r["pipeline"], r["window_start"], r["n"]) for r in content] == [
        ("a", h[0], 3), ("a", h[2], 20), ("b", h[1], 1), ("b", h[3], 4),
    ]
    assert _duckdb_rows(path) == _sorted(content)


def test_read_small_table_reads_each_file_once_and_follows_the_snapshot(tmp_path: Path) -> None:
    """Issue 13: ops tables are read many times per cycle and grow by a file per commit; each data file is
    read once per process, and every read still returns exactly the latest snapshot (appends, a rewrite
    that removes files, a column added)."""
    from sluice.storage.snapshots import read_small_table

    path = tmp_path / "ops"

    def fresh() -> list[dict[str, Any]]:
        return sorted(read_rows(path), key=lambda r: r["id"])

    def cached() -> list[dict[str, Any]]:
        data = read_small_table(path)
        assert data is not None
        return sorted(data.to_pylist(), key=lambda r: r["id"])

    write_deltalake(str(path), pa.table({"id": [1, 2]}))
    assert cached() == fresh() == [{"id": 1}, {"id": 2}]
    first_file = Path(DeltaTable(str(path)).file_uris()[0])
    original = first_file.read_bytes()
    first_file.write_bytes(b"not parquet")  # a second read of this file would fail
    try:
        write_deltalake(str(path), pa.table({"id": [3]}), mode="append")
        assert cached() == [{"id": 1}, {"id": 2}, {"id": 3}]
    finally:
        first_file.write_bytes(original)
    assert cached() == fresh()
    write_deltalake(str(path), pa.table({"id": [5]}), mode="overwrite")  # removes every earlier file
    assert cached() == fresh() == [{"id": 5}]
    write_deltalake(str(path), pa.table({"id": [6], "note": ["x"]}), mode="append", schema_mode="merge")
    assert cached() == fresh() == [{"id": 5, "note": None}, {"id": 6, "note": "x"}]


def test_each_table_has_one_writing_engine(spark: SparkSession, engine: DeltaEngine, tmp_path: Path) -> None:
    """delta-spark writes the tables Spark computes, from their creation on; the ops tables stay on delta-rs."""
    from sluice.core.jars import locked

    data, ops = tmp_path / "bronze" / "events", tmp_path / "ops" / "batches"
    engine.ensure_table(data, SCHEMA, PARTS)
    engine.append(_df(spark, [_row(1, 10)]), data, app_id="a", version=1)
    engine.append_rows([_row(2, 11)], SCHEMA, data, app_id="a", version=2)
    engine.replace(_df(spark, [_row(3, 11)]), data, keep=lambda df: df, files=lambda v: v["event_hour"] == 11,
                   app_id="b", version=1)
    engine.ensure_table(ops, SMALL)
    engine.append_rows([("a", dt.datetime(2024, 5, 1, tzinfo=UTC), 1)], SMALL, ops, app_id="o", version=1)

    def writers(path: Path) -> set[str]:
        infos = [a["commitInfo"] for v in range(_version(path) + 1) for a in _log(path, v) if "commitInfo" in a]
        return {i.get("engineInfo") or i.get("clientVersion", "?") for i in infos}

    (connector,) = [j.version for j in locked(["delta"]) if j.artifact.startswith("delta-spark")]
    spark_writers = writers(data)
    assert len(spark_writers) == 1 and _version(data) == 3, spark_writers
    assert re.fullmatch(rf"Apache-Spark/4\.2\.\d+ Delta-Lake/{re.escape(connector)}", spark_writers.pop())
    assert all(w.startswith("delta-rs") for w in writers(ops)), writers(ops)
    assert _delta_rows(data) == _dicts([_row(1, 10), _row(2, 11), _row(3, 11)])


def test_compact_and_vacuum_keep_the_rows_and_clear_what_no_version_needs(
    spark: SparkSession, engine: DeltaEngine, events: Path
) -> None:
    """sluice_maintenance's two steps, by the engine that writes the table."""
    for version, rows in enumerate(([_row(1, 10), _row(2, 10)], [_row(3, 10)], [_row(4, 11)]), 1):
        engine.append(_df(spark, rows), events, app_id="ingest", version=version)
    before, version = _delta_rows(events), _version(events)
    assert engine.compact(events) >= 2  # hour 10's files became one
    assert _version(events) == version + 1
    assert all(a["dataChange"] is False for a in _actions(events, version + 1, "add"))
    assert _delta_rows(events) == before
    compacted_away = _parquet_on_disk(events) - _live_files(events)
    assert len(compacted_away) >= 2
    # A day's retention: a crashed write's file that no commit references, two days old, goes; the files the
    # compaction removed a moment ago stay (a reader of the version before may still need them).
    some = Path(sorted(compacted_away)[0])
    orphan = some.with_name("part-00000-crashed-write.c000.snappy.parquet")
    shutil.copyfile(some, orphan)
    two_days_ago = time.time() - 48 * 3600
    os.utime(orphan, (two_days_ago, two_days_ago))
    assert engine.vacuum(events, 24) == 1
    assert not orphan.exists() and _parquet_on_disk(events) - _live_files(events) == compacted_away
    # Retention 0 (sluice_maintenance never goes under a day): exactly the files no current version needs.
    assert engine.vacuum(events, 0) == len(compacted_away)
    assert _parquet_on_disk(events) == _live_files(events)
    assert _delta_rows(events) == before and _spark_rows(engine.read(events)) == before


_HOURLY_SCHEMA = StructType([
    StructField("id", StringType()), StructField("event_time", TimestampType()),
    StructField("event_date", DateType()), StructField("event_hour", IntegerType()),
])


def _scans_files_only(df: DataFrame) -> bool:
    """Whether the read's plan lists its files itself (Spark's Parquet source) rather than through Delta's index,
    which plans from the table's whole state with stats (Spark jobs before the read's own)."""
    plan = df._jdf.queryExecution().executedPlan().toString()  # type: ignore[operator]
    return "InMemoryFileIndex" in plan and "TahoeLogFileIndex" not in plan and "PreparedDeltaFileIndex" not in plan


def test_a_table_whose_files_are_its_rows_is_read_from_its_files_and_one_with_deletion_vectors_by_delta(
    spark: SparkSession, engine: DeltaEngine, tmp_path: Path
) -> None:
    """Reads (whole, and of the partitions a predicate chooses) give delta-spark's rows either way. A table of
    reader protocol 1 in Hive-style folders is read as the Parquet files its log lists; once deletion vectors
    hide rows that its files still hold, delta-spark reads it."""
    path = str(tmp_path / "hourly")
    engine.ensure_table(path, _HOURLY_SCHEMA, ["event_date", "event_hour"])
    start = dt.datetime(2024, 5, 1, 22, tzinfo=dt.UTC)
    rows = [(f"e{i}", start + dt.timedelta(minutes=25 * i)) for i in range(8)]
    frame = spark.createDataFrame(
        [(i, t, t.date(), t.hour) for i, t in rows], _HOURLY_SCHEMA)
    assert engine.append(frame, path, app_id="w", version=1)

    def delta_read() -> list[dict[str, Any]]:
        return _spark_rows(spark.read.format("delta").load(path))

    late = lambda values: values["event_hour"] >= 23 or values["event_date"] > dt.date(2024, 5, 1)  # noqa: E731
    whole, chosen = engine.read(path), engine.read(path, files=late)
    assert _scans_files_only(whole) and _scans_files_only(chosen)
    assert whole.columns == _HOURLY_SCHEMA.fieldNames()
    assert _spark_rows(whole) == delta_read()
    assert _spark_rows(chosen) == [r for r in delta_read() if late(r)]
    assert {r["id"] for r in _spark_rows(chosen)} == {"e3", "e4", "e5", "e6", "e7"}
    assert engine.read(path, files=lambda values: False).count() == 0

    spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')")
    spark.sql(f"DELETE FROM delta.`{path}` WHERE id IN ('e1', 'e5')")
    assert DeltaTable(path).protocol().min_reader_version > 1  # the files still hold e1 and e5
    whole, chosen = engine.read(path), engine.read(path, files=late)
    assert not _scans_files_only(whole) and not _scans_files_only(chosen)
    assert sorted(r["id"] for r in _spark_rows(whole)) == ["e0", "e2", "e3", "e4", "e6", "e7"]
    assert sorted(r["id"] for r in _spark_rows(chosen)) == ["e3", "e4", "e6", "e7"]
