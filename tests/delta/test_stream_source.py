"""The ``sluice_delta`` Spark Python data source over real delta-rs tables: batch snapshots, streaming
offsets = Delta versions, admission control, Trigger.AvailableNow, restarts and stateful consumers."""

from __future__ import annotations

import datetime as dt
import decimal
import os
import pickle
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxFiles
from pyspark.sql.types import (
    DateType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from sluice.storage.stream_source import (
    DeltaDataSource,
    DeltaStreamReader,
    files_between,
    latest_version,
    register,
    table_schema,
)

UTC = dt.UTC
PARTITIONS = ["event_date", "event_hour"]


def _ts(hour: int, minute: int = 0) -> dt.datetime:
    return dt.datetime(2024, 5, 1, hour, minute, tzinfo=UTC)


def _events(ids: list[int], hours: list[int | None]) -> pa.Table:
    """Rows spread over (event_date, event_hour) partitions; hour None = null partition values."""
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "name": pa.array([f"n{i}" if i % 3 else None for i in ids], pa.string()),
            "event_time": pa.array(
                [_ts(h or 0, i % 60) for i, h in zip(ids, hours, strict=True)], pa.timestamp("us", tz="UTC")
            ),
            "event_date": pa.array(
                [None if h is None else dt.date(2024, 5, 1 + h % 2) for h in hours], pa.date32()
            ),
            "event_hour": pa.array(hours, pa.int32()),
        }
    )


def _append(path: Path, table: pa.Table, partition_by: list[str] | None = None) -> None:
    write_deltalake(str(path), table, mode="append", partition_by=partition_by)


def _expected(tables: list[pa.Table]) -> list[tuple[Any, ...]]:
    """Rows as comparable tuples: timestamps as epoch microseconds (independent of local time zone)."""
    rows = []
    for table in tables:
        for r in table.to_pylist():
            ts = r["event_time"]
            rows.append(
                (
                    r["id"],
                    r["name"],
                    None if ts is None else int(ts.timestamp() * 1_000_000),
                    r["event_date"],
                    r["event_hour"],
                )
            )
    return sorted(rows, key=repr)


def _as_tuples(rows: list[Row]) -> list[tuple[Any, ...]]:
    return sorted(
        [(r.id, r.name, r.ts_us, r.event_date, r.event_hour) for r in rows],
        key=repr,
    )


_COMPARABLE = ["id", "name", "unix_micros(event_time) AS ts_us", "event_date", "event_hour"]


@pytest.fixture
def partitioned(tmp_path: Path) -> tuple[Path, list[pa.Table]]:
    """Versions 0..2 of a table partitioned by a date and an int column (with a null partition)."""
    path = tmp_path / "partitioned"
    commits = [
        _events([1, 2, 3], [1, 2, None]),
        _events([4, 5], [1, 3]),
        _events([6, 7, 8], [2, 2, 4]),
    ]
    for table in commits:
        _append(path, table, PARTITIONS)
    return path, commits


