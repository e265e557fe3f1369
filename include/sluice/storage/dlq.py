"""The pipeline's DLQ records per window, counted without reading the whole DLQ on every cycle.

The amendment scan (every cycle), the close (every window) and the DQ step's lateness check all need
"how many late records does this window have"; the DLQ grows with the history, one small file per ingest
batch with late records. :class:`DlqBuckets` keeps each file's counts once (files never change), so each
count reads only the files added since the last one.
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from sluice.config import Settings
from sluice.core.model import PipelineDef
from sluice.core.windows import Window, epoch_micros
from sluice.storage import snapshots, tables
from sluice.storage.state import lake_state

_LOCK = threading.Lock()


def dlq_paths(settings: Settings, pipeline: PipelineDef) -> dict[str, str]:
    return {s: tables.dlq(settings.stream(s)).path(settings) for s in pipeline.streams}


def dlq_counts(settings: Settings, pipeline: PipelineDef, windows: Sequence[Window]) -> dict[Window, int]:
    """DLQ records per window (event_time in [start, end)) over the pipeline's streams; windows without any
    are left out."""
    if not windows:
        return {}
    return dlq_snapshot(settings, pipeline).counts(windows)


def dlq_snapshot(settings: Settings, pipeline: PipelineDef) -> DlqSnapshot:
    """The pipeline's DLQ records per time bucket as the DLQ tables hold them now: counts for any windows
    later, as of this moment (a backfill with ``include_late`` takes one before it reads the DLQ)."""
    with _LOCK:  # one writer of the kept counts at a time within a process (the outputs' query threads)
        return DlqBuckets(settings, pipeline).snapshot()


@dataclass(frozen=True)
class DlqSnapshot:
    """DLQ records per time bucket (start in µs since the epoch -> records) at one moment."""

    totals: Mapping[int, int]

    def counts(self, windows: Sequence[Window]) -> dict[Window, int]:
        """DLQ records per window (event_time in [start, end)); windows without any are left out."""
        out = {}
        for window in windows:
            lo, hi = (epoch_micros(t) for t in window)
            n = sum(count for start, count in self.totals.items() if lo <= start < hi)
            if n:
                out[window] = n
        return out


class DlqBuckets:
    """DLQ records per window without reading the DLQ again: a DLQ data file never changes once written, so
    the count of each file's event times per time bucket (the greatest common divisor of the window's size
    and slide, on the same grid as the windows) is read once and kept in
    ``lake/_checkpoints/pipelines/<pipeline>/dlq_buckets.json`` (a state object, :mod:`sluice.storage.state`).
    A scan reads only the files added since (the increment), drops files no longer in the tables (compaction),
    and sums buckets per window: exact, and O(new DLQ files) instead of O(history). A lost or stale file only
    costs a re-read."""

    def __init__(self, settings: Settings, pipeline: PipelineDef) -> None:
        self.paths = dlq_paths(settings, pipeline)
        self.state = lake_state(settings)
        self.key = ("pipelines", pipeline.name, "dlq_buckets.json")
        window = pipeline.window
        self.grain_us = math.gcd(int(window.size / timedelta(microseconds=1)),
                                 int(window.slide / timedelta(microseconds=1)))

    def _load(self) -> dict[str, dict[int, int]]:
        saved = self.state.read_json(*self.key)
        if saved is None or saved.get("grain_us") != self.grain_us:
            return {}
        return {f: {int(b): int(n) for b, n in buckets.items()} for f, buckets in saved["files"].items()}

    def _save(self, files: Mapping[str, Mapping[int, int]]) -> None:
        # A whole-object replace (the outputs' queries close windows, and count, in threads of one process).
        self.state.write(json.dumps({"grain_us": self.grain_us, "files": files}, sort_keys=True), *self.key)

    def buckets(self) -> dict[str, dict[int, int]]:
        """Live DLQ file -> {bucket start (µs since the epoch): records}; reads only files not known yet."""
        known = self._load()
        live: dict[str, dict[int, int]] = {}
        for stream, path in sorted(self.paths.items()):
            for file in snapshots.live_files(path):
                key = f"{stream}/{file.relative}"
                live[key] = known[key] if key in known else self._read(file.path)
        if live != known:
            self._save(live)
        return live

    def _read(self, file: str) -> dict[int, int]:
        times = pq.read_table(file, columns=["event_time"]).column("event_time")
        micros = pc.cast(pc.cast(times, pa.timestamp("us", "UTC")), pa.int64())
        # Integer division floors: event times before 1970 never reach the DLQ (they are bad_timestamp).
        starts = pc.multiply(pc.divide(micros, self.grain_us), self.grain_us)
        counted = pc.value_counts(starts).to_pylist()
        return {int(c["values"]): int(c["counts"]) for c in counted if c["values"] is not None}

    def snapshot(self) -> DlqSnapshot:
        """The live DLQ files' buckets summed over the pipeline's streams."""
        totals: dict[int, int] = {}
        for buckets in self.buckets().values():
            for start, n in buckets.items():
                totals[start] = totals.get(start, 0) + n
        return DlqSnapshot(totals)

    def counts(self, windows: Sequence[Window]) -> dict[Window, int]:
        """DLQ records per window (event_time in [start, end)), over the pipeline's streams."""
        return self.snapshot().counts(windows)
