"""The time rules of ingest (SPEC 3): the early rule, file watermarks, lateness, and heartbeats.

What a *micro-batch* means here. Spark may group many files into one trigger (``max_files_per_trigger``)
for throughput, but the time semantics are applied per landing file, in arrival order (file mtime, then
path) - exactly what Spark's own rule gives with one file per trigger. So results never depend on how
files were grouped into triggers.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

from pyspark.sql import Column
from pyspark.sql import functions as F

from sluice.core.model import StreamSpec
from sluice.ingest.files import source_key
from sluice.ingest.state import BatchRow, StreamState
from sluice.ingest.topics import is_kafka_address

log = logging.getLogger("sluice.ingest")


def early_bound(spec: StreamSpec) -> Column:
    """The early rule: a record whose event time is past this bound (its file's arrival time +
    ``early_tolerance``) is quarantined ``early`` and never advances the watermark."""
    return F.col("arrival_time") + F.expr(
        f"make_dt_interval(0, 0, 0, {spec.early_tolerance.total_seconds()})"
    )


def _max(a: datetime | None, b: datetime | None) -> datetime | None:
    if a is None:
        return b
    if b is None:
        return a
    return max(a, b)


def file_watermarks(
    per_file_max: Sequence[tuple[int, datetime | None]], start: datetime | None, delay: timedelta
) -> dict[int, tuple[datetime | None, datetime | None]]:
    """Spark's watermark rule applied file by file: a file is judged against the max event time accepted
    in *earlier* files (minus the delay), and the watermark never moves backwards.

    Late records cannot raise the max (they are below a watermark that is already <= the max), so the
    max over all non-duplicate valid records of a file equals the max over its accepted ones; that is
    what lets this run without first knowing which records are late."""
    out: dict[int, tuple[datetime | None, datetime | None]] = {}
    watermark = start
    for seq, max_event in sorted(per_file_max, key=lambda item: item[0]):
        before = watermark
        if max_event is not None:
            watermark = _max(watermark, max_event - delay)
        out[seq] = (before, watermark)
    return out


def heartbeat(spec: StreamSpec, state: StreamState, now: datetime) -> BatchRow | None:
    """SPEC 3: a stream is idle when now - latest arrival >= idle_timeout; it then gets a heartbeat at
    event time now - idle_timeout, recorded after this cycle's files, which advances the watermark as
    a record would. A heartbeat that would not move the watermark is pointless and is not stored: None."""
    last = state.last_arrival
    if last is None:
        # A stream that has never received a file is not idle: it has no clock yet. A heartbeat at
        # wall-clock time would move its watermark to today, and the history its producer lands first
        # (event times of last year) would all be late. It holds its pipelines' windows open instead.
        log.info("%s: no file has arrived yet; no watermark, no heartbeat", spec.name)
        return None
    if now - last < spec.idle_timeout:
        return None
    event_time = now - spec.idle_timeout
    watermark = state.watermark
    after = event_time - spec.watermark_delay
    if watermark is not None and after <= watermark:
        return None
    return BatchRow(
        stream=spec.name,
        batch_id=state.last_batch_id + 1,
        watermark_before=watermark,
        watermark_after=_max(watermark, after),
        max_event_time=event_time,
        is_heartbeat=True,
    )


def all_late(row: BatchRow) -> bool:
    """A landing file every line of which was late: most likely a producer replaying history, or a clock
    gone wrong, rather than a few stragglers."""
    return not row.is_heartbeat and row.lines > 0 and row.late == row.lines


def all_late_message(row: BatchRow) -> str:
    mark = row.watermark_before.strftime("%Y-%m-%dT%H:%M:%SZ") if row.watermark_before else "-"
    return (f"file {Path(source_key(row.source_file or '')).name}: {row.late} of {row.lines} lines late "
            f"(watermark {mark}); is the producer replaying history?")


def arrived_after(batches: Mapping[str, Sequence[BatchRow]], now: datetime) -> list[BatchRow]:
    """The landing files of these batches (of one run, per stream) whose arrival time is after ``now``: taken
    in the cycle that found them, under their own arrival time (SPEC 3), most likely because ``--now`` (or
    ``SLUICE_NOW``) lies behind the files, or a producer's clock runs ahead."""
    return [r for rows in batches.values() for r in rows
            if not r.is_heartbeat and r.max_arrival_time is not None and r.max_arrival_time > now]


def arrived_after_message(rows: Sequence[BatchRow], now: datetime) -> str:
    """One line for all of them: ``3 files arrived after now (...); was --now meant?``."""

    def stamp(ts: datetime) -> str:
        return ts.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    latest = max(r.max_arrival_time for r in rows if r.max_arrival_time is not None)
    if all(is_kafka_address(r.source_file) for r in rows):
        # A Kafka micro-batch is not a file: its records carry the broker's arrival stamps.
        batches = "1 Kafka micro-batch" if len(rows) == 1 else f"{len(rows)} Kafka micro-batches"
        return (f"{batches} held records that arrived after now ({stamp(now)}; the latest at {stamp(latest)}), "
                "taken under their own arrival time; was --now meant?")
    files = "1 file" if len(rows) == 1 else f"{len(rows)} files"
    return (f"{files} arrived after now ({stamp(now)}; the latest at {stamp(latest)}) and "
            f"{'was' if len(rows) == 1 else 'were'} taken under {'its' if len(rows) == 1 else 'their'} own arrival "
            "time; was --now meant?")
