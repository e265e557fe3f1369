"""Every Delta table sluice owns: its path under the lake, its schema and its partitioning (SPEC section 4).

Column names are part of the contract that acceptance tests read, so they live here and nowhere else.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from pyspark.sql.types import (
    BooleanType,
    DataType,
    DateType,
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from sluice.core.model import EVENT_TIME, StreamSpec

if TYPE_CHECKING:
    from sluice.config import Settings
    from sluice.storage.engine import DeltaEngine


@dataclass(frozen=True)
class TableDef:
    """A Delta table: where it lives (relative to the lake), its schema and partition columns."""

    name: str
    schema: StructType
    partition_by: tuple[str, ...] = ()

    def path(self, settings: Settings) -> str:
        """The table's URI (a local path for a local lake)."""
        return settings.lake.table(self.name)


def _fields(*pairs: tuple[str, object]) -> list[StructField]:
    return [StructField(name, dtype, True) for name, dtype in pairs]  # type: ignore[arg-type]


SPARK_TYPES: dict[str, DataType] = {
    "string": StringType(),
    "long": LongType(),
    "double": DoubleType(),
    "boolean": BooleanType(),
    "timestamp": TimestampType(),
}


def payload_fields(spec: StreamSpec) -> list[StructField]:
    """The stream's own fields with their declared types; event_time normalised to UTC."""
    return [StructField(f, SPARK_TYPES[spec.type_of(f)], True) for f in spec.fields]


_LINEAGE = _fields(
    ("arrival_time", TimestampType()),
    ("source_file", StringType()),
    ("ingest_batch_id", LongType()),
)

# Bronze is partitioned by event hour so that dedup lookups, backfills and windows prune to the hours
# they touch instead of scanning the stream's whole history.
EVENT_PARTITIONS = ("event_date", "event_hour")


def bronze(spec: StreamSpec) -> TableDef:
    schema = StructType(
        [
            *payload_fields(spec),
            *_LINEAGE,
            StructField("is_heartbeat", BooleanType(), False),
            StructField("event_date", DateType(), True),
            StructField("event_hour", IntegerType(), True),
        ]
    )
    return TableDef(f"bronze/{spec.name}", schema, EVENT_PARTITIONS)


def quarantine(spec: StreamSpec) -> TableDef:
    schema = StructType(
        _fields(
            ("raw", StringType()),
            ("source_file", StringType()),
            ("reason", StringType()),
            ("detail", StringType()),
            ("arrival_time", TimestampType()),
            ("ingest_batch_id", LongType()),
            # The line of source_file (1-based, blank lines counted, as an editor shows it); null for a file
            # quarantined whole (unreadable_file). Added after the first release: null in older rows.
            ("line_number", LongType()),
        )
    )
    return TableDef(f"quarantine/{spec.name}", schema)


def dlq(spec: StreamSpec) -> TableDef:
    # A stream with substreams (SPEC 3): `watermark` is the E_k the record missed, `substream` its key as text.
    keyed = _fields(("substream", StringType())) if spec.substream else []
    schema = StructType(
        [
            *payload_fields(spec),
            *_fields(("watermark", TimestampType())),
            *keyed,
            *_LINEAGE,
            *_fields(("raw", StringType())),
        ]
    )
    return TableDef(f"dlq/{spec.name}", schema)


def substreams(spec: StreamSpec) -> TableDef:
    """A stream's substream watermarks (SPEC 3): per ingest batch, the largest accepted event time of each
    substream that batch accepted records of. One commit per batch group (the same app transaction as its bronze
    rows), so the state a batch was judged by is the rows of earlier batches, after a crash too; earlier groups'
    rows are collapsed now and then (sluice.ingest.substreams.record_maxima). ``W_k`` is the max per key minus
    ``watermark_delay``; the key is kept as text."""
    schema = StructType(_fields(
        ("substream", StringType()),
        ("max_event_time", TimestampType()),
        ("max_arrival_time", TimestampType()),
        ("ingest_batch_id", LongType()),
    ))
    return TableDef(f"substreams/{spec.name}", schema)


INGEST_BATCHES = TableDef(
    "ops/ingest_batches",
    StructType(
        _fields(
            ("stream", StringType()),
            ("batch_id", LongType()),
            ("lines", LongType()),
            ("accepted", LongType()),
            ("quarantined", LongType()),
            ("late", LongType()),
            ("duplicates", LongType()),
            ("watermark_before", TimestampType()),
            ("watermark_after", TimestampType()),
            # Beyond the SPEC minimum: what lets `status`, restarts and heartbeats reason about a batch.
            ("max_event_time", TimestampType()),
            ("max_arrival_time", TimestampType()),
            ("source_file", StringType()),
            ("is_heartbeat", BooleanType()),
            ("spark_batch_id", LongType()),
            ("query_id", StringType()),
            # Blank lines (empty or whitespace only) of the file: no records, so not in `lines` (SPEC 2).
            # Added after the first release: null in older rows.
            ("skipped", LongType()),
            # SPEC 4: offsets of a Kafka topic lost to retention (0 for files). Null in older rows.
            ("lost", LongType()),
        )
    ),
)

# Heartbeat rows carry string keys with this prefix (see sluice.ingest); user code never sees them.
HEARTBEAT_PREFIX = "__heartbeat__"

QUARANTINE_REASONS = (
    "malformed_json", "missing_field", "bad_timestamp", "bad_type", "early", "bad_encoding", "unreadable_file",
)


def stream_tables(spec: StreamSpec) -> list[TableDef]:
    return [bronze(spec), quarantine(spec), dlq(spec), *([substreams(spec)] if spec.substream else [])]


