"""Ingest: landing JSON Lines -> bronze, quarantine, dlq and ops/ingest_batches (SPEC sections 2-3).

One Structured Streaming query per stream reads ``landing/<stream>/`` as text with
``trigger(availableNow=True)``; each Spark micro-batch is handed to
:meth:`sluice.ingest.microbatch.MicroBatchIngest.process_batch`. Before the query, unreadable files are
quarantined whole; after it, an idle stream gets a heartbeat (:mod:`sluice.ingest.time_rules`).

What a *micro-batch* means here. Spark may group many files into one trigger (``max_files_per_trigger``)
for throughput, but the time semantics are applied per landing file, in arrival order (file mtime, then
path) - exactly what Spark's own rule gives with one file per trigger. So results never depend on how
files were grouped into triggers, and every file gets its own row in ``ops/ingest_batches`` with its own
``batch_id`` (a per-stream sequence shared with heartbeats).

Every line ends up in exactly one place:

* ``quarantine`` with a reason (``bad_encoding``, ``malformed_json``, ``missing_field``, ``bad_timestamp``,
  ``bad_type``, ``early``; ``unreadable_file`` for a whole file that cannot be read),
* the duplicate count (an id already accepted or dead-lettered, or an earlier copy in the same batch),
* ``dlq`` with the watermark it missed (``event_time < watermark``),
* ``bronze`` (accepted).

A blank line (empty or whitespace only) is no record, as in Spark's JSON reader: it is counted in the file's
``skipped`` and nowhere else, and ``lines`` counts records only. Every quarantined line keeps its line number
(``line_number``, as an editor shows it) and, for ``malformed_json``, what the parser said in ``detail``.

Exactly once: every commit carries the Delta app transaction ``(sluice.ingest.<stream>, batch id)``, and the
ops rows go first (see :mod:`sluice.ingest.microbatch`).

The parts: :mod:`~sluice.ingest.files` (landing files), :mod:`~sluice.ingest.parsing` (lines and quarantine
reasons), :mod:`~sluice.ingest.dedup`, :mod:`~sluice.ingest.time_rules` (early, watermarks, lateness,
heartbeats), :mod:`~sluice.ingest.state` (ops rows) and :mod:`~sluice.ingest.microbatch` (one Spark batch).
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from datetime import datetime
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from sluice.core.lake import credentials_for
from sluice.core.model import StreamSpec
from sluice.core.progress import nothing, progress
from sluice.ingest.files import (
    LANDING_GLOB,
    LANDING_READ_OPTIONS,
    LANDING_SUFFIXES,
    landing_store,
    probe_file,
    source_key,
    spark_path,
)
from sluice.ingest.microbatch import BLOCK_START, MicroBatchIngest
from sluice.ingest.state import BatchRow, app_id, load_state, ops_rows
from sluice.ingest.time_rules import all_late, all_late_message, heartbeat
from sluice.runtime.context import RunContext
from sluice.storage import tables
from sluice.storage.objects import ObjectInfo, folder_listing, hadoop_read_options
from sluice.storage.tables import HEARTBEAT_PREFIX

log = logging.getLogger("sluice.ingest")


def nothing_to_wait_for() -> None:
    """A stream ingested on its own writes whenever it is ready."""


class StreamIngest:
    """Runs one availableNow ingest query for one stream and the heartbeat after it."""

    def __init__(self, ctx: RunContext, spec: StreamSpec, before_write: Callable[[], None] = nothing_to_wait_for):
        self._ctx = ctx
        self.settings = ctx.settings
        self.engine = ctx.engine
        self.state = ctx.state
        self.spec = spec
        self.bronze = tables.bronze(spec)
        self.quarantine = tables.quarantine(spec)
        self.dlq = tables.dlq(spec)
        # The ingest query's Spark checkpoint (a URI under the lake), and sluice's own objects beside it.
        self.checkpoint = ctx.lake.checkpoint("ingest", spec.name)
        self._state = ("ingest", spec.name)
        self.reports: list[BatchRow] = []
        # The readable landing files this cycle found new: what the ingest query's batches are made of.
        self._pending: list[ObjectInfo] = []
        self._advance: Callable[[int], None] = nothing
        # The stream's tables, made once per run, before its first write (see ensure_tables).
        self._tables: Future[None] | None = None
        # Called before each write to a table (run_ingest: waits until the streams before this one are done).
        self._before_write = before_write

    @property
    def spark(self) -> SparkSession:
        """The run's Spark session, started when first needed (a cycle with nothing to do needs none)."""
        return self._ctx.spark

    # -- setup --------------------------------------------------------------------------------------
    def ensure_tables(self) -> None:
        """The stream's tables, made before its first write: a cycle that finds nothing to write creates none,
        and starts no JVM (delta-spark creates the tables Spark writes, SPEC 7)."""
        if self._tables is None:
            self.start_tables()
        assert self._tables is not None
        self._tables.result()

    def start_tables(self) -> None:
        """Start making the stream's tables in a thread of their own: delta-spark takes seconds for the first
        ones of a session (mostly the driver's work), which the ingest query's parse of the batch, on the
        executors, hides. The first write waits for them (:meth:`ensure_tables`)."""
        if self._tables is None:
            self._tables = Future()
            thread = threading.Thread(target=self._make_tables, args=(self._tables,),
                                      name=f"sluice-tables-{self.spec.name}", daemon=True)
            thread.start()

    def _make_tables(self, done: Future[None]) -> None:
        try:
            tables.ensure_stream_tables(self.engine, self.settings, self.spec)
        except BaseException as exc:  # handed to the writer that waits for the tables
            done.set_exception(exc)
        else:
            done.set_result(None)

    def _ready_to_write(self) -> None:
        """Before a write outside the ingest query: the stream's tables, then its turn (see run_ingest)."""
        self.ensure_tables()
        self._before_write()

    def query_id(self) -> str:
        """Identifies the checkpoint lineage, so that Spark batch ids of a new checkpoint (which restart at
        0) are never mistaken for those of an old one."""
        # Put-if-absent: two processes that race to start a new lineage agree on one id.
        return self.state.create(uuid.uuid4().hex, *self._state, "sluice_query_id").strip()

    # -- the cycle ----------------------------------------------------------------------------------
    def run(self) -> list[BatchRow]:
        self.reconcile_single_row_batches()
        landing = self.settings.landing.join(self.spec.name)
        # One listing serves the unreadable-file probe, the "anything to do?" test and the progress total.
        listed = self._listing()
        readable = self.quarantine_unreadable(self._new_files(listed)) if listed is not None else []
        self._pending = readable
        if listed is not None and (readable or self._uncommitted_batch()):
            self.start_tables()
            with progress(len(readable), f"ingest {self.spec.name}", "file") as self._advance:
                self._run_query()
            self._advance = nothing
            self.ensure_tables()  # made even when the query wrote nothing (and its errors are this run's)
        elif listed is not None:
            log.info("%s: no new landing files", self.spec.name)
        else:
            log.info("%s: landing directory %s does not exist yet; stream is idle", self.spec.name, landing)
        self.maybe_heartbeat()
        return self.reports

    def _uncommitted_batch(self) -> bool:
        """Whether the ingest query planned a Spark batch it never committed (a crash). Together with new
        landing files, this decides whether the query runs at all: starting an availableNow query costs
        seconds even when it finds nothing, which is the common case of a scheduled cycle. (A file that
        yields no ops row, e.g. an empty one, only costs that start on each cycle.)"""

        state = self.state

        def last(folder: str) -> int:
            return max((int(o.name) for o in state.list(*self._state, folder) if o.name.isdigit()), default=-1)

        return last("offsets") != last("commits")

    def new_bytes(self) -> int:
        """The size of the landing files no ops row records yet (a listing; nothing is read or written)."""
        listed = self._listing()
        return sum(f.size for f in self._new_files(listed)) if listed else 0

    def _listing(self) -> list[ObjectInfo] | None:
        """The objects directly in the stream's landing folder (paged on object storage), or None when the
        folder does not exist: on object storage, when no object has its prefix yet."""
        return folder_listing(self.settings.landing, landing_store(self.settings), self.spec.name)

    def _new_files(self, listed: list[ObjectInfo]) -> list[ObjectInfo]:
        """Landing files that no ops row records yet, in arrival order (mtime or LastModified, then path). Like
        Spark's file source, names starting with '.' or '_' (in-flight files) are not landing files."""
        seen = {source_key(r.source_file) for r in load_state(self.settings, self.spec.name).rows if r.source_file}
        found = [
            f for f in listed
            if f.name.endswith(LANDING_SUFFIXES) and not f.name.startswith((".", "_")) and source_key(f.uri) not in seen
        ]
        return sorted(found, key=lambda f: (f.modified, f.uri))

    # -- unreadable files ---------------------------------------------------------------------------
    def quarantine_unreadable(self, new: list[ObjectInfo]) -> list[ObjectInfo]:
        """SPEC 2: a file that cannot be read at all (a corrupt or truncated .gz, no read permission) gets
        one quarantine row, reason ``unreadable_file`` with the error in ``detail``, and its own ops row,
        so that it never blocks the stream. The streaming query then skips it (``ignoreCorruptFiles``) and
        drops any lines Spark could read from it before the corruption. Returns the readable ones."""
        errors = self._probe([f.uri for f in new])
        state = load_state(self.settings, self.spec.name)
        batch_id = state.last_batch_id
        for f in new:
            if errors.get(f.uri) is None:
                continue
            self._ready_to_write()
            batch_id += 1
            arrival = f.modified
            # The file counts as one line, its one quarantine row, so lines = accepted + quarantined + late +
            # duplicates still holds for every batch.
            row = BatchRow(
                stream=self.spec.name, batch_id=batch_id, lines=1, quarantined=1, watermark_before=state.watermark,
                watermark_after=state.watermark, max_arrival_time=arrival, source_file=spark_path(f.uri),
            )
            log.warning("%s: %s cannot be read and is quarantined whole (%s)", self.spec.name, f.name, errors[f.uri])
            self.engine.append_rows(
                ops_rows([row]), tables.INGEST_BATCHES.schema, tables.INGEST_BATCHES.path(self.settings),
                app_id=app_id(self.spec.name), version=batch_id, metadata=self._single_meta(row),
            )
            self._write_unreadable(row, errors[f.uri])
            self._report(row)
        return [f for f in new if errors.get(f.uri) is None]

    def _probe(self, paths: list[str]) -> dict[str, str | None]:
        """probe_file for each path. Decompressing a .gz to its end is real work, so it runs on the
        executors, never pulling file contents through the driver; other files only need an open()."""
        gz = [p for p in paths if p.endswith(".gz")]
        # An object is read with the landing zone's credentials, on the driver and the executors alike.
        credentials = credentials_for(self.settings.landing.uri)
        out = {p: probe_file(p, credentials) for p in paths if not p.endswith(".gz")}
        if gz:
            probed = (self.spark.sparkContext.parallelize(gz, len(gz))
                      .map(lambda p: (p, probe_file(p, credentials))).collect())
            out.update(dict(probed))
        return out

    def _write_unreadable(self, row: BatchRow, error: str | None) -> None:
        assert row.source_file is not None and row.max_arrival_time is not None
        detail = f"file cannot be read: {error or 'unknown error (it may have been replaced since)'}"
        # No line number: the file is quarantined whole.
        record = (None, row.source_file, "unreadable_file", detail, row.max_arrival_time, row.batch_id, None)
        self.engine.append_rows(
            [record], self.quarantine.schema, self.quarantine.path(self.settings), app_id=app_id(self.spec.name),
            version=row.batch_id, metadata=self._single_meta(row),
        )

    def _run_query(self) -> None:
        """The stream's ingest query, availableNow: each micro-batch of :meth:`_records` to
        :meth:`_micro_batches`, its offsets in the stream's checkpoint."""
        records, batches = self._records(), self._micro_batches()
        query = (
            records.writeStream.queryName(f"sluice_ingest_{self.spec.name}")
            .option("checkpointLocation", self.checkpoint)
            .trigger(availableNow=True)
            .foreachBatch(batches.process_batch)
            .start()
        )
        # This thread only waits for the query: meanwhile, it analyses the batch's plans ahead of it.
        try:
            batches.warm_up(records.schema)
        except Exception:  # only a head start: the batch analyses the same plans, and reports what fails there
            log.debug("%s: analysing the batch's plans ahead failed", self.spec.name, exc_info=True)
        query.awaitTermination()

    def _micro_batches(self) -> MicroBatchIngest:
        return MicroBatchIngest(
            self.spark, self.settings, self.engine, self.spec, self.query_id(), self._pending, self._report,
            before_commit=self._ready_to_write,
        )

    def _records(self) -> DataFrame:
        """The landing folder's lines as a stream: ``raw``, ``source_file``, ``arrival_time`` and the split."""
        return (
            self.spark.readStream.format("text")
            .option("pathGlobFilter", LANDING_GLOB)
            .options(**LANDING_READ_OPTIONS)
            .options(**hadoop_read_options(self.settings.landing))
            .option("maxFilesPerTrigger", str(self.settings.max_files_per_trigger))
            .load(self.settings.landing.join(self.spec.name))
            .select(
                F.col("value").alias("raw"),
                F.col("_metadata.file_path").alias("source_file"),
                F.col("_metadata.file_modification_time").alias("arrival_time"),
                # Which split of the file a line was read from: what its line number counts from (the text
                # source has no row index; see sluice.ingest.microbatch).
                F.coalesce(F.col("_metadata.file_block_start"), F.lit(0)).alias(BLOCK_START),
            )
        )

    # -- heartbeats ---------------------------------------------------------------------------------
    def maybe_heartbeat(self) -> None:
        """Record a heartbeat if the stream is idle and it moves the watermark (:func:`time_rules.heartbeat`):
        its ops row, then its bronze row."""
        spec = self.spec
        row = heartbeat(spec, load_state(self.settings, spec.name), self.settings.now())
        if row is None:
            return
        self._ready_to_write()
        self.engine.append_rows(
            ops_rows([row]), tables.INGEST_BATCHES.schema, tables.INGEST_BATCHES.path(self.settings),
            app_id=app_id(spec.name), version=row.batch_id, metadata=self._single_meta(row),
        )
        self._write_heartbeat(row)
        self._report(row)

    def reconcile_single_row_batches(self) -> None:
        """Finish heartbeats and unreadable files whose ops row was committed but whose bronze or
        quarantine row was not (a crash between the two commits), before any new batch can take a higher
        version."""
        state = load_state(self.settings, self.spec.name)
        appid = app_id(self.spec.name)
        bronze_done = self.engine.committed_version(self.bronze.path(self.settings), appid)
        quarantine_done = self.engine.committed_version(self.quarantine.path(self.settings), appid)
        for row in state.rows:
            if row.is_heartbeat and (bronze_done is None or row.batch_id > bronze_done):
                log.warning("%s: completing heartbeat batch %s after an interrupted cycle",
                            self.spec.name, row.batch_id)
                self._ready_to_write()
                self._write_heartbeat(row)
            elif row.unreadable and (quarantine_done is None or row.batch_id > quarantine_done):
                log.warning("%s: completing the quarantine of unreadable file batch %s after an interrupted "
                            "cycle", self.spec.name, row.batch_id)
                self._ready_to_write()
                self._write_unreadable(row, probe_file(source_key(row.source_file or ""),
                                                       credentials_for(self.settings.landing.uri)))

    def _unit_name(self, row: BatchRow) -> str:
        """What the ingest log names a batch by: its landing file's name."""
        return Path(row.source_file or "").name

    def _progress_units(self, row: BatchRow) -> int:
        """What a committed batch counts for in the progress of the query: one landing file."""
        return 1

    def _single_meta(self, row: BatchRow) -> dict[str, Any]:
        return {
            "stream": row.stream, "batch_ids": [row.batch_id, row.batch_id], "heartbeat": row.is_heartbeat,
            "watermark_before": row.watermark_before, "watermark_after": row.watermark_after,
        }

    def _write_heartbeat(self, row: BatchRow) -> None:
        spec = self.spec
        assert row.max_event_time is not None
        values: dict[str, Any] = {f: None for f in spec.fields}
        # A heartbeat only moves the stream's watermark; user code never sees it (the pipeline inputs drop
        # is_heartbeat rows). String keys still carry a sentinel, distinct per stream and batch, so that a
        # heartbeat row read by any other tool can never be taken for a real record.
        for f in spec.required:
            if spec.type_of(f) == "string":
                values[f] = f"{HEARTBEAT_PREFIX}:{spec.name}"
        if spec.type_of(spec.id_field) == "string":
            values[spec.id_field] = f"{HEARTBEAT_PREFIX}:{spec.name}:{row.batch_id}"
        values["event_time"] = row.max_event_time
        record = (
            *values.values(), self.settings.now(), None, row.batch_id, True,
            row.max_event_time.date(), row.max_event_time.hour,
        )
        self.engine.append_rows(
            [record], self.bronze.schema, self.bronze.path(self.settings), app_id=app_id(spec.name),
            version=row.batch_id, metadata=self._single_meta(row),
        )

    def _report(self, row: BatchRow) -> None:
        self.reports.append(row)
        if row.spark_batch_id is not None:
            self._advance(self._progress_units(row))
        wm = lambda ts: ts.strftime("%Y-%m-%dT%H:%M:%SZ") if ts else "-"  # noqa: E731
        if row.is_heartbeat:
            log.info("ingest %-11s batch %4d heartbeat at %s  watermark %s -> %s", row.stream, row.batch_id,
                     wm(row.max_event_time), wm(row.watermark_before), wm(row.watermark_after))
        else:
            if all_late(row):
                log.warning("%s: %s", row.stream, all_late_message(row))
            log.info(
                "ingest %-11s batch %4d %-28s lines=%d accepted=%d quarantined=%d late=%d duplicates=%d%s"
                "  watermark %s -> %s", row.stream, row.batch_id, self._unit_name(row),
                row.lines, row.accepted, row.quarantined, row.late, row.duplicates,
                f" (blank lines skipped={row.skipped})" if row.skipped else "",
                wm(row.watermark_before), wm(row.watermark_after),
            )


def _json_default(value: object) -> str:
    return value.isoformat() if isinstance(value, datetime) else str(value)


def dumps(obj: object) -> str:
    return json.dumps(obj, default=_json_default, indent=2, sort_keys=True)


__all__ = ["StreamIngest"]
