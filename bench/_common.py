"""Helpers shared by the stand-alone bench jobs (bare Spark, Spark batch, empty job).

The jobs deliberately do not import ``sluice``: they are what a data engineer would hand-write. ``run.py``
passes them the very Spark settings sluice uses (``sluice.spark.spark_conf``) as JSON, so the comparison
is like for like (same master, shuffle partitions, state store, UI off, driver memory).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

T0 = time.monotonic()  # process start, as seen from the job (the interpreter is already up)

IMPRESSION_FIELDS = ("impression_id", "ad_id", "user_id", "event_time")
CLICK_FIELDS = ("click_id", "impression_id", "ad_id", "user_id", "event_time")


def add_spark_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--conf-json", default="{}", help="Spark settings as a JSON object")


def build_spark(args: argparse.Namespace, app_name: str) -> Any:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name).master(args.master)
    for key, value in json.loads(args.conf_json).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


def schema(fields: tuple[str, ...]) -> Any:
    """Explicit schema: every field a string (event_time is parsed explicitly, RFC 3339 with zone)."""
    from pyspark.sql.types import StringType, StructField, StructType

    return StructType([StructField(f, StringType(), True) for f in fields])


def report(**values: Any) -> None:
    """The one machine-readable line run.py parses: ``BENCH {json}``."""
    values.setdefault("in_process_s", round(time.monotonic() - T0, 3))
    print("BENCH " + json.dumps(values, default=str), flush=True)
