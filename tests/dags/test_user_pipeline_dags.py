"""SPEC 8 through Airflow: a team's pipeline in a folder of its own (SLUICE_PIPELINES) gets its scheduled
DAG and a value in sluice_backfill's enum, runs with ``dag.test()`` (spark-submit in local mode), validates
its windows and alerts a real webhook; a broken file beside it is an import error naming that file only."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from sluice.config import load_settings
from support.lake import land, read_rows
from support.servers import WebhookServer, webhook_fixture  # noqa: F401 (pytest fixture ``webhook``)
from support.tutorial import write_tutorial

DAY = datetime(2024, 5, 1, tzinfo=UTC)
DAGS = Path(__file__).resolve().parents[2] / "dags"


def rows(home: Path, table: str) -> list[dict[str, Any]]:
    path = home / "lake" / table
    return read_rows(path) if DeltaTable.is_deltatable(str(path)) else []


def at(minutes: int) -> datetime:
    return DAY + timedelta(hours=10, minutes=minutes)


def reading(i: int, device: str, minute: int, temp: float | None) -> dict[str, Any]:
    return {"reading_id": f"r{i}", "device_id": device, "temp_c": temp, "battery": 90,
            "event_time": at(minute).isoformat().replace("+00:00", "Z")}


def state(value: Any) -> str:
    return str(getattr(value, "value", value))


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_own_pipeline_runs_under_airflow_and_a_broken_file_names_itself(
    sluice_home: Any, airflow_db: Path, webhook: WebhookServer, tmp_path: Path
) -> None:
    from airflow.dag_processing.dagbag import DagBag

    folder = write_tutorial(tmp_path / "team-pipelines")
    (folder / "broken_pipeline.py").write_text("from sluice import Stream\nStream(name='x', fields={}, id='x')\n")
    sluice_home.setenv("SLUICE_PIPELINES", str(folder))
    sluice_home.setenv("AIRFLOW_CONN_SLUICE_WEBHOOK", json.dumps({"conn_type": "http", "host": webhook.url}))
    sluice_home.set_now(at(60))  # the stream has been idle since 10:16: its heartbeat closes every window
    settings = load_settings()
    land(settings, "readings", "r1.jsonl", [reading(1, "d1", 0, 20.0), reading(2, "d2", 2, 30.0),
                                            reading(3, "d1", 4, 22.0)], at(6))
    land(settings, "readings", "r2.jsonl", [reading(4, "d1", 10, 24.0), reading(5, "d2", 12, None)], at(16))

    bag = DagBag(dag_folder=str(DAGS))
    assert {"device_temps", "sluice_backfill", "sluice_maintenance"} <= set(bag.dag_ids)
    assert not {"ad_clicks_hourly", "user_activity_hourly"} & set(bag.dag_ids), "only this folder's pipelines"
    errors = "\n".join(str(e) for e in bag.import_errors.values())
    assert "broken_pipeline.py" in errors and "fields must be a mapping" in errors, bag.import_errors
    assert "device_temps.py" not in errors
    dag = bag.dags["device_temps"]
    assert dag.timetable.expression == "*/5 * * * *"
    from airflow.sdk import AssetAlias

    # Its gold Asset events go through the pipeline's alias (none for a run that closes nothing).
    assert dag.get_task("run_cycle").outlets == [AssetAlias("sluice_device_temps_gold", group="sluice")]
    assert bag.dags["sluice_backfill"].params.get_param("pipeline").schema["enum"] == ["device_temps"]

    dag = copy.deepcopy(dag)
    for task in dag.tasks:
        task.retry_delay = timedelta(seconds=1)
    run = dag.test(logical_date=datetime(2025, 6, 1, tzinfo=UTC))
    states = {ti.task_id: state(ti.state) for ti in run.get_task_instances()}
    # d2's reading without a temperature (10:12) fails completeness in the windows holding it: alerted by
    # send_alerts, and the run fails at check_quality, its data-quality outcome (the Spark task did its work).
    assert states == {
        "choose_path": "success", "run_cycle": "success", "send_alerts": "success",
        "reprocess_interval": "skipped", "check_quality": "failed",
    }, states

    home = sluice_home.home
    gold = rows(home, "gold/device_temps")
    windows = sorted({(r["window_start"], r["window_end"]) for r in gold})
    assert windows[0] == (at(-10), at(5)) and windows[-1] == (at(10), at(25)), windows
    ledger = {(r["window_start"], r["window_end"]): r["state"] for r in rows(home, "ops/window_ledger")}
    failing = {w for w in ledger if w[0] <= at(12) < w[1]}
    assert len(failing) == 3 and len(ledger) == len(windows) == 5
    assert {w for w, s in ledger.items() if s == "failed"} == failing
    assert {p["pipeline"] for p in webhook.posts()} == {"device_temps"}
    assert sorted(datetime.fromisoformat(p["window_start"]) for p in webhook.posts()) == sorted(w[0] for w in failing)

    backfill = copy.deepcopy(bag.dags["sluice_backfill"])
    for task in backfill.tasks:
        task.retry_delay = timedelta(seconds=1)
    conf = {"pipeline": "device_temps", "start": "2024-05-01T09:50:00Z", "end": "2024-05-01T10:05:00Z",
            "include_late": False}
    run = backfill.test(logical_date=datetime(2025, 6, 1, 1, tzinfo=UTC), run_conf=conf)
    states = {ti.task_id: state(ti.state) for ti in run.get_task_instances()}
    # [10:00, 10:15) fails its checks again: recorded, delivered by send_alerts; check_quality fails the run.
    assert states == {"validate_params": "success", "backfill": "success", "send_alerts": "success",
                      "check_quality": "failed"}, states
    assert [datetime.fromisoformat(p["window_start"]) for p in webhook.posts()][3:] == [at(0)]
    assert sorted(map(str, rows(home, "gold/device_temps"))) == sorted(map(str, gold))
    reprocessed = {(r["window_start"], r["window_end"]) for r in rows(home, "ops/window_ledger")
                   if r["state"] == "reprocessed"}
    # The range holds the windows starting 09:50, 09:55 and 10:00; the last one fails its checks again.
    assert reprocessed == {(at(-10), at(5)), (at(-5), at(10))}
