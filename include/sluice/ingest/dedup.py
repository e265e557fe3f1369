"""Dedup: a valid record whose id was already accepted or dead-lettered (within the dedup horizon), or that
has an earlier copy in the same batch, is counted as a duplicate and stored nowhere (SPEC 2)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from sluice.config import Settings
from sluice.core.model import StreamSpec
from sluice.ingest.state import StreamState
from sluice.storage import tables
from sluice.storage.engine import DeltaEngine

# Arrival order for landing files: (mtime, path), the order batch ids are given in; the raw line breaks ties.
FILE_ORDER = ("arrival_time", "source_file", "raw")


def duplicate_lines(df: DataFrame, seen_ids: DataFrame | None, spec: StreamSpec, line_id: str, *,
                    small: bool = True, order: Sequence[str] | None = None) -> DataFrame:
    """The lines (``line_id``) of ``df`` that are duplicates: valid records whose id was already accepted or
    dead-lettered (``seen_ids``: one ``id`` column, the text the id was parsed from; None when no earlier batch
    accepted or dead-lettered anything), or that have an earlier valid copy in this batch (earlier file in
    arrival order; ties broken by the raw line so that the choice is deterministic; ``order`` names other
    columns for that order, such as a Kafka record's timestamp, partition and offset). A quarantined copy of an
    id (bad timestamp, early) is not a record: it never makes a valid one a duplicate, as it cannot when the
    two land in different triggers.

    Only the ids are shuffled to find those with several valid copies, and only the rows of those ids (and of
    ids seen before) are ranked: most ids of a batch are unique, and ranking every row by a window over the
    whole batch shuffled and sorted all of it. The look-up of earlier ids goes from the horizon to the batch:
    every id of the horizon is probed against a hash of the batch's ids (broadcast when the batch is
    ``small``), and only the few that match are joined back; the dedup horizon (rate x ``dedup_retention``)
    is much larger than a steady-state batch."""
    id_col = f"_s_{spec.id_field}"
    valid = df.filter(F.col("reason").isNull())
    ids = valid.select(F.col(id_col).alias("id"))
    several = ids.groupBy("id").agg(F.count(F.lit(1)).alias("_n")).filter(F.col("_n") > 1).select(
        "id", F.lit(False).alias("_seen"))
    suspects = several
    if seen_ids is not None:
        matched = seen_ids.select("id").join(F.broadcast(ids) if small else ids, "id", "left_semi").distinct()
        suspects = suspects.unionByName(matched.select("id", F.lit(True).alias("_seen")))
    suspects = suspects.groupBy("id").agg(F.max("_seen").alias("_seen"))
    columns = list(order or FILE_ORDER)
    first = Window.partitionBy("id").orderBy(*columns)
    # The suspects are few (about 1% of a batch's ids are duplicates): broadcast, so that only their rows are
    # ranked, where a sort-merge join shuffled every valid row of the batch to find them.
    ranked = valid.select(F.col(id_col).alias("id"), *columns, line_id).join(
        F.broadcast(suspects), "id").withColumn("_rank", F.row_number().over(first))
    return ranked.filter(F.col("_seen") | (F.col("_rank") > 1)).select(line_id)


def mark_duplicates(duplicates: DataFrame, line_id: str) -> Any:
    """Flag (``_duplicate``) the lines that :func:`duplicate_lines` found (a small frame, broadcast)."""

    def transform(df: DataFrame) -> DataFrame:
        flagged = duplicates.select(line_id, F.lit(True).alias("_duplicate"))
        return df.join(F.broadcast(flagged), line_id, "left").withColumn(
            "_duplicate", F.coalesce(F.col("_duplicate"), F.lit(False)))

    return transform


def seen_ids(
    engine: DeltaEngine, settings: Settings, spec: StreamSpec, prior: StreamState, first_id: int
) -> DataFrame:
    """Ids that were accepted or dead-lettered before this batch, within the dedup horizon.

    The horizon (watermark - dedup_retention) is the memory bound of dedup: bronze is partitioned by
    event hour, so only the hours inside the horizon are read."""
    horizon = prior.watermark - settings.dedup_retention if prior.watermark else None

    in_horizon = tables.hours_overlapping(horizon, None)

    id_field = spec.id_field
    bronze = engine.read(tables.bronze(spec).path(settings), files=in_horizon)
    dlq = engine.read(tables.dlq(spec).path(settings))
    keep = F.col("ingest_batch_id") < first_id
    if horizon is not None:
        keep = keep & (F.col("event_time") >= F.lit(horizon))
    # Ids are compared as the text they were parsed from (bronze holds the declared type).
    ids = F.col(id_field).cast("string").alias("id")
    return bronze.filter(keep & ~F.col("is_heartbeat")).select(ids).unionByName(dlq.filter(keep).select(ids))
