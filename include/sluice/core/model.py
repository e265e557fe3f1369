"""The resolved, internal form of stream and pipeline definitions.

:mod:`sluice.api` is what users write; the registry turns each definition into these small typed records,
with durations parsed, configuration overrides (YAML, environment) applied, and the event-time field
mapped to the internal ``event_time`` column that bronze, the DLQ and every time rule use.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sluice.core.checks import Check
from sluice.core.windows import WindowSpec

if TYPE_CHECKING:
    from sluice.core.api import Build, KafkaSource, Pipeline, Stream

EVENT_TIME = "event_time"  # the internal name of every stream's event-time column


@dataclass(frozen=True)
class StreamSpec:
    """A landing stream: its id column, required fields, field types and time semantics.

    Field names are internal column names: the event-time field is always ``event_time`` here, and
    ``json_names`` maps it back to the key records carry when the stream declares another name."""

    name: str
    id_field: str
    required: tuple[str, ...]
    optional: tuple[str, ...]
    watermark_delay: timedelta
    early_tolerance: timedelta = timedelta(minutes=5)
    idle_timeout: timedelta = timedelta(minutes=30)
    types: Mapping[str, str] = field(default_factory=dict)  # internal field -> string|long|double|boolean|timestamp
    time_field: str = EVENT_TIME  # the event-time key in the records (and in the build function's inputs)
    source: KafkaSource | None = None  # a Kafka topic, or None: the landing folder
    # SPEC 3, "Substreams": the field whose values have their own watermark, and how far behind the stream's
    # newest event time a substream may run (the floor F = max event time - skew_tolerance).
    substream: str | None = None
    skew_tolerance: timedelta | None = None

    @property
    def fields(self) -> tuple[str, ...]:
        """All payload fields in their declared order, event_time last."""
        ordered = [f for f in (*self.required, *self.optional) if f != EVENT_TIME]
        return (*sorted(set(ordered), key=ordered.index), EVENT_TIME)

    def type_of(self, field_name: str) -> str:
        return self.types.get(field_name, "timestamp" if field_name == EVENT_TIME else "string")

    def json_name(self, field_name: str) -> str:
        return self.time_field if field_name == EVENT_TIME else field_name

    @classmethod
    def from_stream(cls, stream: Stream) -> StreamSpec:
        def internal(name: str) -> str:
            return EVENT_TIME if name == stream.event_time else name

        declared = [internal(f) for f in stream.fields]
        required = tuple(internal(f) for f in stream.required or ())
        return cls(
            name=stream.name,
            id_field=stream.id,
            required=tuple(f for f in declared if f in required),
            optional=tuple(f for f in declared if f not in required),
            watermark_delay=stream.watermark_delay,  # type: ignore[arg-type]  # parsed by Stream
            early_tolerance=stream.early_tolerance,  # type: ignore[arg-type]
            idle_timeout=stream.idle_timeout,  # type: ignore[arg-type]
            types={internal(f): t for f, t in stream.fields.items()},
            time_field=stream.event_time,
            source=stream.source,
            substream=stream.substream,
            skew_tolerance=stream.skew_tolerance,  # type: ignore[arg-type]  # parsed by Stream
        )


@dataclass(frozen=True)
class OutputDef:
    """One gold table of a pipeline, produced by one streaming query (and by batch closes and backfills)."""

    name: str  # gold/<name>; also the query name and the app id of its commits
    build: Build
    keys: tuple[str, ...]
    checks: tuple[Check, ...] = ()
    on_change: str = "rebuild"  # SPEC 9: rebuild, forward or fail

    @property
    def table_name(self) -> str:
        return f"gold/{self.name}"

    @property
    def key(self) -> str:
        return self.keys[0]

    def path(self, settings: Any) -> str:
        """The output's table URI under the lake (``settings.lake``, a :class:`sluice.core.lake.Lake`)."""
        return str(settings.lake.table(self.table_name))


@dataclass(frozen=True)
class PipelineDef:
    name: str
    streams: tuple[str, ...]
    outputs: tuple[OutputDef, ...]
    window: WindowSpec = field(default_factory=WindowSpec)
    # How long after a window's end its rows can still change (join bounds): a window is final once the
    # pipeline watermark reaches end + this.
    lateness_bound: timedelta = timedelta(0)
    schedule: str | None = "*/15 * * * *"
    description: str = ""
    tags: tuple[str, ...] = ()
    source: Path | None = None  # the file that declared it
    # Late data after a window closed: "manual" flags it (``late_waiting``; the state keeps its DQ outcome);
    # "auto" also re-computes it (at most ``max_corrections_per_run`` windows per cycle, none older than
    # ``correction_max_age``).
    corrections: str = "manual"
    correction_max_age: timedelta = timedelta(days=7)
    max_corrections_per_run: int = 24
    # A window still open at end + lateness_bound + freshness_grace raises one ``stale`` alert.
    freshness_grace: timedelta = timedelta(hours=1)
    # The substream field every stream declares (SPEC 3), or None.
    substream: str | None = None

    def output(self, name: str) -> OutputDef:
        for out in self.outputs:
            if out.name == name:
                return out
        raise KeyError(name)

    @classmethod
    def from_pipeline(cls, pipeline: Pipeline, source: Path | None = None) -> PipelineDef:
        return cls(
            name=pipeline.name,
            streams=pipeline.stream_names,
            outputs=tuple(OutputDef(o.name, o.build, o.keys, tuple(o.checks), o.on_change or pipeline.on_change)
                         for o in pipeline.outputs),
            window=WindowSpec(pipeline.window_size, pipeline.window_hop),
            lateness_bound=pipeline.lateness_bound,  # type: ignore[arg-type]  # parsed by Pipeline
            schedule=pipeline.schedule,
            description=pipeline.description,
            tags=tuple(pipeline.tags),
            source=source,
            corrections=pipeline.corrections,
            correction_max_age=pipeline.max_age,  # type: ignore[arg-type]  # parsed by Pipeline
            freshness_grace=pipeline.freshness_grace,  # type: ignore[arg-type]
            substream=pipeline.streams[0].substream,
        )
