"""A Kafka stream's topic, as ingest sees it (SPEC 2, "Kafka streams"): the client properties for the driver
and for Spark's Kafka source, what the broker says about the topic (its id, partitions, timestamp type, first
and next offsets), and what the ingest query's checkpoint says each Spark micro-batch read.

The properties are librdkafka's (the driver's client is confluent-kafka, as the Apache Kafka provider's
``kafka_default`` connection holds them); Spark's source takes the Java client's, prefixed ``kafka.``
(:func:`spark_options`). None of them is ever written to a table, a state object or a log.

Offsets. Spark's Kafka source keeps its offsets in the query's checkpoint: ``sources/0/0`` holds the offsets
the query started from, ``offsets/<n>`` the end offsets (exclusive) of micro-batch n, planned before it runs.
So a micro-batch's range per partition is known before any record is read, and a rerun after a crash replays
exactly the same range (:func:`planned_ranges`).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sluice.core.errors import ConfigError
from sluice.storage.state import LakeState

log = logging.getLogger("sluice.ingest")

TIMEOUT_S = 30
CREATE_TIME = "CreateTime"
LOG_APPEND_TIME = "LogAppendTime"
# librdkafka properties that the Java client spells differently, or not at all (see spark_options).
_SASL_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}
_DRIVER_ONLY = {"sasl.username", "sasl.password", "sasl.mechanisms", "ssl.ca.location", "group.id",
                "client.id", "enable.auto.commit", "auto.offset.reset"}


class KafkaConfigError(ConfigError):
    """A Kafka stream without servers, or with properties the Java client cannot be given."""


class TopicChanged(RuntimeError):
    """The topic a stream read was deleted and created again: its offsets start over, so the ingest query's
    checkpoint no longer says what was read."""


def client_config(properties: Mapping[str, str], stream: str) -> dict[str, str]:
    """The driver's client properties (confluent-kafka); fails, saying what to set, without servers."""
    if not properties.get("bootstrap.servers"):
        raise KafkaConfigError(
            f"stream {stream!r} reads a Kafka topic, but no Kafka servers are configured: set SLUICE_KAFKA_BOOTSTRAP "
            "(e.g. SLUICE_KAFKA_BOOTSTRAP=broker:9092) or the YAML key kafka.bootstrap.servers, or define the "
            "Airflow connection kafka_default (its extra holds bootstrap.servers)"
        )
    return {k: v for k, v in properties.items() if k not in ("group.id", "enable.auto.commit")}


def spark_options(properties: Mapping[str, str]) -> dict[str, str]:
    """The Java client's properties for Spark's Kafka source, each prefixed ``kafka.``. librdkafka's SASL user
    and password become a JAAS line, ``sasl.mechanisms`` ``sasl.mechanism`` and a PEM CA file a PEM trust
    store; the properties the two clients share pass as they are. Consumer group and offset settings are
    Spark's own (it assigns partitions itself) and are not passed."""
    out = {f"kafka.{k}": v for k, v in properties.items() if k not in _DRIVER_ONLY}
    mechanism = properties.get("sasl.mechanism") or properties.get("sasl.mechanisms")
    if mechanism:
        out["kafka.sasl.mechanism"] = mechanism
    user, password = properties.get("sasl.username"), properties.get("sasl.password")
    if user is not None and "sasl.jaas.config" not in properties:
        module = _SASL_MODULES.get((mechanism or "PLAIN").upper())
        if module is None:
            raise KafkaConfigError(f"Kafka: sasl.username is set for mechanism {mechanism!r}; give the Java client's "
                                   "sasl.jaas.config instead (SLUICE_KAFKA_SASL_JAAS_CONFIG)")
        quoted = lambda text: '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'  # noqa: E731
        out["kafka.sasl.jaas.config"] = (f"{module} required username={quoted(user)} "
                                         f"password={quoted(password or '')};")
    if properties.get("ssl.ca.location") and "ssl.truststore.location" not in properties:
        out["kafka.ssl.truststore.type"] = "PEM"
        out["kafka.ssl.truststore.location"] = properties["ssl.ca.location"]
    return out


@dataclass(frozen=True)
class Topic:
    """What the broker says about a topic now."""

    name: str
    topic_id: str
    timestamp_type: str  # LogAppendTime or CreateTime
    earliest: Mapping[int, int]  # partition -> the first offset the broker still holds
    latest: Mapping[int, int]  # partition -> the next offset it will give (the end, exclusive)

    def to_json(self) -> str:
        return json.dumps({"topic": self.name, "topic_id": self.topic_id, "timestamp_type": self.timestamp_type},
                          sort_keys=True)


