"""The scheduled path: bronze -> gold, one availableNow streaming query per pipeline output, and the
closing rule that decides when a window is written.

The inputs a build function gets and the closing rule every path applies are described in
:mod:`sluice.streaming.batch`.

**Streaming and the batch close.** Each output's streaming query (Spark's stateful operators and their state
store) writes the windows Spark closes. Spark closes on its own watermark, which only moves with rows it
sees (never heartbeats), treats ``event_time <= watermark`` as late, evicts ``<=`` join state a
millisecond later than the rule above, and forgets an input with no rows after a restart. An output that
reads only some of the pipeline's streams has a Spark watermark of those streams only, which can run ahead
of ``W``: so the sink keeps only the windows the rule makes final in this cycle (``window_end <= W -
lateness_bound``), and any window Spark emitted early is written by the batch close once ``W`` passes it.
(Spark's own watermark runs one millisecond behind the stored one, see :func:`spark_delay`, so that a record
accepted exactly at the watermark still reaches every window that holds it.) After the streaming queries, every window
the rule makes final that is not in gold yet is computed in batch from bronze (the backfill code path:
same transforms, same rows) and committed the same way; ``closed_through`` records the boundary
(``W - lateness_bound``) it reached, and the streaming sink drops windows ending at or before it. After
every cycle, gold therefore holds exactly the windows that end at or before ``W - lateness_bound``,
however Spark's watermark moved.

**Batch catch-up.** Replaying a long backlog through stateful streaming operators costs 2-3x what the
same logic costs as one Spark batch. So when a pipeline's queries start fresh (no checkpoint) and at least
``catchup_min_windows`` windows are already closable, the runner first computes those windows in batch and
the streaming queries read only the bronze rows that can still reach a later window (whole hourly
partitions before that are not even read). The marker is written before the batch commits (state
``pending``), and those commits carry their own app transactions, so a crash anywhere in between is
repaired by the next run.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from sluice.config import Settings
from sluice.core.model import EVENT_TIME, OutputDef, PipelineDef
from sluice.core.spark import collected_utc, local_frame
from sluice.core.windows import Window
from sluice.ingest.state import load_state
from sluice.runtime.context import RunContext
from sluice.storage import snapshots, tables
from sluice.storage.dlq import dlq_counts
from sluice.streaming.batch import (
    CatchUp,
    Turnstile,
    batch_inputs,
    closed_through,
    closing_boundary,
    ensure_output_table,
    gold_rows,
    gold_windows,
    mark_closed_through,
    pipeline_watermark,
    prepare_input,
    streams_without_files,
)
from sluice.streaming.definitions import (
    OutputDefinition,
    Recorded,
    checkpoint_name,
    fingerprints,
    pipeline_definitions,
    record,
    recorded_outputs,
)
from sluice.windows.ledger import WINDOW_LEDGER, LedgerRow, airflow_task, next_version

log = logging.getLogger("sluice.aggregate")



@dataclass
class AggregateResult:
    pipeline: str
    closed: dict[str, list[Window]] = field(default_factory=dict)  # output -> windows closed this cycle

    @property
    def windows(self) -> list[Window]:
        return sorted({w for ws in self.closed.values() for w in ws})


def has_records(settings: Settings, pipeline: PipelineDef) -> bool:
    """Whether any stream of ``pipeline`` accepted a record yet (its ops rows, read on the driver)."""
    return any(r.accepted for s in pipeline.streams for r in load_state(settings, s).rows)


class PipelineRunner:
    def __init__(self, ctx: RunContext, pipeline: PipelineDef,
                 definitions: Mapping[str, OutputDefinition] | None = None):
        self._ctx = ctx
        self.settings = ctx.settings
        self.engine = ctx.engine
        self.state = ctx.state
        self.ledger = ctx.ledger(pipeline.name)
        self.pipeline = pipeline
        self.result = AggregateResult(pipeline.name)
        self._turnstile = Turnstile(len(pipeline.outputs))
        # The closing boundary (W - lateness_bound) this cycle's streaming sinks close windows up to.
        self._boundary: datetime | None = None
        self._definitions: dict[str, OutputDefinition] | None = None if definitions is None else dict(definitions)
        # Each output's checkpoint generation (a change to the pipeline starts a new one, SPEC 9).
        self._recorded: dict[str, Recorded] = recorded_outputs(self.state, pipeline.name)

    @property
    def spark(self) -> SparkSession:
        """The run's Spark session, started when first needed (a cycle with nothing to do needs none)."""
        return self._ctx.spark

    def definitions(self) -> dict[str, OutputDefinition]:
        """The outputs' definitions (analysed once per run, when it first writes a window)."""
        if self._definitions is None:
            self._definitions = pipeline_definitions(self.spark, self.settings, self.pipeline)
        return self._definitions

    def _folder(self, output: OutputDef) -> str:
        """The folder of the output's current checkpoint under ``pipelines/<pipeline>/``."""
        kept = self._recorded.get(output.name)
        return checkpoint_name(output.name, kept.generation if kept else 0)

    def checkpoint(self, output: OutputDef) -> str:
        """The output's streaming checkpoint (a URI under the lake)."""
        return self.settings.lake.checkpoint("pipelines", self.pipeline.name, self._folder(output))

    def _state(self, *parts: str) -> tuple[str, ...]:
        """The name of one of the pipeline's state objects (see :mod:`sluice.storage.state`)."""
        return ("pipelines", self.pipeline.name, *parts)

    def closed_through(self) -> datetime | None:
        """The boundary up to which the batch close (or catch-up) has written every final window."""
        return closed_through(self.state, self.pipeline.name)

    def ensure_tables(self) -> None:
        for output in self.pipeline.outputs:
            ensure_output_table(self.spark, self.settings, self.engine, self.pipeline, output)
        self.engine.ensure_table(WINDOW_LEDGER.path(self.settings), WINDOW_LEDGER.schema)

    def inputs(self, since: datetime | None = None) -> dict[str, DataFrame]:
        """The streaming inputs; ``since`` (after a catch-up) skips bronze rows older than it."""
        frames = {}
        for stream in self.pipeline.streams:
            spec = self.settings.stream(stream)
            path = tables.bronze(spec).path(self.settings)
            raw = self.engine.read_stream(
                path, max_files_per_trigger=self.settings.max_files_per_trigger, min_event_time=since
            )
            if since is not None:
                raw = raw.filter(F.col(EVENT_TIME) >= F.lit(since))
            frames[stream] = prepare_input(spec, raw)
        return frames

    def has_records(self) -> bool:
        """Whether any stream of the pipeline accepted a record (ops rows, no Spark)."""
        return has_records(self.settings, self.pipeline)

    def run(self) -> AggregateResult:
        for output in self.pipeline.outputs:
            self.result.closed.setdefault(output.name, [])
        if not self.has_records():
            # Only heartbeats so far: no window can hold a row, and a later first query replays these
            # versions anyway. Skipping saves starting the stateful queries (seconds each) on empty runs, and
            # the JVM itself: gold's schema is the build's, which only Spark can analyse.
            self.engine.ensure_table(WINDOW_LEDGER.path(self.settings), WINDOW_LEDGER.schema)
            log.info("%s: no records accepted yet; nothing to aggregate", self.pipeline.name)
            return self.result
        self.ensure_tables()
        if closing_boundary(self.settings, self.pipeline) is None:
            # A stream without a watermark (no file yet, SPEC 3) holds every window open. The stateful queries
            # take these rows in the first cycle that can close a window, exactly as in any deferred cycle.
            log.info("%s: no window can close before %s receive(s) a first file", self.pipeline.name,
                     ", ".join(streams_without_files(self.settings, self.pipeline)) or "every stream")
            return self.result
        catchup = self.catch_up()
        boundaries = [b for b in (catchup.boundary if catchup else None, self.closed_through()) if b is not None]
        after = max(boundaries) if boundaries else None
        if after is not None and not self.can_close(after):
            log.info("%s: no window can close before the closing boundary passes %s; the stateful queries "
                     "will take this cycle's rows when one can", self.pipeline.name, self._next_end(after).isoformat())
            return self.result
        # The outputs' queries run side by side: on small increments their time is mostly fixed latency
        # (planning, state store commits, the no-data batch that moves the watermark), which overlaps well.
        # Their ledger commits still happen in output order (see Turnstile), so tables stay deterministic.
        self._turnstile = Turnstile(len(self.pipeline.outputs))
        self._boundary = closing_boundary(self.settings, self.pipeline)
        running: list[tuple[int, StreamingQuery, tuple[str, ...], dict[str, int]]] = []
        try:
            for index, output in enumerate(self.pipeline.outputs):
                started = self._start_output(index, output, catchup, after)
                if started is None:
                    self._turnstile.finish(index)
                else:
                    running.append((index, *started))
            for index, query, marker, versions in running:
                try:
                    query.awaitTermination()
                finally:
                    self._turnstile.finish(index)
                self.state.write(json.dumps(versions, sort_keys=True), *marker)
        finally:
            for _index, query, _marker, _versions in running:
                if query.isActive:
                    query.stop()
        self.close_final_windows(after)
        return self.result

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

    def may_close(self) -> bool:
        """:meth:`can_close` before the cycle's aggregation runs (a pending catch-up closes windows)."""
        marker = self.state.read(*self._state("catchup.json"))
        if marker is not None and not CatchUp.from_json(marker).done:
            return True
        return self.can_close(self.closed_through())

    # -- the batch close (see the module docstring) -----------------------------------------------------
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
                self._record_closed(output, missing, watermark, app_id=app,
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
        lo = after - pipeline.window.size - pipeline.lateness_bound if after is not None else None
        inputs = batch_inputs(self.settings, self.engine, pipeline, lo, boundary + pipeline.lateness_bound)
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
                self._commit_windows(output, rows, meta, watermark, app,
                                     next_version(self.engine, output.path(self.settings), app),
                                     ledger_app=f"sluice.ledger.close.{output.name}")
            finally:
                rows.unpersist()
        self._mark_closed_through(boundary)
        # Said apart from the windows the streaming queries closed (logged one by one above), so that a
        # batch close with nothing left to write does not read as "nothing closed".
        log.info("%s: batch close up to %s (watermark %s): %d window(s) beyond those the streaming queries "
                 "wrote, in %.1fs", pipeline.name, boundary.isoformat(), watermark.isoformat() if watermark else "-",
                 len(self.result.windows) - closed_before, time.monotonic() - started)

    # -- batch catch-up (see the module docstring) ----------------------------------------------------
    def _started(self, output: OutputDef) -> bool:
        commits = self.state.list(*self._state(self._folder(output), "commits"))
        return any(True for _ in commits)

    def catch_up(self) -> CatchUp | None:
        """Run (or finish) the pipeline's batch catch-up if one is due; return the one in effect."""
        state, marker = self.state, self._state("catchup.json")
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
        if minimum <= 0 or any(self._started(o) for o in self.pipeline.outputs) or self.closed_through() is not None:
            return None
        watermark = pipeline_watermark(self.settings, self.pipeline)
        if watermark is None:
            return None
        boundary = watermark - self.pipeline.lateness_bound
        # The oldest data any stream has accepted: its files' max event times bound it from above, which
        # is close enough to size the backlog.
        oldest = [
            r.max_event_time
            for s in self.pipeline.streams
            for r in load_state(self.settings, s).rows
            if r.accepted and r.max_event_time is not None
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
                self._commit_windows(output, rows, meta, catchup.watermark, self._catchup_app(output),
                                     catchup.version, ledger_app=f"sluice.ledger.catchup.{output.name}")
            finally:
                rows.unpersist()
        log.info("%s: catch-up done in %.1fs: %d window(s) up to %s; streaming from there", pipeline.name,
                 time.monotonic() - started, len(self.result.windows), catchup.boundary.isoformat())

    def input_versions(self) -> dict[str, int]:
        """The current Delta version of every bronze input (metadata only)."""
        versions = {}
        for stream in self.pipeline.streams:
            path = tables.bronze(self.settings.stream(stream)).path(self.settings)
            versions[stream] = snapshots.version(path)
        return versions

    def _start_output(
        self, index: int, output: OutputDef, catchup: CatchUp | None, after: datetime | None
    ) -> tuple[StreamingQuery, tuple[str, ...], dict[str, int]] | None:
        checkpoint = self.checkpoint(output)
        self.result.closed.setdefault(output.name, [])
        # Nothing new in bronze since this query last finished: its watermark cannot have moved, so no
        # window can close. Skipping saves starting a streaming query (seconds) on idle cycles.
        marker = self._state(self._folder(output), "sluice_input_versions.json")
        versions = self.input_versions()
        if self.state.read_json(*marker) == versions:
            log.info("%s: no new bronze commits since the last run; nothing to aggregate", output.name)
            return None
        # A checkpoint started by a change to the pipeline reads only the rows that can still reach an open
        # window (gold holds every window closed before it); so does the first one after a catch-up.
        kept = self._recorded.get(output.name)
        since = kept.stream_from if kept is not None and kept.stream_from is not None else (
            catchup.stream_from(self.pipeline) if catchup else None)
        windowed = output.build(self.inputs(since), self.pipeline.window)
        query = (
            windowed.writeStream.queryName(f"sluice_{self.pipeline.name}_{output.name}")
            .outputMode("append")
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .foreachBatch(lambda df, batch_id: self._sink(index, output, checkpoint, df, batch_id, after))
            .start()
        )
        return query, marker, versions

    def _sink(
        self, index: int, output: OutputDef, checkpoint: str, df: DataFrame, batch_id: int, after: datetime | None
    ) -> None:
        try:
            self._sink_batch(index, output, checkpoint, df, batch_id, after)
        finally:
            self._turnstile.passed(index, batch_id)

    def _sink_batch(
        self, index: int, output: OutputDef, checkpoint: str, df: DataFrame, batch_id: int, after: datetime | None
    ) -> None:
        rows = gold_rows(output, df, self.pipeline.window)
        if after is not None:
            # Windows up to this boundary were written by the batch catch-up or the batch close.
            rows = rows.filter(F.col("window_end") > F.lit(after))
        # One W per pipeline: an output whose own streams' watermark is ahead of W writes nothing the rule
        # has not made final; the batch close writes such a window once W passes it.
        # (run() starts no query while W is undefined: a constant false filter would let Spark drop the
        # stateful operators from the batch, and their state store commits with them.)
        if self._boundary is not None:
            rows = rows.filter(F.col("window_end") <= F.lit(self._boundary))
        rows = rows.persist(StorageLevel.MEMORY_AND_DISK)
        try:
            # The app ids name the checkpoint: a new one (after a change, SPEC 9) counts its batches from 0 again.
            meta = {"pipeline": self.pipeline.name, "output": output.name, "batch_id": batch_id}
            # The watermark that closed these windows is the pipeline's W (the sink filter above), not
            # Spark's own, which runs 1 ms behind it (spark_delay) and is per query.
            watermark = None if self._boundary is None else self._boundary + self.pipeline.lateness_bound
            self._commit_windows(output, rows, meta, watermark,
                                 f"sluice.gold.{self._folder(output)}", batch_id,
                                 ledger_app=f"sluice.ledger.{self._folder(output)}",
                                 turn=(index, batch_id))
        finally:
            rows.unpersist()

    def _commit_windows(
        self,
        output: OutputDef,
        rows: DataFrame,
        meta: dict[str, object],
        watermark: datetime | None,
        app_id: str,
        version: int,
        *,
        ledger_app: str,
        turn: tuple[int, int] | None = None,
    ) -> None:
        """Append closed windows to gold in one commit and record them in the ledger (both idempotent per
        (app_id, version))."""
        counts = {
            (collected_utc(r["window_start"]), collected_utc(r["window_end"])): int(r["n"])
            for r in rows.groupBy("window_start", "window_end").agg(F.count(F.lit(1)).alias("n")).collect()
        }
        if not counts:
            return
        windows = sorted(counts)
        meta = {**meta, "watermark": watermark, "closed_windows": [[s.isoformat(), e.isoformat()] for s, e in windows]}
        self.engine.append(rows, output.path(self.settings), app_id=app_id, version=version, metadata=meta)
        if turn is not None:
            self._turnstile.wait_turn(*turn)
        self._record_closed(output, counts, watermark, app_id=ledger_app, version=version)
        self.result.closed[output.name].extend(windows)
        for start, end in windows:
            log.info("%s: closed window %s..%s (%d rows, watermark %s)", output.name,
                     start.strftime("%Y-%m-%d %H:%M"), end.strftime("%H:%M"), counts[(start, end)],
                     watermark.isoformat() if watermark else "-")

    def _record_closed(
        self, output: OutputDef, counts: dict[Window, int], watermark: datetime | None, *, app_id: str, version: int
    ) -> None:
        """Ledger rows for windows this batch closed. A pipeline with several outputs shares one ledger row
        per window; the first output to close it creates the row, later ones add their rows."""
        existing = self.ledger.by_window()
        late = dlq_counts(self.settings, self.pipeline, list(counts))
        now = self.settings.now()
        definition = fingerprints(self.definitions())
        rows = []
        for window, n in sorted(counts.items()):
            current = existing.get(window)
            if current is not None:
                current.rows += n
                current.late_rows = late.get(window, 0)
                current.updated_at = now
                current.definition = definition
                rows.append(current)
            else:
                rows.append(
                    LedgerRow(
                        pipeline=self.pipeline.name,
                        window_start=window[0],
                        window_end=window[1],
                        state="closed",
                        closed_by_watermark=watermark,
                        rows=n,
                        late_rows=late.get(window, 0),
                        closed_at=now,
                        updated_at=now,
                        closed_by=airflow_task(),
                        definition=definition,
                    )
                )
        self.ledger.close(self.engine, rows, app_id=app_id, version=version)
        record(self.state, self.pipeline.name, self.definitions())
