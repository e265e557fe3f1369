"""A crashed Spark task alerts: a team's transform that raises fails ``run_cycle`` for real (spark-submit
under ``dag.test()``), and its ``on_failure_callback`` sends a ``task_failure`` alert to a real webhook on
127.0.0.1 and records it in the ops/alerts outbox."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from sluice.config import load_settings
from support.lake import land, read_rows
from support.servers import WebhookServer, webhook_fixture  # noqa: F401 (pytest fixture ``webhook``)

DAGS = Path(__file__).resolve().parents[2] / "dags"

BROKEN_BUILD = '''
from sluice import Output, Pipeline, Stream

readings = Stream(name="readings", fields={"reading_id": "string", "event_time": "timestamp"},
                  id="reading_id", watermark_delay="2m")


def hourly(inputs, window):
    raise RuntimeError("the team's transform has a bug")


pipeline = Pipeline(name="buggy_hourly", streams=[readings], window="1h", schedule="@hourly",
                    outputs=[Output("buggy_hourly", hourly, key="reading_id")])
'''


def state(value: Any) -> str:
    return str(getattr(value, "value", value))


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_crashed_spark_task_raises_a_task_failure_alert(
    sluice_home: Any, airflow_db: Path, webhook: WebhookServer, tmp_path: Path
) -> None:
    from airflow.dag_processing.dagbag import DagBag

    folder = tmp_path / "team-pipelines"
    folder.mkdir()
    (folder / "buggy_hourly.py").write_text(BROKEN_BUILD)
    sluice_home.setenv("SLUICE_PIPELINES", str(folder))
    sluice_home.setenv("AIRFLOW_CONN_SLUICE_WEBHOOK", json.dumps({"conn_type": "http", "host": webhook.url}))
    sluice_home.set_now(datetime(2024, 5, 1, 12, tzinfo=UTC))
    land(load_settings(), "readings", "r1.jsonl",
         [{"reading_id": "r1", "event_time": "2024-05-01T10:00:00Z"}], datetime(2024, 5, 1, 10, 1, tzinfo=UTC))

    bag = DagBag(dag_folder=str(DAGS))
    dag = copy.deepcopy(bag.dags["buggy_hourly"])
    for task in dag.tasks:
        task.retries = 0  # the DAG's retries would only repeat the same crash
    run = dag.test(logical_date=datetime(2025, 6, 2, tzinfo=UTC))
    states = {ti.task_id: state(ti.state) for ti in run.get_task_instances()}
    assert states["run_cycle"] == "failed", states

    [post] = webhook.posts()
    assert post["event"] == "sluice.task_failure" and post["kind"] == "task_failure" and post["level"] == "error"
    assert post["pipeline"] == "buggy_hourly" and post["window_start"] is None
    [item] = post["failed"]
    assert item["expectation"] == "task:buggy_hourly.run_cycle"
    assert item["observed_value"].startswith(f"run {run.run_id}")
    outbox = read_rows(sluice_home.home / "lake/ops/alerts")
    assert [(r["kind"], r["channels"], r["alert_id"]) for r in outbox] == [
        ("task_failure", "webhook", post["alert_id"])]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_task_that_is_not_spark_alerts_too_and_send_alerts_does_not_repeat_its_alerts(
    sluice_home: Any, airflow_db: Path, run_dag: Any, webhook: WebhookServer
) -> None:
    """Issue 28: a backfill asked for a range that ends before it starts fails at validate_params, which alerts
    as every task does; the callback stays quiet for send_alerts' own deliberate failure (its alerts are the
    news)."""
    from airflow.sdk.exceptions import AirflowFailException

    from sluice.airflow.factory import AlertsRaised, task_failure_alert
    from sluice.airflow.outcomes import AlertsUndelivered, ChecksFailed

    sluice_home.setenv("AIRFLOW_CONN_SLUICE_WEBHOOK", json.dumps({"conn_type": "http", "host": webhook.url}))
    sluice_home.set_now(datetime(2024, 5, 1, 12, tzinfo=UTC))
    conf = {"pipeline": "ad_clicks_hourly", "start": "2024-05-01T02:00:00Z", "end": "2024-05-01T00:00:00Z",
            "include_late": False}
    run = run_dag("sluice_backfill", datetime(2025, 6, 3, tzinfo=UTC), run_conf=conf)
    states = {ti.task_id: state(ti.state) for ti in run.get_task_instances()}
    assert states["validate_params"] == "failed", states
    [post] = webhook.posts()
    assert post["kind"] == "task_failure" and post["pipeline"] == "ad_clicks_hourly"
    [item] = post["failed"]
    assert item["expectation"] == "task:sluice_backfill.validate_params"
    assert item["observed_value"].startswith(f"run {run.run_id} try 1: backfill range is empty or reversed")

    for deliberate in (ChecksFailed("2 data-quality problem(s) of p"), AlertsUndelivered("1 alert(s) of p")):
        task_failure_alert({"exception": deliberate, "dag": None})
    assert len(webhook.posts()) == 1
    assert issubclass(AlertsRaised, AirflowFailException)  # still fails the task without retries
