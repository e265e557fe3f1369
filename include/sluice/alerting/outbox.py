"""ops/alerts as an outbox: an alert is recorded first, delivered after, and marked delivered last.

Each row is keyed by (pipeline, window, kind, attempt), also stored as one string, ``alert_id``:

* :func:`raise_alert` records an alert as ``pending`` unless its key is already there, so a retried task
  or a rerun after a crash records it once. The data-quality step writes the outbox row *before* the
  ledger state that says the window failed: a crash between the two leaves the window to validate again,
  which finds its alert already recorded, never a failed window without its alert.
* :func:`deliver_pending` sends every pending row of a pipeline through the notifiers and then marks it
  (channels, ``delivered_at``). Marking is keyed by ``alert_id``, so delivering twice sends nothing twice.
  A crash between sending and marking re-sends once on the next delivery: the payload carries
  ``alert_id`` so that receivers can drop the repeat.
* An alert whose every configured channel failed stays pending and is tried again by the next delivery;
  with no channel configured it is marked ``none`` (there is nowhere it could go).

Writes go through the engine's ``replace_rows`` (the table is small: alerts, not records), one atomic
commit each under the app id ``sluice.alerts.<pipeline>``, sorted so that the file content does not depend
on the order of earlier writes. No Spark is needed: this also runs in Airflow workers and callbacks.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from sluice.alerting.alert import SMTP_CONN_ID, WEBHOOK_CONN_ID
from sluice.config import Settings
from sluice.storage import tables
from sluice.storage.engine import COMMIT_ATTEMPTS, CommitConflictError, commit_backoff
from sluice.storage.snapshots import read_small_table

if TYPE_CHECKING:
    from sluice.alerting.alert import Alert
    from sluice.storage.engine import RowsEngine

log = logging.getLogger("sluice.alerts")

PENDING = "pending"
NO_CHANNEL = "none"
ORDER = ("pipeline", "window_start", "window_end", "kind", "attempt", "alert_id")


def _engine(settings: Settings, engine: RowsEngine | None) -> RowsEngine:
    if engine is not None:
        return engine
    from sluice.storage.engines import ops_engine

    return ops_engine(settings)


def read_outbox(settings: Settings, pipeline: str | None = None) -> list[dict[str, Any]]:
    """Every row of ops/alerts (of ``pipeline``), oldest first."""
    data = read_small_table(tables.ALERTS.path(settings))
    rows = [r for r in (data.to_pylist() if data is not None else [])
            if pipeline is None or r["pipeline"] == pipeline]
    return sorted(rows, key=lambda r: (_utc(r["raised_at"]), row_id(r), r["message"] or ""))


def _utc(value: datetime | None) -> datetime:
    if value is None:
        return datetime.min.replace(tzinfo=UTC)
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


def row_id(row: Mapping[str, Any]) -> str:
    """A row's alert_id; rows written before the outbox had none and are keyed by their message."""
    return row.get("alert_id") or f"{row['pipeline']}/message/{row['message']}"


def _row(alert: Alert) -> tuple[Any, ...]:
    values = {
        "pipeline": alert.pipeline, "window_start": alert.window_start, "window_end": alert.window_end,
        "raised_at": alert.raised_at, "message": alert.message, "channels": PENDING,
        "failed_expectations": json.dumps(alert.failed, sort_keys=True), "kind": alert.kind,
        "attempt": alert.attempt, "alert_id": alert.alert_id, "level": alert.level, "docs_url": alert.docs_url,
        "delivered_at": None,
    }
    return tuple(values[name] for name in tables.ALERTS.schema.names)


def _commit(
    settings: Settings, engine: RowsEngine, pipeline: str, rows: Sequence[tuple[Any, ...]], replaced: set[str]
) -> None:
    """One atomic commit: the rows whose alert_id is in ``replaced`` give way to ``rows``."""
    from sluice.windows.ledger import next_version

    path = tables.ALERTS.path(settings)
    engine.ensure_table(path, tables.ALERTS.schema)  # also adds the outbox columns to an older table
    app = f"sluice.alerts.{pipeline}"
    for failed in range(1, COMMIT_ATTEMPTS + 1):
        # Each write takes the next version of the app id; False means another process took that version
        # first (our rows are not in), so take the one after it.
        if engine.replace_rows(rows, tables.ALERTS.schema, path, drop=lambda r: row_id(r) in replaced,
                               order_by=ORDER, app_id=app, version=next_version(engine, path, app)):
            return
        commit_backoff(failed)
    raise CommitConflictError(f"{path}: {app}: other writers took the next version {COMMIT_ATTEMPTS} times")