def describe(config: Mapping[str, str], topic: str) -> Topic | None:
    """The topic as the broker has it, or None when it does not exist (yet). A transient refusal (a partition
    whose leader is being elected, as just after the topic was made) is asked again, for up to ``TIMEOUT_S``."""
    from confluent_kafka import KafkaException

    deadline = time.monotonic() + TIMEOUT_S
    while True:
        try:
            return _describe(config, topic)
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            if not (getattr(error, "retriable", lambda: False)() and time.monotonic() < deadline):
                raise
            log.info("Kafka topic %s: %s; asking again", topic, error)
            time.sleep(0.5)


def _describe(config: Mapping[str, str], topic: str) -> Topic | None:
    from confluent_kafka import KafkaException, TopicCollection, TopicPartition
    from confluent_kafka.admin import AdminClient, ConfigResource, OffsetSpec, ResourceType

    admin = AdminClient(dict(config))
    try:
        described = admin.describe_topics(TopicCollection([topic]))[topic].result(timeout=TIMEOUT_S)
    except KafkaException as exc:
        if exc.args and getattr(exc.args[0], "name", lambda: "")() == "UNKNOWN_TOPIC_OR_PART":
            return None
        raise
    resource = ConfigResource(ResourceType.TOPIC, topic)
    configs = admin.describe_configs([resource])[resource].result(timeout=TIMEOUT_S)
    entry = configs.get("message.timestamp.type")
    partitions = sorted(p.id for p in described.partitions)

    def offsets(spec: Any) -> dict[int, int]:
        asked = {TopicPartition(topic, p): spec for p in partitions}
        answers = admin.list_offsets(asked, request_timeout=TIMEOUT_S) if asked else {}
        return {tp.partition: answer.result(timeout=TIMEOUT_S).offset for tp, answer in answers.items()}

    return Topic(topic, str(described.topic_id), entry.value if entry is not None else CREATE_TIME,
                 offsets(OffsetSpec.earliest()), offsets(OffsetSpec.latest()))


def _offsets_json(text: str | None, topic: str) -> dict[int, int] | None:
    """The offsets of ``topic`` in a checkpoint log entry: a version line (``v1``, after a NUL byte in
    ``sources/0/0``), the batch's metadata, then one line per source."""
    if text is None:
        return None
    for line in reversed(text.lstrip("\x00").splitlines()):
        line = line.strip()
        if line.startswith("{"):
            data = json.loads(line)
            if topic in data:
                return {int(p): int(o) for p, o in data[topic].items()}
    return None


def checkpoint_path(stream: str, *parts: str) -> tuple[str, ...]:
    return ("ingest", stream, *parts)


def committed_offsets(state: LakeState, stream: str, topic: str) -> dict[int, int] | None:
    """The end offsets of the last micro-batch the ingest query committed, or None before its first."""
    done = [int(o.name) for o in state.list(*checkpoint_path(stream, "commits")) if o.name.isdigit()]
    if not done:
        return None
    return _offsets_json(state.read(*checkpoint_path(stream, "offsets", str(max(done)))), topic)


def planned_ranges(state: LakeState, stream: str, topic: str, spark_batch_id: int) -> dict[int, tuple[int, int]]:
    """partition -> (start, end) of micro-batch ``spark_batch_id`` as the checkpoint planned it (end exclusive);
    a partition that the previous batch did not know (new in the topic) starts at 0."""
    end = _offsets_json(state.read(*checkpoint_path(stream, "offsets", str(spark_batch_id))), topic) or {}
    if spark_batch_id == 0:
        start = _offsets_json(state.read(*checkpoint_path(stream, "sources", "0", "0")), topic) or {}
    else:
        start = _offsets_json(state.read(*checkpoint_path(stream, "offsets", str(spark_batch_id - 1))), topic) or {}
    return {p: (start.get(p, 0), e) for p, e in sorted(end.items())}


KAFKA_SCHEME = "kafka://"  # the scheme of a Kafka record's or micro-batch's address (its ``source_file``)


def topic_prefix(topic: str) -> str:
    """Where every address of ``topic`` starts: ``kafka://<topic>/``."""
    return f"{KAFKA_SCHEME}{topic}/"


def is_kafka_address(source_file: str | None) -> bool:
    """Whether an ``ops/ingest_batches.source_file`` (or bronze's) names Kafka records rather than a file."""
    return (source_file or "").startswith(KAFKA_SCHEME)


