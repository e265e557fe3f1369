"""What every path that writes gold shares: the inputs a build function gets, the gold rows it yields, the
closing boundary, and the output tables (streaming queries, the batch close, the catch-up and backfills).

**Inputs.** A pipeline's build function gets, per stream, the accepted records of bronze: heartbeats
removed, the declared fields only (the event-time field under its declared name), watermarked with the
stream's delay and deduplicated on the stream's id (a guard against a replayed bronze commit). So
heartbeats are invisible to user code, whatever it does.

**The closing rule.** A window ``[start, end)`` is final, and is written to gold once, when the pipeline
watermark ``W`` (the minimum of the stored per-stream watermarks, heartbeats included) satisfies
``W >= end + lateness_bound`` (:func:`closing_boundary`).
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass
from datetime import datetime, timedelta

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructField, StructType

from sluice.config import Settings
from sluice.core.model import EVENT_TIME, OutputDef, PipelineDef, StreamSpec
from sluice.core.spark import collected_utc, local_frame
from sluice.core.windows import Window, WindowSpec
from sluice.ingest.state import load_state
from sluice.storage import snapshots, tables
from sluice.storage.engine import DeltaEngine
from sluice.storage.state import LakeState

log = logging.getLogger("sluice.aggregate")


def stream_floor(settings: Settings, stream: str) -> datetime | None:
    """What closes a stream's windows as a whole: its watermark ``W``, or for a stream with substreams (SPEC 3) its
    floor ``F = W + watermark_delay - skew_tolerance`` (the largest event time minus ``skew_tolerance``), below
    which no substream, known or new, can add a record."""
    watermark = load_state(settings, stream).watermark
    spec = settings.stream(stream)
    if watermark is None or spec.substream is None or spec.skew_tolerance is None:
        return watermark
    return watermark + spec.watermark_delay - spec.skew_tolerance


def pipeline_watermark(settings: Settings, pipeline: PipelineDef) -> datetime | None:
    """The pipeline's event-time watermark: the minimum of its streams' stored watermarks, each stream's floor
    when it has substreams (None until every stream has one)."""
    marks = [stream_floor(settings, s) for s in pipeline.streams]
    if any(m is None for m in marks):
        return None
    return min(m for m in marks if m is not None)


def streams_without_files(settings: Settings, pipeline: PipelineDef) -> list[str]:
    """The pipeline's streams that have never received a file, once another of its streams has: they have
    no watermark (SPEC 3), so they hold every window of the pipeline open until their first file arrives.
    (A pipeline none of whose streams has data yet is simply new.)"""
    arrived = {s: load_state(settings, s).last_arrival is not None for s in pipeline.streams}
    missing = [s for s, yes in arrived.items() if not yes]
    return missing if len(missing) < len(arrived) else []


def closing_boundary(settings: Settings, pipeline: PipelineDef) -> datetime | None:
    """Windows ending at or before this are final: ``W - lateness_bound`` (see the module docstring)."""
    watermark = pipeline_watermark(settings, pipeline)
    return None if watermark is None else watermark - pipeline.lateness_bound


CLOSED_THROUGH = "closed_through.json"
# The batch catch-up's marker (see sluice.streaming.closing).
CATCHUP = "catchup.json"


def pipeline_state(pipeline: str, *parts: str) -> tuple[str, ...]:
    """The name of one of a pipeline's state objects (see :mod:`sluice.storage.state`)."""
    return ("pipelines", pipeline, *parts)


def closed_through(state: LakeState, pipeline: str) -> datetime | None:
    """The closing boundary up to which gold holds every final window: the later of the one the batch close or
    a rebuild recorded and a finished catch-up's. (A catch-up's first cycle may close nothing after it, when no
    window ends before W moves again, so its boundary is in its own marker alone; a rebuild that stopped at the
    last window holding rows would miss the empty windows it made final.)"""
    marks = []
    marker = state.read_json(*pipeline_state(pipeline, CLOSED_THROUGH))
    if marker is not None:
        marks.append(datetime.fromisoformat(marker["boundary"]))
    catchup = state.read(*pipeline_state(pipeline, CATCHUP))
    if catchup is not None and (finished := CatchUp.from_json(catchup)).done:
        marks.append(finished.boundary)
    return max(marks, default=None)


