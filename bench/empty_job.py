"""The fixed cost of Spark itself: start a SparkSession with sluice's settings, run one trivial job, stop.

``run.py`` compares its wall time with ``sluice run`` on an empty landing zone, so the difference is what
sluice adds per cycle on top of starting the JVM (imports, table bootstrap, Delta log reads, DQ set-up).

    python bench/empty_job.py [--master local[2]] [--conf-json '{...}']
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import T0, add_spark_args, build_spark, report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_spark_args(parser)
    args = parser.parse_args()
    spark = build_spark(args, "bench-empty")
    t_session = time.monotonic()
    rows = spark.range(1).count()
    t_job = time.monotonic()
    spark.stop()
    report(session_s=round(t_session - T0, 3), job_s=round(t_job - t_session, 3), rows=rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