def range_label(topic: str, ranges: Mapping[int, tuple[int, int]]) -> str:
    """A micro-batch's address in ``ops/ingest_batches.source_file``: ``kafka://<topic>/<partition>/<first>-<last>``
    per partition it read, comma-separated (``kafka://readings/0/0-99,1/0-42``). A record's address
    (``kafka://readings/1/17``) falls in its batch's range."""
    parts = [f"{p}/{start}-{end - 1}" for p, (start, end) in sorted(ranges.items()) if end > start]
    return topic_prefix(topic) + ",".join(parts)


def lost_offsets(ranges: Mapping[int, tuple[int, int]], first_read: Mapping[int, int],
                 earliest: Mapping[int, int]) -> dict[int, tuple[int, int]]:
    """partition -> (first, end) of the offsets a micro-batch planned but could not read because retention had
    deleted them: the ones below the first offset it read (or its whole range when it read none), where the
    broker's first offset is now past them. A gap the broker still holds (a transaction marker, a compacted
    record) is not a loss."""
    out = {}
    for p, (start, end) in ranges.items():
        if earliest.get(p, 0) <= start:
            continue
        stop = min(first_read.get(p, end), earliest[p], end)
        if stop > start:
            out[p] = (start, stop)
    return out


def check_topic(state: LakeState, stream: str, topic: Topic) -> None:
    """Record the topic's id with the stream's checkpoint the first time, and stop (:class:`TopicChanged`)
    when the topic now has another id: it was deleted and created again, and reading it from the offsets
    the checkpoint holds would skip or reread records."""
    stored = state.read_json(*checkpoint_path(stream, "kafka_topic.json"))
    if stored is not None and stored.get("topic") == topic.name and stored.get("topic_id") != topic.topic_id:
        raise TopicChanged(
            f"stream {stream!r}: Kafka topic {topic.name!r} was deleted and created again (its id was "
            f"{stored.get('topic_id')}, now {topic.topic_id}), so the offsets this stream read up to no longer "
            "name the same records; nothing was ingested. To read the new topic from its first offset, remove the "
            f"stream's ingest checkpoint, the folder <lake>/_checkpoints/ingest/{stream}: records already in bronze "
            "then count as duplicates by their id."
        )
    if stored is None or stored.get("topic") != topic.name or stored.get("timestamp_type") != topic.timestamp_type:
        state.write(topic.to_json(), *checkpoint_path(stream, "kafka_topic.json"))


@dataclass
class TopicBatches:
    """What a Kafka stream's micro-batches need from the topic (:class:`sluice.ingest.microbatch.MicroBatchIngest`):
    their planned ranges, names and sizes, the lost offsets, and each record's address and arrival order."""

    state: LakeState
    stream: str
    topic: str
    config: Mapping[str, str]
    # Arrival order within a micro-batch, for dedup's "earlier copy": broker time, then partition and offset.
    order: tuple[str, ...] = ("arrival_time", "_partition", "_offset")
    # The planned ranges per Spark batch, read once from the checkpoint (label, records and lost all need them).
    _ranges: dict[int, dict[int, tuple[int, int]]] = field(default_factory=dict, repr=False)

    def ranges(self, spark_batch_id: int) -> dict[int, tuple[int, int]]:
        if spark_batch_id not in self._ranges:
            self._ranges[spark_batch_id] = planned_ranges(self.state, self.stream, self.topic, spark_batch_id)
        return self._ranges[spark_batch_id]

    def label(self, spark_batch_id: int) -> str:
        return range_label(self.topic, self.ranges(spark_batch_id))

    def records(self, spark_batch_id: int) -> int:
        return sum(end - start for start, end in self.ranges(spark_batch_id).values())

    def lost(self, spark_batch_id: int, first_read: Mapping[int, int]) -> dict[int, tuple[int, int]]:
        """The batch's offsets that retention deleted before it read them (:func:`lost_offsets`). The broker is
        asked only when the batch read less than it planned."""
        ranges = self.ranges(spark_batch_id)
        if all(first_read.get(p, end) <= start for p, (start, end) in ranges.items()):
            return {}
        now = describe(self.config, self.topic)
        return lost_offsets(ranges, first_read, now.earliest if now is not None else {})

    def address(self) -> Any:
        """A record's address, ``kafka://<topic>/<partition>/<offset>`` (its ``source_file``)."""
        from pyspark.sql import functions as F

        return F.concat(F.lit(topic_prefix(self.topic)), F.col("_partition").cast("string"), F.lit("/"),
                        F.col("_offset").cast("string"))
