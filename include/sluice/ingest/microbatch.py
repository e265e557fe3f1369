"""One Spark micro-batch of a stream's ingest query: parse, classify, dedup, judge lateness per file, then
commit bronze, quarantine, dlq and ops/ingest_batches exactly once (SPEC 2-3).

Every landing file of a batch gets its own row in ``ops/ingest_batches`` with its own ``batch_id`` (a
per-stream sequence shared with heartbeats), in arrival order, as one file per trigger would give them.

Exactly once: for each Spark batch the ops rows are committed first (they are the intent log that pins
the batch ids), then bronze, quarantine and dlq, each with the Delta app transaction
``(sluice.ingest.<stream>, last batch id)``. A batch re-run after a crash reuses its batch ids and every
table that already has the commit skips it.

Line numbers (``quarantine.line_number``: the file's line, 1-based, blank lines counted, as an editor shows
it). Spark's text source has no row index, so every line read gets ``monotonically_increasing_id()`` before
any filter (:data:`LINE_ID`), beside the start of the file split it was read from (:data:`BLOCK_START`,
``_metadata.file_block_start``). The lines of one split are read in order into one partition, so their ids
are consecutive: a line's number is the lines of its file in splits that start before its own, plus its
distance from the smallest id of its split, plus one. The counts and smallest ids per (file, split) come
from the per-file aggregation the batch runs anyway (:meth:`MicroBatchIngest._per_file`), and the offset per
split is joined back with the batch's small per-file frame: no extra job, no shuffle. The classified frame
is persisted, so the ids are computed once. Blank lines stay in the frame until then, because they count
for the numbering; they are counted as ``skipped`` and stored nowhere.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructType

from sluice.config import Settings
from sluice.core.model import EVENT_TIME, StreamSpec
from sluice.core.spark import collected_utc, local_frame
from sluice.ingest.dedup import duplicate_lines, mark_duplicates, seen_ids
from sluice.ingest.files import source_key
from sluice.ingest.parsing import BLANK, MALFORMED, classify_invalid, malformed_detail, parse_lines
from sluice.ingest.rejects import write_rejects
from sluice.ingest.state import BatchRow, StreamState, app_id, load_state, ops_rows
from sluice.ingest.substreams import KEY, judge_by_substream, record_maxima
from sluice.ingest.time_rules import file_watermarks
from sluice.ingest.topics import TopicBatches
from sluice.storage import tables
from sluice.storage.engine import DeltaEngine
from sluice.storage.objects import ObjectInfo

log = logging.getLogger("sluice.ingest")

# A batch of landing files up to this size (gzip files counted at GZIP_RATIO times their size) has its ids
# broadcast for the dedup look-up (a few tens of MB of ids at most); larger ones are shuffled instead.
BROADCAST_BATCH_BYTES = 128 << 20
GZIP_RATIO = 8
# What a Kafka record is taken to weigh for that choice (a typical event of a few fields).
KAFKA_RECORD_BYTES = 200
# Up to this many quarantined and late lines in a batch are collected and written by the driver: a Parquet
# write job per table costs more than the rows. More (a whole file of bad lines) are written by Spark.
DRIVER_WRITE_ROWS = 10_000
# Columns of every line Spark read: the start of its file split (set by the ingest query's read) and an id
# unique in the batch, consecutive within a split (set first thing in process_batch). See the module docstring.
BLOCK_START = "_block_start"
LINE_ID = "_line_id"


@dataclass
class FileCounts:
    """What the batch's one counting job found in a landing file (:meth:`MicroBatchIngest._per_file`)."""

    arrival_time: datetime
    lines: int = 0  # records: the lines read, blank ones excepted
    skipped: int = 0  # blank lines
    quarantined: int = 0
    duplicates: int = 0
    below_watermark: int = 0
    max_event: datetime | None = None  # of the candidate records (valid, not duplicates)
    # (block start, lines read, smallest line id) per file split Spark read
    splits: list[tuple[int, int, int]] = field(default_factory=list)
    # A Kafka micro-batch: partition -> the first offset it read (its splits are its partitions)
    first_offsets: dict[int, int] = field(default_factory=dict)

    def line_offsets(self) -> list[tuple[int, int]]:
        """(block start, offset) per split: a line's number is its line id plus its split's offset."""
        out, before = [], 0
        for start, read, first_id in sorted(self.splits):
            out.append((start, before - first_id + 1))
            before += read
        return out