def mark_closed_through(state: LakeState, pipeline: str, boundary: datetime) -> None:
    state.write(json.dumps({"boundary": boundary.isoformat()}), *pipeline_state(pipeline, CLOSED_THROUGH))


def gold_windows(settings: Settings, output: OutputDef, *, after: datetime | None = None,
                 until: datetime | None = None) -> dict[Window, int]:
    """The windows of an output's gold ending in ``(after, until]`` (either end open when None), with their
    row counts: read from the window columns alone (metadata-sized: gold holds one row per window and key)."""
    dataset = snapshots.dataset(output.path(settings))
    if dataset is None:
        return {}
    filt = None if after is None else pc.field("window_end") > pa.scalar(after, pa.timestamp("us", "UTC"))
    if until is not None:
        upper = pc.field("window_end") <= pa.scalar(until, pa.timestamp("us", "UTC"))
        filt = upper if filt is None else filt & upper
    data = dataset.to_table(columns=["window_start", "window_end"], filter=filt)
    # Counted in Arrow: a gold table of a million rows holds a few hundred windows.
    grouped = data.group_by(["window_start", "window_end"]).aggregate([("window_start", "count")])
    counts: dict[Window, int] = {}
    for s, e, n in zip(grouped.column("window_start").to_pylist(), grouped.column("window_end").to_pylist(),
                       grouped.column("window_start_count").to_pylist(), strict=True):
        window = (collected_utc(s), collected_utc(e))
        counts[window] = counts.get(window, 0) + int(n)
    return counts


def prepare_input(spec: StreamSpec, df: DataFrame) -> DataFrame:
    """Bronze rows as a build function sees them: no heartbeats, the declared fields under their declared
    names, watermarked and deduplicated (plain dedup on batch frames, which have no watermark)."""
    columns = [F.col(f).alias(spec.json_name(f)) if f == EVENT_TIME else F.col(f) for f in spec.fields]
    rows = df.filter(~F.col("is_heartbeat")).select(*columns) if "is_heartbeat" in df.columns else df.select(*columns)
    if rows.isStreaming:
        # A stream with substreams accepts records down to its floor (SPEC 3), skew_tolerance behind its newest.
        delay = spec.skew_tolerance if spec.substream is not None and spec.skew_tolerance else spec.watermark_delay
        return rows.withWatermark(spec.time_field, spark_delay(delay)).dropDuplicatesWithinWatermark(
            [spec.id_field]
        )
    return rows.dropDuplicates([spec.id_field])


def spark_delay(delay: timedelta) -> str:
    """The delay of Spark's own watermark on bronze: the stream's delay plus one millisecond.

    Ingest accepts a record at exactly its watermark (late is ``event_time < watermark``), but Spark's
    stateful operators drop ``event_time <= watermark`` as late. Spark's watermark on bronze is never ahead
    of the ingest watermark a record was judged against (it is computed from the same or fewer earlier
    rows, truncated to milliseconds), so one millisecond more keeps every accepted record above it."""
    return f"{delay // timedelta(milliseconds=1) + 1} milliseconds"


def batch_inputs(
    settings: Settings,
    engine: DeltaEngine,
    pipeline: PipelineDef,
    lo: datetime | None,
    hi: datetime,
    include_late: bool = False,
) -> dict[str, DataFrame]:
    """The pipeline's prepared inputs as batch frames: bronze rows with event_time in [lo, hi) (plus the
    DLQ with ``include_late``), read only from the hourly partitions that overlap the range."""
    in_range = tables.hours_overlapping(lo, hi)
    frames = {}
    for stream in pipeline.streams:
        spec = settings.stream(stream)
        tables.ensure_stream_tables(engine, settings, spec)
        bronze = engine.read(tables.bronze(spec).path(settings), files=in_range).filter(~F.col("is_heartbeat"))
        if include_late:
            dlq = engine.read(tables.dlq(spec).path(settings))
            bronze = bronze.select(*spec.fields).unionByName(dlq.select(*spec.fields))
        keep = F.col(EVENT_TIME) < F.lit(hi)
        if lo is not None:
            keep = keep & (F.col(EVENT_TIME) >= F.lit(lo))
        frames[stream] = prepare_input(spec, bronze.filter(keep))
    return frames


