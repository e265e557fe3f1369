"""Object-storage credentials under Airflow (SPEC 1): the ``aws_default`` connection, in the Amazon provider's
format, reaches sluice's tasks as the standard AWS variables (sluice.airflow.credentials). Resolved by Airflow's
own connection lookup (an ``AIRFLOW_CONN_`` variable here), and used for real: ``sluice_maintenance`` under
``dag.test()`` compacts an ops table in a bucket of the tests' S3 server, with no AWS variable set."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from pyspark.sql.types import LongType, StringType, StructField, StructType

from sluice.airflow.credentials import aws_env, connection_env, task_settings
from sluice.airflow.operators import spark_env
from sluice.config import load_settings
from sluice.storage import snapshots
from sluice.storage.engine import OpsDeltaEngine
from support.s3 import ACCESS_KEY, REGION, SECRET_KEY, S3Server

SCHEMA = StructType([StructField("name", StringType(), True), StructField("n", LongType(), True)])


def _connection(s3: S3Server) -> str:
    return json.dumps({"conn_type": "aws", "login": ACCESS_KEY, "password": SECRET_KEY,
                       "extra": {"region_name": REGION, "endpoint_url": s3.endpoint}})


def test_the_providers_connection_format_becomes_the_standard_variables() -> None:
    assert connection_env("AKIA", "secret", {"region_name": "eu-west-1", "aws_session_token": "tok",
                                             "service_config": {"s3": {"endpoint_url": "http://127.0.0.1:9"}}}) == {
        "AWS_ACCESS_KEY_ID": "AKIA", "AWS_SECRET_ACCESS_KEY": "secret", "AWS_SESSION_TOKEN": "tok",
        "AWS_REGION": "eu-west-1", "AWS_ENDPOINT_URL": "http://127.0.0.1:9"}
    # Keys in extra (an older form of the connection); nothing set, nothing given.
    assert connection_env(None, None, {"aws_access_key_id": "a", "aws_secret_access_key": "s"}) == {
        "AWS_ACCESS_KEY_ID": "a", "AWS_SECRET_ACCESS_KEY": "s"}
    assert connection_env(None, None, None) == {}


def test_a_defined_connection_reaches_the_tasks_and_the_spark_jobs(
    s3: S3Server, clean_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert aws_env() == {}  # not defined: the worker's own variables, if any, are all there is
    monkeypatch.setenv("AIRFLOW_CONN_AWS_DEFAULT", _connection(s3))
    monkeypatch.setenv("AWS_REGION", "somewhere-else")  # the connection's values win, as in the provider's hooks
    expected = {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_REGION": REGION,
                "AWS_ENDPOINT_URL": s3.endpoint}
    assert aws_env() == expected
    assert expected.items() <= spark_env().items()
    credentials = task_settings().lake.credentials
    assert (credentials.endpoint_url, credentials.region) == (s3.endpoint, REGION)


@pytest.mark.spark
def test_maintenance_compacts_a_lake_in_a_bucket_with_only_the_connection(
    s3: S3Server, sluice_home: Any, run_dag: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    bucket = s3.bucket("aws-conn")
    lake = f"s3://{bucket}/lake"
    # Three small commits to an ops table in the bucket, written with explicit credentials.
    writer = load_settings({**s3.env(), "SLUICE_LAKE": lake}, home=sluice_home.home)
    path = writer.lake.table("ops/alerts_like")
    engine = OpsDeltaEngine()
    engine.ensure_table(path, SCHEMA)
    for version in range(3):
        engine.append_rows([(f"r{version}", version)], SCHEMA, path, app_id="w", version=version)
    assert len(snapshots.live_files(path)) == 3

    # The tasks get nothing but the connection: no AWS variable in their environment.
    sluice_home.setenv("SLUICE_LAKE", lake)
    monkeypatch.setenv("AIRFLOW_CONN_AWS_DEFAULT", _connection(s3))
    run = run_dag("sluice_maintenance", datetime(2024, 6, 3, tzinfo=UTC))
    states = {ti.task_id: str(getattr(ti.state, "value", ti.state)) for ti in run.get_task_instances()}
    assert states == {"compact": "success", "vacuum": "success", "clean_checkpoints": "success"}, states
    assert len(snapshots.live_files(path)) == 1  # compacted in the bucket
    assert sorted(r["name"] for r in snapshots.read_small_table(path).to_pylist()) == ["r0", "r1", "r2"]
    # It held the pipelines' locks as leases in the same bucket.
    locks = s3.client().list_objects_v2(Bucket=bucket, Prefix="lake/_locks/")
    assert locks.get("KeyCount", 0) > 0