class MicroBatchIngest:
    """Ingests each Spark micro-batch of one run of a stream's ingest query (``foreachBatch``)."""

    def __init__(
        self,
        spark: SparkSession,
        settings: Settings,
        engine: DeltaEngine,
        spec: StreamSpec,
        query_id: str,
        pending: list[ObjectInfo],
        report: Callable[[BatchRow], None],
        before_commit: Callable[[], None] | None = None,
        topic: TopicBatches | None = None,
    ):
        self.spark = spark
        self.settings = settings
        self.engine = engine
        self.spec = spec
        self.bronze = tables.bronze(spec)
        self.quarantine = tables.quarantine(spec)
        self.dlq = tables.dlq(spec)
        # Identifies the checkpoint lineage (see StreamIngest.query_id).
        self._query_id = query_id
        # The readable landing files this cycle found new: what the ingest query's batches are made of.
        self._pending = pending
        # Records a committed row (StreamIngest's reports and progress).
        self._report = report
        # Waits for this stream's turn to write (see sluice.ingest.run.run_ingest).
        self._before_commit = before_commit or (lambda: None)
        # A Kafka stream's micro-batches (sluice.ingest.kafka): the unit is the whole micro-batch, not a file.
        self._topic = topic
        # The parse and the checks, their column expressions built once for every batch of the run (by the
        # warm-up, or the first batch): about a second of calls into the JVM each time.
        self._parse = parse_lines(spec)
        self._check = classify_invalid(spec)

    def warm_up(self, schema: StructType) -> None:
        """Build a batch's parse and checks, and analyse them and the dedup on an empty frame of the records'
        ``schema``, while the ingest query plans its first micro-batch. Building the expressions takes about a
        second of calls into the JVM, and a JVM loads, links and compiles the analyser's code for these hundred-odd
        expressions the first time it meets them: done here, beside the query's offsets and planning, the batch
        finds that done (bench/README, "What each change bought")."""
        empty = local_frame(self.spark, [], schema).withColumn(LINE_ID, F.monotonically_increasing_id())
        classified = self._classify(empty)
        state = load_state(self.settings, self.spec.name)
        earlier = any(r.accepted or r.late for r in state.rows)
        seen = seen_ids(self.engine, self.settings, self.spec, state, state.last_batch_id + 1) if earlier else None
        order = self._topic.order if self._topic is not None else None
        classified.transform(mark_duplicates(duplicate_lines(classified, seen, self.spec, LINE_ID, order=order),
                                             LINE_ID))

    def _classify(self, df: DataFrame) -> DataFrame:
        """The lines parsed and checked, without the parse's and checks' columns that nothing after them reads (not
        cached, and not shuffled by dedup)."""
        spec = self.spec
        spent = [*(f"_t_{f}" for f in spec.fields), *(f"_s_{f}" for f in spec.fields if f != spec.id_field),
                 "_bad_encoding", "_blank", "_malformed"]
        return df.transform(self._parse).transform(self._check).drop(*spent)

    def process_batch(self, df: DataFrame, spark_batch_id: int) -> None:
        state = load_state(self.settings, self.spec.name)
        if self._topic is not None:
            # A Kafka micro-batch is one unit (one ops row, one watermark), named by the offset ranges the
            # checkpoint planned for it: the same name when a crashed batch is replayed.
            df = df.withColumn("source_file", F.lit(self._topic.label(spark_batch_id)))
        # Lines Spark read from a file quarantined whole (the start of a truncated .gz) are not records.
        unreadable = {r.source_file for r in state.rows if r.unreadable and r.source_file}
        # Before any filter, in the stage that reads the files: ids consecutive within each file split, which
        # give the lines their numbers (module docstring). Not in the streaming query itself: Spark refuses
        # monotonically_increasing_id in a streaming plan.
        self._process(df.withColumn(LINE_ID, F.monotonically_increasing_id()), spark_batch_id, state, unreadable)

    def _process(self, df: DataFrame, spark_batch_id: int, state: StreamState, unreadable: set[str]) -> None:
        spec = self.spec
        if unreadable:
            df = df.filter(~F.col("source_file").isin(sorted(unreadable)))
        existing = sorted(
            (r for r in state.rows if r.spark_batch_id == spark_batch_id and r.query_id == self._query_id),
            key=lambda r: r.batch_id,
        )
        # A retry of a batch whose ops rows were committed reuses exactly the same batch ids.
        first_id = existing[0].batch_id if existing else state.last_batch_id + 1
        prior = state.before(first_id)
        # Parsed once: the batch's ids are taken from it for the dedup look-up, and it is then marked.
        classified = self._classify(df).persist(StorageLevel.MEMORY_AND_DISK)
        try:
            # No earlier batch accepted or dead-lettered a record (a new stream): no id was seen before.
            earlier = any(r.accepted or r.late for r in prior.rows)
            seen = seen_ids(self.engine, self.settings, spec, prior, first_id) if earlier else None
            order = self._topic.order if self._topic is not None else None
            duplicates = duplicate_lines(classified, seen, spec, LINE_ID, small=self._small_batch(spark_batch_id),
                                         order=order).persist(StorageLevel.MEMORY_AND_DISK)
            # Not cached itself: the cached lines and a broadcast join of the few duplicates' line ids.
            parsed = classified.transform(mark_duplicates(duplicates, LINE_ID))
            try:
                # One Spark job lists the batch's files and counts what happened to their lines.
                per_file = self._per_file(parsed, prior.watermark, offsets=self._topic is not None)
                # The file path as Spark spelled it may differ from ours (spark_path): judge by identity.
                unread = {source_key(u) for u in unreadable}
                ignored = {path for path in per_file if source_key(path) in unread or self._nested(path)}
                if ignored:
                    self._process(df, spark_batch_id, state, unreadable | ignored)
                elif per_file or self._topic is not None:
                    self._finish_batch(parsed, per_file, existing, prior, spark_batch_id, first_id)
            finally:
                duplicates.unpersist()
        finally:
            classified.unpersist()

    def _nested(self, path: str) -> bool:
        """Whether a file Spark read lies in a subfolder of the landing folder (the recursive lookup lists
        those too): landing files are the folder's own files, as the listing of new files has them."""
        if self._topic is not None:
            return False
        folder = source_key(self.settings.landing.join(self.spec.name))
        nested = source_key(path).rsplit("/", 1)[0] != folder.rstrip("/")
        if nested:
            log.warning("%s: ignoring %s: landing files must sit directly in %s", self.spec.name,
                        source_key(path), folder)
        return nested

    @staticmethod
    def _per_file(parsed: DataFrame, watermark: datetime | None, offsets: bool = False) -> dict[str, FileCounts]:
        """Per landing file of the batch: its arrival time, lines (records) and blank lines, the max event
        time of its candidate records (valid, not duplicates), how many lines were quarantined, duplicates,
        or below ``watermark`` (the stream's watermark before the batch: late, for every file that the batch's
        own earlier files do not move it past), and per file split the lines read and their smallest id (for
        the line numbers). Counted per (file, split) by Spark and summed per file here. A Kafka micro-batch is
        one "file" whose splits are its partitions; ``offsets`` adds the first offset read per partition."""
        reason = F.col("reason")
        candidate = reason.isNull() & ~F.col("_duplicate")
        below = candidate & (F.col("event_time") < F.lit(watermark)) if watermark else F.lit(False)
        extra = [F.min("_offset").alias("first_offset")] if offsets else []
        rows = (
            # A file's lines share its arrival time; a Kafka batch's records each have their own: its latest.
            parsed.groupBy("source_file", BLOCK_START)
            .agg(
                *extra,
                F.max("arrival_time").alias("arrival_time"),
                F.count(F.lit(1)).alias("read"),
                F.min(LINE_ID).alias("first_id"),
                F.count(F.when(reason == BLANK, 1)).alias("skipped"),
                F.max(F.when(candidate, F.col("event_time"))).alias("max_event"),
                F.count(F.when(reason.isNotNull() & (reason != BLANK), 1)).alias("quarantined"),
                F.count(F.when(reason.isNull() & F.col("_duplicate"), 1)).alias("duplicates"),
                F.count(F.when(below, 1)).alias("below_watermark"),
            )
            .collect()
        )
        out: dict[str, FileCounts] = {}
        for r in rows:
            counts = out.setdefault(r["source_file"], FileCounts(r["arrival_time"]))
            counts.lines += r["read"] - r["skipped"]
            counts.skipped += r["skipped"]
            counts.quarantined += r["quarantined"]
            counts.duplicates += r["duplicates"]
            counts.below_watermark += r["below_watermark"]
            if r["max_event"] is not None and (counts.max_event is None or r["max_event"] > counts.max_event):
                counts.max_event = r["max_event"]
            counts.arrival_time = max(counts.arrival_time, r["arrival_time"])
            counts.splits.append((r[BLOCK_START], r["read"], r["first_id"]))
            if offsets:
                counts.first_offsets[r[BLOCK_START]] = r["first_offset"]
        return out

    def _small_batch(self, spark_batch_id: int) -> bool:
        """Whether a batch's ids are few enough to be broadcast for the dedup look-up, judged from the size
        of the landing files this cycle listed (metadata, no Spark job): a batch holds at most
        ``max_files_per_trigger`` of them; for Kafka, from its offset ranges. Either way the result is the same."""
        if self._topic is not None:
            return self._topic.records(spark_batch_id) * KAFKA_RECORD_BYTES <= BROADCAST_BATCH_BYTES
        if not self._pending:
            # Only a batch planned before a crash is left, of files this cycle no longer lists: size unknown.
            return False
        sizes = [f.size * GZIP_RATIO if f.name.endswith(".gz") else f.size for f in self._pending]
        largest = sorted(sizes, reverse=True)[: self.settings.max_files_per_trigger]
        return sum(largest) <= BROADCAST_BATCH_BYTES

    def _finish_batch(
        self,
        parsed: DataFrame,
        per_file: dict[str, FileCounts],
        existing: list[BatchRow],
        prior: StreamState,
        spark_batch_id: int,
        first_id: int,
    ) -> None:
        spec = self.spec
        lost = self._lost(spark_batch_id, per_file)
        if not per_file:
            # A Kafka micro-batch whose every offset was lost to retention: its row records the loss.
            if lost:
                self._commit_lost(spark_batch_id, existing, prior, first_id, lost)
            return
        # Batch ids follow arrival order (mtime, then path), as one file per trigger would give them.
        files = sorted((collected_utc(c.arrival_time), path) for path, c in per_file.items())
        if existing:
            by_file = {r.source_file: r.batch_id for r in existing}
            seq = {path: by_file[path] for _arrival, path in files}
        else:
            seq = {path: first_id + i for i, (_arrival, path) in enumerate(files)}
        last_id = max(seq.values())
        max_event = {seq[p]: collected_utc(c.max_event) for p, c in per_file.items() if c.max_event is not None}
        marks = file_watermarks([(s, max_event.get(s)) for s in seq.values()], prior.watermark, spec.watermark_delay)
        # One row per (file, split): the file's batch id and watermark, and the split's line-number offset.
        files_df = local_frame(
            self.spark,
            [(path, start, s, marks[s][0], offset)
             for path, s in seq.items() for start, offset in per_file[path].line_offsets()],
            f"source_file string, {BLOCK_START} long, _file_seq long, _wm_before timestamp, _line_offset long",
        )
        status = (
            F.when(F.col("reason") == BLANK, "skipped")
            .when(F.col("reason").isNotNull(), "quarantined")
            .when(F.col("_duplicate"), "duplicate")
            .when(F.col("_wm_before").isNotNull() & (F.col("event_time") < F.col("_wm_before")), "late")
            .otherwise("accepted")
        )
        # Cheap to recompute from the cached `parsed` (a broadcast join and a column), so not cached itself.
        final = parsed.join(F.broadcast(files_df), ["source_file", BLOCK_START])
        judged = None
        if spec.substream is not None:
            # Each record's watermark is its substream's E_k (sluice.ingest.substreams), before `_status` reads it.
            judged = judge_by_substream(self.settings, self.engine, spec, final, first_id)
            final = judged.frame
        try:
            final = final.withColumn("_status", status).withColumn("_line", F.col(LINE_ID) + F.col("_line_offset"))
            if self._topic is not None:
                # Each record keeps its own address, and a record has no line number: its value is one document.
                final = final.withColumn("source_file", self._topic.address()).withColumn(
                    "_line", F.lit(None).cast("long"))
            # Judged per substream with no (key, file) pair below its E_k: nothing is late, nothing to count.
            recount = judged.flagged > 0 if judged is not None else None
            rows = self._batch_rows(final, files, seq, per_file, marks, prior, spark_batch_id, lost, recount)
            self._commit(final, rows, first_id, last_id)
        finally:
            if judged is not None:
                judged.pairs.unpersist()

    def _batch_rows(self, final: DataFrame, files: list[tuple[datetime, str]], seq: dict[str, int],
                    per_file: dict[str, FileCounts], marks: dict[int, tuple[datetime | None, datetime | None]],
                    prior: StreamState, spark_batch_id: int, lost: int, recount: bool | None) -> list[BatchRow]:
        """A row of ``ops/ingest_batches`` per file (or Kafka micro-batch), in arrival order. ``recount``: for a
        stream with substreams, whether any record can be late (None for others)."""
        late = {seq[p]: c.below_watermark for p, c in per_file.items()}
        if recount is False:
            late = {s: 0 for s in seq.values()}
        elif recount or any(before != prior.watermark for before, _after in marks.values()):
            # An earlier file of the batch moved the watermark for a later one (a catch-up of several files), or
            # each substream has its own: count the files' late records against their own watermarks.
            late = {s: 0 for s in seq.values()}
            late.update({
                r["_file_seq"]: r["n"]
                for r in final.filter(F.col("_status") == "late").groupBy("_file_seq")
                .agg(F.count(F.lit(1)).alias("n")).collect()
            })
        rows = []
        for arrival, path in files:
            s, counts = seq[path], per_file[path]
            before, after = marks[s]
            rows.append(BatchRow(
                stream=self.spec.name,
                batch_id=s,
                lines=counts.lines,
                accepted=counts.lines - counts.quarantined - counts.duplicates - late[s],
                quarantined=counts.quarantined,
                late=late[s],
                duplicates=counts.duplicates,
                watermark_before=before,
                watermark_after=after,
                max_event_time=collected_utc(counts.max_event) if counts.max_event is not None else None,
                max_arrival_time=arrival,
                source_file=path,
                spark_batch_id=spark_batch_id,
                query_id=self._query_id,
                skipped=counts.skipped,
                lost=lost,
            ))
        return rows

    def _lost(self, spark_batch_id: int, per_file: dict[str, FileCounts]) -> int:
        """How many of a Kafka micro-batch's planned offsets retention deleted before it read them (0 for files)."""
        if self._topic is None:
            return 0
        first_read = {p: o for counts in per_file.values() for p, o in counts.first_offsets.items()}
        lost = self._topic.lost(spark_batch_id, first_read)
        if lost:
            ranges = ", ".join(f"partition {p}: {start}-{end - 1}" for p, (start, end) in sorted(lost.items()))
            log.warning("%s: %d Kafka offset(s) of topic %s were deleted by the topic's retention before they were "
                        "read (%s); going on from the earliest offset", self.spec.name,
                        sum(e - s for s, e in lost.values()), self._topic.topic, ranges)
        return sum(end - start for start, end in lost.values())

    def _commit_lost(self, spark_batch_id: int, existing: list[BatchRow], prior: StreamState, first_id: int,
                     lost: int) -> None:
        assert self._topic is not None
        batch_id = existing[0].batch_id if existing else first_id
        row = BatchRow(stream=self.spec.name, batch_id=batch_id, watermark_before=prior.watermark,
                       watermark_after=prior.watermark, source_file=self._topic.label(spark_batch_id),
                       spark_batch_id=spark_batch_id, query_id=self._query_id, lost=lost)
        self._before_commit()
        self.engine.append_rows(
            ops_rows([row]), tables.INGEST_BATCHES.schema, tables.INGEST_BATCHES.path(self.settings),
            app_id=app_id(self.spec.name), version=batch_id,
            metadata={"stream": row.stream, "batch_ids": [batch_id, batch_id], "watermark_before": prior.watermark,
                      "watermark_after": prior.watermark, "spark_batch_id": spark_batch_id,
                      "query_id": self._query_id},
        )
        self._report(row)

    def _commit(self, final: DataFrame, rows: list[BatchRow], first_id: int, last_id: int) -> None:
        spec = self.spec
        meta = {
            "stream": spec.name,
            "batch_ids": [first_id, last_id],
            "watermark_before": rows[0].watermark_before,
            "watermark_after": rows[-1].watermark_after,
            "spark_batch_id": rows[0].spark_batch_id,
            "query_id": rows[0].query_id,
        }
        appid = app_id(spec.name)
        self._before_commit()
        # The ops rows go first: they pin the batch ids if the rest has to be retried.
        self.engine.append_rows(
            ops_rows(rows), tables.INGEST_BATCHES.schema, tables.INGEST_BATCHES.path(self.settings),
            app_id=appid, version=last_id, metadata=meta,
        )
        payload = [F.col(f"_v_{f}").alias(f) if f != EVENT_TIME else F.col(EVENT_TIME) for f in spec.fields]
        lineage = [F.col("arrival_time"), F.col("source_file"), F.col("_file_seq").alias("ingest_batch_id")]
        accepted = final.filter(F.col("_status") == "accepted").select(
            *payload, *lineage, F.lit(False).alias("is_heartbeat"),
            F.to_date("event_time").alias("event_date"), F.hour("event_time").alias("event_hour"),
        )
        # One file per event hour, rows in id order: fewer files, and deterministic file content. Sorted by the
        # partition columns first, which is the order Delta's writer needs: one sort instead of two.
        accepted = accepted.repartition("event_date", "event_hour").sortWithinPartitions(
            "event_date", "event_hour", spec.id_field, "ingest_batch_id"
        )
        # A line that is not UTF-8 cannot be stored as text (readers of the table would fail on it), so
        # its bytes are kept losslessly as base64, as its detail says.
        # (Spark's base64 may wrap lines MIME-style; the stored text has no line breaks.)
        b64 = F.regexp_replace(F.base64(F.col("raw").cast("binary")), r"\s", "")
        raw = F.when(F.col("reason") == "bad_encoding", b64).otherwise(F.col("raw"))
        totals = {k: sum(getattr(r, k) for r in rows) for k in ("accepted", "quarantined", "late")}
        # A late record of a substream keeps its key beside the E_k it missed (SPEC 3).
        keyed = [F.col(KEY).alias("substream")] if spec.substream is not None else []
        # A few rejected lines (the usual share is about 1%): one Spark job collects both kinds and the driver
        # writes them, instead of a Parquet write job per table. Not when a late record may hold a timestamp
        # that Python cannot (before year 1): only its event time is bounded, by EARLIEST_EVENT_TIME.
        other_times = any(spec.type_of(f) == "timestamp" for f in spec.fields if f != EVENT_TIME)
        on_driver = 0 < totals["quarantined"] + totals["late"] <= DRIVER_WRITE_ROWS and not other_times
        writes = [(self.bronze, accepted, totals["accepted"])]
        if not on_driver:
            quarantined = final.filter(F.col("_status") == "quarantined").select(
                raw.alias("raw"), "source_file", "reason", "detail", "arrival_time",
                F.col("_file_seq").alias("ingest_batch_id"), F.col("_line").alias("line_number"),
            )
            # What the parser says about a malformed line, in Python: for those lines only (the same function
            # as on the driver, so the same detail whichever path writes it).
            malformed = F.col("reason") == MALFORMED
            explain = F.udf(malformed_detail, StringType(), useArrow=False)
            quarantined = quarantined.filter(~malformed).unionByName(
                quarantined.filter(malformed).withColumn("detail", explain(F.col("raw")))
            ).coalesce(1).sortWithinPartitions("ingest_batch_id", "line_number")
            late = final.filter(F.col("_status") == "late").select(
                *payload, F.col("_wm_before").alias("watermark"), *keyed, *lineage, "raw"
            ).coalesce(1).sortWithinPartitions("ingest_batch_id", spec.id_field)
            writes += [(self.quarantine, quarantined, totals["quarantined"]), (self.dlq, late, totals["late"])]
        for table, frame, n in writes:
            if n:
                self.engine.append(
                    frame, table.path(self.settings), app_id=appid, version=last_id, metadata=meta
                )
        if on_driver:
            # A quarantined line's parsed values are not stored (and may be out of Python's range): nulls.
            is_late = F.col("_status") == "late"
            late_payload = [F.when(is_late, F.col(f"_v_{f}" if f != EVENT_TIME else f)).alias(f) for f in spec.fields]
            side = final.filter(F.col("_status").isin("quarantined", "late")).select(
                *late_payload, F.when(is_late, F.col("_wm_before")).alias("watermark"), *keyed, *lineage,
                raw.alias("raw"),
                # Prefixed: a stream may have fields of these names.
                F.col("reason").alias("_q_reason"), F.col("detail").alias("_q_detail"),
                F.col("_line").alias("_q_line"), "_status",
            )
            write_rejects(self.engine, self.settings, spec, side.collect(), appid, last_id, meta)
        if spec.substream is not None and totals["accepted"]:
            # After bronze: the state of the batches to come (a replay of this group reads the rows before it).
            record_maxima(self.settings, self.engine, spec, final.filter(F.col("_status") == "accepted"), last_id,
                          appid, meta)
        for row in rows:
            self._report(row)