def all_ingest_tables(settings: Settings) -> list[TableDef]:
    tables = [INGEST_BATCHES]
    for spec in settings.streams.values():
        tables.extend(stream_tables(spec))
    return tables


DQ_RESULTS = TableDef(
    "ops/dq_results",
    StructType(
        _fields(
            ("pipeline", StringType()),
            ("window_start", TimestampType()),
            ("window_end", TimestampType()),
            ("expectation", StringType()),
            ("observed_value", StringType()),
            ("success", BooleanType()),
            ("validated_at", TimestampType()),
            ("docs_path", StringType()),
        )
    ),
)

ALERTS = TableDef(
    "ops/alerts",
    StructType(
        _fields(
            ("pipeline", StringType()),
            ("window_start", TimestampType()),
            ("window_end", TimestampType()),
            ("raised_at", TimestampType()),
            ("message", StringType()),
            # "pending" until delivered; then the channels that took it ("none": no channel configured).
            ("channels", StringType()),
            ("failed_expectations", StringType()),
            # The outbox key: (pipeline, window, kind, attempt), also as one stable string, alert_id.
            ("kind", StringType()),
            ("attempt", LongType()),
            ("alert_id", StringType()),
            ("level", StringType()),
            ("docs_url", StringType()),
            ("delivered_at", TimestampType()),
        )
    ),
)


def partition_hour(values: Mapping[str, Any]) -> datetime | None:
    """The event hour of a bronze partition (``event_date``, ``event_hour``), or None for null partitions."""
    if values.get("event_date") is None:
        return None
    return datetime.combine(values["event_date"], datetime.min.time(), UTC) + timedelta(hours=int(values["event_hour"]))


def is_ops_table(path: str | Path) -> bool:
    """One of the small ``ops/*`` tables (ingest batches, ledger, DQ results, alerts), whose rows the driver
    builds and commits with delta-rs whatever the engine of the tables Spark writes."""
    return PurePosixPath(str(path)).parent.name == "ops"


def table_properties(settings: Settings) -> dict[str, str]:
    """The Delta table properties every sluice table is created with, as Delta readers expect them:

    * deleted files are kept exactly as long as ``sluice_maintenance``'s VACUUM keeps them
      (``vacuum_retention_hours``), so every reader agrees on how far time travel reaches;
    * the log is kept at least 30 days, and never less than that: versions stay listable after their files
      are vacuumed, for ``DESCRIBE HISTORY`` and audits;
    * a checkpoint every 10 commits: the ops tables and bronze are committed every cycle and read on every
      cycle, and a checkpoint keeps the log tail a reader replays short (delta-rs writes it after the
      commit that reaches the interval)."""
    hours = settings.vacuum_retention_hours
    return {
        "delta.deletedFileRetentionDuration": f"interval {hours} hours",
        "delta.logRetentionDuration": f"interval {max(hours, 30 * 24)} hours",
        "delta.checkpointInterval": "10",
    }


def ensure_stream_tables(engine: DeltaEngine, settings: Settings, spec: StreamSpec) -> None:
    """A stream's tables (bronze, quarantine, dlq, its substreams' if any, and ops/ingest_batches): made by
    ingest before its first write, so that a cycle with nothing to write creates none (and starts no JVM:
    delta-spark creates the tables Spark writes), and by a Spark reader of a stream that never received a file (a
    backfill over it reads nothing)."""
    for table in (INGEST_BATCHES, *stream_tables(spec)):
        engine.ensure_table(table.path(settings), table.schema, table.partition_by)


def bronze_hours(path: str) -> dict[datetime, int]:
    """Event hours present in a bronze table and their record counts (heartbeats included), from the
    partition values and file statistics in the Delta log: no data file is read."""
    from sluice.storage.snapshots import live_files

    hours: dict[datetime, int] = {}
    for file in live_files(path):
        hour = partition_hour(file.partition)
        if hour is not None:
            hours[hour] = hours.get(hour, 0) + (file.records or 0)
    return hours


def bronze_rows_between(path: str, lo: datetime | None, hi: datetime | None) -> int | None:
    """Records (heartbeats included) of a bronze table's event hours that overlap ``[lo, hi)``, from the file
    statistics in the Delta log: what a read pruned by :func:`hours_overlapping` scans. None when a file of
    those hours has no statistics."""
    from sluice.storage.snapshots import live_files

    overlaps = hours_overlapping(lo, hi)
    counts = [file.records for file in live_files(path) if overlaps(file.partition)]
    return None if None in counts else sum(n for n in counts if n is not None)


def first_event_time(path: str) -> datetime | None:
    """The earliest event time a bronze table holds (heartbeats included), from the file statistics in the
    Delta log, or a file's event hour where the writer kept none: no data file is read. None when empty."""
    from sluice.storage.snapshots import live_files

    firsts = []
    for file in live_files(path):
        first = file.minimum.get(EVENT_TIME)
        firsts.append(first.astimezone(UTC) if isinstance(first, datetime) else partition_hour(file.partition))
    return min((f for f in firsts if f is not None), default=None)


def hours_overlapping(lo: datetime | None, hi: datetime | None) -> Callable[[Mapping[str, Any]], bool]:
    """Partition predicate: bronze hours that overlap ``[lo, hi)`` (None = unbounded). Callers still filter
    rows on event_time; this only decides which files are read."""

    def accept(values: Mapping[str, Any]) -> bool:
        hour = partition_hour(values)
        if hour is None:
            return True
        return (lo is None or hour + timedelta(hours=1) > lo) and (hi is None or hour < hi)

    return accept
