"""Airflow glue shared by the DAG files, which only wire tasks. Nothing here starts Spark or reads data
at DAG parse time; the DAG factory reads only the pipeline definitions (the registry).

* :func:`pipeline_dags`: one DAG per registered pipeline (dag_id = pipeline name, its schedule as a cron
  *data interval* timetable, one Asset per gold table, retries, ``max_active_runs=1``), and one placeholder
  that turns broken pipeline files into an import error naming each file, without hiding the other
  pipelines' DAGs. A run of type ``backfill`` (``airflow backfill create``, the UI's "Run backfill")
  reprocesses the windows of its data interval through the backfill path; every other run is a cycle whose
  clock is its ``data_interval_end``.
* :class:`SluiceSparkSubmitOperator`: ``SparkSubmitOperator`` through the ``spark_default`` connection when
  it is defined; otherwise local mode (``local[*]``), never the provider's YARN default. It runs pyspark's
  own ``spark-submit`` from this interpreter's environment and hands the Python workers this interpreter.
* :class:`SluiceGoldOperator`: ``sluice run`` or ``sluice backfill`` through spark-submit, then one Asset
  event per gold table of the pipeline, carrying the windows it closed or rewrote; none when it changed none.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import os
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pendulum
from airflow.exceptions import AirflowTimetableInvalid
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import DAG, Asset, AssetAlias, BaseHook, CronDataIntervalTimetable, Param, TriggerRule
from airflow.sdk.exceptions import AirflowNotFoundException
from airflow.timetables.simple import NullTimetable

from sluice.airflow.credentials import aws_env, kafka_env, task_settings
from sluice.airflow.outcomes import (  # noqa: F401  (AlertsRaised: re-exported for DAG files and tests)
    CHECK_QUALITY,
    SEND_ALERTS,
    AlertsRaised,
    deliver,
    judge,
    send_alerts_task,
    task_failure_alert,
)
from sluice.core.model import PipelineDef
from sluice.core.registry import Registry

log = logging.getLogger("sluice.orchestration")

REPO_ROOT = Path(__file__).resolve().parents[3]
JOBS_DIR = REPO_ROOT / "jobs"
SPARK_CONN_ID = "spark_default"
LOCAL_MASTER = "local[*]"

JOB = "sluice_job"  # the one generic spark-submit entry point under jobs/
START_DATE = pendulum.datetime(2024, 1, 1, tz="UTC")

# What sluice_backfill's events go through: which gold tables a backfill rewrote is known only at run time
# (the `pipeline` param), so its task declares this alias and resolves it to the chosen pipeline's Assets.
GOLD_ALIAS = AssetAlias(name="sluice_backfill_gold", group="sluice")

# The pipeline DAGs' tasks (the Airflow graph shows both paths; the branch picks one per run).
CHOOSE_PATH, RUN_CYCLE, REPROCESS = "choose_path", "run_cycle", "reprocess_interval"
BACKFILL_RUN_TYPE = "backfill"  # DagRunType.BACKFILL_JOB: runs created by `airflow backfill create` / the UI


def gold_assets(pipeline: PipelineDef) -> list[Asset]:
    """One Asset per gold table the pipeline writes."""
    return [Asset(name=o.table_name, uri=f"sluice://{o.table_name}", group="sluice") for o in pipeline.outputs]


def rfc3339(value: datetime) -> str:
    """RFC 3339 in UTC with a ``Z`` (what ``SLUICE_NOW`` and ``sluice backfill --start/--end`` take)."""
    return value.astimezone(UTC).replace(tzinfo=None).isoformat() + "Z"


def pipeline_timetable(schedule: str | None) -> Any:
    """The pipeline's ``schedule`` as a timetable whose runs cover real data intervals.

    Airflow 3 turns a plain cron string into a ``CronTriggerTimetable`` (unless
    ``[scheduler] create_cron_data_intervals`` is set), whose runs have an empty data interval
    ``[t, t)``: a backfill of such a DAG would hold no window. ``CronDataIntervalTimetable`` gives each run
    the interval from the previous cron tick to its own, ``[previous, this)``, contiguous, so a backfill
    over a range reprocesses each window exactly once, and a scheduled run still runs at (and takes its
    clock from) the end of its interval. Presets other than cron aliases (``@once``, ``@continuous``) and
    None (manual only) are passed through unchanged."""
    if schedule is None or schedule in ("@once", "@continuous"):
        return schedule
    return CronDataIntervalTimetable(schedule, timezone="UTC")


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


# Retries cover transient failures (a killed JVM, a busy machine); every write is idempotent, so a retry
# resumes where the failed attempt stopped. Every task of every sluice DAG alerts when it fails for good (its
# retries used up): the Spark tasks, and also choose_path, validate_params, send_alerts (unless it failed on
# purpose) and the maintenance tasks.
DEFAULT_ARGS: dict[str, Any] = {"owner": "sluice", "retries": 2, "retry_delay": timedelta(minutes=1),
                                "on_failure_callback": task_failure_alert}


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


def pipeline_gold_alias(pipeline: PipelineDef) -> AssetAlias:
    """The alias a pipeline DAG's gold-writing tasks emit their events through (see SluiceGoldOperator)."""
    return AssetAlias(name=f"sluice_{pipeline.name}_gold", group="sluice")


