"""Ingest of a stream that reads a Kafka topic (SPEC 2, "Kafka streams"): the same query, micro-batches and
guarantees as a landing folder's (:mod:`sluice.ingest.landing`), on Spark's Kafka source.

What differs from a landing folder:

* The unit of ingest is Spark's micro-batch, not a file: one row in ``ops/ingest_batches`` per micro-batch,
  named by its offset ranges (``kafka://readings/0/0-99,1/0-42``), judged against the watermark before it, as
  Spark's own rule has it. Each record keeps its own address in ``source_file``
  (``kafka://<topic>/<partition>/<offset>``), and its Kafka timestamp is its arrival time.
* Offsets live in the query's checkpoint and every commit is a Delta app transaction, as for files: a killed
  run replays the micro-batch it planned, with the same ranges and batch ids.
* Offsets that the topic's retention deleted before they were read are counted in the batch's ``lost``
  (Spark's source runs with ``failOnDataLoss=false`` and goes on from the earliest offset); the cycle raises one
  alert for them.
* A topic that was deleted and created again has a new topic id: the run stops (:class:`~sluice.ingest.topics.
  TopicChanged`) rather than read the new topic from offsets that named other records.
* A record with no value (a tombstone) is no record, as a blank line is: counted in ``skipped``.

When the broker has nothing past the checkpoint's offsets, the query does not start (a cycle with nothing to do
starts no Spark job), and an idle topic gets a heartbeat as an idle folder does.
"""

from __future__ import annotations

import logging

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from sluice.core.progress import nothing, progress
from sluice.ingest.landing import StreamIngest
from sluice.ingest.microbatch import BLOCK_START, KAFKA_RECORD_BYTES, MicroBatchIngest
from sluice.ingest.state import BatchRow
from sluice.ingest.topics import (
    LOG_APPEND_TIME,
    Topic,
    TopicBatches,
    check_topic,
    client_config,
    committed_offsets,
    describe,
    spark_options,
    topic_prefix,
)

log = logging.getLogger("sluice.ingest")


class KafkaIngest(StreamIngest):
    """Runs one availableNow ingest query over a stream's Kafka topic, and the heartbeat after it."""

    @property
    def topic_name(self) -> str:
        assert self.spec.source is not None
        return self.spec.source.topic

    def _config(self) -> dict[str, str]:
        return client_config(self.settings.kafka, self.spec.name)

    def run(self) -> list[BatchRow]:
        self.reconcile_single_row_batches()
        topic = describe(self._config(), self.topic_name)
        if topic is None:
            log.info("%s: Kafka topic %s does not exist yet; stream is idle", self.spec.name, self.topic_name)
        else:
            check_topic(self.state, self.spec.name, topic)
            if topic.timestamp_type != LOG_APPEND_TIME:
                log.warning("%s: Kafka topic %s stamps its records with the producer's clock (%s), so arrival "
                            "times are the producers' and the early rule trusts them; set "
                            "message.timestamp.type=LogAppendTime on the topic for broker arrival times",
                            self.spec.name, topic.name, topic.timestamp_type)
            pending = self._pending_records(topic)
            if pending or self._uncommitted_batch():
                self.start_tables()
                with progress(pending, f"ingest {self.spec.name}", "record") as self._advance:
                    self._run_query()
                self._advance = nothing
                self.ensure_tables()
            else:
                log.info("%s: no new records in Kafka topic %s", self.spec.name, topic.name)
        self.maybe_heartbeat()
        return self.reports

    def _pending_records(self, topic: Topic) -> int:
        """Offsets past those the query last committed (from the earliest the broker holds before its first), the
        ones retention deleted since included: a batch of nothing but lost offsets still records them (``lost``)."""
        committed = committed_offsets(self.state, self.spec.name, topic.name) or {}
        return sum(max(0, end - committed.get(p, topic.earliest.get(p, 0))) for p, end in topic.latest.items())

    def new_bytes(self) -> int:
        """An estimate of what is new, for the order of the streams' writes (sluice.ingest.run.run_ingest)."""
        topic = describe(self._config(), self.topic_name)
        return self._pending_records(topic) * KAFKA_RECORD_BYTES if topic is not None else 0

    def _micro_batches(self) -> MicroBatchIngest:
        return MicroBatchIngest(
            self.spark, self.settings, self.engine, self.spec, self.query_id(), [], self._report,
            before_commit=self._ready_to_write,
            topic=TopicBatches(self.state, self.spec.name, self.topic_name, self._config()),
        )

    def _records(self) -> DataFrame:
        """The topic's records as a stream: the value as ``raw`` (none: a blank line), the broker's timestamp as
        ``arrival_time``, the partition as the "split" and the offset. ``source_file`` is set per micro-batch."""
        return (
            self.spark.readStream.format("kafka")
            .options(**spark_options(self.settings.kafka))
            .option("subscribe", self.topic_name)
            .option("startingOffsets", "earliest")
            # Offsets deleted by retention are counted and alerted (TopicBatches.lost), never a failed run.
            .option("failOnDataLoss", "false")
            .load()
            .select(
                F.coalesce(F.col("value").cast("string"), F.lit("")).alias("raw"),
                F.lit("").alias("source_file"),
                F.col("timestamp").alias("arrival_time"),
                F.col("partition").cast("long").alias(BLOCK_START),
                F.col("partition").alias("_partition"),
                F.col("offset").alias("_offset"),
            )
        )

    def _unit_name(self, row: BatchRow) -> str:
        """A micro-batch's offset ranges, without the topic the stream names anyway: ``0/0-99,1/0-42``."""
        return (row.source_file or "").removeprefix(topic_prefix(self.topic_name)) or "-"

    def _progress_units(self, row: BatchRow) -> int:
        return row.lines + row.skipped + row.lost
