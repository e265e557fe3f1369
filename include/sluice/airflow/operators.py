"""The operators of sluice's DAG tasks, and what they hand the spark-submit process.

* :class:`SluiceSparkSubmitOperator`: ``SparkSubmitOperator`` through the ``spark_default`` connection when
  it is defined; otherwise local mode (``local[*]``), never the provider's YARN default. It runs pyspark's
  own ``spark-submit`` from this interpreter's environment and hands the Python workers this interpreter.
* :class:`SluiceGoldOperator`: ``sluice run`` or ``sluice backfill`` through spark-submit, then one Asset
  event per gold table of the pipeline, carrying the windows it closed or rewrote; none when it changed none.
* :class:`SluiceCheckOperator`: a run's last task, its data-quality outcome.

Nothing here starts Spark at DAG parse time: PySpark is imported when a task runs.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import os
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import Asset, AssetAlias, BaseHook
from airflow.sdk.exceptions import AirflowNotFoundException

from sluice.airflow.credentials import aws_env, kafka_env, task_settings
from sluice.airflow.outcomes import deliver, judge, task_failure_alert
from sluice.core.model import PipelineDef

log = logging.getLogger("sluice.orchestration")

REPO_ROOT = Path(__file__).resolve().parents[3]
JOBS_DIR = REPO_ROOT / "jobs"
SPARK_CONN_ID = "spark_default"
LOCAL_MASTER = "local[*]"

JOB = "sluice_job"  # the one generic spark-submit entry point under jobs/
BACKFILL_RUN_TYPE = "backfill"  # DagRunType.BACKFILL_JOB: runs created by `airflow backfill create` / the UI


def gold_assets(pipeline: PipelineDef) -> list[Asset]:
    """One Asset per gold table the pipeline writes."""
    return [Asset(name=o.table_name, uri=f"sluice://{o.table_name}", group="sluice") for o in pipeline.outputs]


def rfc3339(value: datetime) -> str:
    """RFC 3339 in UTC with a ``Z`` (what ``SLUICE_NOW`` and ``sluice backfill --start/--end`` take)."""
    return value.astimezone(UTC).replace(tzinfo=None).isoformat() + "Z"


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
    # A lake or landing zone on object storage: the aws_default connection's credentials, when it is defined
    # (the worker's own AWS variables reach the job anyway: spark-submit inherits the task's environment).
    env.update(aws_env())
    # A stream on a Kafka topic: the kafka_default connection's servers and security, when it is defined.
    env.update(kafka_env())
    # Airflow 3's task supervisor keeps tasks off the metadata DB by pointing the DB URL of the task process
    # at a placeholder (`airflow-db-not-allowed:///`). The job inherits the task's environment and imports
    # Airflow (its alert records), whose import fails to parse that URL: every spark-submit task would fail
    # under a real executor (`dag.test()` runs tasks unsupervised and never sees it). The job never uses
    # the metadata DB; an in-memory SQLite keeps it that way and lets the import succeed.
    for key in _DB_URL_KEYS:
        if os.environ.get(key, "").startswith(_BLOCKED_DB_URL):
            env[key] = "sqlite://"
    return env


_DB_URL_KEYS = ("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "AIRFLOW__CORE__SQL_ALCHEMY_CONN")
_BLOCKED_DB_URL = "airflow-db-not-allowed:"

class SluiceSparkSubmitOperator(SparkSubmitOperator):
    """spark-submit with sluice's defaults: ``spark_default`` if defined, else ``local[*]`` (no YARN).

    ``clock_from_data_interval``: the job's "now" (``SLUICE_NOW``) is the run's ``data_interval_end``, so
    that re-running a past DAG run means what it meant then, unless ``SLUICE_NOW`` is already set (in the
    environment or the task's ``env_vars``); a run without a data interval (a manual run triggered without a
    logical date) keeps the wall clock."""

    def __init__(self, *, clock_from_data_interval: bool = False, **kwargs: Any) -> None:
        kwargs.setdefault("conn_id", SPARK_CONN_ID)
        kwargs.setdefault("name", kwargs.get("task_id", "sluice"))
        kwargs.setdefault("conf", {"spark.sql.session.timeZone": "UTC", "spark.ui.showConsoleProgress": "false"})
        # A Spark task that fails for good (retries used up) alerts through sluice's notifiers and outbox, in
        # sluice's DAGs (DEFAULT_ARGS) and in a team's own DAG that uses this operator.
        kwargs.setdefault("on_failure_callback", task_failure_alert)
        conn_id = kwargs["conn_id"]
        super().__init__(**kwargs)
        self.spark_conn_id: str = conn_id
        self.clock_from_data_interval = clock_from_data_interval

    @property
    def work(self) -> str:
        """The kind of run the job is, for its JVM's settings (``sluice.runtime.spark.JIT_OPTIONS``): a
        ``backfill`` job's (a pipeline's reprocess path, the backfill DAG), else a ``cycle``'s."""
        return "backfill" if list(self.application_args or [])[:1] == ["backfill"] else "cycle"

    def execute(self, context: Any) -> None:
        from sluice.config import load_settings
        from sluice.runtime.spark import (  # imports PySpark: at run time, never at parse time
            delta_jars,
            driver_class_path,
            executor_class_path,
            log_conf,
            sluice_jars,
        )

        self.env_vars = {**spark_env(), **(self.env_vars or {})}
        # Delta's connector (and S3A's, for roots on object storage) on the driver's classpath from the start
        # (spark.jars set by the job's session would reach the executors only), and shipped to the executors
        # of a cluster that shares no disk, unless its workers hold them (SLUICE_EXECUTOR_JARS: the job's
        # session puts that folder on the executors' class path). The job's settings are its environment's.
        settings = load_settings({**os.environ, **self.env_vars})
        on_workers = executor_class_path(settings)
        if on_workers is None:
            # With the pinned jars, sluice's own (the line reader, built per machine by make setup).
            self.jars = ",".join(j for j in (self.jars, delta_jars(settings), sluice_jars()) if j)
        else:
            self.driver_class_path = os.pathsep.join(
                p for p in (self.driver_class_path, driver_class_path(settings)) if p)
            self.conf = {"spark.executor.extraClassPath": on_workers, **(self.conf or {})}
        if self.clock_from_data_interval:
            self.env_vars = with_clock(self.env_vars, context.get("data_interval_end"))
        # The driver logs as quietly as in `sluice run` (sluice's log4j2 properties) and compiles as the CLI's
        # command would (a backfill's JIT settings are its own), unless the task says.
        self.conf = {**log_conf(self.work), **(self.conf or {})}
        if connection_defined(self.spark_conn_id):
            return super().execute(context)
        # The provider would fall back to YARN; sluice's contract is local mode.
        log.info("connection %r is not defined: running Spark in %s", self.spark_conn_id, LOCAL_MASTER)
        if not self.env_vars.get("SPARK_LOCAL_IP", os.environ.get("SPARK_LOCAL_IP")):
            # A local driver serves no one else: loopback only (as sluice's own sessions, runtime.spark).
            self.conf = {"spark.driver.bindAddress": "127.0.0.1", "spark.driver.host": "127.0.0.1", **self.conf}
        with local_spark_connection(self.spark_conn_id):
            return super().execute(context)


