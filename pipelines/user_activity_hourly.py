"""user_activity_hourly: events per user per 10-minute window, averaged per user per hour (SPEC section 4).

Chained window aggregations in one query. The average is taken over the 10-minute windows that have
events.
"""

from __future__ import annotations

from collections.abc import Mapping

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from sluice import Output, Pipeline, Stream, WindowSpec, checks

events = Stream(
    name="events",
    fields={"event_id": "string", "user_id": "string", "event_type": "string", "event_time": "timestamp"},
    id="event_id",
    required=["event_id", "user_id", "event_time"],
    watermark_delay="5m",
)


def user_activity(inputs: Mapping[str, DataFrame], window: WindowSpec) -> DataFrame:
    per_10min = (
        inputs["events"]
        .groupBy(F.window("event_time", "600 seconds", "600 seconds"), "user_id")
        .agg(F.count(F.lit(1)).alias("events"))
    )
    # A 10-min window belongs to the hourly window its start falls in (only matters for windows with gaps).
    return (
        per_10min.filter(window.keep(F.col("window.start")))
        .groupBy(window.column(F.col("window")), "user_id")
        .agg(F.avg("events").alias("avg_events_per_10min"))
    )


pipeline = Pipeline(
    name="user_activity_hourly",
    description=__doc__ or "",
    streams=[events],
    window="1h",
    # A window closes 5 min after its end (the events watermark delay).
    schedule="*/15 * * * *",
    outputs=[
        Output("user_activity_hourly", user_activity, key="user_id", checks=[
            # Every user with events in the hour has exactly one gold row.
            checks.completeness("user_id", stream="events", distinct="user_id", name="users"),
        ]),
    ],
)
