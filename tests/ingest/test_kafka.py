"""A stream that reads a Kafka topic (SPEC 2, "Kafka streams"; issue 57), on a real broker (tests/support/kafka.py)
and the suite's Spark: the SPEC 8 pipeline with ``source=kafka(topic=...)``, fed in rounds of records that hold
every kind of bad input, run by cycles in this process and by ``sluice run`` in its own; its gold, bronze, DLQ and
quarantine equal those of the same records landed as files with the same arrival times. Then the offsets that
retention deleted before they were read, and a topic deleted and created again."""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from sluice.alerting.outbox import read_outbox
from sluice.config import Settings, load_settings
from sluice.ingest.run import run_ingest
from sluice.ingest.state import load_state
from sluice.ingest.topics import TopicChanged
from sluice.runtime.context import open_run
from sluice.runtime.spark import JIT_OPTIONS
from support.kafka import Delivered, KafkaBroker, kafka_pipelines
from support.lake import cycle, table, table_snapshot
from support.shell import user_shell
from support.tutorial import write_tutorial

pytestmark = [pytest.mark.spark, pytest.mark.slow]

START = datetime.now(UTC).replace(second=0, microsecond=0)
# Event times of the last three hours, on the window grid: the broker stamps arrivals with its own clock.
BASE = START.replace(minute=START.minute - START.minute % 15) - timedelta(hours=3)
ADDRESS = re.compile(r"^kafka://(?P<topic>[^/]+)/(?P<partition>\d+)/(?P<offset>\d+)$")


def reading(i: int, minutes: float, device: str | None = None, **extra: Any) -> str:
    record = {"reading_id": f"r{i}", "device_id": device or f"d{i % 3}", "temp_c": 20 + i % 7, "battery": 100 - i,
              "event_time": (BASE + timedelta(minutes=minutes)).strftime("%Y-%m-%dT%H:%M:%SZ"), **extra}
    return json.dumps(record)


def round_one() -> list[tuple[int, bytes | str | None]]:
    """(partition, value): readings over the first hour, two partitions, and one of every kind of bad input."""
    good = [(i % 2, reading(i, 2 * i)) for i in range(30)]
    bad: list[tuple[int, bytes | str | None]] = [
        (0, "{not json"),                                                                 # malformed_json
        (1, json.dumps({"reading_id": "m1", "event_time": BASE.isoformat()})),             # missing device_id
        (0, reading(100, 5, temp_c="hot")),                                                # bad_type
        (1, b'{"reading_id": "\xff\xfe", "device_id": "d0", "event_time": "2024-01-01T00:00:00Z"}'),  # bad_encoding
        (0, reading(101, 60 * 5)),                                                         # early: 2 h ahead
        (1, None),                                                                         # a tombstone: skipped
        (1, reading(3, 6)),                                                                # r3 again, same batch
    ]
    return good + bad


def round_two() -> list[tuple[int, bytes | str | None]]:
    """The second hour, r5 again (accepted in round one), and a reading far below the watermark."""
    return [(i % 2, reading(i, 2 * i)) for i in range(30, 60)] + [(0, reading(5, 10)), (1, reading(200, 1))]


def produce(kafka: KafkaBroker, topic: str, records: list[tuple[int, bytes | str | None]]) -> list[Delivered]:
    out = []
    for partition in (0, 1):
        out += kafka.produce(topic, [v for p, v in records if p == partition], partition=partition)
    return out


def cli_run(settings: Settings, pipeline: str, now: datetime, env: dict[str, str], events: Path) -> str:
    """``sluice run`` as a user runs it, in a process (and a Spark driver) of its own, with Spark's event log in
    ``events``. It exits 2: the windows of round two's late reading fail their lateness check (SPEC 5)."""
    conf = events.parent / "spark-conf"
    conf.mkdir()
    (conf / "spark-defaults.conf").write_text(
        f"spark.eventLog.enabled true\nspark.eventLog.dir {events.as_uri()}\nspark.eventLog.compress false\n")
    events.mkdir()
    shell = {**user_shell(), "SLUICE_HOME": str(settings.home), "SLUICE_PIPELINES": str(settings.pipelines_path),
             "SPARK_CONF_DIR": str(conf), **env}
    done = subprocess.run([sys.executable, "-m", "sluice.cli", "run", pipeline, "--now", now.isoformat()],
                          env=shell, capture_output=True, text=True, timeout=600)
    assert done.returncode == 2, done.stdout[-3000:] + done.stderr[-5000:]
    return done.stdout + done.stderr