def record_alerts(settings: Settings, alerts: Iterable[Alert], engine: RowsEngine | None = None) -> list[Alert]:
    """Record ``alerts`` as pending, in one commit, skipping those whose key is already in the outbox
    (delivered or not). Returns the alerts newly recorded."""
    engine = _engine(settings, engine)
    path = tables.ALERTS.path(settings)
    engine.ensure_table(path, tables.ALERTS.schema)
    known = {row_id(r) for r in read_outbox(settings)}
    new: dict[str, Alert] = {}
    for alert in alerts:
        if alert.alert_id not in known:
            new.setdefault(alert.alert_id, alert)
    by_pipeline: dict[str, list[Alert]] = {}
    for alert in new.values():
        log.log(logging.INFO if alert.level == "info" else logging.WARNING, "%s", alert.message)
        by_pipeline.setdefault(alert.pipeline, []).append(alert)
    for pipeline, items in sorted(by_pipeline.items()):
        _commit(settings, engine, pipeline, [_row(a) for a in items], {a.alert_id for a in items})
    return list(new.values())


def raise_alert(
    settings: Settings, alert: Alert, *, deliver: bool, engine: RowsEngine | None = None
) -> list[str]:
    """Record ``alert`` in the outbox and, with ``deliver``, send the pipeline's pending alerts now (else the
    DAG's ``send_alerts`` task, or ``sluice alerts --deliver``, does). Idempotent per alert key. Returns the
    channels that delivered ``alert`` in this call."""
    record_alerts(settings, [alert], engine)
    if not deliver:
        return []
    report = deliver_pending(settings, alert.pipeline, engine)
    return report.channels.get(alert.alert_id, [])


@dataclass
class Delivery:
    """What one :func:`deliver_pending` call did."""

    delivered: list[Alert] = field(default_factory=list)
    undelivered: list[Alert] = field(default_factory=list)  # every configured channel failed: still pending
    channels: dict[str, list[str]] = field(default_factory=dict)  # alert_id -> channels that took it


def alert_from_row(row: Mapping[str, Any]) -> Alert:
    """The :class:`Alert` an outbox row records (rows of older versions lack kind and attempt)."""
    from sluice.alerting.alert import DQ_FAILURE, UNREADABLE_FILE, Alert

    kind = row.get("kind") or (DQ_FAILURE if row["window_start"] is not None else UNREADABLE_FILE)
    return Alert(
        pipeline=row["pipeline"], window_start=row["window_start"], window_end=row["window_end"],
        failed=json.loads(row["failed_expectations"] or "[]"), docs_url=row.get("docs_url"),
        raised_at=row["raised_at"], kind=kind, attempt=int(row.get("attempt") or 1),
    )


def deliver_pending(settings: Settings, pipeline: str, engine: RowsEngine | None = None) -> Delivery:
    """Send the pipeline's pending alerts, oldest first, then mark them delivered in one commit."""
    report = Delivery()
    rows = [r for r in read_outbox(settings, pipeline) if r["channels"] == PENDING]
    if not rows:
        return report
    from sluice.alerting.notifiers import configured_channels, send_alert  # imports Airflow: only when needed

    channels = configured_channels()
    now = datetime.now(UTC)  # when it really went out: a fact about delivery, not about the data
    marked: dict[str, tuple[Any, ...]] = {}
    for row in rows:
        key = row_id(row)
        if key in marked:
            continue
        alert = alert_from_row(row)
        sent = send_alert(alert) if channels else []
        report.channels[key] = sent
        if channels and not sent:
            report.undelivered.append(alert)
            continue
        report.delivered.append(alert)
        # Rows of older versions lack the outbox columns: the alert they record fills them in.
        values = dict(zip(tables.ALERTS.schema.names, _row(alert), strict=True))
        values.update({k: v for k, v in row.items() if v is not None and k in values})
        values.update(alert_id=key, channels=",".join(sent) or NO_CHANNEL, delivered_at=now)
        marked[key] = tuple(values.values())
    if marked:
        _commit(settings, _engine(settings, engine), pipeline, list(marked.values()), set(marked))
    if report.undelivered:
        log.error("%d alert(s) of %s could not be delivered through any channel (%s); they stay pending and are "
                  "retried by the next delivery", len(report.undelivered), pipeline, ", ".join(channels))
    return report


def outbox_snapshot(settings: Settings, pipeline: str) -> dict[str, str]:
    """``{alert_id: channels}`` of the pipeline's outbox now: a run compares it with the outbox after it
    (:func:`alerts_recorded_since`) to say what became of the alerts it recorded."""
    return {row_id(r): r["channels"] for r in read_outbox(settings, pipeline)}


@dataclass(frozen=True)
class AlertTally:
    """The alerts one run recorded, by what became of them."""

    sent: int = 0  # delivered through at least one channel
    unrouted: int = 0  # no channel configured: marked ``none``
    pending: int = 0  # not delivered yet (--no-deliver, or every channel failed)

    def render(self) -> list[str]:
        """One line per outcome, e.g. "7 alerts recorded, no channel configured (sluice_webhook, sluice_smtp)"."""
        lines = []
        if self.sent:
            lines.append(f"{_alerts(self.sent)} recorded and sent")
        if self.unrouted:
            lines.append(f"{_alerts(self.unrouted)} recorded, no channel configured ({WEBHOOK_CONN_ID}, "
                         f"{SMTP_CONN_ID}); `sluice alerts --all` lists them")
        if self.pending:
            lines.append(f"{_alerts(self.pending)} recorded, not delivered yet; `sluice alerts --deliver` "
                         "sends them")
        return lines


