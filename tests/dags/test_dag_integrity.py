"""DAG integrity (SPEC sections 7-8), fast: the repo's dags/ parse cleanly into one DAG per registered pipeline
plus the fixed backfill and maintenance DAGs, each with the settings a production scheduler relies on, and
parsing does no work (no Spark, no SLUICE_HOME)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.timeout(300)

REPO = Path(__file__).resolve().parents[2]
DAGS = REPO / "dags"

from sluice.config import load_settings, without_settings  # noqa: E402

REGISTRY = load_settings({}).registry
PIPELINES = set(REGISTRY.pipelines)
EXPECTED = {*PIPELINES, "sluice_backfill", "sluice_maintenance"}
SCHEDULED = {*(n for n, p in REGISTRY.pipelines.items() if p.schedule), "sluice_maintenance"}
# Tasks where a retry cannot help: the alert task fails the run on purpose (a retry would re-send), and
# bad backfill params stay bad.
NO_RETRY_TASKS = {"send_alerts", "validate_params"}


def test_no_import_errors_and_one_dag_per_registered_pipeline(dagbag: Any) -> None:
    assert REGISTRY.errors == []
    assert PIPELINES, "the shipped pipelines folder registers no pipeline"
    assert dagbag.import_errors == {}
    assert set(dagbag.dag_ids) == EXPECTED


@pytest.mark.parametrize("pipeline", sorted(PIPELINES))
def test_pipeline_dag_matches_its_definition(dagbag: Any, pipeline: str) -> None:
    from airflow.sdk import CronDataIntervalTimetable, TriggerRule

    definition = REGISTRY.pipelines[pipeline]
    dag = dagbag.dags[pipeline]
    # The schedule as a data-interval timetable: every run covers [previous tick, its tick), so a backfill's
    # runs hold windows (a cron string alone gives Airflow 3's trigger timetable, whose intervals are empty).
    assert isinstance(dag.timetable, CronDataIntervalTimetable)
    assert dag.timetable.expression == definition.schedule
    assert str(dag.timetable.timezone) in ("UTC", "Timezone('UTC')")
    # Two paths, chosen per run: the cycle, or the backfill path for runs of type backfill.
    downstream = {t.task_id: set(t.downstream_task_ids) for t in dag.tasks}
    assert downstream == {
        "choose_path": {"run_cycle", "reprocess_interval"},
        "run_cycle": {"send_alerts"},
        "reprocess_interval": {"send_alerts"},
        "send_alerts": {"check_quality"},
        "check_quality": set(),
    }
    assert dag.get_task("send_alerts").trigger_rule == TriggerRule.NONE_FAILED_MIN_ONE_SUCCESS
    from airflow.sdk import AssetAlias

    # Both gold-writing paths emit through the pipeline's alias: an event only for a run that changed a window.
    alias = [AssetAlias(f"sluice_{pipeline}_gold", group="sluice")]
    assert dag.get_task("run_cycle").outlets == alias and dag.get_task("reprocess_interval").outlets == alias
    # The gold Assets are known to Airflow as check_quality's inlets (it reads them), so that the alias's events
    # find them: without, each event logs "AssetModel ... not found; cannot create asset event" (issue 53).
    from sluice.airflow.operators import gold_assets

    assert dag.get_task("check_quality").inlets == gold_assets(definition)
    assert dag.get_task("run_cycle").clock_from_data_interval
    assert dag.get_task("check_quality").clock_from_data_interval
    assert not dag.get_task("reprocess_interval").clock_from_data_interval  # a backfill runs now
    assert dag.params.get_param("include_late").value is False
    args = dag.get_task("reprocess_interval").application_args
    assert args[:2] == ["backfill", pipeline] and "--no-deliver" in args and "--no-fail-on-checks" in args


def test_backfill_dag_emits_gold_asset_events_through_an_alias(dagbag: Any) -> None:
    from airflow.sdk import AssetAlias

    assert dagbag.dags["sluice_backfill"].get_task("backfill").outlets == [AssetAlias("sluice_backfill_gold",
                                                                                        group="sluice")]


@pytest.mark.parametrize("dag_id", sorted(EXPECTED))
def test_dag_settings(dagbag: Any, dag_id: str) -> None:
    dag = dagbag.dags[dag_id]
    assert dag is not None
    assert dag.tags, f"{dag_id} has no tags"
    assert "sluice" in dag.tags
    assert (dag.default_args or {}).get("retries", 0) >= 1, f"{dag_id}: default_args must retry (retries >= 1)"
    for task in dag.tasks:
        if task.task_id not in NO_RETRY_TASKS:
            assert task.retries >= 1, f"{dag_id}.{task.task_id} never retries"
    assert dag.catchup is False
    assert dag.max_active_runs == 1
    assert dag.doc_md and dag_id in dag.doc_md, f"{dag_id}: doc_md must describe the DAG"
    if dag_id in SCHEDULED:
        from airflow.sdk import CronDataIntervalTimetable

        # A cron string, or (pipeline DAGs) a cron data-interval timetable.
        assert isinstance(dag.schedule, str | CronDataIntervalTimetable) and dag.schedule, \
            f"{dag_id} needs an explicit schedule"
    else:
        assert dag.schedule is None, "the backfill DAG is manual only"


def test_backfill_params_offer_every_registered_pipeline(dagbag: Any) -> None:
    dag = dagbag.dags["sluice_backfill"]
    assert set(dag.params.keys()) >= {"pipeline", "start", "end", "include_late"}
    assert set(dag.params.get_param("pipeline").schema["enum"]) == PIPELINES
    # Issue 53: the ledger page triggers it; a paused DAG would hold its runs in `queued` without a word.
    assert dag.is_paused_upon_creation is False
    downstream = {t.task_id: set(t.downstream_task_ids) for t in dag.tasks}
    assert downstream == {"validate_params": {"backfill", "send_alerts"}, "backfill": {"send_alerts"},
                          "send_alerts": {"check_quality"}, "check_quality": set()}


def test_pipeline_dags_come_from_one_factory_file(dagbag: Any) -> None:
    files = Counter(Path(dagbag.dags[p].fileloc).resolve() for p in PIPELINES)
    assert list(files) == [(DAGS / "sluice_pipelines.py").resolve()]
    assert {p.stem for p in DAGS.glob("*.py") if not p.name.startswith("_")} == {
        "sluice_pipelines", "sluice_backfill", "sluice_maintenance"}
    assert [p.name for p in (REPO / "jobs").glob("*.py")] == ["sluice_job.py"]


def test_spark_tasks_use_existing_job_files(dagbag: Any) -> None:
    from sluice.airflow.operators import SluiceSparkSubmitOperator

    spark_tasks = [t for dag in dagbag.dags.values() for t in dag.tasks if isinstance(t, SluiceSparkSubmitOperator)]
    assert len(spark_tasks) == 3 * len(PIPELINES) + 1  # run_cycle, check_quality, reprocess_interval; backfill
    for task in spark_tasks:
        assert Path(task.application).is_file(), f"{task.dag_id}.{task.task_id}: {task.application} is missing"
    # The backfill jobs (the backfill DAG's and each pipeline's reprocess path) start their JVM with a
    # backfill's JIT settings (sluice.runtime.spark.JIT_OPTIONS), every other job with a cycle's.
    backfills = {(t.dag_id, t.task_id) for t in spark_tasks if t.work == "backfill"}
    assert backfills == {("sluice_backfill", "backfill"), *((p, "reprocess_interval") for p in PIPELINES)}
    assert {t.work for t in spark_tasks if (t.dag_id, t.task_id) not in backfills} == {"cycle"}


_PARSE_SCRIPT = """
import json, os, sys
from pathlib import Path
from airflow.dag_processing.dagbag import DagBag
import pyspark
from pyspark.sql import SparkSession
bag = DagBag(dag_folder=sys.argv[1])
print(json.dumps({
    "dag_ids": sorted(bag.dag_ids),
    "errors": {str(k): str(v) for k, v in bag.import_errors.items()},
    "active_session": SparkSession.getActiveSession() is not None,
    "active_context": pyspark.SparkContext._active_spark_context is not None,
    "jvm_gateway": pyspark.SparkContext._gateway is not None,
}))
"""


def test_parsing_does_no_work_in_a_fresh_process(tmp_path: Path) -> None:
    """In a fresh interpreter (so nothing the suite started can hide it): parsing every DAG file starts no
    Spark (no session, no context, no JVM gateway) and creates neither $SLUICE_HOME nor ./.sluice."""
    home = tmp_path / "not-created-home"
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    env = without_settings(os.environ)
    env.update(SLUICE_HOME=str(home), SLUICE_NOW="2024-05-01T04:00:00Z")
    done = subprocess.run(
        [sys.executable, "-c", _PARSE_SCRIPT, str(DAGS)], cwd=cwd, env=env,
        capture_output=True, text=True, timeout=240, check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["errors"] == {}
    assert set(result["dag_ids"]) == EXPECTED
    assert result == {**result, "active_session": False, "active_context": False, "jvm_gateway": False}
    assert not home.exists(), "parsing the DAGs created SLUICE_HOME"
    assert list(cwd.iterdir()) == [], "parsing the DAGs wrote into the working directory"

    # Without SLUICE_HOME the default is ./.sluice: parsing must not create that either.
    del env["SLUICE_HOME"]
    done = subprocess.run(
        [sys.executable, "-c", _PARSE_SCRIPT, str(DAGS)], cwd=cwd, env=env,
        capture_output=True, text=True, timeout=240, check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert not (cwd / ".sluice").exists()


def test_parsing_in_process_starts_no_spark(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import pyspark
    from airflow.dag_processing.dagbag import DagBag

    home = tmp_path / "home"
    monkeypatch.setenv("SLUICE_HOME", str(home))
    before = pyspark.SparkContext._active_spark_context
    bag = DagBag(dag_folder=str(DAGS))
    assert bag.import_errors == {}
    assert pyspark.SparkContext._active_spark_context is before
    if before is None:
        from pyspark.sql import SparkSession

        assert SparkSession.getActiveSession() is None
    assert not home.exists()


def test_every_task_of_every_dag_alerts_when_it_fails(dagbag: Any) -> None:
    """Issue 28: not only the Spark tasks; choose_path, validate_params, send_alerts and maintenance too."""
    from sluice.airflow.factory import task_failure_alert

    for dag_id in sorted(EXPECTED):
        for task in dagbag.dags[dag_id].tasks:
            callbacks = task.on_failure_callback
            callbacks = callbacks if isinstance(callbacks, list) else [callbacks]
            assert task_failure_alert in callbacks, (dag_id, task.task_id, callbacks)
