"""The public API for declaring streams and pipelines (SPEC section 8).

A data team writes a file in the pipelines folder::

    from sluice import Output, Pipeline, Stream, checks

    readings = Stream(name="readings", fields={...}, id="reading_id", watermark_delay="2m")
    pipeline = Pipeline(name="device_temps", streams=[readings], window=("15m", "5m"),
                        outputs=[Output("device_temps", build, key="device_id", checks=[...])])

and sluice does the rest: ingest with quarantine, dedup, watermarks and DLQ; the streaming query; the
closing of windows; the ledger; data quality; the DAG; backfills. Everything here is plain data, checked
when it is constructed, so a mistake fails at load time with a message that says what to fix.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from sluice.core.checks import Check
from sluice.core.errors import DefinitionError
from sluice.core.timeutil import parse_duration

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from sluice.core.windows import WindowSpec

FIELD_TYPES = ("string", "long", "double", "boolean", "timestamp")
CORRECTION_POLICIES = ("manual", "auto")
# What a run does with an output whose definition changed since its gold was built (SPEC 9): recompute every
# closed window with the new definition, keep the closed windows as they are and use the new one from now on,
# or refuse.
ON_CHANGE = ("rebuild", "forward", "fail")


def _on_change(owner: str, value: object) -> None:
    if value not in ON_CHANGE:
        raise DefinitionError(f"{owner}: on_change must be one of {', '.join(ON_CHANGE)}, got {value!r}")
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
_COLUMN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Columns sluice adds to bronze and DLQ rows; a stream field of the same name would collide with them.
RESERVED_COLUMNS = frozenset({
    "arrival_time", "source_file", "ingest_batch_id", "is_heartbeat", "event_date", "event_hour", "watermark", "raw",
})


def _name(kind: str, value: object) -> str:
    if not isinstance(value, str) or not _NAME.match(value):
        raise DefinitionError(
            f"{kind} name {value!r} is not valid; use lower-case letters, digits and '_' (it names folders "
            "and Delta tables), starting with a letter, e.g. 'device_temps'"
        )
    return value


def _duration(owner: str, key: str, value: object) -> timedelta:
    try:
        return parse_duration(value, f"{owner}: {key}")
    except ValueError as exc:
        raise DefinitionError(str(exc)) from None


# A Kafka topic name: what the broker accepts (Kafka's Topic.validate).
_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")


@dataclass(frozen=True)
class KafkaSource:
    """Where a stream's records come from when it is not a landing folder: a Kafka topic (SPEC 2, "Kafka
    streams"). Each record's value is one JSON document and its timestamp is its arrival time. The servers and
    security come from the run's settings (the Airflow connection ``kafka_default``, or ``SLUICE_KAFKA_*``),
    never from the declaration, so that a pipeline file holds no address and no secret."""

    topic: str

    def __post_init__(self) -> None:
        if not isinstance(self.topic, str) or not _TOPIC.match(self.topic) or self.topic in (".", ".."):
            raise DefinitionError(f"kafka(topic={self.topic!r}): a topic name is 1-249 letters, digits, '.', '_' "
                                  "or '-', e.g. kafka(topic='readings')")


def kafka(topic: str) -> KafkaSource:
    """A stream's source: the Kafka topic ``topic``, e.g. ``Stream(..., source=kafka(topic="readings"))``."""
    return KafkaSource(topic)