def _alerts(n: int) -> str:
    return f"{n} alert{'s' if n != 1 else ''}"


def alerts_recorded_since(settings: Settings, pipeline: str, before: Mapping[str, str]) -> AlertTally:
    """What became of the alerts recorded since ``before`` (an :func:`outbox_snapshot`), and of those that
    were pending then and were handled since."""
    sent = unrouted = pending = 0
    for alert_id, channels in outbox_snapshot(settings, pipeline).items():
        if before.get(alert_id) == channels:
            continue
        if channels == PENDING:
            pending += 1
        elif channels == NO_CHANNEL:
            unrouted += 1
        else:
            sent += 1
    return AlertTally(sent=sent, unrouted=unrouted, pending=pending)


def _named_in_outbox(settings: Settings, pipeline: str, kind: str) -> set[tuple[str, str]]:
    """The (expectation, observed value) items that alerts of ``kind`` of the pipeline have named already."""
    from sluice.alerting.alert import UNREADABLE_FILE

    named: set[tuple[str, str]] = set()
    for row in read_outbox(settings, pipeline):
        # Rows from before the kind column: an alert with no window was an unreadable file's.
        if (row.get("kind") or (UNREADABLE_FILE if row["window_start"] is None else None)) != kind:
            continue
        for item in json.loads(row["failed_expectations"] or "[]"):
            named.add((str(item.get("expectation")), str(item.get("observed_value"))))
    return named


def unreadable_files_alert(settings: Settings, pipeline: str) -> Alert | None:
    """One alert naming the landing files of the pipeline's streams that were quarantined whole
    (``unreadable_file``) and that no alert of this pipeline has named yet; None when there are none.

    Derived from the ingest log, not from what the current cycle saw, so that a crash between a file's
    quarantine and its alert cannot lose the alert: the next cycle raises it. Its key includes a digest of
    the files, so a rerun raises the same alert, not a second one."""
    from sluice.ingest.files import source_key
    from sluice.ingest.state import load_state

    unreadable = [
        (stream, source_key(batch.source_file or ""))
        for stream in settings.pipeline(pipeline).streams
        for batch in load_state(settings, stream).rows
        if batch.unreadable
    ]
    if not unreadable:
        # The common case: no alert to build, and the outbox is not read.
        return None
    from sluice.alerting.alert import UNREADABLE_FILE, Alert

    named = _named_in_outbox(settings, pipeline, UNREADABLE_FILE)
    files = [(stream, path) for stream, path in unreadable if (f"{UNREADABLE_FILE}:{stream}", path) not in named]
    return Alert.unreadable_files(pipeline, files, settings.now()) if files else None


def kafka_offsets_lost_alert(settings: Settings, pipeline: str) -> Alert | None:
    """One alert naming the Kafka micro-batches of the pipeline's streams that lost offsets to the topic's
    retention (``ops/ingest_batches.lost``) and that no alert of this pipeline has named yet; None when there are
    none. From the ingest log, as :func:`unreadable_files_alert`, so a crash cannot lose it nor a rerun repeat it."""
    from sluice.ingest.state import load_state

    lost = [
        (stream, batch.source_file or "", batch.lost)
        for stream in settings.pipeline(pipeline).streams
        for batch in load_state(settings, stream).rows
        if batch.lost
    ]
    if not lost:
        return None
    from sluice.alerting.alert import KAFKA_OFFSETS_LOST, Alert

    named = _named_in_outbox(settings, pipeline, KAFKA_OFFSETS_LOST)
    fresh = [(stream, where, n) for stream, where, n in lost
             if (f"{KAFKA_OFFSETS_LOST}:{stream}", f"{n} offset(s) of {where}") not in named]
    return Alert.kafka_offsets_lost(pipeline, fresh, settings.now()) if fresh else None


def on_task_failure(context: Mapping[str, Any]) -> None:
    """``on_failure_callback`` of every task of sluice's DAGs (``run_cycle``, ``validate_params``,
    ``compact``, ...): a task that failed for good (its retries used up) raises a ``task_failure`` alert
    through the same notifiers and outbox as every other alert. The pipeline is the DAG's (its dag_id), or the
    ``pipeline`` param of ``sluice_backfill``. Never raises: a callback error must not hide the failure."""
    from sluice.alerting.notifiers import Alert, send_alert

    dag_id = str(getattr(context.get("dag"), "dag_id", None) or getattr(context.get("ti"), "dag_id", ""))
    alert = Alert.task_failure(dag_id, context, datetime.now(UTC))
    try:
        from sluice.config import load_settings

        settings = load_settings()
        params = context.get("params") or {}
        pipeline = dag_id if dag_id in settings.registry.pipelines else params.get("pipeline") or dag_id
        alert = Alert.task_failure(str(pipeline), context, settings.now())
        raise_alert(settings, alert, deliver=True)
    except Exception:
        # The outbox may be what failed (an unwritable home): the alert still goes out, unrecorded.
        log.exception("sluice: could not record the task-failure alert in ops/alerts; sending it directly")
        try:
            send_alert(alert)
        except Exception:
            log.exception("sluice: could not send the task-failure alert")