class Scenario:
    """Both homes after the same rounds: ``kafka`` read the topic, ``files`` the same records landed as one file
    per Kafka micro-batch, with the batch's last arrival time as the file's."""

    def __init__(self, kafka_home: Settings, files_home: Settings, topic: str, delivered: list[Delivered],
                 cli_log: str, cli_events: Path) -> None:
        self.kafka, self.files, self.topic, self.delivered, self.cli_log, self.cli_events = (
            kafka_home, files_home, topic, delivered, cli_log, cli_events)


@pytest.fixture(scope="module")
def scenario(spark: SparkSession, kafka: KafkaBroker, tmp_path_factory: pytest.TempPathFactory) -> Scenario:
    root = tmp_path_factory.mktemp("kafka-stream")
    topic = kafka.topic("readings", partitions=2)
    env = {"SLUICE_KAFKA_BOOTSTRAP": kafka.bootstrap}
    kafka_home = load_settings(env, home=root / "kafka", pipelines=kafka_pipelines(root / "kafka-pipelines", topic))
    files_home = load_settings({}, home=root / "files", pipelines=write_tutorial(root / "file-pipelines"))

    delivered = produce(kafka, topic, round_one())
    now_one = datetime.now(UTC)
    kafka_home = cycle(spark, kafka_home, "device_temps", now_one)
    delivered += produce(kafka, topic, round_two())
    now_two = datetime.now(UTC)
    cli_events = root / "cli-events"
    cli_log = cli_run(kafka_home, "device_temps", now_two, env, cli_events)
    # Idle: a heartbeat closes the last windows.
    idle = datetime.now(UTC) + timedelta(hours=1)
    kafka_home = cycle(spark, kafka_home, "device_temps", idle)

    # The same records as landing files: one per Kafka micro-batch, in its offset order, arriving at its last
    # record's arrival; the same cycles at the same times.
    by_address = {}
    # In the order produce() sent them: round by round, partition 0's records, then partition 1's.
    sent = [v for rnd in (round_one(), round_two()) for part in (0, 1) for p, v in rnd if p == part]
    for d, value in zip(delivered, sent, strict=True):
        by_address[(d.partition, d.offset)] = (value, d.timestamp)
    batches = [r for r in load_state(kafka_home, "readings").rows if not r.is_heartbeat]
    for n, row in enumerate(batches):
        lines, arrival = [], None
        for part in (row.source_file or "").split("/", 3)[3].split(","):
            partition, span = part.split("/")
            first, last = (int(x) for x in span.split("-"))
            for offset in range(first, last + 1):
                value, stamp = by_address[(int(partition), offset)]
                arrival = stamp if arrival is None else max(arrival, stamp)
                lines.append(value)
        assert arrival is not None
        raw = b"".join((v if isinstance(v, bytes) else (v or "").encode()) + b"\n" for v in lines)
        path = files_home.landing_dir("readings") / f"batch-{n:03d}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(raw)
        os.utime(path, (arrival.timestamp(), arrival.timestamp()))
        if n == 0:
            files_home = cycle(spark, files_home, "device_temps", now_one)
    files_home = cycle(spark, files_home, "device_temps", now_two, quality=True)  # as `sluice run` does
    files_home = cycle(spark, files_home, "device_temps", idle)
    return Scenario(kafka_home, files_home, topic, delivered, cli_log, cli_events)


def test_each_micro_batch_is_one_row_named_by_its_offset_ranges_and_every_record_is_accounted_for(
        scenario: Scenario) -> None:
    rows = load_state(scenario.kafka, "readings").rows
    batches = [r for r in rows if not r.is_heartbeat]
    assert len(batches) == 2 and rows[-1].is_heartbeat
    for row in batches:
        assert row.lines == row.accepted + row.quarantined + row.late + row.duplicates
        assert row.lost == 0
        assert re.fullmatch(rf"kafka://{re.escape(scenario.topic)}/0/\d+-\d+,1/\d+-\d+", row.source_file or "")
    one, two = batches
    # Round one: 30 readings + 6 bad records (the tombstone is skipped) + r3 twice.
    assert (one.lines, one.accepted, one.quarantined, one.late, one.duplicates, one.skipped) == (36, 30, 5, 0, 1, 1)
    assert (two.lines, two.accepted, two.quarantined, two.late, two.duplicates) == (32, 30, 0, 1, 1)
    # Spark's rule: the watermark before round two is round one's last accepted reading (58 min) minus 2 min.
    assert two.watermark_before == BASE + timedelta(minutes=56)
    # The arrival time is the broker's timestamp of the batch's last record.
    assert one.max_arrival_time == max(d.timestamp for d in scenario.delivered[:37])


