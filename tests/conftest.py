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
# The Spark drivers a test starts in a process of its own (sluice, spark-submit; spark-submit adds
# SPARK_SUBMIT_OPTS to the driver's Java options) compile with C1 only and collect with one GC thread: they live
# seconds to minutes on tiny data, on 2 cores shared by two workers, and C2's compiler threads cost more CPU than
# its code saves (an incremental cycle: 32 s -> 26 s alone, 62 s -> 38 s for two at once). Neither changes what a
# job computes. Not the workers' own sessions (the spark fixture), which run for the whole suite: C2 pays there
# (two randomized streaming tests: 119 s, 134 s with C1). Not through SPARK_CONF_DIR either: Spark puts that
# folder on the class path, which then no longer matches the class-data archive's, and the JVM drops the archive
# silently. sluice itself keeps the JVM's defaults.
# Both kinds of JVM also get a larger code cache (512 MB, default 240 MB): Spark compiles a class per query plan
# (Janino), the suite plans thousands, and with the default the JVM's sweeper flushed and recompiled code all the
# time (11.8 of 110 CPU-seconds of three warm cycles went to the sweeper thread on C1).
SUBPROCESS_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -XX:ReservedCodeCacheSize=512m"
# The workers' own sessions (the spark fixture) keep C2, which pays over a whole suite, but only for code that is
# really hot: C2 compiled every plan's generated classes after 5,000 calls, and its threads took a third of the
# machine's CPU over three warm cycles (48 of 145 CPU-seconds; 15 of 101 with these thresholds, at the same or
# shorter wall time). The generated classes of one query rarely reach these counts; Spark's own code does.
SESSION_JVM_OPTIONS = ("-XX:ReservedCodeCacheSize=512m -XX:Tier4InvocationThreshold=50000 "
                       "-XX:Tier4MinInvocationThreshold=6000 -XX:Tier4CompileThreshold=150000 "
                       "-XX:Tier4BackEdgeThreshold=400000")
os.environ.setdefault("SPARK_SUBMIT_OPTS", SUBPROCESS_JVM_OPTIONS)

from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from sluice.config import Settings, load_settings
from sluice.runtime.spark import get_spark
from support import scheduling
from support.kafka import kafka  # noqa: F401 (the session's Kafka broker, started on first use)
from support.s3 import s3  # noqa: F401 (the session's S3 server, started on first use)

# A test stuck in native code, which pytest-timeout cannot interrupt, ends its worker with every stack printed.
pytest_plugins = ["support.watchdog", "support.browser"]


def pytest_configure(config: pytest.Config) -> None:
    scheduling.configure(config)


@pytest.hookimpl(tryfirst=True)  # before xdist appends each group's name to its tests' node ids
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    scheduling.order_longest_first(items)


@pytest.fixture(autouse=True)
def _no_airflow_task_context() -> Iterator[None]:
    """``dag.test()`` runs tasks in this process, and Airflow's task runner exports each task's context
    (``AIRFLOW_CTX_*``) into ``os.environ``, where it would stay for later tests and their subprocesses: their
    ledger rows would name a DAG run that is long over (``closed_by``). An Airflow worker runs each task in a
    process of its own."""
    yield
    for key in [k for k in os.environ if k.startswith("AIRFLOW_CTX_")]:
        del os.environ[key]


@pytest.fixture(autouse=True)
def _forget_the_delta_tables_of_earlier_tests() -> Iterator[None]:
    """delta-spark keeps every table it has opened in its ``DeltaLog`` cache (up to 10,000, for an hour), with
    its snapshot: about 3 MB of the driver's heap per table (measured on this suite's session). A ``sluice run``
    opens a dozen tables and exits, but the suite's one session opens thousands, one home per test, and its 2 GB
    heap fills after a few hundred (150 tables held 512 MB after a full GC). Tests late in the suite ran far
    slower than on their own (test_bad_input's glob test: 75 s against 12 s; 14 s with this). No test reads a
    table through a cache entry that an earlier test left, so each test ends by emptying it."""
    yield
    from pyspark import SparkContext

    context = SparkContext._active_spark_context
    if context is not None:
        context._jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()  # type: ignore[union-attr]


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    home = tmp_path_factory.mktemp("spark-home")
    # 3 GB, not sluice's default 2 GB: this driver lives for the whole suite and opens thousands of tables, and
    # with 2 GB its old generation stayed nearly full (about 5% of the worker's CPU went to collecting it). The
    # machine has 24 GB for 2 workers and their short-lived subprocess drivers.
    # Kafka's servers configured, so that the session has Spark's Kafka source (sluice.runtime.spark._jar_sets):
    # the Kafka tests ingest with it, each from its own settings that name the tests' broker.
    settings = load_settings({"SLUICE_DRIVER_MEMORY": "3g", "SLUICE_KAFKA_BOOTSTRAP": "127.0.0.1:9"}, home=home)
    ours = os.environ.get("SPARK_SUBMIT_OPTS") == SUBPROCESS_JVM_OPTIONS
    if ours:  # this JVM runs for the whole suite: C2, with SESSION_JVM_OPTIONS (see SUBPROCESS_JVM_OPTIONS)
        os.environ["SPARK_SUBMIT_OPTS"] = SESSION_JVM_OPTIONS
    try:
        session = get_spark(settings, "sluice-tests", master="local[2]")
    finally:
        if ours:
            os.environ["SPARK_SUBMIT_OPTS"] = SUBPROCESS_JVM_OPTIONS
    session.conf.set("spark.sql.shuffle.partitions", "2")
    yield session
    session.stop()


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    """Settings rooted in a fresh SLUICE_HOME under tmp_path, with no environment leaking in."""
    return load_settings({}, home=tmp_path / "home")