@dataclass(frozen=True, eq=False)
class Stream:
    """A stream: ``landing/<name>/`` JSON Lines files, or a Kafka topic (``source=kafka(topic=...)``), with the
    fields each record carries.

    ``fields`` maps field names to ``string``, ``long``, ``double``, ``boolean`` or ``timestamp``; the
    event-time field (``event_time`` unless ``event_time=`` names another) must be a ``timestamp``.
    ``id`` is the dedup key. ``required`` defaults to the id and the event time.

    ``substream`` names a field whose values have their own watermark (SPEC 3, "Substreams"): producers whose
    clocks disagree, e.g. ``substream="device_id", skew_tolerance="3h"``. ``skew_tolerance`` (default 1h, at
    least ``watermark_delay``) is how far behind the stream's newest event time a substream may run and still
    be on time. The substream field is required (a record without it is quarantined).
    """

    name: str
    fields: Mapping[str, str]
    id: str
    required: Sequence[str] | None = None
    watermark_delay: str | timedelta | float = "10m"
    early_tolerance: str | timedelta | float = "5m"
    idle_timeout: str | timedelta | float = "30m"
    event_time: str = "event_time"
    source: KafkaSource | None = None  # None: the landing folder
    substream: str | None = None
    skew_tolerance: str | timedelta | float | None = None

    def __post_init__(self) -> None:
        _name("stream", self.name)
        owner = f"Stream {self.name!r}"
        if self.source is not None and not isinstance(self.source, KafkaSource):
            raise DefinitionError(f"{owner}: source must be kafka(topic=...) or left out (the landing folder), "
                                  f"got {self.source!r}")
        if not isinstance(self.fields, Mapping) or not self.fields:
            raise DefinitionError(f"{owner}: fields must be a mapping of field name to type, e.g. "
                                  "{'reading_id': 'string', 'event_time': 'timestamp'}")
        fields = dict(self.fields)
        for name, kind in fields.items():
            if not isinstance(name, str) or not _COLUMN.match(name):
                raise DefinitionError(f"{owner}: field name {name!r} is not a valid column name")
            if name in RESERVED_COLUMNS:
                raise DefinitionError(f"{owner}: field {name!r} clashes with a column sluice adds "
                                      f"({', '.join(sorted(RESERVED_COLUMNS))}); rename it")
            if kind not in FIELD_TYPES:
                raise DefinitionError(f"{owner}: field {name!r} has unknown type {kind!r}; "
                                      f"use one of: {', '.join(FIELD_TYPES)}")
        if self.event_time not in fields:
            raise DefinitionError(f"{owner}: the event-time field {self.event_time!r} is missing from fields; "
                                  f"add it as 'timestamp', or name another one with event_time=...")
        if fields[self.event_time] != "timestamp":
            raise DefinitionError(f"{owner}: the event-time field {self.event_time!r} must have type 'timestamp', "
                                  f"not {fields[self.event_time]!r}")
        if self.event_time != "event_time" and "event_time" in fields:
            raise DefinitionError(f"{owner}: 'event_time' is a field but {self.event_time!r} is the event time; "
                                  "rename one of them")
        if self.id not in fields:
            raise DefinitionError(f"{owner}: the id field {self.id!r} is missing from fields; add it to fields")
        if self.id == self.event_time:
            raise DefinitionError(f"{owner}: the id field cannot be the event-time field")
        required = list(self.required) if self.required is not None else [self.id, self.event_time]
        if isinstance(self.required, str):
            raise DefinitionError(f"{owner}: required must be a list of field names, e.g. [{self.required!r}]")
        for name in required:
            if name not in fields:
                raise DefinitionError(f"{owner}: required field {name!r} is missing from fields; "
                                      f"declare it in fields (known: {', '.join(fields)})")
        for must in (self.id, self.event_time):
            if must not in required:
                required.append(must)
        object.__setattr__(self, "fields", fields)
        for key in ("watermark_delay", "early_tolerance", "idle_timeout"):
            object.__setattr__(self, key, _duration(owner, key, getattr(self, key)))
        if self.substream is not None:
            self._check_substream(owner, fields)
            if self.substream not in required:
                required.append(self.substream)
        elif self.skew_tolerance is not None:
            raise DefinitionError(f"{owner}: skew_tolerance applies to substreams only; name the field whose values "
                                  "have their own clock with substream=..., or remove skew_tolerance")
        object.__setattr__(self, "required", tuple(required))

    def _check_substream(self, owner: str, fields: dict[str, str]) -> None:
        if not isinstance(self.substream, str) or self.substream not in fields:
            raise DefinitionError(f"{owner}: substream={self.substream!r} must name one of its fields "
                                  f"({', '.join(fields)}), e.g. substream='device_id'")
        if self.substream == self.event_time:
            raise DefinitionError(f"{owner}: the substream field cannot be the event-time field; name the field "
                                  "that tells the producers apart, e.g. substream='device_id'")
        if fields[self.substream] not in ("string", "long", "boolean"):
            raise DefinitionError(f"{owner}: substream field {self.substream!r} has type "
                                  f"{fields[self.substream]!r}; a substream key must be a string, long or boolean")
        if "substream" in fields:
            raise DefinitionError(f"{owner}: field 'substream' clashes with the column the DLQ of a stream with "
                                  "substreams adds (the key of each late record); rename it")
        skew = _duration(owner, "skew_tolerance", "1h" if self.skew_tolerance is None else self.skew_tolerance)
        delay = self.watermark_delay
        assert isinstance(delay, timedelta)
        if skew < delay:
            raise DefinitionError(f"{owner}: skew_tolerance ({self.skew_tolerance}) must be at least watermark_delay "
                                  f"({delay}): a substream's own watermark already allows that much lateness")
        object.__setattr__(self, "skew_tolerance", skew)

    def _identity(self) -> tuple[Any, ...]:
        return (self.name, tuple(self.fields.items()), self.id, self.required, self.watermark_delay,
                self.early_tolerance, self.idle_timeout, self.event_time, self.source, self.substream,
                self.skew_tolerance)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Stream) and self._identity() == other._identity()

    def __hash__(self) -> int:
        return hash(self._identity())


