"""Airflow glue shared by the DAG files, which only wire tasks. Nothing here starts Spark or reads data
at DAG parse time; the DAG factory reads only the pipeline definitions (the registry).

:func:`pipeline_dags`: one DAG per registered pipeline (dag_id = pipeline name, its schedule as a cron *data
interval* timetable, one Asset per gold table, retries, ``max_active_runs=1``), and one placeholder that turns
broken pipeline files into an import error naming each file, without hiding the other pipelines' DAGs. A run of
type ``backfill`` (``airflow backfill create``, the UI's "Run backfill") reprocesses the windows of its data
interval through the backfill path; every other run is a cycle whose clock is its ``data_interval_end``. The
tasks' operators are in :mod:`sluice.airflow.operators`.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

import pendulum
from airflow.exceptions import AirflowTimetableInvalid
from airflow.sdk import DAG, AssetAlias, CronDataIntervalTimetable, Param, TriggerRule
from airflow.timetables.simple import NullTimetable

from sluice.airflow.credentials import task_settings
from sluice.airflow.operators import (
    BACKFILL_RUN_TYPE,
    SluiceCheckOperator,
    SluiceGoldOperator,
    gold_assets,
    job,
    rfc3339,
)
from sluice.airflow.outcomes import (  # noqa: F401  (AlertsRaised: re-exported for DAG files and tests)
    CHECK_QUALITY,
    SEND_ALERTS,
    AlertsRaised,
    send_alerts_task,
    task_failure_alert,
)
from sluice.core.model import PipelineDef
from sluice.core.registry import Registry

log = logging.getLogger("sluice.orchestration")

START_DATE = pendulum.datetime(2024, 1, 1, tz="UTC")

# What sluice_backfill's events go through: which gold tables a backfill rewrote is known only at run time
# (the `pipeline` param), so its task declares this alias and resolves it to the chosen pipeline's Assets.
GOLD_ALIAS = AssetAlias(name="sluice_backfill_gold", group="sluice")

# The pipeline DAGs' tasks (the Airflow graph shows both paths; the branch picks one per run).
CHOOSE_PATH, RUN_CYCLE, REPROCESS = "choose_path", "run_cycle", "reprocess_interval"


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


# Retries cover transient failures (a killed JVM, a busy machine); every write is idempotent, so a retry
# resumes where the failed attempt stopped. Every task of every sluice DAG alerts when it fails for good (its
# retries used up): the Spark tasks, and also choose_path, validate_params, send_alerts (unless it failed on
# purpose) and the maintenance tasks.
DEFAULT_ARGS: dict[str, Any] = {"owner": "sluice", "retries": 2, "retry_delay": timedelta(minutes=1),
                                "on_failure_callback": task_failure_alert}


def pipeline_gold_alias(pipeline: PipelineDef) -> AssetAlias:
    """The alias a pipeline DAG's gold-writing tasks emit their events through (see
    :class:`~sluice.airflow.operators.SluiceGoldOperator`)."""
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
