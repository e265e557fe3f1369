"""Event-time windows: tumbling, hopping (overlapping) and windows with gaps, half-open ``[start, end)``.

A pipeline's build function gets a :class:`WindowSpec` and groups by ``window.column(<time column>)``.
"""

from __future__ import annotations

import calendar
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from sluice.core.errors import ConfigError
from sluice.core.timeutil import parse_duration

#: A window's bounds, half-open ``[start, end)``, aware UTC: the key of a window in gold, the ledger and the DLQ.
Window = tuple[datetime, datetime]

# Window starts are aligned to the Unix epoch (Spark's window() with no start offset): k * slide.
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def epoch_micros(ts: datetime) -> int:
    """An aware time as whole microseconds since the epoch (exact; negative before it)."""
    return (ts - EPOCH) // timedelta(microseconds=1)


def first_window_start_at_or_after(ts: datetime, slide: timedelta) -> datetime:
    """The earliest window start ``>= ts`` on the epoch-aligned grid of ``slide``. ``ts`` must be aware."""
    if ts.tzinfo is None or ts.utcoffset() is None:
        raise ValueError(f"a timezone-aware time is required, got {ts!r}")
    if slide <= timedelta(0):
        raise ValueError(f"window slide must be > 0, got {slide}")
    # In whole microseconds (exact; and pendulum's DateTime, which Airflow hands tasks, mixes badly with
    # stdlib timedelta arithmetic). Ceiling division: -(-a // b).
    since_epoch_us = calendar.timegm(ts.utctimetuple()) * 1_000_000 + ts.microsecond
    slide_us = slide // timedelta(microseconds=1)
    return EPOCH + timedelta(microseconds=-(-since_epoch_us // slide_us) * slide_us)


def windows_starting_in(start: datetime, end: datetime, slide: timedelta) -> Window | None:
    """The windows whose start lies in ``[start, end)`` (e.g. an Airflow run's data interval), as the aligned
    backfill range ``[first window start >= start, first window start >= end)``; None when no window starts
    in it (say a 15-minute interval of an hourly pipeline that holds no full hour). Both bounds of a result
    are on the pipeline's window grid, as ``sluice backfill`` requires."""
    lo = first_window_start_at_or_after(start, slide)
    hi = first_window_start_at_or_after(end, slide)
    return (lo, hi) if lo < hi else None


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

    def next_end(self, after: datetime) -> datetime:
        """The first end of a window of this spec after ``after`` (ends are start + size, starts on the slide
        grid from the epoch)."""
        slide_us = self.slide // timedelta(microseconds=1)
        size_us = self.size // timedelta(microseconds=1)
        after_us = epoch_micros(after)
        k = (after_us - size_us) // slide_us + 1
        return EPOCH + timedelta(microseconds=k * slide_us + size_us)

    def ending_in(self, after: datetime, until: datetime) -> set[Window]:
        """Every window of this spec ending in ``(after, until]``."""
        windows = set()
        end = self.next_end(after)
        while end <= until:
            windows.add((end - self.size, end))
            end += self.slide
        return windows

    @classmethod
    def parse(cls, size: str, hop: str | None = None) -> WindowSpec:
        return cls(parse_duration(size, "window.size"), parse_duration(hop, "window.hop") if hop else None)
