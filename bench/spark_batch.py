"""(d) A plain Spark batch query with the ad_clicks logic, the baseline for ``sluice backfill``.

Reads the landing JSON files (explicit schema), dedups ids, joins impressions LEFT OUTER clicks within
[impression, impression + 30 min], aggregates per impression and then per hour and ad, counts unmatched
clicks per hour and ad, and writes both results as Delta tables through delta-spark. No streaming, no
bronze, no data quality.

    python bench/spark_batch.py --landing DIR --out DIR [--master local[2]] [--conf-json '{...}']
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
    parser.add_argument("--landing", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    add_spark_args(parser)
    args = parser.parse_args()

    spark = build_spark(args, "bench-spark-batch")
    t_session = time.monotonic()
    from pyspark.sql import functions as F

    impressions = (
        spark.read.schema(schema(IMPRESSION_FIELDS)).json(str(args.landing / "impressions"))
        .select("impression_id", "ad_id", F.try_to_timestamp("event_time").alias("impression_time"))
        .where(F.col("impression_id").isNotNull() & F.col("ad_id").isNotNull() & F.col("impression_time").isNotNull())
        .dropDuplicates(["impression_id"])
    )
    clicks = (
        spark.read.schema(schema(CLICK_FIELDS)).json(str(args.landing / "clicks"))
        .select("click_id", F.col("impression_id").alias("click_impression_id"), F.col("ad_id").alias("click_ad_id"),
                F.try_to_timestamp("event_time").alias("click_time"))
        .where(F.col("click_id").isNotNull() & F.col("click_impression_id").isNotNull()
               & F.col("click_ad_id").isNotNull() & F.col("click_time").isNotNull())
        .dropDuplicates(["click_id"])
    )
    match = (
        (F.col("click_impression_id") == F.col("impression_id"))
        & (F.col("click_time") >= F.col("impression_time"))
        & (F.col("click_time") <= F.col("impression_time") + F.expr("INTERVAL 30 MINUTES"))
    )
    ad_clicks = (
        impressions.join(clicks, match, "leftOuter")
        .groupBy(F.window("impression_time", "1 hour"), "impression_id", "ad_id")
        .agg(F.count("click_id").alias("clicks"))
        .groupBy("window", "ad_id")
        .agg(F.count(F.lit(1)).alias("impressions"), F.sum("clicks").alias("clicks"))
        .select(F.col("window.start").alias("window_start"), F.col("window.end").alias("window_end"), "ad_id",
                "impressions", "clicks", (F.col("clicks") / F.col("impressions")).alias("ctr"))
    )
    unmatched = (
        clicks.join(impressions, match, "leftAnti")
        .groupBy(F.window("click_time", "1 hour"), F.col("click_ad_id").alias("ad_id"))
        .agg(F.count(F.lit(1)).alias("unmatched_clicks"))
        .select(F.col("window.start").alias("window_start"), F.col("window.end").alias("window_end"), "ad_id",
                "unmatched_clicks")
    )
    timings = {}
    for name, frame in (("ad_clicks_hourly", ad_clicks), ("unmatched_clicks_hourly", unmatched)):
        started = time.monotonic()
        frame.coalesce(1).write.format("delta").mode("overwrite").save(str(args.out / name))
        timings[f"{name}_s"] = round(time.monotonic() - started, 3)
    spark.stop()
    report(session_s=round(t_session - T0, 3), **timings)
    return 0


if __name__ == "__main__":
    sys.exit(main())
