"""Airflow glue shared by the DAG files, which only wire tasks. Nothing here runs at DAG parse time.

* :class:`SluiceSparkSubmitOperator`: ``SparkSubmitOperator`` through the ``spark_default`` connection when
  it is defined; otherwise local mode (``local[*]``), never the provider's YARN default. It runs pyspark's
  own ``spark-submit`` from this interpreter's environment and hands the Python workers this interpreter.
* Assets per gold table, and the pools/params used by the DAGs.
"""

from __future__ import annotations

import logging
import os
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import Asset

log = logging.getLogger("sluice.orchestration")

REPO_ROOT = Path(__file__).resolve().parents[2]
JOBS_DIR = REPO_ROOT / "jobs"
SPARK_CONN_ID = "spark_default"
LOCAL_MASTER = "local[*]"

# Retries cover transient failures (a killed JVM, a busy machine); every write is idempotent, so a retry
# resumes where the failed attempt stopped.
DEFAULT_ARGS: dict[str, Any] = {"owner": "sluice", "retries": 2, "retry_delay": timedelta(minutes=1)}

GOLD_ASSETS: dict[str, list[Asset]] = {
    "ad_clicks_hourly": [
        Asset(name="gold/ad_clicks_hourly", uri="sluice://gold/ad_clicks_hourly", group="sluice"),
        Asset(name="gold/unmatched_clicks_hourly", uri="sluice://gold/unmatched_clicks_hourly", group="sluice"),
    ],
    "user_activity_hourly": [
        Asset(name="gold/user_activity_hourly", uri="sluice://gold/user_activity_hourly", group="sluice"),
    ],
}


def job(name: str) -> str:
    """Absolute path of a spark-submit entry point under jobs/."""
    return str(JOBS_DIR / f"{name}.py")


def connection_defined(conn_id: str) -> bool:
    """True when Airflow can resolve the connection (env var, secrets backend or metadata DB)."""
    try:
        SparkSubmitHook.get_connection(conn_id)
    except Exception:
        return False
    return True


def spark_env() -> dict[str, str]:
    """Environment for the spark-submit process: this interpreter's bin first on PATH (pyspark's own
    spark-submit lives there), this interpreter for the driver and the Python workers, and the sluice
    settings passed through unchanged (SLUICE_HOME, SLUICE_NOW, ...)."""
    bin_dir = str(Path(sys.executable).parent)
    env = {
        "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
        "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable),
        "PYSPARK_DRIVER_PYTHON": os.environ.get("PYSPARK_DRIVER_PYTHON", sys.executable),
        "TZ": "UTC",
    }
    env.update({k: v for k, v in os.environ.items() if k.startswith(("SLUICE_", "AIRFLOW_CONN_SLUICE"))})
    return env


class SluiceSparkSubmitOperator(SparkSubmitOperator):
    """spark-submit with sluice's defaults: ``spark_default`` if defined, else ``local[*]`` (no YARN)."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("conn_id", SPARK_CONN_ID)
        kwargs.setdefault("name", kwargs.get("task_id", "sluice"))
        kwargs.setdefault("conf", {"spark.sql.session.timeZone": "UTC", "spark.ui.showConsoleProgress": "false"})
        super().__init__(**kwargs)

    def execute(self, context: Any) -> None:
        self.env_vars = {**spark_env(), **(self.env_vars or {})}
        return super().execute(context)

    def _get_hook(self) -> SparkSubmitHook:
        hook = super()._get_hook()
        if not connection_defined(self._conn_id):
            # The provider would fall back to YARN; sluice's contract is local mode.
            log.info("connection %r is not defined: running Spark in %s", self._conn_id, LOCAL_MASTER)
            hook._connection["master"] = LOCAL_MASTER
            # The hook derived these from the YARN master in __init__; derive them again for local mode,
            # or it would pass env_vars as spark.yarn.appMasterEnv.* instead of to the process.
            hook._is_yarn = False
            hook._is_yarn_cluster_mode = False
            hook._is_kubernetes = False
            hook._should_track_driver_status = hook._resolve_should_track_driver_status()
        return hook


def send_alerts_task(pipeline: Any) -> Any:
    """The DAGs' last step: deliver the alerts the DQ step recorded, exactly once per failing window, then
    fail the run (without retries) so the failure is visible in Airflow too. ``pipeline`` is a name or the
    XCom of an upstream task that returns one."""
    from airflow.sdk import task

    @task(task_id="send_alerts", retries=0)
    def send_alerts(pipeline_name: str) -> int:
        from airflow.sdk.exceptions import AirflowFailException

        from sluice.config import load_settings
        from sluice.quality import deliver_pending_alerts

        sent = deliver_pending_alerts(load_settings(), pipeline_name)
        for message in sent:
            log.warning("%s", message)
        if sent:
            raise AirflowFailException(f"{len(sent)} window(s) of {pipeline_name} failed data quality; alerts sent")
        return 0

    return send_alerts(pipeline)
