"""Airflow glue shared by the DAG files, which only wire tasks. Nothing here starts Spark or reads data
at DAG parse time; the DAG factory reads only the pipeline definitions (the registry).

* :func:`pipeline_dags`: one DAG per registered pipeline (dag_id = pipeline name, its schedule, one Asset
  per gold table, retries, ``max_active_runs=1``), and one placeholder that turns broken pipeline files into
  an import error naming each file, without hiding the other pipelines' DAGs.
* :class:`SluiceSparkSubmitOperator`: ``SparkSubmitOperator`` through the ``spark_default`` connection when
  it is defined; otherwise local mode (``local[*]``), never the provider's YARN default. It runs pyspark's
  own ``spark-submit`` from this interpreter's environment and hands the Python workers this interpreter.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import os
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pendulum
from airflow.exceptions import AirflowTimetableInvalid
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import DAG, Asset, BaseHook
from airflow.sdk.exceptions import AirflowNotFoundException
from airflow.timetables.simple import NullTimetable

from sluice.core.model import PipelineDef
from sluice.core.registry import Registry

log = logging.getLogger("sluice.orchestration")

REPO_ROOT = Path(__file__).resolve().parents[3]
JOBS_DIR = REPO_ROOT / "jobs"
SPARK_CONN_ID = "spark_default"
LOCAL_MASTER = "local[*]"

# Retries cover transient failures (a killed JVM, a busy machine); every write is idempotent, so a retry
# resumes where the failed attempt stopped.
DEFAULT_ARGS: dict[str, Any] = {"owner": "sluice", "retries": 2, "retry_delay": timedelta(minutes=1)}

JOB = "sluice_job"  # the one generic spark-submit entry point under jobs/
START_DATE = pendulum.datetime(2024, 1, 1, tz="UTC")


def gold_assets(pipeline: PipelineDef) -> list[Asset]:
    """One Asset per gold table the pipeline writes."""
    return [Asset(name=o.table_name, uri=f"sluice://{o.table_name}", group="sluice") for o in pipeline.outputs]


def job(name: str = JOB) -> str:
    """Absolute path of a spark-submit entry point under jobs/."""
    return str(JOBS_DIR / f"{name}.py")


def connection_defined(conn_id: str) -> bool:
    """True when Airflow can resolve the connection (env var, secrets backend or metadata DB). Only "not
    found" means False: any other failure (a broken secrets backend) propagates, because running Spark
    locally on the Airflow worker instead of on the cluster the missing connection names is worse than a
    failed task."""
    try:
        BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        pass
    else:
        return True
    # The SDK logs a failing secrets backend at debug level and reports the connection as absent; ask the
    # configured backend directly, so that an outage raises here (None: it has no such connection).
    backend = _configured_secrets_backend()
    return backend is not None and backend.get_connection(conn_id) is not None


def _configured_secrets_backend() -> Any:
    """The ``[secrets] backend`` instance, as configured (None when only the defaults are in use)."""
    from airflow.configuration import conf

    path = conf.get("secrets", "backend", fallback="")
    if not path:
        return None
    module, _, name = path.rpartition(".")
    kwargs = conf.getjson("secrets", "backend_kwargs", fallback={})
    return getattr(importlib.import_module(module), name)(**(kwargs if isinstance(kwargs, dict) else {}))


@contextlib.contextmanager
def local_spark_connection(conn_id: str) -> Iterator[None]:
    """Within the block, ``conn_id`` resolves to local mode, defined the supported way (an ``AIRFLOW_CONN_``
    variable of this task process), so that the provider's hook resolves it with its own logic. Restored
    afterwards: ``dag.test()`` runs every task in one process."""
    name = f"AIRFLOW_CONN_{conn_id.upper()}"
    before = os.environ.get(name)
    os.environ[name] = json.dumps({"conn_type": "spark", "host": LOCAL_MASTER})
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


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
        conn_id = kwargs["conn_id"]
        super().__init__(**kwargs)
        self.spark_conn_id: str = conn_id

    def execute(self, context: Any) -> None:
        from sluice.core.spark import log_conf  # imports PySpark: at run time, never at DAG parse time

        self.env_vars = {**spark_env(), **(self.env_vars or {})}
        # The driver logs as quietly as in `sluice run` (sluice's log4j2 properties), unless the task says.
        self.conf = {**log_conf(), **(self.conf or {})}
        if connection_defined(self.spark_conn_id):
            return super().execute(context)
        # The provider would fall back to YARN; sluice's contract is local mode.
        log.info("connection %r is not defined: running Spark in %s", self.spark_conn_id, LOCAL_MASTER)
        with local_spark_connection(self.spark_conn_id):
            return super().execute(context)


def send_alerts_task(pipeline: Any) -> Any:
    """The DAGs' last step: deliver the alerts the DQ step recorded, exactly once per failing window, then
    fail the run (without retries) so the failure is visible in Airflow too. ``pipeline`` is a name or the
    XCom of an upstream task that returns one."""
    from airflow.sdk import task

    @task(task_id="send_alerts", retries=0)
    def send_alerts(pipeline_name: str) -> int:
        from airflow.sdk.exceptions import AirflowFailException

        from sluice.config import load_settings
        from sluice.quality.checker import deliver_pending_alerts

        sent = deliver_pending_alerts(load_settings(), pipeline_name)
        for message in sent:
            log.warning("%s", message)
        if sent:
            raise AirflowFailException(f"{len(sent)} window(s) of {pipeline_name} failed data quality; alerts sent")
        return 0

    return send_alerts(pipeline)


def _doc_md(pipeline: PipelineDef) -> str:
    outputs = ", ".join(f"`{o.table_name}`" for o in pipeline.outputs)
    streams = ", ".join(f"`landing/{s}`" for s in pipeline.streams)
    return (
        f"### {pipeline.name}\n\n{pipeline.description.strip()}\n\n"
        f"Declared in `{pipeline.source}`. Reads {streams}; writes {outputs}.\n\n"
        "1. **run_cycle** (one Spark application): ingest the pipeline's streams into bronze, quarantine and "
        "DLQ, then the streaming queries (and the batch close) write the windows the watermark closed.\n"
        "2. **check_quality**: Great Expectations on each newly closed window -> `ops/dq_results`, Data Docs, "
        "ledger.\n"
        "3. **send_alerts**: webhook/email for failing windows (connections `sluice_webhook`, `sluice_smtp`).\n\n"
        "Spark runs on the `spark_default` connection if defined, else in local mode."
    )


def pipeline_dag(pipeline: PipelineDef) -> DAG:
    """The scheduled DAG of one pipeline: run_cycle >> check_quality >> send_alerts."""
    with DAG(
        dag_id=pipeline.name,
        schedule=pipeline.schedule,
        start_date=START_DATE,
        catchup=False,
        max_active_runs=1,
        default_args=DEFAULT_ARGS,
        tags=["sluice", "pipeline", *pipeline.tags],
        doc_md=_doc_md(pipeline),
    ) as dag:
        run_cycle = SluiceSparkSubmitOperator(
            task_id="run_cycle",
            application=job(),
            application_args=["run", pipeline.name, "--skip-quality"],
            outlets=gold_assets(pipeline),
        )
        check_quality = SluiceSparkSubmitOperator(
            task_id="check_quality",
            application=job(),
            application_args=["check", pipeline.name, "--no-deliver"],
        )
        send_alerts = send_alerts_task(pipeline.name)
        run_cycle >> check_quality >> send_alerts
    return dag


class _BrokenPipelineFiles(NullTimetable):
    """Fails DAG validation with the load errors, so that the DagBag shows them as an import error while
    every other DAG of the factory file is still bagged."""

    def __init__(self, message: str) -> None:
        super().__init__()
        self.message = message

    def validate(self) -> None:
        raise AirflowTimetableInvalid(self.message)


BROKEN_DAG_ID = "sluice_broken_pipeline_files"


def pipeline_dags(registry: Registry) -> dict[str, DAG]:
    """Every registered pipeline's DAG, plus a placeholder carrying the load errors of broken files."""
    dags = {name: pipeline_dag(p) for name, p in sorted(registry.pipelines.items())}
    if registry.errors:
        message = "sluice pipeline file(s) failed to load; their DAGs are missing, the others are fine:\n" + \
            "\n".join(f"  {e}" for e in registry.errors)
        log.error("%s", message)
        dags[BROKEN_DAG_ID] = DAG(dag_id=BROKEN_DAG_ID, schedule=_BrokenPipelineFiles(message),
                                  start_date=START_DATE, catchup=False, doc_md=message)
    return dags
