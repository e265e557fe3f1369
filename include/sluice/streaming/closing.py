"""Closing windows in batch, from bronze: the batch close after a cycle's streaming queries, and the batch
catch-up before a fresh pipeline's first ones (see :mod:`sluice.streaming.runner` for the streaming queries).

**The batch close.** After the streaming queries, every window the closing rule makes final that is not in gold
yet is computed in batch from bronze (the backfill code path: same transforms, same rows) and committed the same
way; ``closed_through`` records the boundary (``W - lateness_bound``) it reached, and the streaming sink drops
windows ending at or before it. After every cycle, gold therefore holds exactly the windows that end at or
before ``W - lateness_bound``, however Spark's watermark moved.

**Small cycles.** A cycle whose closable windows read at most ``batch_close_rows`` bronze rows
(:meth:`BatchClose.rows_to_close`, from the Delta log) runs the batch close alone, without the streaming queries
(see :mod:`sluice.streaming.runner`).

**Batch catch-up.** Replaying a long backlog through stateful streaming operators costs 2-3x what the
same logic costs as one Spark batch. So when a pipeline's queries start fresh (no checkpoint) and at least
``catchup_min_windows`` windows are already closable, the runner first computes those windows in batch and
the streaming queries read only the bronze rows that can still reach a later window (whole hourly
partitions before that are not even read). The marker is written before the batch commits (state
``pending``), and those commits carry their own app transactions, so a crash anywhere in between is
repaired by the next run.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import datetime, timedelta

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from sluice.core.model import OutputDef, PipelineDef
from sluice.core.spark import local_frame
from sluice.core.windows import Window
from sluice.ingest.state import load_state
from sluice.ingest.substreams import KEY, minus, stored_maxima
from sluice.runtime.context import RunContext
from sluice.storage import tables
from sluice.streaming.batch import (
    CATCHUP,
    CatchUp,
    batch_inputs,
    closed_through,
    closing_boundary,
    gold_rows,
    gold_windows,
    mark_closed_through,
    pipeline_state,
    pipeline_watermark,
    reach_from,
    stream_floor,
)
from sluice.streaming.commits import WindowCommits
from sluice.windows.ledger import WINDOW_LEDGER, next_version

log = logging.getLogger("sluice.aggregate")


class BatchClose:
    """The batch close and the batch catch-up of one pipeline; ``started(output)`` says whether an output's
    streaming query has committed a batch (its checkpoint is the runner's)."""

    def __init__(self, ctx: RunContext, pipeline: PipelineDef, commits: WindowCommits,
                 started: Callable[[OutputDef], bool]):
        self._ctx = ctx
        self.settings = ctx.settings
        self.engine = ctx.engine
        self.state = ctx.state
        self.ledger = ctx.ledger(pipeline.name)
        self.pipeline = pipeline
        self.commits = commits
        self.result = commits.result
        self._started = started

    @property
    def spark(self) -> SparkSession:
        return self._ctx.spark

    def closed_through(self) -> datetime | None:
        """The boundary up to which the batch close (or catch-up) has written every final window."""
        return closed_through(self.state, self.pipeline.name)

    def can_close(self, after: datetime | None) -> bool:
        """Whether a window may close this cycle: one ends in ``(after, W - lateness_bound]`` (True when
        nothing has closed yet, so there is no ``after`` to compare with). Metadata only.

        Most scheduled cycles cannot (a 15-minute increment closes an hourly window one cycle in four), and
        they skip the stateful queries: starting them, their state store commits and the no-data batch cost
        seconds each. Deferring their rows is exact: Spark never writes a window before the closing rule
        makes it final, and a later, larger batch only holds Spark's own watermark further back (nothing it
        keeps becomes late). The queries take the deferred bronze versions in the cycle that can close."""
        if after is None:
            return True
        boundary = closing_boundary(self.settings, self.pipeline)
        return boundary is None or self._window_ends(after, boundary)

    # -- the batch close (see the module docstring) -----------------------------------------------------
    def read_range(self, after: datetime | None, boundary: datetime) -> tuple[datetime | None, datetime]:
        """The event times ``[lo, hi)`` of the bronze rows that can reach a window ending in ``(after, boundary]``."""
        return (None if after is None else reach_from(self.pipeline, after)), boundary + self.pipeline.lateness_bound

    def rows_to_close(self, after: datetime | None) -> int | None:
        """Bronze rows (heartbeats included) in the event hours a batch close of this cycle reads, from the
        Delta log's file statistics (no data file is read); None while no window can close, or when a file
        has no statistics."""
        boundary = closing_boundary(self.settings, self.pipeline)
        if boundary is None:
            return None
        lo, hi = self.read_range(after, boundary)
        rows = [tables.bronze_rows_between(tables.bronze(self.settings.stream(s)).path(self.settings), lo, hi)
                for s in self.pipeline.streams]
        return None if None in rows else sum(n for n in rows if n is not None)

    def _next_end(self, lo: datetime) -> datetime:
        """The first end of a window of the pipeline after ``lo``."""
        return self.pipeline.window.next_end(lo)

    def _window_ends(self, lo: datetime | None, hi: datetime) -> bool:
        """Whether some window of the pipeline ends in ``(lo, hi]``."""
        return lo is None or self._next_end(lo) <= hi

    def _final_windows(self, after: datetime | None, boundary: datetime) -> set[Window] | None:
        """Every window of the pipeline ending in ``(after, boundary]`` (None when nothing has closed yet:
        then there is no lower end to count from)."""
        return None if after is None else self.pipeline.window.ending_in(after, boundary)

    def _written_windows(self, output: OutputDef, after: datetime | None) -> dict[Window, int]:
        """Windows of gold ending after ``after``, with their row counts (metadata-sized)."""
        return gold_windows(self.settings, output, after=after)

    def _repair_ledger(self, written: dict[str, dict[Window, int]], boundary: datetime,
                       watermark: datetime | None) -> None:
        """Ledger rows for final windows that are in gold but not in the ledger: a batch close that crashed
        between its gold commit and its ledger commit (its rerun finds the windows written already)."""
        known = set(self.ledger.windows())
        for output in self.pipeline.outputs:
            missing = {w: n for w, n in written[output.name].items() if w[1] <= boundary and w not in known}
            if missing:
                log.warning("%s: recording %d window(s) in the ledger after an interrupted batch close",
                            output.name, len(missing))
                app = f"sluice.ledger.repair.{output.name}"
                self.commits.record_closed(output, missing, watermark, app_id=app,
                                           version=next_version(self.engine, WINDOW_LEDGER.path(self.settings), app))
                known.update(missing)

    def _mark_closed_through(self, boundary: datetime) -> None:
        mark_closed_through(self.state, self.pipeline.name, boundary)

    def close_final_windows(self, after: datetime | None) -> None:
        """Write, in batch, every window the closing rule makes final that gold does not hold yet."""
        pipeline = self.pipeline
        # One read of the stored watermarks serves the boundary and the ledger rows.
        watermark = pipeline_watermark(self.settings, pipeline)
        if watermark is None:
            return
        boundary = watermark - pipeline.lateness_bound
        if after is not None and boundary <= after:
            return
        if not self._window_ends(after, boundary):
            self._mark_closed_through(boundary)
            return
        written = {o.name: self._written_windows(o, after) for o in pipeline.outputs}
        self._repair_ledger(written, boundary, watermark)
        due = self._final_windows(after, boundary)
        if due is not None and all(due <= written[o.name].keys() for o in pipeline.outputs):
            # The usual case in a scheduled cycle that closes a window: the streaming queries wrote every window
            # the rule makes final, in every output. The batch close would find nothing left to write, after
            # reading bronze and running the pipeline's transforms over it (seconds of Spark jobs).
            self._mark_closed_through(boundary)
            log.info("%s: every window final up to %s is in gold already; no batch close needed", pipeline.name,
                     boundary.isoformat())
            return
        started = time.monotonic()
        inputs = batch_inputs(self.settings, self.engine, pipeline, *self.read_range(after, boundary))
        closed_before = len(self.result.windows)
        for output in pipeline.outputs:
            final = F.col("window_end") <= F.lit(boundary)
            if after is not None:
                final = final & (F.col("window_end") > F.lit(after))
            rows = gold_rows(output, output.build(inputs, pipeline.window), pipeline.window).filter(final)
            if written[output.name]:
                done = local_frame(self.spark, sorted(written[output.name]), "_ws timestamp, _we timestamp")
                rows = rows.join(
                    F.broadcast(done),
                    (F.col("window_start") == F.col("_ws")) & (F.col("window_end") == F.col("_we")),
                    "left_anti",
                ).coalesce(1).sortWithinPartitions("window_start", "window_end", *output.keys)
            rows = rows.persist(StorageLevel.MEMORY_AND_DISK)
            try:
                app = f"sluice.close.{output.name}"
                meta = {"pipeline": pipeline.name, "output": output.name, "batch_close": True,
                        "watermark": watermark, "boundary": boundary}
                self.commits.commit(output, rows, meta, watermark, app,
                                    next_version(self.engine, output.path(self.settings), app),
                                    ledger_app=f"sluice.ledger.close.{output.name}")
            finally:
                rows.unpersist()
        self._mark_closed_through(boundary)
        # Only the batch's own windows (each window closed is logged one by one above): after the streaming
        # queries, a batch close with nothing left to write must not read as "nothing closed"; in a small cycle
        # (no streaming query) these are all of the cycle's windows.
        log.info("%s: batch close up to %s (watermark %s): %d window(s) written in batch, in %.1fs", pipeline.name,
                 boundary.isoformat(), watermark.isoformat() if watermark else "-",
                 len(self.result.windows) - closed_before, time.monotonic() - started)

    # -- substreams (SPEC 3): each key's rows on its own clock -------------------------------------------
    def _clocks(self) -> DataFrame:
        """Per substream key (``_substream``, as text): ``_e_k``, the smallest over the pipeline's streams of
        ``E_k = max(W_k, F)`` (a stream that never saw the key gives its floor ``F``)."""
        clocks = None
        floors = []
        for stream in self.pipeline.streams:
            spec = self.settings.stream(stream)
            floor = stream_floor(self.settings, stream)
            assert floor is not None and spec.skew_tolerance is not None
            floors.append(floor)
            mark = F.greatest(minus(F.col("_k_stored_max"), spec.watermark_delay), F.lit(floor))
            own = stored_maxima(self.settings, self.engine, spec).select(KEY, mark.alias(f"_e_{len(floors)}"))
            clocks = own if clocks is None else clocks.join(own, KEY, "full_outer")
        assert clocks is not None
        marks = [F.coalesce(F.col(f"_e_{i}"), F.lit(f)) for i, f in enumerate(floors, 1)]
        return clocks.select(KEY, (F.least(*marks) if len(marks) > 1 else marks[0]).alias("_e_k"))

    def close_by_key(self, after: datetime | None) -> None:
        """A pipeline over substreams (SPEC 3), in batch from bronze each cycle: the rows of window w for key k go
        to gold once ``E_k >= end(w) + lateness_bound``; the window as a whole closes (ledger, data quality) once
        the floor ``F`` passes it, when every key's rows of it are in gold (``E_k >= F`` for every key, and a key
        never seen has only ``F``). Reads the bronze rows that can reach a window not closed as a whole."""
        pipeline, settings = self.pipeline, self.settings
        floor = pipeline_watermark(settings, pipeline)
        if floor is None:
            return
        bound = pipeline.lateness_bound
        boundary = floor - bound
        started = time.monotonic()
        newest = max(w + settings.stream(s).watermark_delay for s in pipeline.streams
                     if (w := load_state(settings, s).watermark) is not None)
        lo = reach_from(pipeline, after) if after is not None else None
        inputs = batch_inputs(settings, self.engine, pipeline, lo, newest + bound + timedelta(microseconds=1))
        clocks = self._clocks()
        field_name = pipeline.substream
        assert field_name is not None
        closed_before = len(self.result.windows)
        totals: dict[Window, int] = {}
        for output in pipeline.outputs:
            # The per-key rule on the build's rows, before gold_rows' single sorted partition: the keys' clocks are
            # broadcast (a timestamp per key: 1M substreams are tens of MB), or the join would run in that partition.
            built = output.build(inputs, pipeline.window).transform(pipeline.window.bounds)
            if after is not None:
                built = built.filter(F.col("window_end") > F.lit(after))
            final = (built.join(F.broadcast(clocks), F.col(field_name).cast("string") == F.col(KEY), "left")
                     .filter(F.col("window_end") <= minus(F.coalesce(F.col("_e_k"), F.lit(floor)), bound))
                     .drop(KEY, "_e_k", "window_start", "window_end"))
            if gold_windows(settings, output, after=after):
                # Rows an earlier cycle wrote on their key's clock (none on the first cycle: no read at all).
                written = self.engine.read(output.path(settings)).select("window_start", "window_end", *output.keys)
                if after is not None:
                    written = written.filter(F.col("window_end") > F.lit(after))
                final = (final.transform(pipeline.window.bounds)
                         .join(written, ["window_start", "window_end", *output.keys], "left_anti")
                         .drop("window_start", "window_end"))
            rows = gold_rows(output, final, pipeline.window).persist(StorageLevel.MEMORY_AND_DISK)
            try:
                app = f"sluice.close.{output.name}"
                meta = {"pipeline": pipeline.name, "output": output.name, "substreams": True, "floor": floor}
                self.commits.write_rows(output, rows, meta, floor, app,
                                        next_version(self.engine, output.path(settings), app), windows_key="windows")
            finally:
                rows.unpersist()
            for window, n in gold_windows(settings, output, after=after, until=boundary).items():
                totals[window] = totals.get(window, 0) + n
        # The windows the floor closed: recorded once for all outputs (a rerun after a crash finds them recorded).
        known = set(self.ledger.windows())
        closing = {w: n for w, n in totals.items() if w not in known}
        if closing:
            app = f"sluice.ledger.close.{pipeline.name}"
            self.commits.record_closed(pipeline.outputs[0], closing, floor, app_id=app,
                                       version=next_version(self.engine, WINDOW_LEDGER.path(settings), app))
            for output in pipeline.outputs:
                self.result.closed[output.name].extend(sorted(closing))
        if after is None or boundary > after:
            self._mark_closed_through(boundary)
        log.info("%s: substreams: gold holds each key's rows up to its own watermark; %d window(s) closed up to "
                 "the floor %s, in %.1fs", pipeline.name, len(self.result.windows) - closed_before,
                 boundary.isoformat(), time.monotonic() - started)

    # -- batch catch-up (see the module docstring) ----------------------------------------------------
    def catch_up(self) -> CatchUp | None:
        """Run (or finish) the pipeline's batch catch-up if one is due; return the one in effect."""
        state, marker = self.state, pipeline_state(self.pipeline.name, CATCHUP)
        saved = state.read(*marker)
        if saved is not None:
            catchup = CatchUp.from_json(saved)
        else:
            planned = self._plan_catch_up()
            if planned is None:
                return None
            catchup = planned
            state.write(catchup.to_json(), *marker)
        if not catchup.done:
            self._run_catch_up(catchup)
            catchup = CatchUp(catchup.boundary, catchup.watermark, catchup.version, done=True)
            state.write(catchup.to_json(), *marker)
        return catchup

    def _plan_catch_up(self) -> CatchUp | None:
        minimum = self.settings.catchup_min_windows
        if (minimum <= 0 or self.pipeline.substream is not None or self.closed_through() is not None
                or any(self._started(o) for o in self.pipeline.outputs)):
            return None
        watermark = pipeline_watermark(self.settings, self.pipeline)
        if watermark is None:
            return None
        boundary = watermark - self.pipeline.lateness_bound
        # The oldest event any stream has accepted, from bronze's file statistics. Not from the ingest batches:
        # they keep only their newest event time, and a topic's backlog arrives as one micro-batch.
        oldest = [
            first
            for s in self.pipeline.streams
            if (first := tables.first_event_time(tables.bronze(self.settings.stream(s)).path(self.settings)))
            is not None
        ]
        if not oldest:
            return None
        backlog = (boundary - min(oldest)) / self.pipeline.window.slide
        if backlog < minimum:
            return None
        versions = [
            version
            for o in self.pipeline.outputs
            for version in (
                next_version(self.engine, o.path(self.settings), self._catchup_app(o)),
                next_version(self.engine, WINDOW_LEDGER.path(self.settings), f"sluice.ledger.catchup.{o.name}"),
            )
        ]
        log.info("%s: %.0f window(s) of backlog; computing windows ending by %s in batch (catch-up)",
                 self.pipeline.name, backlog, boundary.isoformat())
        return CatchUp(boundary, watermark, max(versions))

    @staticmethod
    def _catchup_app(output: OutputDef) -> str:
        return f"sluice.catchup.{output.name}"

    def _run_catch_up(self, catchup: CatchUp) -> None:
        started = time.monotonic()
        pipeline = self.pipeline
        hi = catchup.boundary + pipeline.lateness_bound
        inputs = batch_inputs(self.settings, self.engine, pipeline, None, hi)
        for output in pipeline.outputs:
            self.result.closed.setdefault(output.name, [])
            rows = (
                gold_rows(output, output.build(inputs, pipeline.window), pipeline.window)
                .filter(F.col("window_end") <= F.lit(catchup.boundary))
                .persist(StorageLevel.MEMORY_AND_DISK)
            )
            try:
                meta = {"pipeline": pipeline.name, "output": output.name, "catchup": True,
                        "watermark": catchup.watermark, "boundary": catchup.boundary}
                self.commits.commit(output, rows, meta, catchup.watermark, self._catchup_app(output),
                                    catchup.version, ledger_app=f"sluice.ledger.catchup.{output.name}")
            finally:
                rows.unpersist()
        log.info("%s: catch-up done in %.1fs: %d window(s) up to %s; streaming from there", pipeline.name,
                 time.monotonic() - started, len(self.result.windows), catchup.boundary.isoformat())