def _doc_md(pipeline: PipelineDef) -> str:
    outputs = ", ".join(f"`{o.table_name}`" for o in pipeline.outputs)
    streams = ", ".join(f"`landing/{s}`" for s in pipeline.streams)
    return (
        f"### {pipeline.name}\n\n{pipeline.description.strip()}\n\n"
        f"Declared in `{pipeline.source}`. Reads {streams}; writes {outputs}.\n\n"
        "**choose_path** picks one of two paths per run.\n\n"
        "Scheduled and manual runs (the cycle; its clock, `SLUICE_NOW`, is the run's `data_interval_end` "
        "unless `SLUICE_NOW` is set, or the wall clock for a run without a data interval):\n\n"
        "1. **run_cycle** (one Spark application): ingest the pipeline's streams into bronze, quarantine and "
        "DLQ, then the streaming queries (and the batch close) write the windows the watermark closed, and "
        "Great Expectations checks each of them -> `ops/dq_results`, Data Docs, ledger.\n"
        "Backfill runs (`airflow backfill create --dag-id " + pipeline.name + " --from-date ... --to-date ...`, "
        "or *Run backfill* in the UI):\n\n"
        "1. **reprocess_interval**: `sluice backfill` of the windows whose start lies in the run's data "
        "interval (aligned to the pipeline's windows; a run whose interval holds no window start does "
        "nothing and says so in choose_path's log): recomputed from bronze, replaced in one atomic commit, "
        "checked again, ledger `reprocessed`; Asset events for the gold tables. The run conf "
        "`{\"include_late\": true}` (param `include_late`) also brings in the DLQ records. Only windows the "
        "watermark has closed are rewritten.\n\n"
        "Then **send_alerts** delivers the run's alerts (connections `sluice_webhook`, `sluice_smtp`; it fails "
        "only when a configured channel refused one), and **check_quality** gives the run's data-quality "
        "outcome: it validates windows a failed cycle left unchecked, and fails when windows of this run "
        "failed their checks (recorded in the ledger and alerted).\n\n"
        "Spark runs on the `spark_default` connection if defined, else in local mode."
    )


def backfill_windows(pipeline_name: str, context: Any) -> tuple[datetime, datetime] | None:
    """The windows of the run's data interval: those whose start lies in ``[data_interval_start,
    data_interval_end)``, as an aligned ``sluice backfill`` range (None when no window starts in it). Reads
    the pipeline's window from the settings (it may be configured) at run time."""
    from sluice.core.windows import windows_starting_in

    start, end = context.get("data_interval_start"), context.get("data_interval_end")
    if start is None or end is None:
        return None
    return windows_starting_in(start, end, task_settings().pipeline(pipeline_name).window.slide)


