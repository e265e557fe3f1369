"""The Kafka broker and jars that Kafka streams stand on (issue 57, its first part): a real Kafka 4.4 broker in
KRaft mode from ``jars.lock``'s kafka-broker set, and Spark 4.2's Kafka source from its kafka set.

One broker (the session fixture) and one ``spark-submit`` of a plain Structured Streaming job, run twice on one
checkpoint: the broker stamps each record on arrival (``LogAppendTime``), Spark's source reads every partition
with ``availableNow``, and the second run reads only what arrived after the first (the offsets live in the
checkpoint), which is what a Kafka stream's exactly-once ingest will rely on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest

from sluice.core.jars import jar_paths, locked
from support.kafka import KafkaBroker

pytestmark = pytest.mark.spark

JOB = """
import json, sys
from pyspark.sql import SparkSession
bootstrap, topic, checkpoint, out = sys.argv[1:5]
spark = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false").getOrCreate()
records = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
           .option("subscribe", topic).option("startingOffsets", "earliest").load())
query = (records.selectExpr("partition", "offset", "timestamp", "timestampType", "CAST(value AS STRING) AS value")
         .writeStream.format("json").option("path", out).option("checkpointLocation", checkpoint)
         .trigger(availableNow=True).start())
query.awaitTermination()
rows = [r.asDict() for r in spark.read.json(out).collect()] if query.lastProgress else []
print("ROWS " + json.dumps(rows, default=str))
"""


def _read(kafka: KafkaBroker, topic: str, work: Path) -> list[dict]:
    script = work / "job.py"
    script.write_text(JOB)
    jars = ",".join(str(p) for p in jar_paths(("kafka",)))
    done = subprocess.run(
        [str(Path(sys.executable).parent / "spark-submit"), "--jars", jars, str(script), kafka.bootstrap, topic,
         str(work / "checkpoint"), str(work / "out")],
        capture_output=True, text=True, timeout=600, check=False,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"},
    )
    assert done.returncode == 0, done.stderr[-4000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("ROWS "))
    return sorted(json.loads(line[5:]), key=lambda r: (r["partition"], r["offset"]))


def test_the_locked_kafka_set_is_spark_4_2s_connector_and_the_broker_set_a_kafka_4_4() -> None:
    connector = {j.artifact: j.version for j in locked(("kafka",))}
    assert connector["spark-sql-kafka-0-10_2.13"] == connector["spark-token-provider-kafka-0-10_2.13"] == "4.2.0"
    assert "kafka-clients" in connector and not any(a.startswith("hadoop-client") for a in connector)
    broker = {j.artifact: j.version for j in locked(("kafka-broker",))}
    assert broker["kafka_2.13"] == "4.4.0" and broker["kafka-server"] == "4.4.0"


def test_spark_reads_each_record_once_with_the_brokers_arrival_time(kafka: KafkaBroker, tmp_path: Path) -> None:
    topic = kafka.topic("readings", partitions=2)
    before = time.time()
    kafka.produce(topic, [json.dumps({"reading_id": f"r{i}"}) for i in range(6)])
    first = _read(kafka, topic, tmp_path)
    assert sorted(json.loads(r["value"])["reading_id"] for r in first) == [f"r{i}" for i in range(6)]
    # LogAppendTime (1): the broker's clock on arrival, not the producer's.
    assert {r["timestampType"] for r in first} == {1}

    kafka.produce(topic, [json.dumps({"reading_id": "r6"}), json.dumps({"reading_id": "r7"})])
    both = _read(kafka, topic, tmp_path)
    # The second run read the two new records only: its output folder holds each record once.
    assert len(both) == 8 and len({(r["partition"], r["offset"]) for r in both}) == 8
    assert sorted(json.loads(r["value"])["reading_id"] for r in both) == [f"r{i}" for i in range(8)]
    after = time.time()
    for r in both:
        stamped = datetime.fromisoformat(r["timestamp"].replace("Z", "+00:00")).timestamp()
        assert before - 1 <= stamped <= after + 1, r
