"""A DQ step's bronze counts per window (SPEC 5): each window's accepted records, and each completeness check's
measure (the distinct values of its column) over the window's rows of bronze and, for a backfill with the late
records, of the DLQ.

Counted in one of two ways, with the same answers (tests/quality/test_counts.py holds them to it):

* **on the driver**, with pyarrow, when the windows' bronze hours hold at most :data:`DRIVER_COUNT_RECORDS` records,
  the tables' files are their rows and no counted column is a floating-point one. A cycle's few windows, or a
  day's catch-up of a million records, are a few columns of a few files: reading them costs less than a Spark
  job's set-up (the catch-up's counts: four Spark jobs, about 4 s, against about 0.5 s);
* **with Spark** otherwise (a backfill of weeks): one query per stream over the windows' event hours.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from sluice.config import Settings
from sluice.core.checks import Completeness
from sluice.core.model import EVENT_TIME, OutputDef, PipelineDef, StreamSpec
from sluice.core.spark import collected_utc, local_frame
from sluice.core.windows import Window, epoch_micros
from sluice.storage import snapshots, tables
from sluice.storage.engine import DeltaEngine

# (check name + output, window) -> the check's bronze measure; window -> accepted records.
Counts = tuple[dict[tuple[str, Window], int], dict[Window, int]]

# Above this many records in the windows' bronze hours (and the DLQ, for a backfill with the late records), the
# counts run in Spark: the driver holds a time and each counted column of every record while it counts.
DRIVER_COUNT_RECORDS = 4_000_000
# Above this many (bucket, window) pairs, _in_windows matches by the bounds alone.
MAX_WINDOW_BUCKETS = 200_000


def completeness_checks(pipeline: PipelineDef) -> list[tuple[OutputDef, Completeness]]:
    return [(output, c) for output in pipeline.outputs for c in output.checks if isinstance(c, Completeness)]


def _internal(spec: StreamSpec, field: str) -> str:
    """The bronze column of a declared field (the event-time field is ``event_time`` in bronze)."""
    return EVENT_TIME if field == spec.time_field else field


def _counted(pipeline: PipelineDef, spec: StreamSpec) -> dict[str, str]:
    """The stream's completeness measures: check name + output -> the bronze column whose distinct values count."""
    return {c.name + output.name: _internal(spec, c.distinct or spec.id_field)
            for output, c in completeness_checks(pipeline) if c.stream == spec.name}


def _count_columns(counted: dict[str, str]) -> list[str]:
    """The bronze columns a stream's counts read: the event time and each measure's column, once each."""
    return list(dict.fromkeys([EVENT_TIME, *counted.values()]))


def _hour_pruner(windows: Sequence[Window]) -> Callable[[Any], bool]:
    return tables.hours_overlapping(min(s for s, _ in windows), max(e for _, e in windows))


def window_counts(settings: Settings, engine: DeltaEngine, pipeline: PipelineDef, windows: Sequence[Window],
                  include_late: bool = False) -> Callable[[], Counts]:
    """The windows' counts, as a call the DQ step runs beside Great Expectations. Its inputs are chosen here, on
    the calling thread: the files read on the driver, or Spark's queries, built here so that the call only waits
    on Spark and does not compete with GE for the GIL."""
    files = _driver_files(settings, pipeline, windows, include_late)
    if files is not None:
        return lambda: _count_on_driver(pipeline, settings, files, windows)
    queries = _count_queries(settings, engine, pipeline, windows, include_late)
    return lambda: _run_queries(queries)


# -- on the driver ----------------------------------------------------------------------------------------------
def _driver_files(settings: Settings, pipeline: PipelineDef, windows: Sequence[Window],
                  include_late: bool) -> dict[str, list[tuple[list[snapshots.LiveFile], pa.Schema, bool]]] | None:
    """Per stream, the files to read (bronze's in the windows' hours; the DLQ's, all of them, with
    ``include_late``), each group with the arrow schema of its columns and whether it is bronze. None when the
    counts must run in Spark (see the module's docstring)."""
    prune = _hour_pruner(windows)
    chosen: dict[str, list[tuple[list[snapshots.LiveFile], pa.Schema, bool]]] = {}
    records = 0
    for stream in pipeline.streams:
        spec = settings.stream(stream)
        columns = _count_columns(_counted(pipeline, spec))
        sources = [(tables.bronze(spec).path(settings), True)]
        if include_late:
            sources.append((tables.dlq(spec).path(settings), False))
        chosen[stream] = []
        for path, is_bronze in sources:
            table = snapshots.open_table(path)
            if table is None or not snapshots.rows_are_files(table):
                return None
            schema = pa.schema(table.schema().to_arrow())
            wanted = [*columns, "is_heartbeat"] if is_bronze else columns
            if any(c not in schema.names for c in wanted):
                return None
            # Spark's count of distinct doubles makes -0.0 and 0.0 (and every NaN) one value; pyarrow's does not.
            if any(pa.types.is_floating(schema.field(c).type) for c in wanted):
                return None
            live = [f for f in snapshots.live_files(path, table) if not is_bronze or prune(f.partition)]
            if any(f.records is None for f in live):
                return None
            records += sum(f.records or 0 for f in live)
            if records > DRIVER_COUNT_RECORDS:
                return None
            chosen[stream].append((live, pa.schema([schema.field(c) for c in wanted]), is_bronze))
    return chosen


