"""A DQ step's bronze counts per window (SPEC 5): each window's accepted records, and each completeness check's
measure (the distinct values of its column) over the window's rows of bronze and, for a backfill with the late
records, of the DLQ: one Spark query per stream over the windows' event hours."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from sluice.config import Settings
from sluice.core.checks import Completeness
from sluice.core.model import EVENT_TIME, OutputDef, PipelineDef, StreamSpec
from sluice.core.spark import collected_utc, local_frame
from sluice.core.windows import Window, epoch_micros
from sluice.storage import tables
from sluice.storage.engine import DeltaEngine

# (check name + output, window) -> the check's bronze measure; window -> accepted records.
Counts = tuple[dict[tuple[str, Window], int], dict[Window, int]]

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


def _hour_pruner(windows: Sequence[Window]) -> Callable[[Any], bool]:
    return tables.hours_overlapping(min(s for s, _ in windows), max(e for _, e in windows))


def window_counts(settings: Settings, engine: DeltaEngine, pipeline: PipelineDef, windows: Sequence[Window],
                  include_late: bool = False) -> Callable[[], Counts]:
    """The windows' counts, as a call the DQ step runs beside Great Expectations. Spark's queries are built here,
    on the calling thread, so that the call only waits on Spark and does not compete with GE for the GIL."""
    queries = _count_queries(settings, engine, pipeline, windows, include_late)
    return lambda: _run_queries(queries)


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
