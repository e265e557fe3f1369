"""What ingest leaves behind per stream: the rows of ops/ingest_batches (one per landing file or heartbeat)
and the stream state derived from them, and the Delta app id that makes each ingest commit exactly once."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

import pyarrow.compute as pc

from sluice.config import Settings
from sluice.storage import tables
from sluice.storage.snapshots import read_small_table


def app_id(stream: str) -> str:
    return f"sluice.ingest.{stream}"


@dataclass
class BatchRow:
    """One row of ops/ingest_batches (a landing file or a heartbeat)."""

    stream: str
    batch_id: int
    lines: int = 0
    accepted: int = 0
    quarantined: int = 0
    late: int = 0
    duplicates: int = 0
    watermark_before: datetime | None = None
    watermark_after: datetime | None = None
    max_event_time: datetime | None = None
    max_arrival_time: datetime | None = None
    source_file: str | None = None
    is_heartbeat: bool = False
    spark_batch_id: int | None = None
    query_id: str | None = None
    # Blank lines of the file: no records, so in none of the counts above (lines = accepted + quarantined + late
    # + duplicates). Last, as in the table's schema: BatchRows are written in field order (ops_rows).
    skipped: int = 0
    # SPEC 4: Kafka offsets lost to retention (issue 57); always 0 for landing files.
    lost: int = 0

    @property
    def unreadable(self) -> bool:
        """A landing file quarantined whole before any Spark batch could read it (``unreadable_file``)."""
        return not self.is_heartbeat and self.spark_batch_id is None and self.source_file is not None


@dataclass
class StreamState:
    """What earlier batches of a stream left behind, derived from its ops/ingest_batches rows."""

    rows: list[BatchRow] = field(default_factory=list)

    def before(self, batch_id: int) -> StreamState:
        return StreamState([r for r in self.rows if r.batch_id < batch_id])

    @property
    def last_batch_id(self) -> int:
        return max((r.batch_id for r in self.rows), default=-1)

    @property
    def watermark(self) -> datetime | None:
        # The watermark never moves backwards: it is the max over every batch ever committed.
        return max((r.watermark_after for r in self.rows if r.watermark_after), default=None)

    @property
    def max_event_time(self) -> datetime | None:
        return max((r.max_event_time for r in self.rows if r.max_event_time), default=None)

    @property
    def last_arrival(self) -> datetime | None:
        return max((r.max_arrival_time for r in self.rows if r.max_arrival_time), default=None)

    def totals(self) -> dict[str, int]:
        keys = ("lines", "accepted", "quarantined", "late", "duplicates")
        return {k: sum(getattr(r, k) for r in self.rows) for k in keys}


def load_state(settings: Settings, stream: str) -> StreamState:
    """Read the stream's ops rows. ops/ingest_batches is metadata-sized (one row per file), so it is read
    on the driver directly with delta-rs rather than through a Spark job."""
    data = read_small_table(tables.INGEST_BATCHES.path(settings))
    if data is None:
        return StreamState()
    table = data.filter(pc.field("stream") == stream)
    names = {f.name for f in tables.INGEST_BATCHES.schema.fields}
    rows = [BatchRow(**{k: v for k, v in r.items() if k in names}) for r in table.to_pylist()]
    for row in rows:
        row.skipped = row.skipped or 0  # null in rows written before the column existed
        row.lost = row.lost or 0
    return StreamState(sorted(rows, key=lambda r: r.batch_id))


def ops_rows(rows: Iterable[BatchRow]) -> list[tuple[Any, ...]]:
    """BatchRows as ops/ingest_batches rows."""
    return [tuple(asdict(r).values()) for r in rows]
