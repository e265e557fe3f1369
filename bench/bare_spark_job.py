"""(a) The baseline: a bare, hand-written Spark Structured Streaming job with the ad_clicks logic.

Reads the landing JSON files directly (explicit schema), dedups ids within the watermark, joins impressions
LEFT OUTER clicks within [impression, impression + 30 min], aggregates per impression and then per hourly
tumbling window and ad, and writes Delta through delta-spark (the sink a Spark shop would use; the jars and
the Delta settings come with the Spark settings run.py passes) with ``trigger(availableNow=True)``. A second
query counts the clicks that matched no impression (as sluice's ``unmatched_clicks_hourly`` does), so both
sides do the same work. Nothing else: no quarantine, no DLQ, no bronze, no ledger, no data quality, no
heartbeats (so windows the data's own watermark has not passed are not emitted).

    python bench/bare_spark_job.py --landing DIR --out DIR [--master local[2]] [--conf-json '{...}']
                                   [--max-files-per-trigger N]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (
    CLICK_FIELDS,
    IMPRESSION_FIELDS,
    T0,
    add_spark_args,
    build_spark,
    report,
    schema,
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # Folders or URIs (s3://bucket/prefix on a cluster: bench/cluster.py).
    parser.add_argument("--landing", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--watermark", default="10 minutes")
    parser.add_argument("--max-files-per-trigger", type=int,
                        help="bound each micro-batch to this many files (default: Spark's, all of them)")
    add_spark_args(parser)
    args = parser.parse_args()

    spark = build_spark(args, "bench-bare-spark")
    t_session = time.monotonic()
    from pyspark.sql import functions as F

    # A long backlog in one micro-batch keeps all of its join and dedup state at once (the watermark only
    # evicts between batches); a bound, as sluice's own ingest has, keeps a catch-up within the executors.
    per_trigger = {"maxFilesPerTrigger": str(args.max_files_per_trigger)} if args.max_files_per_trigger else {}

    def impressions():
        return (
            spark.readStream.schema(schema(IMPRESSION_FIELDS)).options(**per_trigger).json(f"{args.landing.rstrip('/')}/impressions")
            .select("impression_id", "ad_id", F.try_to_timestamp("event_time").alias("impression_time"))
            .where(F.col("impression_id").isNotNull() & F.col("ad_id").isNotNull()
                   & F.col("impression_time").isNotNull())
            .withWatermark("impression_time", args.watermark)
            .dropDuplicatesWithinWatermark(["impression_id"])
        )

    def clicks():
        return (
            spark.readStream.schema(schema(CLICK_FIELDS)).options(**per_trigger).json(f"{args.landing.rstrip('/')}/clicks")
            .select("click_id", F.col("impression_id").alias("click_impression_id"),
                    F.col("ad_id").alias("click_ad_id"), F.try_to_timestamp("event_time").alias("click_time"))
            .where(F.col("click_id").isNotNull() & F.col("click_impression_id").isNotNull()
                   & F.col("click_ad_id").isNotNull() & F.col("click_time").isNotNull())
            .withWatermark("click_time", args.watermark)
            .dropDuplicatesWithinWatermark(["click_id"])
        )

    match = (
        (F.col("click_impression_id") == F.col("impression_id"))
        & (F.col("click_time") >= F.col("impression_time"))
        & (F.col("click_time") <= F.col("impression_time") + F.expr("INTERVAL 30 MINUTES"))
    )

    per_impression = (
        impressions().join(clicks(), match, "leftOuter")
        .groupBy(F.window("impression_time", "1 hour"), "impression_id", "ad_id")
        .agg(F.count("click_id").alias("clicks"))
    )
    ad_clicks = (
        per_impression.groupBy("window", "ad_id")
        .agg(F.count(F.lit(1)).alias("impressions"), F.sum("clicks").alias("clicks"))
        .select(F.col("window.start").alias("window_start"), F.col("window.end").alias("window_end"), "ad_id",
                "impressions", "clicks", (F.col("clicks") / F.col("impressions")).alias("ctr"))
    )
    unmatched = (
        clicks().join(impressions(), match, "leftOuter")
        .where(F.col("impression_id").isNull())
        .groupBy(F.window("click_time", "1 hour"), F.col("click_ad_id").alias("ad_id"))
        .agg(F.count(F.lit(1)).alias("unmatched_clicks"))
        .select(F.col("window.start").alias("window_start"), F.col("window.end").alias("window_end"), "ad_id",
                "unmatched_clicks")
    )

    timings = {}
    for name, frame in (("ad_clicks_hourly", ad_clicks), ("unmatched_clicks_hourly", unmatched)):
        started = time.monotonic()
        query = (
            frame.writeStream.format("delta")
            .option("path", f"{args.out.rstrip('/')}/{name}")
            .option("checkpointLocation", f"{args.out.rstrip('/')}/_checkpoints/{name}")
            .outputMode("append")
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        timings[f"{name}_s"] = round(time.monotonic() - started, 3)
        timings[f"{name}_batches"] = len(query.recentProgress)
    spark.stop()
    report(session_s=round(t_session - T0, 3), **timings)
    return 0


if __name__ == "__main__":
    sys.exit(main())
