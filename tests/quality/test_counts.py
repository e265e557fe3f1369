"""A DQ step's bronze counts per window (sluice.quality.counts): the window match of Spark's counts, and the
counts on the driver held to Spark's and to the plain definition, on a stream's bronze and DLQ as delta-spark
writes them."""

from __future__ import annotations

import random
import textwrap
from dataclasses import replace
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from sluice.config import load_settings
from sluice.quality import counts
from sluice.storage import tables
from sluice.storage.engines import engine_for

HOUR = timedelta(hours=1)
T0 = datetime(2024, 5, 1, 10, tzinfo=UTC)
PIPELINE = textwrap.dedent('''
    from pyspark.sql import functions as F
    from sluice import Output, Pipeline, Stream, checks

    readings = Stream(
        name="readings",
        fields={"reading_id": "string", "device_id": "string", "seq": "long", "temp_c": "double",
                "event_time": "timestamp"},
        id="reading_id",
        required=["reading_id", "event_time"],
        watermark_delay="2m",
    )


    def per_device(inputs, window):
        return inputs["readings"].groupBy(window.column("event_time"), "device_id").agg(F.count("*").alias("n"))


    pipeline = Pipeline(
        name="counted",
        streams=[readings],
        window=("15m", "5m"),
        outputs=[Output("per_device", per_device, key="device_id", checks=[
            checks.completeness("n", stream="readings"),
            checks.completeness("device_id", stream="readings", distinct="device_id", name="devices"),
            checks.completeness("n", stream="readings", distinct="seq", name="seqs"),
        ])],
    )
''')


@pytest.mark.spark
def test_rows_are_matched_to_exactly_the_windows_that_hold_them(spark: SparkSession) -> None:
    """The DQ counts' window match (a time-bucket join, then the bounds) against the plain definition
    ``start <= t < end``: windows of mixed lengths, overlapping, with gaps, off any grid and before the epoch; rows
    on every bound, a microsecond either side of it, and a null time. And with the bucket pairs capped, the
    bounds-only match, which must agree."""
    import random

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


@pytest.mark.spark
def test_counts_on_the_driver_are_sparks(spark: SparkSession, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Bronze (heartbeats, repeated ids, null values, rows on the windows' bounds) and the DLQ, written by
    delta-spark in four commits; the pipeline's 15-minute windows every 5 and windows off its grid, one without a
    row. The driver's counts equal Spark's and the plain definition, with and without the late records; more
    records than DRIVER_COUNT_RECORDS, or a floating-point column to count, send the counts to Spark."""
    folder = tmp_path / "pipelines"
    folder.mkdir()
    (folder / "counted.py").write_text(PIPELINE)
    settings = load_settings({"SLUICE_PIPELINES": str(folder)}, home=tmp_path / "home")
    engine = engine_for(spark, settings)
    pipeline, spec = settings.pipeline("counted"), settings.stream("readings")
    rng = random.Random(11)
    minute, micro = timedelta(minutes=1), timedelta(microseconds=1)
    windows = [(T0 + k * 5 * minute, T0 + (k * 5 + 15) * minute) for k in range(30)]
    windows += [(T0 + 7 * micro, T0 + 40 * minute), (T0 + 90 * minute, T0 + 210 * minute), (T0 - HOUR, T0)]

    def record(i: int, t: datetime) -> tuple:  # type: ignore[type-arg]
        device = None if i % 17 == 0 else f"d{rng.randrange(12)}"
        return (f"r{rng.randrange(300)}", device, None if i % 13 == 0 else rng.randrange(40), 20.0, t)

    times = [t + d for w in windows[:8] for t in w for d in (-micro, timedelta(0), micro)]
    times += [T0 + timedelta(seconds=rng.randrange(-600, 3 * 3600)) for _ in range(400)]
    accepted = [record(i, t) for i, t in enumerate(times)]
    late = [record(i, T0 + timedelta(seconds=rng.randrange(0, 3 * 3600))) for i in range(40)]
    heartbeats = [(None, None, None, None, T0 + k * 20 * minute) for k in range(9)]

    def bronze_row(values: tuple, heartbeat: bool) -> tuple:  # type: ignore[type-arg]
        t = values[-1]
        return (*values, t, "f", 1, heartbeat, date(t.year, t.month, t.day), t.hour)

    tables.ensure_stream_tables(engine, settings, spec)
    bronze = tables.bronze(spec)
    for version, chunk in enumerate((accepted[:200], accepted[200:], heartbeats)):
        engine.append_rows([bronze_row(v, chunk is heartbeats) for v in chunk], bronze.schema,
                           bronze.path(settings), app_id="test", version=version)
    dlq = tables.dlq(spec)
    engine.append_rows([(*v, v[-1], v[-1], "f", 1, "{}") for v in late], dlq.schema, dlq.path(settings),
                       app_id="test", version=0)

    names = [c.name + "per_device" for c in pipeline.outputs[0].checks]

    def expected(include_late: bool) -> counts.Counts:
        rows = [(v, True) for v in accepted] + ([(v, False) for v in late] if include_late else [])
        measure, records = {}, {}
        for w in windows:
            inside = [(v, is_bronze) for v, is_bronze in rows if w[0] <= v[-1] < w[1]]
            if not inside:
                continue
            records[w] = sum(1 for _v, is_bronze in inside if is_bronze)
            for key, column in zip(names, (0, 1, 2), strict=True):  # reading_id, device_id, seq
                measure[(key, w)] = len({v[column] for v, _b in inside if v[column] is not None})
        return measure, records

    for include_late in (False, True):
        assert counts._driver_files(settings, pipeline, windows, include_late) is not None
        on_driver = counts.window_counts(settings, engine, pipeline, windows, include_late)()
        in_spark = counts._run_queries(counts._count_queries(settings, engine, pipeline, windows, include_late))
        assert on_driver == in_spark == expected(include_late)
    assert (T0 - HOUR, T0) in on_driver[1] and (T0 + 90 * minute, T0 + 210 * minute) in on_driver[1]

    monkeypatch.setattr(counts, "DRIVER_COUNT_RECORDS", len(accepted) - 1)
    assert counts._driver_files(settings, pipeline, windows, False) is None
    monkeypatch.undo()
    output = pipeline.outputs[0]
    temps = replace(output.checks[2], distinct="temp_c")
    floating = replace(pipeline, outputs=[replace(output, checks=[*output.checks[:2], temps])])
    assert counts._driver_files(settings, floating, windows, False) is None
