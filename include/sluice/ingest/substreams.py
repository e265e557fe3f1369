"""Lateness per substream (SPEC 3, "Substreams"): a watermark per key, for producers whose clocks disagree.

For a record of substream ``k`` in a landing file (or Kafka micro-batch) ``s``:

- ``W_k`` is the largest event time of ``k``'s records accepted in earlier micro-batches, minus
  ``watermark_delay``: those of earlier batch groups from ``substreams/<stream>`` (rows of batches before this
  group only, so a group replayed after a crash is judged by the same state), and those of the group's own
  earlier files by a running maximum per key in file order;
- ``F`` is the stream's floor before ``s``: its watermark before ``s`` (largest event time minus
  ``watermark_delay``) plus ``watermark_delay``, minus ``skew_tolerance``;
- the record is late when its event time is below ``E_k = max(W_k, F)`` (only ``F`` for a new key).

The running maximum takes every valid, non-duplicate record of ``k``, late ones too. That gives the same ``E_k``
as accepted records alone: a late record above ``k``'s maximum was late by ``F`` alone, so the ``W_k`` it makes
stays below ``F``, which never goes down. The state stored for later groups is of accepted records alone.

Everything is a narrow aggregation per (key, file), one window per key over it and joins: no per-key loop on the
driver, the batch's wide records are never shuffled for it, and a key that sent nothing costs nothing but its row
in the state table.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pyarrow as pa
from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from sluice.config import Settings
from sluice.core.model import StreamSpec
from sluice.core.spark import local_frame
from sluice.storage import snapshots, tables
from sluice.storage.engine import DeltaEngine

# The key of a record as text, in the frames of a micro-batch.
KEY = "_substream"


def minus(column: Column, delta: timedelta) -> Column:
    return column - F.expr(f"INTERVAL {delta // timedelta(microseconds=1)} MICROSECONDS")


def plus(column: Column, delta: timedelta) -> Column:
    return column + F.expr(f"INTERVAL {delta // timedelta(microseconds=1)} MICROSECONDS")


def key_of(spec: StreamSpec) -> Column:
    assert spec.substream is not None
    return F.col(f"_v_{spec.substream}").cast("string")


#: Up to this many (substream, file) pairs that hold a late record are broadcast to the batch's
#: records; more (a device whose clock is far behind sends many) are joined by a shuffle.
BROADCAST_PAIRS = 200_000


@dataclass(frozen=True)
class Judged:
    """A micro-batch judged per substream: ``frame`` as :func:`judge_by_substream` says, ``pairs`` the cached
    (key, file) pairs that hold a late record (released by the caller once the batch is written), and their
    number: with none, no record of the batch is late."""

    frame: DataFrame
    pairs: DataFrame
    flagged: int


def judge_by_substream(settings: Settings, engine: DeltaEngine, spec: StreamSpec, final: DataFrame,
                       first_id: int) -> Judged:
    """``final`` (a micro-batch's lines with their file's ``_file_seq`` and stream watermark ``_wm_before``) with
    its key in :data:`KEY` and ``_wm_before`` replaced by the watermark that judges each record: ``E_k`` for the
    records of a (key, file) pair that holds a late record, and ``F`` for the others, whose every candidate is at
    or above ``E_k >= F`` and so accepted either way.

    The candidates are judged on a narrow frame (key, file and event time), never by moving the batch's wide
    records; the few pairs that hold a late record then join them.
    """
    assert spec.skew_tolerance is not None
    final = final.withColumn(KEY, key_of(spec))
    candidate = F.col("reason").isNull() & ~F.col("_duplicate")
    floor = minus(plus(F.col("_wm_before"), spec.watermark_delay), spec.skew_tolerance)
    # The largest candidate event time of the key in the group's earlier files (range -1: every file before this
    # one, none of this one), beside the stored maxima of earlier groups: one window over the candidates' keys,
    # files and times alone.
    earlier_files = Window.partitionBy(KEY).orderBy("_file_seq").rangeBetween(Window.unboundedPreceding, -1)
    state = stored_maxima(settings, engine, spec, before_batch=first_id).select(KEY, "_k_stored_max")
    own = minus(F.greatest("_k_group_max", "_k_stored_max"), spec.watermark_delay)
    pairs = (final.filter(candidate).select(KEY, "_file_seq", "event_time", floor.alias("_floor"))
             .withColumn("_k_group_max", F.max("event_time").over(earlier_files))
             .join(state, KEY, "left")
             .withColumn("_e_k", F.greatest(own, F.col("_floor")))
             .filter(F.col("event_time") < F.col("_e_k"))
             .select(KEY, "_file_seq", "_e_k").distinct()
             .persist(StorageLevel.MEMORY_AND_DISK))
    flagged = pairs.count()
    if not flagged:
        # Every candidate is at or above its E_k: no record is late.
        return Judged(final.withColumn("_wm_before", floor), pairs, 0)
    judged = F.broadcast(pairs) if flagged <= BROADCAST_PAIRS else pairs
    final = (final.join(judged, [KEY, "_file_seq"], "left")
             .withColumn("_wm_before", F.coalesce(F.col("_e_k"), floor))
             .drop("_e_k"))
    return Judged(final, pairs, flagged)


def stored_maxima(settings: Settings, engine: DeltaEngine, spec: StreamSpec,
                  before_batch: int | None = None) -> DataFrame:
    """Per substream key (:data:`KEY`): the largest accepted event time (``_k_stored_max``) and arrival time
    (``_k_last_arrival``) of the batches before ``before_batch`` (all when None)."""
    table = tables.substreams(spec)
    if not snapshots.exists(table.path(settings)):
        # The stream's tables are made beside its first batch's parse (StreamIngest.start_tables): no state yet.
        return local_frame(engine.spark, [], f"{KEY} string, _k_stored_max timestamp, _k_last_arrival timestamp")
    rows = engine.read(table.path(settings))
    if before_batch is not None:
        rows = rows.filter(F.col("ingest_batch_id") < before_batch)
    return rows.groupBy(F.col("substream").alias(KEY)).agg(
        F.max("max_event_time").alias("_k_stored_max"), F.max("max_arrival_time").alias("_k_last_arrival"))


def accepted_maxima(accepted: DataFrame, last_id: int) -> DataFrame:
    """The rows a batch group adds to ``substreams/<stream>``: per key of its accepted records, their largest event
    and arrival times, under the group's last batch id."""
    return (accepted.groupBy(F.col(KEY).alias("substream"))
            .agg(F.max("event_time").alias("max_event_time"), F.max("arrival_time").alias("max_arrival_time"))
            .withColumn("ingest_batch_id", F.lit(last_id).cast("long"))
            .coalesce(1).sortWithinPartitions("substream"))