def _count_on_driver(pipeline: PipelineDef, settings: Settings,
                     files: dict[str, list[tuple[list[snapshots.LiveFile], pa.Schema, bool]]],
                     windows: Sequence[Window]) -> Counts:
    """Per stream: its rows' times sorted once, each window is a slice of them (``start <= t < end``), counted."""
    measure: dict[tuple[str, Window], int] = {}
    records: dict[Window, int] = {}
    for stream, groups in files.items():
        counted = _counted(pipeline, settings.stream(stream))
        columns = _count_columns(counted)
        parts, flags = [], []
        for live, schema, is_bronze in groups:
            table = snapshots.read_files([f.path for f in live], schema)
            if is_bronze:
                table = table.filter(pc.invert(table.column("is_heartbeat")))
            parts.append(table.select(columns))
            flags.append(np.full(table.num_rows, is_bronze))
        rows = pa.concat_tables(parts)
        # A row without a time is in no window (Spark's match drops it too).
        timed = rows.column(EVENT_TIME).is_valid().to_numpy(zero_copy_only=False)
        rows, bronze = rows.filter(pa.array(timed)), np.concatenate(flags)[timed]
        times = pc.cast(pc.cast(rows.column(EVENT_TIME), pa.timestamp("us", "UTC")), pa.int64()).to_numpy()
        order = np.argsort(times, kind="stable")
        times, rows = times[order], rows.take(pa.array(order))
        # Accepted records before each row: a window's records are a difference of two of these.
        before = np.concatenate([[0], np.cumsum(bronze[order])])
        for window in windows:
            lo, hi = (int(np.searchsorted(times, epoch_micros(t), side="left")) for t in window)
            if hi <= lo:
                continue  # no row: Spark's grouping has no row for the window either
            records[window] = records.get(window, 0) + int(before[hi] - before[lo])
            for key, column in counted.items():
                measure[(key, window)] = int(pc.count_distinct(rows.column(column).slice(lo, hi - lo)).as_py())
    return measure, records


# -- with Spark -------------------------------------------------------------------------------------------------
def _in_windows(df: DataFrame, windows: Sequence[Window], time_column: str = "event_time") -> DataFrame:
    """Rows of ``df`` tagged (``_ws``, ``_we``) with every window of ``windows`` their event time falls in.

    A join on the bounds alone (``start <= t < end``) is a nested loop in Spark: every row against every
    window, 294 comparisons a row for the 294 windows of a day's catch-up of 15-minute windows every 5, and
    more in a backfill of weeks. So each row is first matched by equality on its time bucket (as long as the
    shortest window, on the epoch's grid) to the windows that overlap that bucket, a broadcast hash join, and
    then by the exact bounds. Exact for any windows, aligned or not, of any lengths."""
    spark = df.sparkSession
    t = F.col(time_column)
    in_bounds = (t >= F.col("_ws")) & (t < F.col("_we"))
    bucket_us = min(epoch_micros(end) - epoch_micros(start) for start, end in windows)
    keyed = [(bucket, start, end) for start, end in windows
             for bucket in range(epoch_micros(start) // bucket_us, (epoch_micros(end) - 1) // bucket_us + 1)]
    if len(keyed) > MAX_WINDOW_BUCKETS:  # windows far longer than the shortest: the bounds alone
        return df.join(F.broadcast(local_frame(spark, windows, "_ws timestamp, _we timestamp")), in_bounds)
    bounds = local_frame(spark, keyed, "_bucket long, _ws timestamp, _we timestamp")
    # Floor division in whole microseconds, as above (integer `div`, right before the epoch too).
    micros = f"unix_micros(`{time_column}`)"
    bucket = F.expr(f"({micros} - pmod({micros}, {bucket_us})) div {bucket_us}")
    return df.withColumn("_bucket", bucket).join(F.broadcast(bounds), "_bucket").filter(in_bounds).drop("_bucket")


def _count_queries(settings: Settings, engine: DeltaEngine, pipeline: PipelineDef, windows: Sequence[Window],
                   include_late: bool) -> list[tuple[DataFrame, list[str]]]:
    """Per stream, one query over the window hours of bronze (and, for a backfill with the late records, its
    DLQ): per window, its record count and every completeness measure on that stream; with the keys (check name
    + output) of those measures, in column order."""
    queries = []
    for stream in pipeline.streams:
        spec = settings.stream(stream)
        tables.ensure_stream_tables(engine, settings, spec)
        bronze = engine.read(
            tables.bronze(spec).path(settings), files=_hour_pruner(windows)
        ).filter(~F.col("is_heartbeat"))
        source = bronze.select(*spec.fields).withColumn("_bronze", F.lit(1))
        if include_late:
            dlq = engine.read(tables.dlq(spec).path(settings))
            source = source.unionByName(dlq.select(*spec.fields).withColumn("_bronze", F.lit(0)))
        counted = _counted(pipeline, spec)
        aggs = [F.sum("_bronze").alias("n")] + [
            F.countDistinct(column).alias(f"_m{i}") for i, column in enumerate(counted.values())
        ]
        queries.append((_in_windows(source, windows).groupBy("_ws", "_we").agg(*aggs), list(counted)))
    return queries


def _run_queries(queries: Sequence[tuple[DataFrame, list[str]]]) -> Counts:
    measure: dict[tuple[str, Window], int] = {}
    records: dict[Window, int] = {}
    for query, keys in queries:
        for r in query.collect():
            w: tuple[datetime, datetime] = (collected_utc(r["_ws"]), collected_utc(r["_we"]))
            records[w] = records.get(w, 0) + int(r["n"] or 0)
            for i, key in enumerate(keys):
                measure[(key, w)] = int(r[f"_m{i}"])
    return measure, records
