"""Shared fixtures: one session-scoped real Spark (local[2], UI off) for the whole suite, and one real S3
server (s3proxy on 127.0.0.1, ``s3``) for the tests that need object storage."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path as _Path

# Airflow reads its configuration when first imported, so a private AIRFLOW_HOME (SQLite, no examples, the
# repo's dags/ and plugins/) must be in place before any test module imports it. Tests never touch the
# developer's ~/airflow.
_REPO = _Path(__file__).resolve().parents[1]
os.environ["AIRFLOW_HOME"] = tempfile.mkdtemp(prefix="sluice-airflow-")
os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(_REPO / "dags")
os.environ["AIRFLOW__CORE__PLUGINS_FOLDER"] = str(_REPO / "plugins")
os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
os.environ.setdefault("TZ", "UTC")
# The suite is CPU-bound on CI's 2 cores, much of it in the JIT compilers of the Spark JVMs that tests start
# (CLI runs, crash runs, DAG tasks): each lives a minute or two, too short to repay C2's optimizations, and
# C1 alone takes about 13% off them. spark-submit passes SPARK_SUBMIT_OPTS to the driver JVM; the suite's
# own session, which lives for the whole run, is started without it (see `spark`).
os.environ.setdefault("SPARK_SUBMIT_OPTS", "-XX:TieredStopAtLevel=1")

from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from sluice.config import Settings, load_settings
from sluice.core.spark import get_spark
from support.s3 import s3  # noqa: F401 (the session's S3 server, started on first use)


@pytest.fixture(autouse=True)
def _no_airflow_task_context() -> Iterator[None]:
    """``dag.test()`` runs tasks in this process, and Airflow's task runner exports each task's context
    (``AIRFLOW_CTX_*``) into ``os.environ``, where it would stay for later tests and their subprocesses: their
    ledger rows would name a DAG run that is long over (``closed_by``). An Airflow worker runs each task in a
    process of its own."""
    yield
    for key in [k for k in os.environ if k.startswith("AIRFLOW_CTX_")]:
        del os.environ[key]


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    home = tmp_path_factory.mktemp("spark-home")
    settings = load_settings({}, home=home)
    child_options = os.environ.pop("SPARK_SUBMIT_OPTS", None)
    try:
        session = get_spark(settings, "sluice-tests", master="local[2]")
    finally:
        if child_options is not None:
            os.environ["SPARK_SUBMIT_OPTS"] = child_options
    session.conf.set("spark.sql.shuffle.partitions", "2")
    # The in-process tests' batches hold tens of rows: compiling the code Spark generates for each new plan
    # costs more CPU than evaluating them, so this session interprets (Spark's own test mode, the same
    # results; about 15% off the randomized scenarios). Processes that tests start keep code generation.
    session.conf.set("spark.sql.codegen.wholeStage", "false")
    session.conf.set("spark.sql.codegen.factoryMode", "NO_CODEGEN")
    yield session
    session.stop()


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    """Settings rooted in a fresh SLUICE_HOME under tmp_path, with no environment leaking in."""
    return load_settings({}, home=tmp_path / "home")
