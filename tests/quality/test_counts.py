"""A DQ step's bronze counts per window (sluice.quality.counts): the window match of Spark's counts."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest
from pyspark.sql import SparkSession

from sluice.quality import counts

HOUR = timedelta(hours=1)
T0 = datetime(2024, 5, 1, 10, tzinfo=UTC)


@pytest.mark.spark
def test_rows_are_matched_to_exactly_the_windows_that_hold_them(spark: SparkSession) -> None:
    """The DQ counts' window match (a time-bucket join, then the bounds) against the plain definition
    ``start <= t < end``: windows of mixed lengths, overlapping, with gaps, off any grid and before the epoch; rows
    on every bound, a microsecond either side of it, and a null time. And with the bucket pairs capped, the
    bounds-only match, which must agree."""

    from sluice.core.spark import local_frame

    rng = random.Random(7)
    minute, micro = timedelta(minutes=1), timedelta(microseconds=1)
    windows = [(T0 + k * 5 * minute, T0 + (k * 5 + 15) * minute) for k in range(6)]  # 15 min every 5
    windows += [(T0 + 2 * HOUR, T0 + 3 * HOUR), (T0 + 2 * HOUR + 7 * micro, T0 + 2 * HOUR + 40 * minute)]
    windows += [(T0 + 5 * HOUR + k * minute, T0 + 5 * HOUR + (k + 1) * minute) for k in range(0, 20, 3)]  # gaps
    windows += [(datetime(1969, 12, 31, 23, 50, tzinfo=UTC), datetime(1970, 1, 1, 0, 5, tzinfo=UTC))]
    times = [t + d for w in windows for t in w for d in (-micro, timedelta(0), micro)]
    times += [T0 + timedelta(seconds=rng.randrange(0, 7 * 3600)) for _ in range(300)]
    rows = [(i, t) for i, t in enumerate(times)] + [(len(times), None)]
    df = local_frame(spark, rows, "id long, event_time timestamp")

    expected = {(i, w) for i, t in rows if t is not None for w in windows if w[0] <= t < w[1]}

    def matched() -> set[tuple[int, tuple[datetime, datetime]]]:
        return {(r["id"], (r["_ws"].replace(tzinfo=UTC), r["_we"].replace(tzinfo=UTC)))
                for r in counts._in_windows(df, windows).collect()}

    per_row = [sum(1 for i, _w in expected if i == row) for row, _t in rows]
    assert max(per_row) >= 3 and 0 in per_row  # rows in several windows, and rows in none
    assert matched() == expected
    cap = counts.MAX_WINDOW_BUCKETS
    try:
        counts.MAX_WINDOW_BUCKETS = 0
        assert matched() == expected
    finally:
        counts.MAX_WINDOW_BUCKETS = cap

