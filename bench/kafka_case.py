"""``make bench``'s Kafka case (issue 57): a sluice stream on a topic beside the plain Spark job a team would
write instead (``bare_kafka_job.py``: Kafka source, JSON parse, watermark, dedup, the same aggregation, a
delta-spark sink), on the same records of a real broker (``sluice.platform.kafka_server``), in one run.

The records are SPEC 8's readings (500 devices, a day of event time ending now), in a two-partition
``LogAppendTime`` topic. Stages:

* ``kafka_cycle`` / ``kafka_bare``: the day's backlog, each side from a fresh home (catch-up);
* ``kafka_incr`` / ``kafka_incr_bare``: then a 15-minute increment of records at a time, each side resuming from
  its own checkpoint (the scheduled cycle).

Ratios: ``kafka_cycle/bare`` and ``kafka_incr/bare`` (medians), both with target 1.0.
"""

from __future__ import annotations

import json
import shutil
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
PIPELINE = "device_temps"
DEVICES = 500
PARTITIONS = 2
INCREMENT = timedelta(minutes=15)
# The SPEC 8 pipeline, its stream on a topic: what a team declares (the README's tutorial, source added).
PIPELINE_FILE = '''from pyspark.sql import functions as F

from sluice import Output, Pipeline, Stream, checks, kafka

readings = Stream(
    name="readings",
    fields={{"reading_id": "string", "device_id": "string", "temp_c": "double", "battery": "long",
            "event_time": "timestamp"}},
    id="reading_id",
    required=["reading_id", "device_id", "event_time"],
    watermark_delay="2m",
    source=kafka(topic="{topic}"),
)


def device_temps(inputs, window):
    r = inputs["readings"]
    return (r.where(F.col("temp_c").isNotNull())
             .groupBy(window.column("event_time"), "device_id")
             .agg(F.count("*").alias("readings"), F.avg("temp_c").alias("avg_temp_c"),
                  F.min("battery").alias("min_battery")))


pipeline = Pipeline(
    name="device_temps",
    streams=[readings],
    window=("15m", "5m"),
    outputs=[Output("device_temps", device_temps, key="device_id",
                    checks=[checks.completeness("readings", stream="readings"),
                            checks.between("avg_temp_c", -60, 100)])],
)
'''


def readings(first: int, count: int, start: datetime, span: timedelta) -> list[str]:
    """``count`` readings numbered from ``first``, their event times spread evenly over ``[start, start + span)``."""
    step = span / count
    return [json.dumps({"reading_id": f"r{i}", "device_id": f"d{i % DEVICES}", "temp_c": 15.0 + (i % 200) / 10,
                        "battery": 100 - i % 100,
                        "event_time": (start + step * (i - first)).strftime("%Y-%m-%dT%H:%M:%SZ")})
            for i in range(first, first + count)]


def produce(bootstrap: str, topic: str, values: list[str]) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50, "batch.num.messages": 10000,
                         "queue.buffering.max.messages": 2_000_000, "enable.idempotence": True})
    for i, value in enumerate(values):
        producer.produce(topic, value, partition=i % PARTITIONS)
        if i % 100_000 == 0:
            producer.poll(0)
    left = producer.flush(300)
    if left:
        raise RuntimeError(f"{left} record(s) of {topic} were not acknowledged")


def new_topic(bootstrap: str, name: str) -> str:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, PARTITIONS, 1, config={"message.timestamp.type": "LogAppendTime"})])[
        name].result(timeout=60)
    return name


class KafkaCase:
    """Runs the Kafka stages on a :class:`run.Bench` (its ``record``, environment and Spark settings)."""

    def __init__(self, bench: Any, events: int, increments: int, parse_sluice: Any) -> None:
        self.bench = bench
        self.events = events
        self.increments = increments
        self.parse_sluice = parse_sluice
        self.root = bench.work / "kafka"

    def run(self) -> None:
        from sluice.platform.kafka_server import start_broker

        shutil.rmtree(self.root, ignore_errors=True)
        (self.root / "broker").mkdir(parents=True)
        broker = start_broker(self.root / "broker")
        try:
            self._stages(broker.bootstrap)
        finally:
            broker.stop()

    def _stages(self, bootstrap: str) -> None:
        bench, log = self.bench, self._log
        topic = new_topic(bootstrap, "bench-readings")
        pipelines = self.root / "pipelines"
        pipelines.mkdir()
        (pipelines / "device_temps.py").write_text(PIPELINE_FILE.format(topic=topic))
        # Event times end now, so that no increment is early: the day, then the increments up to now.
        now = datetime.now(UTC).replace(microsecond=0)
        day_end = now - INCREMENT * self.increments
        produce(bootstrap, topic, readings(0, self.events, day_end - timedelta(days=1), timedelta(days=1)))
        log(f"kafka: {self.events:,} readings in topic {topic} ({PARTITIONS} partitions)")
        home, out = self.root / "home", self.root / "bare"
        env = {**bench.env, "SLUICE_HOME": str(home), "SLUICE_PIPELINES": str(pipelines),
               "SLUICE_KAFKA_BOOTSTRAP": bootstrap}
        # The bare job gets sluice's Spark settings and, as sluice's sessions with Kafka servers configured do,
        # Spark's Kafka source from the same pinned jars.
        from sluice.config import load_settings
        from sluice.runtime.spark import jars_conf

        kafka_jars = jars_conf(load_settings({"SLUICE_KAFKA_BOOTSTRAP": bootstrap}, home=self.root / "probe"))
        bare = [sys.executable, str(BENCH / "bare_kafka_job.py"), "--bootstrap", bootstrap, "--topic", topic,
                "--out", str(out), "--master", bench.master, "--conf-json",
                json.dumps({**bench.spark_conf, **kafka_jars})]
        # The catch-up: both sides read the whole backlog from a fresh home (the bare job first: no side always
        # finds the machine warm).
        bench.record("kafka_bare", self.events, 0, bare)
        self._sluice("kafka_cycle", self.events, 0, env)
        per_increment = max(1, self.events // 96)
        first = self.events
        for rep in range(self.increments):
            start = day_end + INCREMENT * rep
            produce(bootstrap, topic, readings(first, per_increment, start, INCREMENT))
            first += per_increment
            runs = [lambda r=rep: self._sluice("kafka_incr", per_increment, r, env),
                    lambda r=rep: bench.record("kafka_incr_bare", per_increment, r, bare)]
            for run in runs[rep % 2:] + runs[: rep % 2]:
                run()

    def _sluice(self, stage: str, events: int, rep: int, env: dict[str, str]) -> None:
        now = datetime.now(UTC).isoformat()
        self.bench.record(stage, events, rep, [*self.bench.sluice, "run", PIPELINE, "--now", now],
                          env={**env, "SLUICE_NOW": now}, parser=self.parse_sluice)

    @staticmethod
    def _log(message: str) -> None:
        print(f"[bench] {message}", file=sys.stderr, flush=True)