def empty_inputs(spark: SparkSession, settings: Settings, pipeline: PipelineDef) -> dict[str, DataFrame]:
    """Empty batch inputs of the right shape: enough for Spark to analyse a build function (its schema)."""
    return {
        s: prepare_input(settings.stream(s), local_frame(spark, [], tables.bronze(settings.stream(s)).schema))
        for s in pipeline.streams
    }


def gold_columns(output: OutputDef, df: DataFrame) -> list[str]:
    """The gold table's columns: window bounds, the key(s), then the metrics in the build's order."""
    missing = [k for k in ("window", *output.keys) if k not in df.columns]
    if missing:
        raise ValueError(
            f"output {output.name!r}: the build function must return a 'window' column (from "
            f"window.column(<time column>)) and the key column(s) {list(output.keys)}; missing: {missing}"
        )
    metrics = [c for c in df.columns if c not in ("window", "window_start", "window_end", *output.keys)]
    return ["window_start", "window_end", *output.keys, *metrics]


def gold_schema(spark: SparkSession, settings: Settings, pipeline: PipelineDef, output: OutputDef) -> StructType:
    """The gold table's schema, from the analysed (never executed) plan of the build function."""
    rows = gold_rows(output, output.build(empty_inputs(spark, settings, pipeline), pipeline.window), pipeline.window)
    return StructType([StructField(f.name, f.dataType, True) for f in rows.schema.fields])


def ensure_output_table(
    spark: SparkSession, settings: Settings, engine: DeltaEngine, pipeline: PipelineDef, output: OutputDef
) -> None:
    path = output.path(settings)
    if not snapshots.exists(path):
        engine.ensure_table(path, gold_schema(spark, settings, pipeline, output))


@dataclass(frozen=True)
class CatchUp:
    """A batch catch-up of a pipeline: windows ending at or before ``boundary`` are computed in batch."""

    boundary: datetime
    watermark: datetime
    version: int  # app-transaction version of its gold and ledger commits
    done: bool = False

    def to_json(self) -> str:
        return json.dumps({"boundary": self.boundary.isoformat(), "watermark": self.watermark.isoformat(),
                           "version": self.version, "done": self.done}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> CatchUp:
        raw = json.loads(text)
        return cls(datetime.fromisoformat(raw["boundary"]), datetime.fromisoformat(raw["watermark"]),
                   int(raw["version"]), bool(raw["done"]))

    def stream_from(self, pipeline: PipelineDef) -> datetime:
        """The oldest event time that can still reach a window ending after the boundary."""
        return reach_from(pipeline, self.boundary)


def reach_from(pipeline: PipelineDef, boundary: datetime) -> datetime:
    """The oldest event time that can reach a window of ``pipeline`` ending after ``boundary`` (its window's
    size, and the lateness bound of its joins, before it)."""
    return boundary - pipeline.window.size - pipeline.lateness_bound


def gold_rows(output: OutputDef, df: DataFrame, window: WindowSpec) -> DataFrame:
    """Sink-side shaping shared by every path: contract columns, deterministic order."""
    columns = gold_columns(output, df)
    return (
        df.transform(window.bounds)
        .select(*columns)
        .coalesce(1)
        .sortWithinPartitions("window_start", "window_end", *output.keys)
    )


class Turnstile:
    """Orders the ledger commits of a pipeline's concurrent queries: output k records batch b only after
    every earlier output has passed batch b or finished. Earlier outputs never wait for later ones, so
    this cannot deadlock; the ledger (shared by the outputs) then gets the same commits in the same order
    as if the queries had run one after the other."""

    def __init__(self, outputs: int) -> None:
        self._cond = threading.Condition()
        self._passed = [-1] * outputs
        self._finished = [False] * outputs

    def wait_turn(self, index: int, batch_id: int) -> None:
        with self._cond:
            self._cond.wait_for(
                lambda: all(self._finished[j] or self._passed[j] >= batch_id for j in range(index))
            )

    def passed(self, index: int, batch_id: int) -> None:
        with self._cond:
            self._passed[index] = max(self._passed[index], batch_id)
            self._cond.notify_all()

    def finish(self, index: int) -> None:
        with self._cond:
            self._finished[index] = True
            self._cond.notify_all()

