"""The transforms of the shipped pipelines: small typed DataFrame -> DataFrame steps.

They work unchanged on streaming and batch DataFrames: ``withWatermark`` and
``dropDuplicatesWithinWatermark`` are no-ops / plain dedup in batch, and the stream-stream joins are
ordinary time-bounded joins there.

Heartbeats are NOT filtered here, on purpose. A filter that does not reference the event-time column is
pushed below ``withWatermark`` by Spark, which would hide heartbeats from the watermark; and a join infers
not-null filters on its keys. Heartbeats therefore carry non-null sentinel keys (distinct per stream, so
they never match each other) through every stateful operator and are dropped at the sink.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from sluice.config import StreamSpec
from sluice.pipelines.base import Inputs, WindowSpec, spark_interval
from sluice.tables import HEARTBEAT_PREFIX

Transform = Callable[[DataFrame], DataFrame]

CLICK_JOIN_BOUND = timedelta(minutes=30)


def watermarked(spec: StreamSpec, time_column: str = "event_time") -> Transform:
    """Spark's watermark for the stream, with the stream's configured delay."""

    def transform(df: DataFrame) -> DataFrame:
        return df.withWatermark(time_column, spark_interval(spec.watermark_delay))

    return transform


def dedup_within_watermark(*keys: str) -> Transform:
    """Bronze is already deduplicated; this guards the query against a replayed bronze commit, with state
    bounded by the watermark."""

    def transform(df: DataFrame) -> DataFrame:
        # Batch (backfills) has no watermark: plain dedup on the same keys is the same rule there.
        if df.isStreaming:
            return df.dropDuplicatesWithinWatermark(list(keys))
        return df.dropDuplicates(list(keys))

    return transform


def impressions_side(spec: StreamSpec) -> Transform:
    def transform(df: DataFrame) -> DataFrame:
        return (
            df.select("impression_id", "ad_id", F.col("event_time").alias("impression_time"))
            .transform(watermarked(spec, "impression_time"))
            .transform(dedup_within_watermark("impression_id"))
        )

    return transform


def clicks_side(spec: StreamSpec) -> Transform:
    def transform(df: DataFrame) -> DataFrame:
        return (
            df.select(
                "click_id",
                F.col("impression_id").alias("click_impression_id"),
                F.col("ad_id").alias("click_ad_id"),
                F.col("event_time").alias("click_time"),
            )
            .transform(watermarked(spec, "click_time"))
            .transform(dedup_within_watermark("click_id"))
        )

    return transform


def click_matches_impression(bound: timedelta = CLICK_JOIN_BOUND) -> Column:
    """SPEC 4: ids agree and impression.event_time <= click.event_time <= impression.event_time + 30 min."""
    return (
        (F.col("click_impression_id") == F.col("impression_id"))
        & (F.col("click_time") >= F.col("impression_time"))
        & (F.col("click_time") <= F.col("impression_time") + F.expr(f"INTERVAL {int(bound.total_seconds())} SECONDS"))
    )


def ad_clicks(inputs: Inputs, window: WindowSpec) -> DataFrame:
    """Impressions LEFT JOIN matched clicks, then per impression (so an impression with several clicks is
    one impression; streaming has no countDistinct), then per window and ad."""
    impressions = inputs["impressions"]
    clicks = inputs["clicks"]
    joined = impressions.join(clicks, click_matches_impression(), "leftOuter")
    per_impression = (
        joined.filter(window.keep(F.col("impression_time")))
        .groupBy(window.column("impression_time"), "impression_id", "ad_id")
        .agg(F.count("click_id").alias("clicks"))
    )
    return per_impression.groupBy("window", "ad_id").agg(
        F.count(F.lit(1)).alias("impressions"), F.sum("clicks").alias("clicks")
    )


def unmatched_clicks(inputs: Inputs, window: WindowSpec) -> DataFrame:
    """Clicks LEFT JOIN impressions; a click with no match is counted in the window of its own event time,
    under its own ad_id, so no click is ever lost."""
    impressions = inputs["impressions"]
    clicks = inputs["clicks"]
    joined = clicks.join(impressions, click_matches_impression(), "leftOuter")
    return (
        joined.filter(F.col("impression_id").isNull() & window.keep(F.col("click_time")))
        .groupBy(window.column("click_time"), F.col("click_ad_id").alias("ad_id"))
        .agg(F.count(F.lit(1)).alias("unmatched_clicks"))
    )


def events_side(spec: StreamSpec) -> Transform:
    def transform(df: DataFrame) -> DataFrame:
        return (
            df.select("event_id", "user_id", "event_time")
            .transform(watermarked(spec))
            .transform(dedup_within_watermark("event_id"))
        )

    return transform


TEN_MINUTES = WindowSpec(timedelta(minutes=10))


def user_activity(inputs: Inputs, window: WindowSpec) -> DataFrame:
    """Chained window aggregations: events per user per 10-min window, then the average of those counts
    per user over the hour, taken over the 10-min windows that have events."""
    per_10min = (
        inputs["events"].groupBy(TEN_MINUTES.column("event_time"), "user_id").agg(F.count(F.lit(1)).alias("events"))
    )
    # A 10-min window belongs to the hourly window its start falls in (only matters for windows with gaps).
    return (
        per_10min.filter(window.keep(F.col("window.start")))
        .groupBy(window.column(F.col("window")), "user_id")
        .agg(F.avg("events").alias("avg_events_per_10min"))
    )


def with_ctr(df: DataFrame) -> DataFrame:
    """ctr = clicks / impressions, or null when there are no impressions."""
    return df.withColumn(
        "ctr",
        F.when(F.col("impressions") > 0, F.col("clicks").cast("double") / F.col("impressions")),
    )


def without_heartbeats(key: str) -> Transform:
    """Drop heartbeat groups at the sink (see the module docstring for why not earlier)."""

    def transform(df: DataFrame) -> DataFrame:
        return df.filter(~F.col(key).startswith(HEARTBEAT_PREFIX))

    return transform
