"""(k) The Kafka baseline: the plain Spark Structured Streaming job a team would write instead of a sluice
stream on a topic, with the SPEC 8 pipeline's logic (``device_temps``).

Reads the topic with Spark's Kafka source (``availableNow``, the same jars sluice's sessions take), parses each
value with an explicit schema, watermarks on the event time, deduplicates the ids within the watermark, and
aggregates per device and window (15 minutes every 5: readings with a temperature, their average, the lowest
battery) into a Delta table through delta-spark. Nothing else: no quarantine, no DLQ, no bronze, no ledger, no
data quality, no heartbeats.

    python bench/bare_kafka_job.py --bootstrap HOST:PORT --topic NAME --out DIR [--master local[2]]
                                   [--conf-json '{...}']
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import T0, add_spark_args, build_spark, report

READING_SCHEMA = "reading_id string, device_id string, temp_c double, battery long, event_time string"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--watermark", default="2 minutes")
    add_spark_args(parser)
    args = parser.parse_args()

    spark = build_spark(args, "bench-bare-kafka")
    t_session = time.monotonic()
    from pyspark.sql import functions as F

    readings = (
        spark.readStream.format("kafka").option("kafka.bootstrap.servers", args.bootstrap)
        .option("subscribe", args.topic).option("startingOffsets", "earliest").load()
        .select(F.from_json(F.col("value").cast("string"), READING_SCHEMA).alias("r")).select("r.*")
        .withColumn("event_time", F.try_to_timestamp("event_time"))
        .where(F.col("reading_id").isNotNull() & F.col("device_id").isNotNull() & F.col("event_time").isNotNull())
        .withWatermark("event_time", args.watermark)
        .dropDuplicatesWithinWatermark(["reading_id"])
    )
    device_temps = (
        readings.where(F.col("temp_c").isNotNull())
        .groupBy(F.window("event_time", "15 minutes", "5 minutes"), "device_id")
        .agg(F.count(F.lit(1)).alias("readings"), F.avg("temp_c").alias("avg_temp_c"),
             F.min("battery").alias("min_battery"))
        .select(F.col("window.start").alias("window_start"), F.col("window.end").alias("window_end"), "device_id",
                "readings", "avg_temp_c", "min_battery")
    )
    started = time.monotonic()
    query = (
        device_temps.writeStream.format("delta")
        .option("path", f"{args.out.rstrip('/')}/device_temps")
        .option("checkpointLocation", f"{args.out.rstrip('/')}/_checkpoints/device_temps")
        .outputMode("append")
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    timings = {"device_temps_s": round(time.monotonic() - started, 3),
               "device_temps_batches": len(query.recentProgress)}
    spark.stop()
    report(session_s=round(t_session - T0, 3), **timings)
    return 0


if __name__ == "__main__":
    sys.exit(main())
