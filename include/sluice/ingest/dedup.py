"""Dedup: a valid record whose id was already accepted or dead-lettered (within the dedup horizon), or that
has an earlier copy in the same batch, is counted as a duplicate and stored nowhere (SPEC 2)."""

from __future__ import annotations

from typing import Any

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from sluice.config import Settings
from sluice.core.model import StreamSpec
from sluice.ingest.state import StreamState
from sluice.storage import tables
from sluice.storage.engine import DeltaEngine


def seen_in_batch(seen_ids: DataFrame, spec: StreamSpec, *, small: bool = True) -> Any:
    """Flag (``_seen``) the valid records whose id was already accepted or dead-lettered (``seen_ids``:
    one ``id`` column, the text the id was parsed from).

    The look-up goes from the horizon to the batch: every id of the horizon is probed against a hash of
    the batch's ids (broadcast when the batch is ``small``), and only the few that match are joined back.
    The dedup horizon (rate x ``dedup_retention``) is much larger than a steady-state batch, and shuffling
    all of it to join it with the batch cost more than the rest of the batch's work."""

    def transform(df: DataFrame) -> DataFrame:
        id_col = f"_s_{spec.id_field}"
        batch_ids = df.filter(F.col("reason").isNull()).select(F.col(id_col).alias("id"))
        matched = seen_ids.select("id").join(F.broadcast(batch_ids) if small else batch_ids, "id", "left_semi")
        seen = matched.distinct().select(F.col("id").alias("_seen_id"), F.lit(True).alias("_seen"))
        return df.join(seen, df[id_col] == seen["_seen_id"], "left").drop("_seen_id")

    return transform


def mark_duplicates(spec: StreamSpec) -> Any:
    """A valid record is a duplicate when its id was already accepted or dead-lettered (``_seen``, from
    :func:`seen_in_batch`), or an earlier copy exists in this batch (earlier file in arrival order; ties
    broken by the raw line so the choice is deterministic)."""

    def transform(df: DataFrame) -> DataFrame:
        id_col = f"_s_{spec.id_field}"
        candidate = F.col("reason").isNull()
        # Valid copies rank first: a quarantined copy of the id (bad timestamp, early) is not a record, so it
        # must not make the valid one a duplicate - as it cannot when the two land in different triggers.
        # Arrival order is (mtime, path), the order batch ids are given in.
        order = Window.partitionBy(id_col).orderBy(F.col("reason").isNotNull(), "arrival_time", "source_file", "raw")
        ranked = df.withColumn("_rank", F.when(candidate, F.row_number().over(order)))
        is_dup = candidate & ((F.col("_rank") > 1) | F.col("_seen").isNotNull())
        return ranked.withColumn("_duplicate", F.coalesce(is_dup, F.lit(False))).drop("_rank", "_seen")

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