Build = Callable[[Mapping[str, "DataFrame"], "WindowSpec"], "DataFrame"]


@dataclass(frozen=True)
class Output:
    """One gold table, ``gold/<name>``: the rows ``build(inputs, window)`` returns, one per window and key.

    ``build`` returns a ``window`` column (from ``window.column(<time column>)``), the key column(s) and
    the metrics. ``checks`` run on every closed window of this output. ``on_change`` (default: the pipeline's)
    says what a run does once its definition changed (SPEC 9).
    """

    name: str
    build: Build
    key: str | Sequence[str]
    checks: Sequence[Check] = ()
    on_change: str | None = None

    def __post_init__(self) -> None:
        _name("output", self.name)
        if not callable(self.build):
            raise DefinitionError(f"Output {self.name!r}: build must be a function (inputs, window) -> DataFrame")
        keys = (self.key,) if isinstance(self.key, str) else tuple(self.key)
        if not keys or not all(isinstance(k, str) and _COLUMN.match(k) for k in keys):
            raise DefinitionError(f"Output {self.name!r}: key must name the grouping column(s), e.g. key='device_id'")
        object.__setattr__(self, "key", keys[0] if len(keys) == 1 else keys)
        checks = tuple(self.checks)
        for check in checks:
            if not isinstance(check, Check):
                raise DefinitionError(f"Output {self.name!r}: {check!r} is not a check; use sluice.checks."
                                      "completeness/between/not_null")
        object.__setattr__(self, "checks", checks)
        if self.on_change is not None:
            _on_change(f"Output {self.name!r}", self.on_change)

    @property
    def keys(self) -> tuple[str, ...]:
        return (self.key,) if isinstance(self.key, str) else tuple(self.key)


def _window(owner: str, value: object) -> tuple[timedelta, timedelta | None]:
    if isinstance(value, str | timedelta):
        return _duration(owner, "window", value), None
    if isinstance(value, Sequence) and len(value) == 2:
        size = _duration(owner, "window size", value[0])
        hop = _duration(owner, "window hop", value[1])
        return size, (None if hop == size else hop)
    raise DefinitionError(f"{owner}: window must be a size such as '1h', or (size, hop) such as ('15m', '5m')")


def _check_substreams(owner: str, streams: tuple[Stream, ...], outputs: tuple[Output, ...]) -> None:
    """SPEC 3: every stream of a pipeline declares the same substream field, or none does; and every output is
    keyed by it (a window's rows for one key are written on that key's own clock)."""
    declared = {s.name: s.substream for s in streams}
    fields = set(declared.values())
    if len(fields) > 1:
        listed = ", ".join(f"{n}: {f!r}" for n, f in declared.items())
        raise DefinitionError(f"{owner}: every stream of a pipeline declares the same substream field, or none "
                              f"does ({listed}); declare substream={next(f for f in fields if f)!r} on each")
    field_name = fields.pop()
    if field_name is None:
        return
    for output in outputs:
        if field_name not in output.keys:
            raise DefinitionError(f"{owner}, output {output.name!r}: an output over substreams is keyed by the "
                                  f"substream field {field_name!r} (its rows of a window are written on that "
                                  f"key's own clock); add it to key= (now {output.key!r})")