def test_each_record_keeps_its_address_and_its_broker_arrival_time(scenario: Scenario) -> None:
    stamps = {(d.partition, d.offset): d.timestamp for d in scenario.delivered}
    bronze = [r for r in table(scenario.kafka, "bronze/readings") if not r["is_heartbeat"]]
    assert len(bronze) == 60
    for row in bronze:
        match = ADDRESS.match(row["source_file"])
        assert match and match["topic"] == scenario.topic, row["source_file"]
        assert row["arrival_time"].replace(tzinfo=UTC) == stamps[(int(match["partition"]), int(match["offset"]))]
    assert len({r["source_file"] for r in bronze}) == 60


def test_bad_values_go_to_quarantine_with_their_reason_and_address(scenario: Scenario) -> None:
    quarantine = table(scenario.kafka, "quarantine/readings")
    assert Counter(r["reason"] for r in quarantine) == Counter(
        {"malformed_json": 1, "missing_field": 1, "bad_type": 1, "bad_encoding": 1, "early": 1})
    for row in quarantine:
        assert ADDRESS.match(row["source_file"]), row
        assert row["line_number"] is None  # a record's value is one document, not a line of a file
    encoded = next(r for r in quarantine if r["reason"] == "bad_encoding")
    assert base64.b64decode(encoded["raw"]).startswith(b'{"reading_id": "\xff\xfe"')


def test_a_late_record_goes_to_the_dlq_with_the_watermark_it_missed(scenario: Scenario) -> None:
    dlq = table(scenario.kafka, "dlq/readings")
    assert [(r["reading_id"], r["watermark"].replace(tzinfo=UTC)) for r in dlq] == [
        ("r200", BASE + timedelta(minutes=56))]
    assert ADDRESS.match(dlq[0]["source_file"])


def test_gold_equals_that_of_the_same_records_landed_as_files(scenario: Scenario) -> None:
    def rows(settings: Settings, name: str, drop: tuple[str, ...] = ()) -> list[tuple[Any, ...]]:
        kept = (tuple(v for k, v in sorted(r.items()) if k not in drop) for r in table(settings, name))
        return sorted(kept, key=repr)

    gold = rows(scenario.kafka, "gold/device_temps")
    assert gold, "no window closed"
    assert gold == rows(scenario.files, "gold/device_temps")
    # And every record went to the same place, its lineage aside: a file's path and one arrival time for its
    # lines, a record's offset and its own timestamp.
    lineage = ("source_file", "ingest_batch_id", "line_number", "arrival_time")
    for name in ("bronze/readings", "dlq/readings", "quarantine/readings"):
        assert rows(scenario.kafka, name, lineage) == rows(scenario.files, name, lineage), name
    # The same windows closed, with the same rows and late rows, and the same verdicts.
    def ledger(settings: Settings) -> list[tuple[Any, ...]]:
        keys = ("window_start", "window_end", "state", "rows", "late_rows")
        return sorted(tuple(r[k] for k in keys) for r in table(settings, "ops/window_ledger"))

    assert ledger(scenario.kafka) == ledger(scenario.files)
    assert Counter(r[2] for r in ledger(scenario.kafka))["failed"] == 3  # the late reading's windows


def test_a_topics_backlog_closes_in_batch_as_a_folders_does(scenario: Scenario) -> None:
    # Round one is an hour of backlog (11 windows of 5 minutes), read by one micro-batch: the first cycle computes
    # its windows in batch (the catch-up), sized from bronze's oldest event, not the batch's newest one.
    for home in (scenario.kafka, scenario.files):
        marker = home.checkpoints / "pipelines" / "device_temps" / "catchup.json"
        assert marker.is_file(), home.home
        caught_up = json.loads(marker.read_text())
        assert caught_up["done"]
        assert datetime.fromisoformat(caught_up["boundary"]) >= BASE + timedelta(minutes=45)


def test_sluice_run_reads_the_topic_in_a_process_of_its_own(scenario: Scenario) -> None:
    assert "ingest readings" in scenario.cli_log
    assert "lines=32 accepted=30 quarantined=0 late=1 duplicates=1" in scenario.cli_log
    assert "lateness:dlq_share_within_threshold" in scenario.cli_log


