"""A team's own two-stream pipeline, as issue 25's bad-input trial used it: ``readings`` (its event time in
``event_time``) and ``txns`` (its event time declared as ``ts``), one output per stream and one that joins
them. The window and the watermark delays are parameters, so tests can try hopping and tumbling windows; so are
substreams (both streams keyed by ``device_id``, which every output is keyed by and the join joins on).

Only the public API (SPEC 8) is used, from a pipelines folder of its own."""

from __future__ import annotations

import textwrap
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any

from sluice.config import Settings, load_settings

PIPELINE = "two_streams"
READINGS_OUT = "two_streams_readings"
TXNS_OUT = "two_streams_txns"
JOINED_OUT = "two_streams_joined"
STREAMS = ("readings", "txns")
ID_FIELD = {"readings": "reading_id", "txns": "txn_id"}
TIME_FIELD = {"readings": "event_time", "txns": "ts"}

SOURCE = '''
from pyspark.sql import functions as F
from sluice import Output, Pipeline, Stream, checks

readings = Stream(
    name="readings",
    fields={{"reading_id": "string", "device_id": "string", "temp_c": "double", "ok": "boolean",
            "seq": "long", "event_time": "timestamp"}},
    id="reading_id",
    required=["reading_id", "device_id", "event_time"],
    watermark_delay="{readings_delay}",{substreams}
)

txns = Stream(
    name="txns",
    fields={{"txn_id": "string", "device_id": "string", "amount": "double", "ts": "timestamp"}},
    id="txn_id",
    event_time="ts",
    required=["txn_id", "device_id", "ts"],
    watermark_delay="{txns_delay}",{substreams}
)


def per_device(inputs, window):
    return (inputs["readings"].groupBy(window.column("event_time"), "device_id")
            .agg(F.count("*").alias("readings"), F.sum("temp_c").alias("sum_temp_c"){extra_metric}))


def per_txn_device(inputs, window):
    return (inputs["txns"].groupBy(window.column("ts"), "device_id")
            .agg(F.count("*").alias("txns"), F.sum("amount").alias("amount")))


def joined(inputs, window):
    # A reading matches the transactions of its device within {bound} after it; counted in the window of
    # the reading's event time (a stream-stream join, then a window aggregation: two stateful operators).
    r = inputs["readings"].select("reading_id", "device_id", F.col("event_time").alias("reading_time"))
    t = inputs["txns"].select("txn_id", F.col("device_id").alias("txn_device"), F.col("ts").alias("txn_time"))
    matched = r.join(t, (F.col("device_id") == F.col("txn_device"))
                     & (F.col("txn_time") >= F.col("reading_time"))
                     & (F.col("txn_time") <= F.col("reading_time") + F.expr("INTERVAL {bound_s} SECONDS")))
    return (matched.groupBy(window.column("reading_time"), "device_id")
            .agg(F.count("*").alias("matches")))


pipeline = Pipeline(
    name="{pipeline}",
    streams=[readings, txns],
    window={window!r},
    lateness_bound="{bound}",
    schedule="*/5 * * * *",
    outputs=[
        Output("{readings_out}", per_device, key="device_id",
               checks=[checks.completeness("readings", stream="readings")]),
        Output("{txns_out}", per_txn_device, key="device_id",
               checks=[checks.completeness("txns", stream="txns")]),
        {joined_output}
    ],
)
'''


def pipeline_source(
    window: str | tuple[str, str] = ("15m", "5m"),
    *,
    readings_delay: str = "2m",
    txns_delay: str = "2m",
    bound: str = "10m",
    with_join: bool = True,
    max_temp: bool = False,
    skew: str | None = None,
) -> str:
    """The pipeline file's Python source; ``max_temp`` adds a metric to the readings output only; ``skew`` makes
    both streams substreams keyed by ``device_id`` (SPEC 3) with that ``skew_tolerance``."""
    seconds = {"m": 60, "h": 3600, "s": 1}
    bound_s = int(bound[:-1]) * seconds[bound[-1]]
    joined_output = f'Output("{JOINED_OUT}", joined, key="device_id"),' if with_join else ""
    return textwrap.dedent(SOURCE).format(
        readings_delay=readings_delay, txns_delay=txns_delay, window=window, bound=bound, bound_s=bound_s,
        pipeline=PIPELINE, readings_out=READINGS_OUT, txns_out=TXNS_OUT, joined_output=joined_output,
        extra_metric=', F.max("temp_c").alias("max_temp_c")' if max_temp else "",
        substreams=f' substream="device_id", skew_tolerance="{skew}",' if skew else "",
    )


def two_stream_home(tmp_path: Path, name: str = "home", **options: Any) -> Settings:
    """Settings of a fresh home whose pipelines folder holds only the two-stream pipeline."""
    folder = tmp_path / f"{name}-pipelines"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{PIPELINE}.py").write_text(pipeline_source(**options))
    settings = load_settings({"SLUICE_PIPELINES": str(folder)}, home=tmp_path / name)
    assert settings.registry.errors == [], settings.registry.errors
    return settings


def at_now(settings: Settings, now: datetime) -> Settings:
    return replace(settings, now_override=now)


def iso(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ") if t.microsecond else t.strftime("%Y-%m-%dT%H:%M:%SZ")


def reading(rid: str, t: datetime, device: str = "d1", temp: float = 20.0, **extra: Any) -> dict[str, Any]:
    return {"reading_id": rid, "device_id": device, "temp_c": temp, "event_time": iso(t), **extra}


def txn(tid: str, t: datetime, device: str = "d1", amount: float = 1.0, **extra: Any) -> dict[str, Any]:
    return {"txn_id": tid, "device_id": device, "amount": amount, "ts": iso(t), **extra}


def record(stream: str, rid: str, t: datetime, **extra: Any) -> dict[str, Any]:
    """A valid record of either stream."""
    return reading(rid, t, **extra) if stream == "readings" else txn(rid, t, **extra)