@dataclass(frozen=True)
class Pipeline:
    """A pipeline: the streams it reads, its window, its schedule and its outputs.

    ``lateness_bound`` is how long after a window's end its rows can still change (a join bound); a
    window closes once the pipeline watermark has passed ``end + lateness_bound``.
    """

    name: str
    streams: Sequence[Stream]
    outputs: Sequence[Output]
    window: str | timedelta | tuple[Any, Any] = "1h"
    schedule: str | None = "*/15 * * * *"
    lateness_bound: str | timedelta | float = 0
    description: str = ""
    tags: Sequence[str] = ()
    # Late data and freshness (README "Operations"): what happens when DLQ records land for a closed window
    # ("manual": the window's ``late_waiting`` counts them; "auto": the next cycle re-computes it with its late
    # records), how old a window may be and still be corrected automatically, and how long after
    # end + lateness_bound a window may stay open before a ``stale`` alert.
    corrections: str = "manual"
    max_age: str | timedelta | float = "7d"
    freshness_grace: str | timedelta | float = "1h"
    # What a run does with an output whose definition changed (SPEC 9); an Output's own on_change wins.
    on_change: str = "rebuild"
    window_size: timedelta = field(init=False, repr=False)
    window_hop: timedelta | None = field(init=False, repr=False)

    def __post_init__(self) -> None:
        _name("pipeline", self.name)
        owner = f"Pipeline {self.name!r}"
        streams = tuple(self.streams) if isinstance(self.streams, Iterable) else ()
        if not streams or not all(isinstance(s, Stream) for s in streams):
            raise DefinitionError(f"{owner}: streams must be a non-empty list of sluice.Stream")
        names = [s.name for s in streams]
        if len(set(names)) != len(names):
            raise DefinitionError(f"{owner}: a stream is listed twice ({', '.join(names)})")
        outputs = tuple(self.outputs) if isinstance(self.outputs, Iterable) else ()
        if not outputs or not all(isinstance(o, Output) for o in outputs):
            raise DefinitionError(f"{owner}: outputs must be a non-empty list of sluice.Output")
        out_names = [o.name for o in outputs]
        if len(set(out_names)) != len(out_names):
            raise DefinitionError(f"{owner}: two outputs are named alike ({', '.join(out_names)})")
        for output in outputs:
            for check in output.checks:
                check.validate(owner=f"{owner}, output {output.name!r}", streams={s.name: s for s in streams})
        _check_substreams(owner, streams, outputs)
        size, hop = _window(owner, self.window)
        if size <= timedelta(0) or (hop is not None and hop <= timedelta(0)):
            raise DefinitionError(f"{owner}: window size and hop must be > 0")
        if self.schedule is not None and not isinstance(self.schedule, str):
            raise DefinitionError(f"{owner}: schedule must be a cron expression or preset such as '@hourly', or None")
        object.__setattr__(self, "streams", streams)
        object.__setattr__(self, "outputs", outputs)
        object.__setattr__(self, "window_size", size)
        object.__setattr__(self, "window_hop", hop)
        object.__setattr__(self, "lateness_bound", _duration(owner, "lateness_bound", self.lateness_bound))
        object.__setattr__(self, "tags", tuple(self.tags))
        if self.corrections not in CORRECTION_POLICIES:
            raise DefinitionError(
                f"{owner}: corrections must be one of {', '.join(CORRECTION_POLICIES)}, got {self.corrections!r}"
            )
        _on_change(owner, self.on_change)
        object.__setattr__(self, "max_age", _duration(owner, "max_age", self.max_age))
        object.__setattr__(self, "freshness_grace", _duration(owner, "freshness_grace", self.freshness_grace))

    @property
    def stream_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.streams)

    def output(self, name: str) -> Output:
        for out in self.outputs:
            if out.name == name:
                return out
        raise KeyError(name)


__all__ = ["FIELD_TYPES", "Output", "Pipeline", "Stream"]