def test_sluice_run_of_an_increment_starts_its_jvm_as_one(scenario: Scenario) -> None:
    # Round two is a few records: the cycle knows it from the topic's offsets before its JVM starts, and compiles
    # with C1 only (runtime.spark.JIT_OPTIONS), as Spark's own record of the driver's settings shows.
    logs = list(scenario.cli_events.rglob("events_*"))
    assert len(logs) == 1, logs
    environment = next(e for e in map(json.loads, logs[0].read_text().splitlines())
                       if e["Event"] == "SparkListenerEnvironmentUpdate")
    properties = environment["Spark Properties"]
    options = dict(properties if isinstance(properties, list) else properties.items())["spark.driver.extraJavaOptions"]
    assert options.split("log4j2.properties ", 1)[1].startswith(JIT_OPTIONS["increment"])


# -- retention and recreated topics ------------------------------------------------------------------------


def simple_home(root: Path, topic: str, bootstrap: str) -> Settings:
    return load_settings({"SLUICE_KAFKA_BOOTSTRAP": bootstrap}, home=root / "home",
                         pipelines=kafka_pipelines(root / "pipelines", topic))


def test_offsets_deleted_by_retention_are_counted_alerted_once_and_skipped(
        spark: SparkSession, kafka: KafkaBroker, tmp_path: Path) -> None:
    from confluent_kafka import TopicPartition

    topic = kafka.topic("retention")
    settings = simple_home(tmp_path, topic, kafka.bootstrap)
    kafka.produce(topic, [reading(i, i) for i in range(10)], partition=0)
    run_ingest(open_run(settings, spark), ["readings"])
    kafka.produce(topic, [reading(i, i) for i in range(10, 20)], partition=0)
    # What retention does: the log now starts at offset 15, and 10-14 were never read.
    admin = kafka.admin()
    admin.delete_records([TopicPartition(topic, 0, 15)])[TopicPartition(topic, 0, 15)].result(timeout=60)

    settings = cycle(spark, settings, "device_temps", datetime.now(UTC))
    rows = load_state(settings, "readings").rows
    assert [(r.lines, r.accepted, r.lost) for r in rows if not r.is_heartbeat] == [(10, 10, 0), (5, 5, 5)]
    assert rows[-1].source_file == f"kafka://{topic}/0/10-19"
    assert sorted(r["reading_id"] for r in table(settings, "bronze/readings") if not r["is_heartbeat"]) == sorted(
        [f"r{i}" for i in range(10)] + [f"r{i}" for i in range(15, 20)])
    alerts = [a for a in read_outbox(settings, "device_temps") if a["kind"] == "kafka_offsets_lost"]
    assert len(alerts) == 1
    assert json.loads(alerts[0]["failed_expectations"]) == [
        {"expectation": "kafka_offsets_lost:readings", "observed_value": f"5 offset(s) of kafka://{topic}/0/10-19"}]
    cycle(spark, settings, "device_temps", datetime.now(UTC))  # nothing new: the same alert, not a second
    assert len([a for a in read_outbox(settings, "device_temps") if a["kind"] == "kafka_offsets_lost"]) == 1

    # Everything new deleted before a cycle read it: a batch of nothing but lost offsets, recorded and alerted.
    kafka.produce(topic, [reading(i, i) for i in range(20, 25)], partition=0)
    admin.delete_records([TopicPartition(topic, 0, 25)])[TopicPartition(topic, 0, 25)].result(timeout=60)
    settings = cycle(spark, settings, "device_temps", datetime.now(UTC))
    last = load_state(settings, "readings").rows[-1]
    assert (last.lines, last.accepted, last.lost, last.source_file) == (0, 0, 5, f"kafka://{topic}/0/20-24")
    assert len([a for a in read_outbox(settings, "device_temps") if a["kind"] == "kafka_offsets_lost"]) == 2


def test_a_topic_deleted_and_created_again_stops_the_run(
        spark: SparkSession, kafka: KafkaBroker, tmp_path: Path) -> None:
    from confluent_kafka.admin import NewTopic

    topic = kafka.topic("recreated")
    settings = simple_home(tmp_path, topic, kafka.bootstrap)
    kafka.produce(topic, [reading(i, i) for i in range(5)], partition=0)
    run_ingest(open_run(settings, spark), ["readings"])
    admin = kafka.admin()
    admin.delete_topics([topic])[topic].result(timeout=60)
    for _ in range(100):  # the broker forgets a deleted topic asynchronously
        try:
            admin.create_topics([NewTopic(topic, 1, 1, config={"message.timestamp.type": "LogAppendTime"})])[
                topic].result(timeout=60)
            break
        except Exception:  # still being deleted
            time.sleep(0.2)
    kafka.produce(topic, [reading(i, i) for i in range(5, 8)], partition=0)
    with pytest.raises(TopicChanged, match="deleted and created again"):
        run_ingest(open_run(settings, spark), ["readings"])
    assert len(load_state(settings, "readings").rows) == 1  # nothing of the new topic was written


