"""What a sluice DAG run ends with, one meaning per task state (Airflow's conventions for data checks):

* the Spark task (``run_cycle``, ``reprocess_interval``, ``backfill``) fails when the job itself failed;
* ``send_alerts`` delivers the alerts the run recorded, and fails only when an alert could not be delivered
  through any configured channel (it stays pending in ``ops/alerts``);
* ``check_quality``, the last task, fails when the run found windows that failed their checks (or a stale
  window, or unreadable landing files): the outcome is recorded in the ledger and alerted, and the failed
  check task is how Airflow shows it, as a failing SQL or Great Expectations check would.

None of these deliberate failures repeats itself as a ``task_failure`` alert: the alerts are the notification.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from airflow.sdk import TriggerRule
from airflow.sdk.exceptions import AirflowFailException

from sluice.airflow.credentials import task_settings

if TYPE_CHECKING:
    from sluice.alerting.outbox import Delivery

log = logging.getLogger("sluice.orchestration")

SEND_ALERTS, CHECK_QUALITY = "send_alerts", "check_quality"
#: What send_alerts hands check_quality (XCom): the summaries of the error-level alerts it delivered.
PROBLEMS = "problems"


class AlertsRaised(AirflowFailException):
    """A task of sluice failed the run on purpose, after recording (and delivering, or keeping pending) the
    alerts that say why: no ``task_failure`` alert repeats them, and no retry would change the outcome."""


class AlertsUndelivered(AlertsRaised):
    """``send_alerts``: every configured channel refused an alert; it stays pending and is retried."""


class ChecksFailed(AlertsRaised):
    """``check_quality``: the run found windows that failed their checks; they are recorded and alerted."""


def task_failure_alert(context: Any) -> None:
    """``on_failure_callback`` of every task of sluice's DAGs (``DEFAULT_ARGS``) and of the Spark operators: a
    ``task_failure`` alert (webhook, email, ops/alerts) naming the DAG, task, run and error
    (:func:`sluice.alerting.outbox.on_task_failure`)."""
    if isinstance(context.get("exception"), AlertsRaised):
        return  # failed on purpose, after its alerts were recorded
    from sluice.alerting.outbox import on_task_failure

    on_task_failure(context)


def deliver(pipeline_name: str) -> list[str]:
    """Deliver the pipeline's pending alerts, log where each went, and return the summaries of the
    error-level ones (notices, such as corrections, are informational). Raises :class:`AlertsUndelivered`
    when a configured channel refused one."""
    from sluice.alerting.outbox import deliver_pending

    report = deliver_pending(task_settings(), pipeline_name)
    _log_delivery(report)
    if report.undelivered:
        raise AlertsUndelivered(
            f"{len(report.undelivered)} alert(s) of {pipeline_name} could not be delivered through any "
            "configured channel; they stay pending in ops/alerts and the next run retries them "
            "(`sluice alerts --deliver` sends them now)"
        )
    return [a.summary for a in report.delivered if a.level != "info"]


def _log_delivery(report: Delivery) -> None:
    from sluice.alerting.alert import SMTP_CONN_ID, WEBHOOK_CONN_ID

    for alert in report.delivered:
        channels = report.channels.get(alert.alert_id) or []
        where = (f"sent through {', '.join(channels)}" if channels else
                 f"recorded in ops/alerts; not sent: no channel is configured ({WEBHOOK_CONN_ID}, {SMTP_CONN_ID})")
        log.log(logging.INFO if alert.level == "info" else logging.WARNING, "%s (%s)", alert.message, where)


def send_alerts_task(pipeline: Any, trigger_rule: str = TriggerRule.ALL_SUCCESS) -> Any:
    """Deliver the alerts the run recorded, exactly once per failing window. ``pipeline`` is a name or the
    XCom of an upstream task that returns one. Returns ``{"pipeline": ..., "problems": [...]}`` for
    :func:`check_quality_task`."""
    from airflow.sdk import task

    @task(task_id=SEND_ALERTS, retries=0, trigger_rule=trigger_rule)
    def send_alerts(pipeline_name: str) -> dict[str, Any]:
        return {"pipeline": pipeline_name, PROBLEMS: deliver(pipeline_name)}

    return send_alerts(pipeline)


def judge(context: Any, pipeline_name: str, found: list[str] | None = None) -> None:
    """Fail ``check_quality`` (:class:`ChecksFailed`) when this run found problems: those ``send_alerts``
    delivered (its XCom) and ``found`` (the check task's own)."""
    delivered = context["ti"].xcom_pull(task_ids=SEND_ALERTS) or {}
    problems = [*(delivered.get(PROBLEMS) or []), *(found or [])]
    if not problems:
        log.info("%s: every window this run closed or checked passed its checks", pipeline_name)
        return
    shown = "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more" if len(problems) > 5 else "")
    message = (f"{len(problems)} data-quality problem(s) of {pipeline_name} in this run, recorded in the window "
               f"ledger and alerted: {shown}. `sluice status {pipeline_name}` and the ledger page show them; "
               "fix the data, then re-check or backfill the windows")
    # Said in the log too: Airflow shows an exception's text apart from the log lines.
    log.error("%s", message)
    raise ChecksFailed(message)


def check_quality_task(pipeline: Any, inlets: list[Any]) -> Any:
    """sluice_backfill's last task: the run's data-quality outcome (see :func:`judge`), after send_alerts.
    ``inlets``: the gold Assets it judges (registered with Airflow, so that the backfill's events find them)."""
    from airflow.sdk import get_current_context, task

    @task(task_id=CHECK_QUALITY, inlets=inlets)  # ChecksFailed is never retried (AirflowFailException)
    def check_quality(outcome: dict[str, Any]) -> None:
        judge(get_current_context(), str(outcome["pipeline"]))

    return check_quality(pipeline)