def choose_path_task(pipeline_name: str) -> Any:
    """The branch: ``reprocess_interval`` for a backfill run whose interval holds windows, nothing for one
    whose interval holds none, ``run_cycle`` for every other run."""
    from airflow.sdk import get_current_context, task

    @task.branch(task_id=CHOOSE_PATH)
    def choose_path() -> str | None:
        context = get_current_context()
        dag_run = context["dag_run"]
        run_type = str(getattr(dag_run.run_type, "value", dag_run.run_type))
        if run_type != BACKFILL_RUN_TYPE:
            log.info("%s run: one cycle of %s", run_type, pipeline_name)
            return RUN_CYCLE
        start, end = context.get("data_interval_start"), context.get("data_interval_end")
        windows = backfill_windows(pipeline_name, context)
        interval = f"[{rfc3339(start)}, {rfc3339(end)})" if start and end else "(none)"
        if windows is None:
            log.info("backfill run: no window of %s starts in its data interval %s: nothing to reprocess",
                     pipeline_name, interval)
            return None  # skips both paths (and send_alerts): the run succeeds having done nothing
        include_late = bool(context["params"].get("include_late", False))
        log.info("backfill run: reprocessing the windows of %s starting in %s, i.e. [%s, %s), include_late=%s",
                 pipeline_name, interval, rfc3339(windows[0]), rfc3339(windows[1]), include_late)
        context["ti"].xcom_push(key="windows", value={"start": rfc3339(windows[0]), "end": rfc3339(windows[1])})
        return REPROCESS

    return choose_path()


def pipeline_dag(pipeline: PipelineDef) -> DAG:
    """The DAG of one pipeline: choose_path >> (run_cycle | reprocess_interval) >> send_alerts >>
    check_quality. Scheduled and manual runs take the cycle; backfill runs reprocess their interval."""
    windows = f"ti.xcom_pull(task_ids='{CHOOSE_PATH}', key='windows')"
    with DAG(
        dag_id=pipeline.name,
        schedule=pipeline_timetable(pipeline.schedule),
        start_date=START_DATE,
        catchup=False,
        max_active_runs=1,
        default_args=DEFAULT_ARGS,
        tags=["sluice", "pipeline", *pipeline.tags],
        doc_md=_doc_md(pipeline),
        params={
            "include_late": Param(
                False, type="boolean",
                description="backfill runs only: also recompute with the DLQ (late) records; set it in the "
                            "backfill's run conf, e.g. {\"include_late\": true}",
            ),
        },
    ) as dag:
        choose_path = choose_path_task(pipeline.name)
        run_cycle = SluiceGoldOperator(
            task_id=RUN_CYCLE,
            pipeline=pipeline.name,
            gold_alias=pipeline_gold_alias(pipeline),
            application=job(),
            # One Spark application per run: the cycle validates the windows it closes. Its alerts (failing
            # windows, unreadable files, correction notices) go out with send_alerts; check_quality then
            # fails the run when windows failed.
            application_args=["run", pipeline.name, "--no-deliver", "--no-fail-on-checks"],
            clock_from_data_interval=True,
        )
        reprocess = SluiceGoldOperator(
            task_id=REPROCESS,
            pipeline=pipeline.name,
            gold_alias=pipeline_gold_alias(pipeline),
            application=job(),
            application_args=[
                "backfill", pipeline.name,
                "--start", "{{ " + windows + "['start'] }}",
                "--end", "{{ " + windows + "['end'] }}",
                "--include-late", "{{ params.include_late | string | lower }}",
                "--no-deliver",
                "--no-fail-on-checks",  # a failed check is the outcome, not a failed job: check_quality says it
            ],
            event_extra={"start": "{{ " + windows + "['start'] }}", "end": "{{ " + windows + "['end'] }}",
                         "include_late": "{{ params.include_late | string | lower }}"},
        )
        # After whichever path ran; skipped when neither did (a backfill run whose interval holds no window).
        send_alerts = send_alerts_task(pipeline.name, trigger_rule=TriggerRule.NONE_FAILED_MIN_ONE_SUCCESS)
        check_quality = SluiceCheckOperator(
            task_id=CHECK_QUALITY,
            pipeline=pipeline.name,
            application=job(),
            # Its own alerts are delivered by the task itself, after the job (see SluiceCheckOperator).
            application_args=["check", pipeline.name, "--no-deliver"],
            clock_from_data_interval=True,
            # It reads and checks the gold tables. As inlets they are registered with Airflow (an event
            # through the alias needs its Asset known: "AssetModel ... not found") and emit nothing.
            inlets=gold_assets(pipeline),
        )
        choose_path >> [run_cycle, reprocess] >> send_alerts >> check_quality
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
