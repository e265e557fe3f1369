"""The session sluice builds (sluice.runtime.spark), on the suite's Spark session, which get_spark built."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from sluice.config import load_settings
from sluice.core.errors import ConfigError
from sluice.runtime.spark import sluice_jars, spark_conf


@pytest.mark.spark
def test_the_code_spark_generates_for_a_cycles_worth_of_plans_is_compiled_once(spark: SparkSession) -> None:
    """A cycle runs a few hundred distinct plans. Spark's default cache of generated classes (100) turned over
    within one cycle, and the same plans were compiled again (Janino, then the JIT) on every run."""
    metrics = spark._jvm.org.apache.spark.metrics.source.CodegenMetrics  # type: ignore[union-attr]
    plans = [f"id * {i} + {i} AS x" for i in range(7000, 7060)]  # two classes each, with their literals compiled in
    for expression in plans:
        spark.range(3).selectExpr(expression).collect()
    compiled = metrics.METRIC_COMPILATION_TIME().getCount()
    for expression in plans:
        assert spark.range(3).selectExpr(expression).collect()[2]["x"] == 3 * int(expression.split()[2])
    assert metrics.METRIC_COMPILATION_TIME().getCount() == compiled


def test_a_root_on_object_storage_brings_s3a_jars_and_settings_and_a_local_home_does_not(tmp_path: Path) -> None:
    local = spark_conf(load_settings({}, home=tmp_path))
    assert "hadoop-aws" not in local["spark.jars"] and not any(k.startswith("spark.hadoop.fs.s3") for k in local)
    env = {"SLUICE_LANDING": "s3://bucket/landing", "AWS_ENDPOINT_URL": "http://127.0.0.1:9000",
           "AWS_ACCESS_KEY_ID": "key", "AWS_SECRET_ACCESS_KEY": "secret"}
    remote = spark_conf(load_settings(env, home=tmp_path))  # the landing alone on S3 is enough
    assert "hadoop-aws-3.5.0.jar" in remote["spark.jars"] and "delta-spark" in remote["spark.jars"]
    assert remote["spark.hadoop.fs.s3.impl"] == "org.apache.hadoop.fs.s3a.S3AFileSystem"
    assert remote["spark.hadoop.fs.s3a.endpoint"] == "http://127.0.0.1:9000"


def test_the_executors_heap_is_spark_s_unless_set_and_a_bad_size_names_the_setting(tmp_path: Path) -> None:
    """On a cluster the executors' heap is SLUICE_EXECUTOR_MEMORY (make platform: its workers' memory); unset, Spark's
    own default (or spark-submit's --executor-memory) stands."""
    assert "spark.executor.memory" not in spark_conf(load_settings({}, home=tmp_path))
    conf = spark_conf(load_settings({"SLUICE_EXECUTOR_MEMORY": "2G"}, home=tmp_path))
    assert conf["spark.executor.memory"] == "2g"
    for wrong in ("2 GB", "1.5g", "lots"):
        with pytest.raises(ConfigError, match=r"SLUICE_EXECUTOR_MEMORY.*e\.g\. 2g"):
            load_settings({"SLUICE_EXECUTOR_MEMORY": wrong}, home=tmp_path)


def test_a_cluster_whose_workers_hold_the_jars_is_shipped_none(tmp_path: Path) -> None:
    """SLUICE_EXECUTOR_JARS names the workers' own copy of the pinned jars: the executors load them from there
    and the driver from its cache, each by its class path, and nothing goes out through spark.jars (sluice's own
    jar, the line reader built on this machine, is not used there). Unset, the driver ships them all (spark.jars,
    the line reader's jar last) and no class path is set."""
    env = {"SLUICE_LAKE": "s3://bucket/lake", "AWS_ENDPOINT_URL": "http://127.0.0.1:9000",
           "AWS_ACCESS_KEY_ID": "key", "AWS_SECRET_ACCESS_KEY": "secret"}
    shipped = spark_conf(load_settings(env, home=tmp_path))
    assert "spark.executor.extraClassPath" not in shipped and "spark.driver.extraClassPath" not in shipped

    held = spark_conf(load_settings({**env, "SLUICE_EXECUTOR_JARS": "/opt/sluice-jars/"}, home=tmp_path))
    ours = sluice_jars()
    assert ours.endswith(".jar"), "make setup builds the line reader on this machine (javac is present)"
    assert "spark.jars" not in held
    on_workers = held["spark.executor.extraClassPath"].split(":")
    on_driver = held["spark.driver.extraClassPath"].split(":")
    # The same jars (delta and, for a lake on S3, s3a's), in the cache's layout under each side's folder.
    assert [p.rsplit("/", 1)[1] for p in on_workers] == [p.rsplit("/", 1)[1] for p in on_driver]
    assert [*on_driver, ours] == shipped["spark.jars"].split(",")
    assert all(p.startswith("/opt/sluice-jars/") and p.endswith(".jar") for p in on_workers), on_workers
    assert any("hadoop-aws" in p for p in on_workers) and any("delta-spark" in p for p in on_workers)
    assert "/opt/sluice-jars/io/delta/delta-storage/" in held["spark.executor.extraClassPath"]

    with pytest.raises(ConfigError, match=r"SLUICE_EXECUTOR_JARS.*absolute folder.*/opt/sluice-jars"):
        load_settings({"SLUICE_EXECUTOR_JARS": "jars"}, home=tmp_path)


@pytest.mark.spark
def test_a_local_session_listens_on_loopback_only(spark: SparkSession) -> None:
    """Issue 53: nothing sluice starts listens beyond loopback unless asked. The suite's session is the one
    get_spark builds for local mode; its driver JVM (and every other process this test process started: the
    S3 server, ...) listens on 127.0.0.1 only, where Spark would take the machine's first address."""
    import psutil

    assert spark.conf.get("spark.driver.bindAddress") == "127.0.0.1"
    children = psutil.Process().children(recursive=True)
    listening = [(p.name(), c.laddr.ip, c.laddr.port) for p in children for c in p.net_connections(kind="inet")
                 if c.status == psutil.CONN_LISTEN]
    assert any(name == "java" for name, _ip, _port in listening), "the session's JVM listens on something"
    assert all(ip in ("127.0.0.1", "::1", "::ffff:127.0.0.1") for _name, ip, _port in listening), listening
