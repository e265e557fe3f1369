"""Spark helpers that need no settings: driver-held rows as DataFrames, and collected times as aware UTC.

The session itself is built from the settings at the edge of a run (:mod:`sluice.runtime.spark`)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType, _parse_datatype_string


def collected_utc(value: datetime) -> datetime:
    """A timestamp from ``collect()`` as aware UTC. PySpark returns naive datetimes in the process's local
    zone, and ``astimezone`` reads a naive value as local time, which is exactly what Spark produced."""
    return value.astimezone(UTC)


def local_frame(spark: SparkSession, rows: Iterable[Sequence[Any]], schema: StructType | str) -> DataFrame:
    """A DataFrame of rows the driver holds (ops rows, window bounds, a batch's files), handed to the JVM as Arrow.

    Not ``spark.createDataFrame(rows, schema)``: from a Python list, PySpark re-serializes the rows through an RDD
    ``map``, so every task that reads the frame runs in a Python worker process (forked, fed and reaped per job):
    about 0.15 s per small frame on a warm local session against 0.03 s this way, and a Python on every executor
    of a cluster for rows that never needed one. Arrow record batches are read by the JVM itself. A schema that
    Arrow cannot carry (none of sluice's own tables) takes PySpark's list path."""
    struct = _parse_datatype_string(schema) if isinstance(schema, str) else schema
    assert isinstance(struct, StructType), schema
    data = [tuple(row) for row in rows]
    try:
        arrow_schema = to_arrow_schema(struct, timezone="UTC")
    except TypeError:  # PySpark's error for a type without an Arrow mapping (e.g. an interval)
        return spark.createDataFrame(data, struct)
    table = pa.Table.from_pylist([dict(zip(struct.names, row, strict=True)) for row in data], schema=arrow_schema)
    return spark.createDataFrame(table, schema=struct)
