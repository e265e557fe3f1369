"""Quiet, useful logs: a small cycle's log fits on a screen, with sluice's own lines and without Great
Expectations' and Spark's noise."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from sluice.runtime import spark as sluice_spark
from support.servers import (
    WebhookServer,
    webhook_fixture,  # noqa: F401 (pytest fixture ``webhook``)
)

NOISE = [
    "Skipping registering function",  # Great Expectations, ~200 lines when it is imported
    "Multiple declarations of metric",  # Great Expectations
    "Loading 'datasources'",  # Great Expectations
    "Unable to close MANIFEST",  # RocksDB (state store) at shutdown
    "Using Spark's default log4j profile",  # Spark without sluice's log4j2.properties
    "NativeCodeLoader",
    "Disabling AQE",
    "adaptive.enabled is not supported in streaming",
    "Truncated the string representation of a plan",
    "Using incubator modules",  # the driver JVM, before log4j starts (issue 29 section 6)
    "airflow.configuration",  # Airflow's start-up, when an alert imports it
    "airflow.settings",
]


def test_spark_log_conf_points_at_the_packaged_properties(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("SPARK_CONF_DIR", raising=False)
    monkeypatch.delenv("PYSPARK_SUBMIT_ARGS", raising=False)
    monkeypatch.setenv("SLUICE_JARS_DIR", str(tmp_path / "jars"))  # no class-data archive (tests/core/test_class_data)
    conf = sluice_spark.log_conf()
    option = conf["spark.driver.extraJavaOptions"]
    jit = sluice_spark.JIT_OPTIONS["cycle"]
    assert option == f"-Dlog4j2.configurationFile={sluice_spark.LOG4J2_PROPERTIES.as_uri()} {jit}"
    assert "rootLogger.level = warn" in sluice_spark.LOG4J2_PROPERTIES.read_text()
    # A backfill's JVM compiles with C1 only (runtime.spark.JIT_OPTIONS); an unknown kind of run is refused.
    backfill = sluice_spark.log_conf("backfill")["spark.driver.extraJavaOptions"]
    assert backfill.endswith(" -XX:-DontCompileHugeMethods -XX:TieredStopAtLevel=1")
    with pytest.raises(ValueError, match="unknown kind of run 'nightly'"):
        sluice_spark.log_conf("nightly")
    # The user's own Spark logging wins.
    (tmp_path / "log4j2.properties").write_text("rootLogger.level = info\n")
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path))
    assert sluice_spark.log_conf() == {}
    monkeypatch.delenv("SPARK_CONF_DIR")
    monkeypatch.setenv("PYSPARK_SUBMIT_ARGS", "--conf spark.driver.extraJavaOptions=-Dx=y pyspark-shell")
    assert sluice_spark.log_conf() == {}


def test_great_expectations_logs_warnings_only() -> None:
    import sluice.quality.validator  # noqa: F401

    ge = logging.getLogger("great_expectations")
    assert ge.getEffectiveLevel() == logging.WARNING
    assert not logging.getLogger("great_expectations._docs_decorators").isEnabledFor(logging.INFO)


def _sluice(home: Path, *args: str, **extra_env: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in {"PYSPARK_SUBMIT_ARGS", "SPARK_CONF_DIR"}}
    env.update(SLUICE_HOME=str(home), **extra_env)
    return subprocess.run([sys.executable, "-m", "sluice.cli", *args], env=env, cwd=home,
                          capture_output=True, text=True, timeout=900)


@pytest.mark.spark
@pytest.mark.slow
def test_a_small_cycle_log_fits_on_a_screen(tmp_path: Path) -> None:
    generated = _sluice(tmp_path, "generate", "--hours", "1", "--streams", "events", "--seed", "3")
    assert generated.returncode == 0, generated.stderr
    result = _sluice(tmp_path, "run", "user_activity_hourly", "--now", "2024-05-01T02:00:00Z")
    assert result.returncode == 0, result.stderr[-5000:]
    lines = result.stderr.splitlines()
    for noise in NOISE:
        assert not [line for line in lines if noise in line], f"{noise!r} in the log:\n{result.stderr}"
    for own in ("sluice.cycle: cycle user_activity_hourly: ingesting events", "sluice.ingest: ingest events",
                "sluice.aggregate: user_activity_hourly: closed window", "sluice.quality: user_activity_hourly:"):
        assert any(own in line for line in lines), f"{own!r} missing from the log:\n{result.stderr}"
    assert len(lines) <= 40, f"{len(lines)} lines:\n{result.stderr}"


def test_delivering_an_alert_logs_without_airflows_start_up_lines(tmp_path: Path, webhook: WebhookServer) -> None:
    """Delivery imports Airflow, whose start-up logs "Reading the config from ..." and "Configured default
    timezone" at INFO: not on a sluice command's stderr."""
    from sluice.alerting.alert import Alert
    from sluice.alerting.outbox import record_alerts
    from sluice.config import load_settings

    settings = load_settings({}, home=tmp_path)
    start = datetime(2024, 5, 1, 10, tzinfo=UTC)
    record_alerts(settings, [Alert("ad_clicks_hourly", start, start + timedelta(hours=1),
                                   [{"expectation": "lateness", "observed_value": "0.05"}], None, start)])
    result = _sluice(tmp_path, "alerts", "--deliver", AIRFLOW_HOME=str(tmp_path / "airflow"),
                     AIRFLOW_CONN_SLUICE_WEBHOOK=json.dumps({"conn_type": "http", "host": webhook.url}))
    assert result.returncode == 0, result.stderr
    assert len(webhook.posts()) == 1
    for noise in NOISE:
        assert noise not in result.stderr, result.stderr