def test_a_kafka_stream_without_servers_fails_fast_saying_what_to_set(tmp_path: Path) -> None:
    from sluice.ingest.topics import KafkaConfigError

    settings = load_settings({}, home=tmp_path / "home", pipelines=kafka_pipelines(tmp_path / "p", "readings"))
    with pytest.raises(KafkaConfigError, match="SLUICE_KAFKA_BOOTSTRAP"):
        run_ingest(open_run(settings), ["readings"])


def test_a_create_time_topic_is_read_and_sluice_status_warns_about_it(
        spark: SparkSession, kafka: KafkaBroker, tmp_path: Path) -> None:
    from sluice.reports.status import render_status, status_data
    from sluice.storage.state import lake_state

    topic = kafka.topic("createtime", timestamps="CreateTime")
    settings = simple_home(tmp_path, topic, kafka.bootstrap)
    delivered = kafka.produce(topic, [reading(i, i) for i in range(3)], partition=0)
    run_ingest(open_run(settings, spark), ["readings"])
    assert [r.accepted for r in load_state(settings, "readings").rows] == [3]
    assert load_state(settings, "readings").rows[0].max_arrival_time == max(d.timestamp for d in delivered)
    state = lake_state(settings)
    assert f"stream readings: Kafka topic {topic} uses CreateTime" in render_status(settings, state)
    assert any("CreateTime" in w for w in status_data(settings, state)["warnings"])


# -- SIGKILL -----------------------------------------------------------------------------------------------

# Each kill is a `sluice run` process killed right after the given commit of round two's micro-batch (its ops row;
# its bronze; its quarantine, before its DLQ), each in the run that recovers from the kill before it; then one
# run that nothing kills must leave the tables of a home that was never interrupted.
KAFKA_CRASHES = ("ops/ingest_batches:1", "bronze/readings:1", "quarantine/readings:1")
NO_LATENESS_FAILURES = {"SLUICE_LATENESS_THRESHOLD": "1"}


def test_sigkill_anywhere_in_a_kafka_ingest_then_rerun_loses_nothing_and_doubles_nothing(
        spark: SparkSession, kafka: KafkaBroker, tmp_path: Path) -> None:
    topic = kafka.topic("sigkill", partitions=2)
    env = {"SLUICE_KAFKA_BOOTSTRAP": kafka.bootstrap, **NO_LATENESS_FAILURES}
    pipelines = kafka_pipelines(tmp_path / "pipelines", topic)
    homes = {name: load_settings(env, home=tmp_path / name, pipelines=pipelines) for name in ("clean", "crash")}
    produce(kafka, topic, round_one())
    now_one = datetime.now(UTC)
    for settings in homes.values():
        cycle(spark, settings, "device_temps", now_one, quality=True)
    produce(kafka, topic, [*round_two(), (1, "{not json either")])
    now_two = datetime.now(UTC)
    cycle(spark, homes["clean"], "device_temps", now_two, quality=True)

    crash = homes["crash"]
    for kill_after in KAFKA_CRASHES:
        shell = {**user_shell(), **env, "SLUICE_HOME": str(crash.home), "SLUICE_PIPELINES": str(pipelines),
                 "SLUICE_KILL_AFTER_COMMIT": kill_after}
        command = [sys.executable, "-m", "sluice.cli", "run", "device_temps", "--now", now_two.isoformat()]
        done = subprocess.run(command, env=shell, capture_output=True, text=True, timeout=600)
        assert done.returncode == -9, f"no SIGKILL after {kill_after}: exit {done.returncode}, {done.stderr[-3000:]}"
    cycle(spark, crash, "device_temps", now_two, quality=True)

    clean, crashed = table_snapshot(homes["clean"].home), table_snapshot(crash.home)
    assert clean.keys() == crashed.keys()
    for name in clean:
        assert crashed[name] == clean[name], name
    rows = load_state(crash, "readings").rows
    assert [(r.lines, r.quarantined, r.late, r.duplicates) for r in rows] == [(36, 5, 0, 1), (33, 1, 1, 1)]
