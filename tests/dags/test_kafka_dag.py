"""A pipeline whose stream reads a Kafka topic, through its scheduled DAG under ``dag.test()`` (issue 57): the
servers come from the Airflow connection ``kafka_default`` (the Apache Kafka provider's type, its extra holding
the client's properties), which the task hands to its spark-submit job; the job reads the tests' real broker."""

from __future__ import annotations

import copy
import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from support.kafka import KafkaBroker, kafka_pipelines
from support.lake import read_rows

DAGS = Path(__file__).resolve().parents[2] / "dags"


def state(value: Any) -> str:
    return str(getattr(value, "value", value))


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_a_kafka_stream_runs_through_its_dag_with_the_kafka_default_connection(
        sluice_home: Any, airflow_db: Path, kafka: KafkaBroker, tmp_path: Path) -> None:
    from airflow.dag_processing.dagbag import DagBag

    topic = kafka.topic("dag", partitions=2)
    folder = kafka_pipelines(tmp_path / "team-pipelines", topic)
    sluice_home.setenv("SLUICE_PIPELINES", str(folder))
    connection = {"conn_type": "kafka", "extra": {"bootstrap.servers": kafka.bootstrap, "group.id": "sluice"}}
    sluice_home.setenv("AIRFLOW_CONN_KAFKA_DEFAULT", json.dumps(connection))

    start = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(hours=2)
    readings = [json.dumps({"reading_id": f"r{i}", "device_id": f"d{i % 2}", "temp_c": 20.0 + i, "battery": 90,
                            "event_time": (start + timedelta(minutes=3 * i)).strftime("%Y-%m-%dT%H:%M:%SZ")})
                for i in range(12)]
    for partition in (0, 1):
        kafka.produce(topic, readings[partition::2], partition=partition)
    # An hour after the records arrived: the topic is idle, and its heartbeat closes every window.
    sluice_home.set_now(datetime.now(UTC) + timedelta(hours=1))

    bag = DagBag(dag_folder=str(DAGS))
    dag = copy.deepcopy(bag.dags["device_temps"])
    for task in dag.tasks:
        task.retry_delay = timedelta(seconds=1)
    run = dag.test(logical_date=datetime(2025, 7, 1, tzinfo=UTC))
    states = {ti.task_id: state(ti.state) for ti in run.get_task_instances()}
    assert states == {"choose_path": "success", "run_cycle": "success", "send_alerts": "success",
                      "reprocess_interval": "skipped", "check_quality": "success"}, states

    home = sluice_home.home
    bronze = [r for r in read_rows(home / "lake" / "bronze/readings") if not r["is_heartbeat"]]
    assert sorted(r["reading_id"] for r in bronze) == sorted(f"r{i}" for i in range(12))
    assert all(re.fullmatch(rf"kafka://{re.escape(topic)}/[01]/\d+", r["source_file"]) for r in bronze)
    gold = read_rows(home / "lake" / "gold/device_temps")
    assert sum(r["readings"] for r in gold if r["window_end"] - r["window_start"] == timedelta(minutes=15)) == 36
    ledger = read_rows(home / "lake" / "ops/window_ledger")
    assert ledger and {r["state"] for r in ledger} == {"validated"}
