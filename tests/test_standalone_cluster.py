"""A pipeline DAG on a real Spark standalone cluster (SPEC section 7: the ``spark_default`` connection when it
is defined): a master and a one-core worker started with pyspark's own ``spark-class`` on 127.0.0.1, the
connection given as ``AIRFLOW_CONN_SPARK_DEFAULT``, and the run checked both in the lake and in the master's
record of the applications it ran. The cluster processes are always stopped (terminate, then kill)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyspark
import pytest
from deltalake import DeltaTable

from sluice.platform.processes import free_port
from sluice_tools.generate import GenerateOptions, generate

pytestmark = [pytest.mark.spark, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent
SPARK_CLASS = Path(pyspark.__file__).parent / "bin" / "spark-class"
START = datetime(2024, 5, 1, tzinfo=UTC)
PIPELINE = "user_activity_hourly"


def _get_json(url: str) -> Any:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=10) as response:
        return json.loads(response.read())


def _stop(proc: subprocess.Popen[Any]) -> None:
    """Terminate the process group this test started for ``proc`` (the JVM and any executor it launched),
    then kill what is left. Bounded waits."""
    if proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 15)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


@dataclass
class Cluster:
    master_url: str
    master_port: int
    ui: str
    logs: Path

    def state(self) -> Any:
        return _get_json(f"{self.ui}/json/")

    def log_tail(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in sorted(self.logs.glob("*.log"))
        )


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    assert SPARK_CLASS.is_file(), SPARK_CLASS
    root = tmp_path_factory.mktemp("spark-standalone")
    logs = root / "logs"
    logs.mkdir()
    port, ui_port, worker_ui_port = free_port(), free_port(), free_port()
    env = {
        **os.environ,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_MASTER_HOST": "127.0.0.1",
        "PYSPARK_PYTHON": sys.executable,
        "SPARK_WORKER_DIR": str(root / "work"),
        "SPARK_LOCAL_DIRS": str(root / "local"),
        "SPARK_LOG_DIR": str(logs),
        "TZ": "UTC",
    }
    procs: list[subprocess.Popen[Any]] = []
    cluster = Cluster(f"spark://127.0.0.1:{port}", port, f"http://127.0.0.1:{ui_port}", logs)
    try:
        with open(logs / "master.log", "w") as out:
            procs.append(subprocess.Popen(
                [str(SPARK_CLASS), "org.apache.spark.deploy.master.Master",
                 "--host", "127.0.0.1", "--port", str(port), "--webui-port", str(ui_port)],
                env=env, cwd=root, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            ))
        with open(logs / "worker.log", "w") as out:
            procs.append(subprocess.Popen(
                [str(SPARK_CLASS), "org.apache.spark.deploy.worker.Worker", cluster.master_url,
                 "--host", "127.0.0.1", "--cores", "1", "--memory", "1g", "--webui-port", str(worker_ui_port),
                 "--work-dir", str(root / "work")],
                env=env, cwd=root, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            ))
        deadline = time.monotonic() + 300
        while True:
            for proc in procs:
                assert proc.poll() is None, f"a cluster process exited early:\n{cluster.log_tail()}"
            try:
                if any(w.get("state") == "ALIVE" for w in cluster.state().get("workers", [])):
                    break
            except OSError:
                pass  # the master UI is not up yet
            assert time.monotonic() < deadline, f"no worker registered within 300s:\n{cluster.log_tail()}"
            time.sleep(1)
        yield cluster
    finally:
        for proc in reversed(procs):  # the worker first, so it stops its executors
            _stop(proc)


@pytest.fixture(scope="module")
def migrated_airflow_db() -> Path:
    """``airflow db migrate`` for the suite's private AIRFLOW_HOME (idempotent if another module did it)."""
    home = Path(os.environ["AIRFLOW_HOME"])
    assert "sluice-airflow-" in home.name, home
    done = subprocess.run([str(VENV_BIN / "airflow"), "db", "migrate"], env=dict(os.environ), cwd=REPO,
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return home


@pytest.mark.timeout(2400)
def test_pipeline_dag_runs_on_a_standalone_cluster(
    cluster: Cluster, migrated_airflow_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow.dag_processing.dagbag import DagBag

    for name in list(os.environ):
        if name.startswith(("SLUICE_", "AIRFLOW_CONN_")):
            monkeypatch.delenv(name)
    home = tmp_path / "home"
    monkeypatch.setenv("SLUICE_HOME", str(home))
    options = GenerateOptions(hours=2, events_per_hour=150, streams=("events",))
    generate(home / "landing", options)
    monkeypatch.setenv("SLUICE_NOW", (START + timedelta(hours=4)).isoformat())
    monkeypatch.setenv("SPARK_LOCAL_IP", "127.0.0.1")
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps(
        {"conn_type": "spark", "host": "spark://127.0.0.1", "port": cluster.master_port}
    ))
    apps_before = {a["id"] for a in cluster.state().get("completedapps", [])}

    bag = DagBag(dag_folder=str(REPO / "dags"))
    dag = bag.dags[PIPELINE]
    run = dag.test(logical_date=datetime(2026, 6, 1, tzinfo=UTC))
    states = {ti.task_id: str(getattr(ti.state, "value", ti.state)) for ti in run.get_task_instances()}
    assert states == {
        "choose_path": "success", "run_cycle": "success", "check_quality": "success",
        "reprocess_interval": "skipped", "send_alerts": "success",
    }, (
        f"{states}\n{cluster.log_tail()}"
    )

    gold = DeltaTable(str(home / "lake" / "gold" / "user_activity_hourly")).to_pyarrow_table().to_pylist()
    windows = {(r["window_start"], r["window_end"]) for r in gold}
    assert windows == {(START, START + timedelta(hours=1)), (START + timedelta(hours=1), START + timedelta(hours=2))}
    assert all(r["avg_events_per_10min"] >= 1 for r in gold)
    ledger = DeltaTable(str(home / "lake" / "ops" / "window_ledger")).to_pyarrow_table().to_pylist()
    assert {r["state"] for r in ledger if r["pipeline"] == PIPELINE} == {"validated"}

    # The work ran on the cluster, in one Spark application per DAG run (issue 13): the cycle, which also
    # validated the windows it closed; check_quality found none left and started no Spark.
    state = cluster.state()
    new_apps = [a for a in state.get("completedapps", []) if a["id"] not in apps_before]
    assert len(new_apps) == 1, json.dumps(state)[:3000]
    assert all(a.get("state") == "FINISHED" for a in new_apps), new_apps
    assert all(w.get("state") == "ALIVE" for w in state["workers"])
