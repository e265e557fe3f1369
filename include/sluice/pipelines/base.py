"""What a pipeline is: a small typed definition, not a copy of a job file.

A pipeline names the bronze streams it reads, its window, and its outputs. Each output is one
``build`` function from the (watermarked) input streams to windowed rows with a ``window`` struct column.
The same ``build`` runs on streaming DataFrames (the scheduled path) and on batch DataFrames (backfills),
so the two paths cannot drift. Adding a pipeline means writing its transform and its config.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from sluice.config import ConfigError, StreamSpec, parse_duration
from sluice.tables import TableDef

Inputs = Mapping[str, DataFrame]


def spark_interval(value: timedelta) -> str:
    """A timedelta as Spark's interval string (whole seconds)."""
    return f"{int(value.total_seconds())} seconds"


@dataclass(frozen=True)
class WindowSpec:
    """Tumbling (``hop`` None or equal to ``size``) or hopping windows; ``hop < size`` overlaps,
    ``hop > size`` leaves gaps whose records fall in no window. Bounds are half-open ``[start, end)``."""

    size: timedelta = timedelta(hours=1)
    hop: timedelta | None = None

    def __post_init__(self) -> None:
        if self.size <= timedelta(0):
            raise ConfigError(f"window size must be > 0, got {self.size}")
        if self.hop is not None and self.hop <= timedelta(0):
            raise ConfigError(f"window hop must be > 0, got {self.hop}")

    @property
    def slide(self) -> timedelta:
        return self.hop or self.size

    @property
    def has_gaps(self) -> bool:
        return self.hop is not None and self.hop > self.size

    def column(self, time_column: str | Column) -> Column:
        """The grouping window. Spark's window() needs slide <= size, so windows with gaps group by the
        tumbling ``hop`` window whose first ``size`` they cover (see :meth:`keep`), and the sink reports
        ``window_end = window_start + size`` (:meth:`bounds`)."""
        if self.has_gaps:
            return F.window(time_column, spark_interval(self.slide))
        return F.window(time_column, spark_interval(self.size), spark_interval(self.slide))

    def keep(self, time_column: Column) -> Column:
        """Rows that fall in some window: all of them, except in the gaps (offset into the hop >= size)."""
        if not self.has_gaps:
            return F.lit(True)
        hop_us = int(self.slide.total_seconds() * 1_000_000)
        size_us = int(self.size.total_seconds() * 1_000_000)
        return (F.unix_micros(time_column) % F.lit(hop_us)) < F.lit(size_us)

    def bounds(self, df: DataFrame) -> DataFrame:
        """The ``window`` struct as the contract's ``window_start`` / ``window_end`` columns."""
        df = df.withColumn("window_start", F.col("window.start"))
        if self.has_gaps:
            return df.withColumn(
                "window_end", F.col("window.start") + F.expr(f"INTERVAL {int(self.size.total_seconds())} SECONDS")
            )
        return df.withColumn("window_end", F.col("window.end"))

    @classmethod
    def parse(cls, size: str, hop: str | None = None) -> WindowSpec:
        return cls(parse_duration(size, "window.size"), parse_duration(hop, "window.hop") if hop else None)


@dataclass(frozen=True)
class Output:
    """One gold table of a pipeline, produced by one streaming query."""

    name: str  # query name, also the app id of its commits
    table: TableDef
    build: Callable[[Inputs, WindowSpec], DataFrame]
    key: str  # the grouping key; heartbeat groups carry a sentinel here and are dropped at the sink
    metrics: tuple[str, ...]


@dataclass(frozen=True)
class PipelineDef:
    name: str
    # stream -> how to prepare its bronze rows (select, rename, watermark, dedup) given the stream's spec
    inputs: Mapping[str, Callable[[StreamSpec], Callable[[DataFrame], DataFrame]]]
    outputs: tuple[Output, ...]
    window: WindowSpec = field(default_factory=WindowSpec)
    # How long after a window's end its rows can still change (join bounds); a window is final once the
    # watermark passes end + this. Used by the ledger and by tests, Spark enforces it by itself.
    lateness_bound: timedelta = timedelta(0)

    @property
    def streams(self) -> tuple[str, ...]:
        return tuple(self.inputs)

    def output(self, name: str) -> Output:
        for out in self.outputs:
            if out.name == name:
                return out
        raise KeyError(name)
