"""ad_clicks_hourly: impressions joined with their clicks, per ad and hour (SPEC section 4).

A click matches its impression when the ids agree and it came at most 30 minutes after it. Results go
into hourly windows on the impression's event time; an impression with several clicks is still one
impression. A click that matches no impression is counted in ``gold/unmatched_clicks_hourly``, in the
hour of its own event time and under its own ``ad_id``, so no click is ever lost.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from sluice import Output, Pipeline, Stream, WindowSpec, checks

JOIN_BOUND = timedelta(minutes=30)

impressions = Stream(
    name="impressions",
    fields={"impression_id": "string", "ad_id": "string", "user_id": "string", "event_time": "timestamp"},
    id="impression_id",
    required=["impression_id", "ad_id", "event_time"],
    watermark_delay="10m",
)

clicks = Stream(
    name="clicks",
    fields={"click_id": "string", "impression_id": "string", "ad_id": "string", "user_id": "string",
            "event_time": "timestamp"},
    id="click_id",
    required=["click_id", "impression_id", "ad_id", "event_time"],
    watermark_delay="10m",
)


def impression_side(df: DataFrame) -> DataFrame:
    return df.select("impression_id", "ad_id", F.col("event_time").alias("impression_time"))


def click_side(df: DataFrame) -> DataFrame:
    # Renamed so that both sides can be joined without ambiguous columns.
    return df.select(
        "click_id",
        F.col("impression_id").alias("click_impression_id"),
        F.col("ad_id").alias("click_ad_id"),
        F.col("event_time").alias("click_time"),
    )


def click_matches_impression(bound: timedelta = JOIN_BOUND) -> Column:
    """Ids agree and impression.event_time <= click.event_time <= impression.event_time + 30 min."""
    return (
        (F.col("click_impression_id") == F.col("impression_id"))
        & (F.col("click_time") >= F.col("impression_time"))
        & (F.col("click_time") <= F.col("impression_time") + F.expr(f"INTERVAL {int(bound.total_seconds())} SECONDS"))
    )


def with_ctr(df: DataFrame) -> DataFrame:
    """ctr = clicks / impressions, or null when there are no impressions."""
    return df.withColumn("ctr", F.when(F.col("impressions") > 0, F.col("clicks").cast("double") / F.col("impressions")))


def ad_clicks(inputs: Mapping[str, DataFrame], window: WindowSpec) -> DataFrame:
    """Impressions LEFT JOIN matched clicks, then per impression (streaming has no countDistinct, and an
    impression with several clicks is one impression), then per window and ad."""
    joined = inputs["impressions"].transform(impression_side).join(
        inputs["clicks"].transform(click_side), click_matches_impression(), "leftOuter"
    )
    per_impression = (
        joined.filter(window.keep(F.col("impression_time")))
        .groupBy(window.column("impression_time"), "impression_id", "ad_id")
        .agg(F.count("click_id").alias("clicks"))
    )
    return (
        per_impression.groupBy("window", "ad_id")
        .agg(F.count(F.lit(1)).alias("impressions"), F.sum("clicks").alias("clicks"))
        .transform(with_ctr)
    )


def unmatched_clicks(inputs: Mapping[str, DataFrame], window: WindowSpec) -> DataFrame:
    """Clicks LEFT JOIN impressions; a click without a match counts in the window of its own event time."""
    joined = inputs["clicks"].transform(click_side).join(
        inputs["impressions"].transform(impression_side), click_matches_impression(), "leftOuter"
    )
    return (
        joined.filter(F.col("impression_id").isNull() & window.keep(F.col("click_time")))
        .groupBy(window.column("click_time"), F.col("click_ad_id").alias("ad_id"))
        .agg(F.count(F.lit(1)).alias("unmatched_clicks"))
    )


pipeline = Pipeline(
    name="ad_clicks_hourly",
    description=__doc__ or "",
    streams=[impressions, clicks],
    window="1h",
    # A window closes 40 min after its end (10-min watermark delay + 30-min join bound); every 15 minutes
    # keeps gold within ~15 min of closable without paying JVM start-up more often than useful.
    schedule="*/15 * * * *",
    lateness_bound=JOIN_BOUND,
    outputs=[
        Output("ad_clicks_hourly", ad_clicks, key="ad_id", checks=[
            checks.completeness("impressions", stream="impressions"),
            checks.between("ctr", 0, 1),
            checks.between("impressions", 0, name="counts_non_negative"),
            checks.between("clicks", 0, name="counts_non_negative"),
        ]),
        Output("unmatched_clicks_hourly", unmatched_clicks, key="ad_id", checks=[
            checks.between("unmatched_clicks", 0, name="counts_non_negative"),
        ]),
    ],
)
