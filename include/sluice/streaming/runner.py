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
accepted exactly at the watermark still reaches every window that holds it.)

**Small cycles close in batch.** A cycle whose closable windows read at most ``batch_close_rows`` bronze rows
runs only the batch close: on a scheduled increment, starting the stateful queries, their state store commits
and the batch that moves Spark's watermark cost more than the batch itself. Each query's checkpoint is then
marked behind; the next cycle that streams starts a new checkpoint generation for it that reads only the rows
that can still reach an open window (as a change does, SPEC 9), instead of replaying what the batch closed.

The batch close that follows the streaming queries, and the batch catch-up before a fresh pipeline's first
ones, are :mod:`sluice.streaming.closing`; every path commits its closed windows through
:mod:`sluice.streaming.commits`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from sluice.config import Settings
from sluice.core.model import EVENT_TIME, OutputDef, PipelineDef
from sluice.ingest.state import load_state
from sluice.runtime.context import RunContext
from sluice.storage import snapshots, tables
from sluice.streaming.batch import (
    CatchUp,
    Turnstile,
    closing_boundary,
    ensure_output_table,
    gold_rows,
    pipeline_state,
    prepare_input,
    reach_from,
    streams_without_files,
)
from sluice.streaming.closing import BatchClose
from sluice.streaming.commits import AggregateResult, WindowCommits
from sluice.streaming.definitions import (
    OutputDefinition,
    Recorded,
    checkpoint_name,
    pipeline_definitions,
    recorded_outputs,
    save_recorded,
)
from sluice.windows.ledger import WINDOW_LEDGER

log = logging.getLogger("sluice.aggregate")
# Beside an output's checkpoint: cycles after its last batch were closed in batch (see _closes_in_batch).
BEHIND = "sluice_behind.json"



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
        self.pipeline = pipeline
        self.result = AggregateResult(pipeline.name)
        self._turnstile = Turnstile(len(pipeline.outputs))
        # The closing boundary (W - lateness_bound) this cycle's streaming sinks close windows up to.
        self._boundary: datetime | None = None
        self._definitions: dict[str, OutputDefinition] | None = None if definitions is None else dict(definitions)
        # Each output's checkpoint generation (a change to the pipeline starts a new one, SPEC 9).
        self._recorded: dict[str, Recorded] = recorded_outputs(self.state, pipeline.name)
        self.commits = WindowCommits(ctx, pipeline, self.result, self.definitions)
        self.closing = BatchClose(ctx, pipeline, self.commits, self._started)

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

    def _started(self, output: OutputDef) -> bool:
        """Whether the output's streaming query has committed a batch in its current checkpoint."""
        commits = self.state.list(*pipeline_state(self.pipeline.name, self._folder(output), "commits"))
        return any(True for _ in commits)

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
        if self.pipeline.substream is not None:
            # Each key's rows close on its own clock (SPEC 3): the batch close's per-key rule, every cycle.
            self.closing.close_by_key(self.closing.closed_through())
            return self.result
        catchup = self.closing.catch_up()
        closed = self.closing.closed_through()
        boundaries = [b for b in (catchup.boundary if catchup else None, closed) if b is not None]
        after = max(boundaries) if boundaries else None
        if after is not None and not self.closing.can_close(after):
            log.info("%s: no window can close before the closing boundary passes %s; the stateful queries "
                     "will take this cycle's rows when one can", self.pipeline.name,
                     self.pipeline.window.next_end(after).isoformat())
            return self.result
        if self._closes_in_batch(after):
            self.closing.close_final_windows(after)
            return self.result
        self._restart_behind(after)
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
        self.closing.close_final_windows(after)
        return self.result

    # -- small cycles close in batch (Settings.batch_close_rows) ---------------------------------------------
    def _behind_marker(self, output: OutputDef) -> tuple[str, ...]:
        return pipeline_state(self.pipeline.name, self._folder(output), BEHIND)

    def _closes_in_batch(self, after: datetime | None) -> bool:
        """Whether this cycle closes its windows in batch from bronze, without the streaming queries: the rows
        they read are few (at most ``batch_close_rows``). The queries' checkpoints are then marked behind."""
        limit = self.settings.batch_close_rows
        if limit <= 0:
            return False
        rows = self.closing.rows_to_close(after)
        if rows is None or rows > limit:
            return False
        for output in self.pipeline.outputs:
            marker = self._behind_marker(output)
            if self.state.read(*marker) is None:
                # Before the batch close commits: a crash in between leaves the query marked, which is only safe.
                self.state.write(json.dumps({"after": None if after is None else after.isoformat()}), *marker)
        log.info("%s: the closable windows read %d bronze row(s) (at most %d): closing them in batch from "
                 "bronze, without the streaming queries", self.pipeline.name, rows, limit)
        return True

    def _restart_behind(self, after: datetime | None) -> None:
        """A query whose checkpoint missed cycles closed in batch starts a new checkpoint generation that reads
        only the rows that can still reach a window ending after ``after`` (as after a change, SPEC 9): its old
        offsets would replay every row those cycles already closed. The old generation is never read again, so
        it is deleted, with its state store: a pipeline whose large and small cycles alternate would otherwise
        keep one checkpoint per restart. (A change's old checkpoint is kept, as SPEC 9 says.)"""
        behind = [o for o in self.pipeline.outputs if self.state.read(*self._behind_marker(o)) is not None]
        # Only this method lists generations as retired, so the records read when the run began tell whether any
        # is left to delete; the records themselves are read again, as the cycle may have recorded definitions.
        if not behind and not any(r.retired for r in self._recorded.values()):
            return
        kept = recorded_outputs(self.state, self.pipeline.name)
        if behind:
            since = None if after is None else reach_from(self.pipeline, after)
            for output in behind:
                old = kept.get(output.name)
                generation = old.generation if old else 0
                kept[output.name] = Recorded(old.definition if old else self.definitions()[output.name],
                                             generation + 1, since, (*(old.retired if old else ()), generation))
                log.info("%s: its streaming query missed cycles closed in batch; a new checkpoint (%s) reads from "
                         "%s", output.name, checkpoint_name(output.name, generation + 1),
                         since.isoformat() if since else "the first row")
            # Saved before any deletion: a crash in between leaves the new generation in effect and the old one
            # listed as retired, which the next streaming cycle deletes.
            save_recorded(self.state, self.pipeline.name, kept)
        retired = {name: r for name, r in kept.items() if r.retired}
        for name, record in retired.items():
            for folder in (checkpoint_name(name, g) for g in record.retired):
                removed = self.state.delete_folder(*pipeline_state(self.pipeline.name, folder))
                log.info("%s: deleted the retired checkpoint %s (%d object(s))", name, folder, removed)
            kept[name] = replace(record, retired=())
        if retired:
            save_recorded(self.state, self.pipeline.name, kept)
        self._recorded = kept

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
        marker = pipeline_state(self.pipeline.name, self._folder(output), "sluice_input_versions.json")
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
            self.commits.commit(output, rows, meta, watermark,
                                f"sluice.gold.{self._folder(output)}", batch_id,
                                ledger_app=f"sluice.ledger.{self._folder(output)}",
                                before_ledger=lambda: self._turnstile.wait_turn(index, batch_id))
        finally:
            rows.unpersist()