def _run_available_now(
    spark: SparkSession, path: Path, checkpoint: Path, **options: object
) -> list[list[Row]]:
    """One Trigger.AvailableNow run; returns the rows of every micro-batch, in batch order."""
    register(spark)
    batches: list[list[Row]] = []
    reader = spark.readStream.format("sluice_delta")
    for key, value in options.items():
        reader = reader.option(key, str(value))
    query = (
        reader.load(str(path))
        .selectExpr(*_COMPARABLE)
        .writeStream.foreachBatch(lambda df, _batch_id: batches.append(df.collect()))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert query.awaitTermination(120), "availableNow query did not finish"
    finally:
        query.stop()
    return batches


def _flatten(batches: list[list[Row]]) -> list[tuple[Any, ...]]:
    return _as_tuples([row for batch in batches for row in batch])


# ------------------------------------------------------------------------------------------------
# Driver-side metadata and the reader protocol, without Spark
# ------------------------------------------------------------------------------------------------


def test_files_between_reads_added_files_per_version(partitioned: tuple[Path, list[pa.Table]]) -> None:
    path, _ = partitioned
    assert latest_version(str(path)) == 2
    assert latest_version(str(path.parent / "missing")) == -1

    v0 = files_between(str(path), -1, 0)
    assert len(v0) == 3
    assert all(os.path.isabs(p) and os.path.exists(p) for p, _ in v0)
    assert sorted((pv["event_date"], pv["event_hour"]) for _, pv in v0 if pv["event_hour"]) == [
        ("2024-05-01", "2"),
        ("2024-05-02", "1"),
    ]
    assert {"event_date": None, "event_hour": None} in [pv for _, pv in v0]
    assert len(files_between(str(path), 0, 2)) == 2 + 2  # one file per partition and commit
    assert files_between(str(path), 2, 2) == []

    # Compaction removes and re-adds files with dataChange=false: no new data.
    DeltaTable(str(path)).optimize.compact()
    assert latest_version(str(path)) == 3
    assert files_between(str(path), 2, 3) == []


def test_schema_types_and_column_order(partitioned: tuple[Path, list[pa.Table]]) -> None:
    path, _ = partitioned
    schema = table_schema(str(path))
    assert [(f.name, f.dataType) for f in schema.fields] == [
        ("id", LongType()),
        ("name", StringType()),
        ("event_time", TimestampType()),
        ("event_date", DateType()),
        ("event_hour", IntegerType()),
    ]


def test_stream_reader_offsets_limits_and_available_now(partitioned: tuple[Path, list[pa.Table]]) -> None:
    path, commits = partitioned
    schema = table_schema(str(path))
    reader = DeltaDataSource({"path": str(path), "maxFilesPerTrigger": "1"}).streamReader(schema)
    assert isinstance(reader, DeltaStreamReader)

    start = reader.initialOffset()
    assert start == {"version": -1}
    assert reader.getDefaultReadLimit() == ReadMaxFiles(1)
    # A commit is never split: version 0 has three files, yet it is admitted whole, and alone.
    assert reader.latestOffset(start, reader.getDefaultReadLimit()) == {"version": 0}
    assert reader.latestOffset({"version": 0}, ReadMaxFiles(2)) == {"version": 1}
    assert reader.latestOffset({"version": 0}, ReadMaxFiles(5)) == {"version": 2}
    assert reader.latestOffset(start, ReadAllAvailable()) == {"version": 2}
    assert reader.latestOffset({"version": 2}, ReadAllAvailable()) == {"version": 2}

    # Executor side: the planned partitions read into batches in exactly Spark's Arrow schema.
    partitions = reader.partitions(start, {"version": 0})
    batches = [b for p in partitions for b in reader.read(p)]
    target = to_arrow_schema(schema, timezone="UTC")
    assert batches and all(b.schema.equals(target) for b in batches)
    got = pa.Table.from_batches(batches).to_pylist()
    assert sorted(r["id"] for r in got) == [1, 2, 3]
    by_id = {r["id"]: r for r in got}
    assert by_id[1]["event_date"] == dt.date(2024, 5, 2) and by_id[1]["event_hour"] == 1
    assert by_id[3]["event_date"] is None and by_id[3]["event_hour"] is None
    assert by_id[1]["event_time"] == _ts(1, 1)
    assert reader.partitions({"version": 2}, {"version": 2}) == []

    # The reader is pickled to executors: it must not carry the driver's log cache.
    clone = pickle.loads(pickle.dumps(reader))
    assert clone._log is None and clone.schema == schema

    # Trigger.AvailableNow: commits after prepareForTriggerAvailableNow() are not read by this run.
    reader.prepareForTriggerAvailableNow()
    _append(path, commits[0], PARTITIONS)
    assert reader.latestOffset({"version": 1}, ReadAllAvailable()) == {"version": 2}
    assert reader.latestOffset({"version": 2}, ReadMaxFiles(10)) == {"version": 2}
    fresh = DeltaDataSource({"path": str(path)}).streamReader(schema)
    assert fresh.latestOffset({"version": 2}, ReadAllAvailable()) == {"version": 3}


def test_typed_partition_values_agree_between_log_and_snapshot(tmp_path: Path) -> None:
    """Timestamp/bool/decimal/string partitions parse the same from commit JSON (stream) and from
    delta-rs (batch snapshot); an empty string partition is null, as in Spark."""
    path = tmp_path / "typed"
    when = dt.datetime(2024, 1, 1, 5, 6, 7, 123456, tzinfo=UTC)
    table = pa.table(
        {
            "id": pa.array([1, 2], pa.int64()),
            "ts": pa.array([when, None], pa.timestamp("us", tz="UTC")),
            "flag": pa.array([True, False]),
            "amount": pa.array([decimal.Decimal("1.25"), decimal.Decimal("3.50")], pa.decimal128(5, 2)),
            "label": pa.array(["", "x y"]),
        }
    )
    _append(path, table, ["ts", "flag", "amount", "label"])
    schema = table_schema(str(path))
    expected = [
        {"id": 1, "ts": when, "flag": True, "amount": decimal.Decimal("1.25"), "label": None},
        {"id": 2, "ts": None, "flag": False, "amount": decimal.Decimal("3.50"), "label": "x y"},
    ]

    stream = DeltaDataSource({"path": str(path)}).streamReader(schema)
    batch = DeltaDataSource({"path": str(path)}).reader(schema)
    for reader, partitions in (
        (stream, stream.partitions({"version": -1}, {"version": 0})),
        (batch, batch.partitions()),
    ):
        rows = [r for p in partitions for b in reader.read(p) for r in b.to_pylist()]
        assert sorted(rows, key=lambda r: r["id"]) == expected


def test_starting_version_option(partitioned: tuple[Path, list[pa.Table]]) -> None:
    path, _ = partitioned
    schema = table_schema(str(path))
    assert DeltaDataSource({"path": str(path), "startingVersion": "1"}).streamReader(
        schema
    ).initialOffset() == {"version": 0}
    assert DeltaDataSource({"path": str(path), "startingVersion": "latest"}).streamReader(
        schema
    ).initialOffset() == {"version": 2}
    with pytest.raises(ValueError, match="maxFilesPerTrigger"):
        DeltaDataSource({"path": str(path), "maxFilesPerTrigger": "0"}).streamReader(schema)


def test_rewrites_are_reemitted_unless_skip_change_commits(tmp_path: Path) -> None:
    path = tmp_path / "rewritten"
    _append(path, pa.table({"id": pa.array([1, 2, 3], pa.int64())}))
    DeltaTable(str(path)).delete("id = 1")  # rewrites the file: remove + add, both dataChange=true
    assert len(files_between(str(path), 0, 1)) == 1  # append-only: the surviving rows come again

    schema = table_schema(str(path))
    reader = DeltaDataSource({"path": str(path), "skipChangeCommits": "true"}).streamReader(schema)
    assert reader.partitions({"version": 0}, {"version": 1}) == []


def test_history_removed_by_log_cleanup_reads_the_checkpoint_as_snapshot(tmp_path: Path) -> None:
    path = tmp_path / "cleaned"
    for batch in ([1, 2], [3], [4, 5]):
        _append(path, pa.table({"id": pa.array(batch, pa.int64())}))
    DeltaTable(str(path)).create_checkpoint()  # at version 2
    _append(path, pa.table({"id": pa.array([6], pa.int64())}))
    for version in (0, 1):  # what log cleanup does to commits older than the checkpoint
        (path / "_delta_log" / f"{version:020d}.json").unlink()

    def ids(files: list[tuple[str, dict[str, str | None]]]) -> list[int]:
        return sorted(i for p, _ in files for i in pq.read_table(p).column("id").to_pylist())

    assert ids(files_between(str(path), -1, 3)) == [1, 2, 3, 4, 5, 6]
    assert ids(files_between(str(path), 2, 3)) == [6]
    with pytest.raises(RuntimeError, match="no longer in the Delta log"):
        files_between(str(path), 0, 3)


# ------------------------------------------------------------------------------------------------
# Through Spark
# ------------------------------------------------------------------------------------------------


@pytest.mark.spark
def test_batch_read_equals_table(spark: SparkSession, partitioned: tuple[Path, list[pa.Table]]) -> None:
    path, commits = partitioned
    register(spark)
    register(spark)  # idempotent

    df = spark.read.format("sluice_delta").load(str(path))
    assert [(f.name, f.dataType) for f in df.schema.fields] == [
        ("id", LongType()),
        ("name", StringType()),
        ("event_time", TimestampType()),
        ("event_date", DateType()),
        ("event_hour", IntegerType()),
    ]
    assert _as_tuples(df.selectExpr(*_COMPARABLE).collect()) == _expected(commits)

    # Time travel, and a user-declared schema (subset, other order) is honoured.
    old = spark.read.format("sluice_delta").option("version", 0).load(str(path))
    assert _as_tuples(old.selectExpr(*_COMPARABLE).collect()) == _expected(commits[:1])
    declared = StructType([StructField("event_hour", IntegerType()), StructField("id", LongType())])
    rows = spark.read.format("sluice_delta").schema(declared).load(str(path)).collect()
    assert sorted((r.id, r.event_hour) for r in rows) == sorted((r[0], r[4]) for r in _expected(commits))


@pytest.mark.spark
def test_stream_available_now_restart_is_exactly_once(
    spark: SparkSession, partitioned: tuple[Path, list[pa.Table]], tmp_path: Path
) -> None:
    path, commits = partitioned
    checkpoint = tmp_path / "checkpoint"

    first = _run_available_now(spark, path, checkpoint)
    assert _flatten(first) == _expected(commits)

    more = [_events([9, 10], [5, None]), _events([11], [1])]
    for table in more:
        _append(path, table, PARTITIONS)
    second = _run_available_now(spark, path, checkpoint)
    assert _flatten(second) == _expected(more)

    assert _run_available_now(spark, path, checkpoint) == []  # nothing new: no batch at all


@pytest.mark.spark
def test_max_files_per_trigger_bounds_batches_without_splitting_commits(
    spark: SparkSession, partitioned: tuple[Path, list[pa.Table]], tmp_path: Path
) -> None:
    path, commits = partitioned
    batches = [b for b in _run_available_now(spark, path, tmp_path / "ck", maxFilesPerTrigger=1) if b]

    assert len(batches) == len(commits) > 1
    # Each commit has several files, yet every batch is exactly one whole commit, in version order.
    assert [_as_tuples(b) for b in batches] == [_expected([c]) for c in commits]


@pytest.mark.spark
def test_watermark_and_event_time_windows_over_the_source(spark: SparkSession, tmp_path: Path) -> None:
    path = tmp_path / "clicks"
    hours = [
        [_ts(0, 5), _ts(0, 20), _ts(0, 50)],
        [_ts(1, 10), _ts(1, 30)],  # watermark -> 01:20: closes [00:00, 01:00)
        [_ts(2, 15), _ts(2, 40)],  # watermark -> 02:30: closes [01:00, 02:00)
        [_ts(3, 30)],  # watermark -> 03:20: closes [02:00, 03:00)
    ]
    next_id = 0
    for times in hours:
        ids = list(range(next_id, next_id + len(times)))
        next_id += len(times)
        _append(
            path,
            pa.table(
                {
                    "click_id": pa.array(ids, pa.int64()),
                    "event_time": pa.array(times, pa.timestamp("us", tz="UTC")),
                }
            ),
        )

    register(spark)
    emitted: list[Row] = []
    windows = (
        spark.readStream.format("sluice_delta")
        .option("maxFilesPerTrigger", 1)
        .load(str(path))
        .withWatermark("event_time", "10 minutes")
        .groupBy(F.window("event_time", "1 hour"))
        .count()
        .select(F.unix_micros(F.col("window.start")).alias("start_us"), "count")
    )
    query = (
        windows.writeStream.outputMode("append")
        .foreachBatch(lambda df, _batch_id: emitted.extend(df.collect()))
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert query.awaitTermination(120)
    finally:
        query.stop()

    got = {r.start_us: r["count"] for r in emitted}
    assert len(got) == len(emitted), "a window was emitted twice"
    hour_us = {h: int(_ts(h).timestamp() * 1_000_000) for h in range(4)}
    # Append mode only emits windows closed by the watermark, each once with its final count; the
    # last window stays open (watermark 03:20 < its end). [02:00, 03:00) is closed by the no-data
    # batch that Trigger.AvailableNow runs after the last data batch.
    assert got == {hour_us[0]: 3, hour_us[1]: 2, hour_us[2]: 2}


@pytest.mark.spark
def test_compaction_does_not_reemit_rows(
    spark: SparkSession, partitioned: tuple[Path, list[pa.Table]], tmp_path: Path
) -> None:
    path, commits = partitioned
    checkpoint = tmp_path / "checkpoint"
    assert _flatten(_run_available_now(spark, path, checkpoint)) == _expected(commits)

    DeltaTable(str(path)).optimize.compact()  # remove + add, dataChange=false
    DeltaTable(str(path)).create_checkpoint()
    later = _events([20, 21], [2, 2])
    _append(path, later, PARTITIONS)

    assert _flatten(_run_available_now(spark, path, checkpoint)) == _expected([later])
    # A new query over the whole history sees every row exactly once, compaction notwithstanding.
    assert _flatten(_run_available_now(spark, path, tmp_path / "fresh")) == _expected([*commits, later])


def test_min_event_time_skips_files_of_hours_that_ended_before_it(partitioned: tuple[Path, list[pa.Table]]) -> None:
    path, commits = partitioned
    schema = table_schema(str(path))

    def planned(**options: str) -> list[int]:
        reader = DeltaDataSource({"path": str(path), **options}).streamReader(schema)
        rows = [row for p in reader.partitions({"version": -1}, {"version": 2}) for row in _read_all(reader, p)]
        return sorted(r["id"] for r in rows)

    everything = sorted(r["id"] for table in commits for r in table.to_pylist())
    assert planned() == everything
    # Hour 2 (2024-05-01 02:00-03:00) ended before 04:30: ids 2, 6, 7 are not read. Hour 1 and 3 lie on
    # 2024-05-02 (see _events), hour 4 ends at 05:00, and null partitions can hold any time: all kept.
    assert planned(minEventTime="2024-05-01T04:30:00Z") == [i for i in everything if i not in (2, 6, 7)]
    with pytest.raises(ValueError, match="minEventTime"):
        DeltaDataSource({"path": str(path), "minEventTime": "yesterday"}).streamReader(schema)
    with pytest.raises(ValueError, match="zone"):
        DeltaDataSource({"path": str(path), "minEventTime": "2024-05-01T04:30:00"}).streamReader(schema)


def _read_all(reader: Any, partition: Any) -> list[dict[str, Any]]:
    return [row for batch in reader.read(partition) for row in pa.Table.from_batches([batch]).to_pylist()]
