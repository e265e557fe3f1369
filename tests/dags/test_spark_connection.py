"""Which Spark the DAG tasks submit to, driven for real through ``dag.test()`` and pyspark's own
spark-submit: ``spark_default`` when it is defined, otherwise local mode (never the provider's YARN
default), decided with the provider's public connection handling only. A broken secrets backend fails the
task instead of quietly running Spark on the Airflow worker."""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
import textwrap
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.spark]

PIPELINE = "user_activity_hourly"


def _submitted_master(dagbag: Any, logical_date: datetime, capfd: pytest.CaptureFixture[str]) -> str:
    """Run the pipeline DAG's ``run_cycle`` task for real (its other tasks marked successful) and return
    the ``--master`` of the spark-submit command the provider logged."""
    dag = copy.deepcopy(dagbag.dags[PIPELINE])
    for task in dag.tasks:
        task.retries = 0
    run = dag.test(logical_date=logical_date, mark_success_pattern="^(check_quality|send_alerts)$")
    out = capfd.readouterr()
    states = {ti.task_id: str(getattr(ti.state, "value", ti.state)) for ti in run.get_task_instances()}
    assert states["run_cycle"] == "success", states
    [master] = re.findall(r"spark-submit --master (\S+)", out.out + out.err)[:1] or ["<no spark-submit command logged>"]
    return master


def test_without_spark_default_tasks_run_spark_locally(
    sluice_home: Any, airflow_db: Path, dagbag: Any, capfd: pytest.CaptureFixture[str]
) -> None:
    assert _submitted_master(dagbag, datetime(2030, 1, 1, tzinfo=UTC), capfd) == "local[*]"
    assert "AIRFLOW_CONN_SPARK_DEFAULT" not in os.environ  # defined for the task only


def test_a_defined_spark_default_is_used(
    sluice_home: Any, airflow_db: Path, dagbag: Any, capfd: pytest.CaptureFixture[str]
) -> None:
    sluice_home.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "local[1]"}))
    assert _submitted_master(dagbag, datetime(2030, 1, 2, tzinfo=UTC), capfd) == "local[1]"


def test_a_broken_secrets_backend_fails_loudly_instead_of_running_locally(tmp_path: Path) -> None:
    script = textwrap.dedent('''
        from sluice.airflow.operators import connection_defined
        print("defined" if connection_defined("spark_default") else "not defined")
    ''')
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW_CONN_")}
    tests = Path(__file__).resolve().parents[1]
    env |= {"AIRFLOW__SECRETS__BACKEND": "support.broken_secrets.Backend",
            "PYTHONPATH": os.pathsep.join([str(tests), env.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0, done.stdout
    assert "secrets backend unreachable while looking up 'spark_default'" in done.stderr
    assert "not defined" not in done.stdout