def with_clock(env: dict[str, str], data_interval_end: datetime | None) -> dict[str, str]:
    """``env`` with ``SLUICE_NOW`` = ``data_interval_end``, unless it already sets ``SLUICE_NOW`` or the run
    has no data interval (then the job keeps its clock: the variable's, or the wall clock)."""
    if env.get("SLUICE_NOW"):
        log.info("now=%s (SLUICE_NOW from the environment)", env["SLUICE_NOW"])
        return env
    if data_interval_end is None:
        log.info("this run has no data interval: now is the wall clock")
        return env
    now = rfc3339(data_interval_end)
    log.info("now=%s (the run's data_interval_end)", now)
    return {**env, "SLUICE_NOW": now}


class SluiceCheckOperator(SluiceSparkSubmitOperator):
    """The run's last task: its data-quality outcome. It first validates windows a failed or interrupted
    cycle left closed but unchecked (``sluice check`` through spark-submit; finding none in the ledger, read
    with delta-rs, it starts no Spark: ``run_cycle`` validates the windows it closes inside its own
    application; not in a backfill run, which leaves every window outside its interval as it is) and
    delivers their alerts. Then it fails (:class:`~sluice.airflow.outcomes.ChecksFailed`,
    no retry) when this run found windows that failed their checks, as a failing data check does in
    Airflow, while the Spark task stays green: the job did its work."""

    template_fields = (*SluiceSparkSubmitOperator.template_fields, "pipeline")

    def __init__(self, *, pipeline: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.pipeline = pipeline

    def execute(self, context: Any) -> None:
        from sluice.runtime.context import open_run

        found: list[str] = []
        dag_run = context.get("dag_run")
        run_type = str(getattr(getattr(dag_run, "run_type", None), "value", getattr(dag_run, "run_type", "")))
        # A backfill run rewrites the windows of its own interval and leaves every other window as it is.
        pending = [] if run_type == BACKFILL_RUN_TYPE else open_run(task_settings()).ledger(self.pipeline).pending()
        if run_type == BACKFILL_RUN_TYPE:
            log.info("backfill run: only the windows of its interval are checked (by reprocess_interval)")
        elif pending:
            log.info("%d window(s) of %s closed but not validated (from %s); validating them", len(pending),
                     self.pipeline, rfc3339(min(pending)[0]))
            super().execute(context)
            found = deliver(self.pipeline)
        else:
            log.info("every closed window of %s is validated (run_cycle checks the windows it closes); "
                     "nothing to check, Spark not started", self.pipeline)
        judge(context, self.pipeline, found)


class SluiceGoldOperator(SluiceSparkSubmitOperator):
    """A Spark task that writes gold (``sluice run`` or ``sluice backfill``): when it succeeds, one Asset
    event per gold table of ``pipeline`` (templated) whose ``extra`` says what the run did to the windows:
    those it closed or rewrote, with their rows and states (from the ledger rows whose gold the run wrote),
    plus ``event_extra`` (templated). A run that wrote no window's gold (a cycle that closed nothing, a
    re-check) emits no event, so a DAG scheduled on the gold Assets runs only when there is something new.

    The events go through ``gold_alias``, an AssetAlias outlet resolved at run time to the pipeline's
    Assets: a task whose outlets were the Assets themselves would emit an event on every success."""

    template_fields = (*SluiceSparkSubmitOperator.template_fields, "pipeline", "event_extra")

    def __init__(
        self,
        *,
        pipeline: str,
        gold_alias: AssetAlias,
        event_extra: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("outlets", [gold_alias])
        super().__init__(**kwargs)
        self.pipeline = pipeline
        self.event_extra = event_extra or {}
        self.gold_alias = gold_alias

    def execute(self, context: Any) -> None:
        from sluice.runtime.context import open_run
        from sluice.windows.ledger import gold_changes

        settings = task_settings()
        ledger = open_run(settings).ledger(self.pipeline)
        before = ledger.rows
        super().execute(context)  # raises on failure: no event for a rewrite that did not happen
        changed = gold_changes(before, ledger.rows)
        if not changed:
            log.info("%s: no window's gold changed: no asset event", self.pipeline)
            return
        extra = {**gold_event_extra(self.pipeline, changed), **self.event_extra}
        assets = gold_assets(settings.pipeline(self.pipeline))
        events = context["outlet_events"]
        for asset in assets:
            events[self.gold_alias].add(asset, extra=extra)
        log.info("asset events for %s (%d window(s), %d row(s)): %s", self.pipeline, extra["window_count"],
                 extra["rows"], ", ".join(a.uri for a in assets))


# An event's extra lists at most this many windows (a catch-up may close thousands); the counts cover all.
EVENT_WINDOWS = 48


def gold_event_extra(pipeline: str, changed: list[Any]) -> dict[str, Any]:
    """The ``extra`` of a gold Asset event: the windows a run closed or rewrote (ledger rows), their rows
    (every output's) and states."""
    rows = sorted(changed, key=lambda r: (r.window_start, r.window_end))
    states: dict[str, int] = {}
    for row in rows:
        states[row.state] = states.get(row.state, 0) + 1
    return {
        "pipeline": pipeline,
        "window_count": len(rows),
        "window_start": rfc3339(rows[0].window_start),
        "window_end": rfc3339(max(r.window_end for r in rows)),
        "rows": sum(r.rows for r in rows),
        "states": dict(sorted(states.items())),
        "windows": [{"window_start": rfc3339(r.window_start), "window_end": rfc3339(r.window_end),
                     "state": r.state, "rows": r.rows} for r in rows[:EVENT_WINDOWS]],
        "windows_truncated": len(rows) > EVENT_WINDOWS,
    }
