"""Fixtures for the Airflow DAG tests: a migrated metadata DB in the suite's private AIRFLOW_HOME (set by
tests/conftest.py at import time), the repo's DagBag, and a sluice home with generated data that the DAG
tasks (and the spark-submit processes they start) find through SLUICE_HOME / SLUICE_NOW."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from sluice.config import Settings, load_settings
from sluice_tools.generate import GenerateOptions, Manifest, generate

REPO = Path(__file__).resolve().parents[2]
DAGS = REPO / "dags"
VENV_BIN = Path(sys.executable).parent
RETRY_DELAY = timedelta(seconds=1)

# Variables that would change what a DAG run does if they leaked in from the shell running the tests.
_LEAKY_PREFIXES = ("SLUICE_", "AIRFLOW_CONN_", "AWS_")
_PROXIES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")


@pytest.fixture(scope="session")
def airflow_db() -> Path:
    """``airflow db migrate`` once for the suite's private AIRFLOW_HOME, exactly as a user would run it."""
    home = Path(os.environ["AIRFLOW_HOME"])
    assert "sluice-airflow-" in home.name, f"refusing to migrate a non-test AIRFLOW_HOME {home}"
    done = subprocess.run(
        [str(VENV_BIN / "airflow"), "db", "migrate"],
        env={**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}"},
        cwd=REPO, capture_output=True, text=True, timeout=600, check=False,
    )
    assert done.returncode == 0, f"airflow db migrate failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return home


@pytest.fixture(scope="session")
def dagbag() -> Any:
    """The repo's DAGs, parsed the way the DAG processor parses them."""
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(DAGS))


@dataclass
class SluiceHome:
    """A SLUICE_HOME under tmp_path that the current process (and its children) use."""

    home: Path
    monkeypatch: pytest.MonkeyPatch

    @property
    def settings(self) -> Settings:
        return load_settings()

    def set_now(self, now: datetime) -> None:
        self.monkeypatch.setenv("SLUICE_NOW", now.isoformat().replace("+00:00", "Z"))

    def setenv(self, name: str, value: str) -> None:
        self.monkeypatch.setenv(name, value)

    def generate(self, options: GenerateOptions, *, now: datetime | None = None) -> Manifest:
        """Generate landing files; ``now`` defaults to two hours after the data (every window closable:
        the idle heartbeat lands at now - 30 min, beyond the last window end + the 30 min join bound)."""
        manifest = generate(self.settings.landing.local(), options, specs=self.settings.streams)
        self.set_now(now or options.start + timedelta(hours=options.hours + 2))
        return manifest


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No sluice settings, connections or proxies leaking in from the shell running the tests."""
    for name in list(os.environ):
        if name.startswith(_LEAKY_PREFIXES) or name in _PROXIES:
            monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TZ", "UTC")


@pytest.fixture
def sluice_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clean_env: None) -> Iterator[SluiceHome]:
    home = tmp_path / "sluice-home"
    monkeypatch.setenv("SLUICE_HOME", str(home))
    yield SluiceHome(home, monkeypatch)


@pytest.fixture(scope="session")
def run_dag(airflow_db: Path, dagbag: Any) -> Callable[..., Any]:
    """``run_dag(dag_id, logical_date, run_conf=None, mark_success_pattern=None)`` -> the finished DagRun of
    ``dag.test()``. Every call needs its own logical date (Airflow keys runs by it); the tests pass distinct
    ones. ``mark_success_pattern``: task ids marked successful instead of run (``dag.test``'s own option)."""

    def run(
        dag_id: str, logical_date: datetime, run_conf: dict[str, Any] | None = None,
        mark_success_pattern: str | None = None,
    ) -> Any:
        assert dag_id in dagbag.dags, f"{dag_id} not in the DagBag: {dagbag.import_errors}"
        # The DAG as shipped, except that a retry comes after 1 s instead of the DAG's retry_delay (dag.test
        # sleeps it out): a failing task is still retried as often as the DAG says, the test just fails sooner.
        dag = copy.deepcopy(dagbag.dags[dag_id])
        for task in dag.tasks:
            task.retry_delay = RETRY_DELAY
        return dag.test(logical_date=logical_date, run_conf=run_conf, mark_success_pattern=mark_success_pattern)

    return run