def substream_maxima(settings: Settings, spec: StreamSpec) -> pa.Table | None:
    """On the driver, without Spark (status, the ledger page, freshness): one row per substream, ``substream``,
    ``max_event_time`` and ``max_arrival_time`` (None before the stream's tables exist)."""
    data = snapshots.dataset(tables.substreams(spec).path(settings))
    if data is None:
        return None
    rows = data.to_table(columns=["substream", "max_event_time", "max_arrival_time"])
    grouped = rows.group_by("substream").aggregate([("max_event_time", "max"), ("max_arrival_time", "max")])
    return grouped.rename_columns(["substream", "max_event_time", "max_arrival_time"])


#: Once the state table has this many files, a batch group's commit collapses it to one row per substream.
COMPACT_FILES = 32


def record_maxima(settings: Settings, engine: DeltaEngine, spec: StreamSpec, accepted: DataFrame, last_id: int,
                  app_id: str, metadata: Mapping[str, Any]) -> None:
    """Append a batch group's rows to ``substreams/<stream>`` (app transaction ``(app_id, last_id)``, after its
    bronze rows), and every :data:`COMPACT_FILES` files collapse the rows of earlier groups to one per substream
    (the largest times, the latest batch id), so reading the state costs what the number of substreams costs, not
    the number of batches. The group's own rows stay as they are: a replay of it after a crash reads the rows
    before its first batch id, which the collapsed rows all are."""
    path = tables.substreams(spec).path(settings)
    engine.append(accepted_maxima(accepted, last_id), path, app_id=app_id, version=last_id, metadata=metadata)
    if len(snapshots.live_files(path)) < COMPACT_FILES:
        return
    rows = engine.read(path)
    earlier = (rows.filter(F.col("ingest_batch_id") != last_id).groupBy("substream")
               .agg(*(F.max(c).alias(c) for c in ("max_event_time", "max_arrival_time", "ingest_batch_id"))))
    own = rows.filter(F.col("ingest_batch_id") == last_id)
    collapsed = earlier.unionByName(own).coalesce(1).sortWithinPartitions("ingest_batch_id", "substream")
    collapsed = collapsed.localCheckpoint()
    engine.overwrite(collapsed, path, app_id=f"{app_id}.compact", version=last_id,
                     metadata={**metadata, "compacted": True})
