"""``sluice alerts``: the alerts recorded in the ops/alerts outbox but not delivered yet (a run with
``--no-deliver``, or the DAGs, whose ``send_alerts`` task delivers them), and ``--deliver`` to send them now.
``--all`` is the whole history, each alert with what became of it: sent (and through which channels),
``none`` (no channel was configured when it was delivered) or pending.

Reading is pure delta-rs (no Spark); delivery is :func:`sluice.alerting.outbox.deliver_pending`, the
function the DAG's task calls, so both mark the same rows delivered."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from sluice.alerting.outbox import NO_CHANNEL, PENDING, deliver_pending, read_outbox, row_id
from sluice.config import ConfigError, Settings
from sluice.ingest.accounting import fmt_ts
from sluice.reports.output import rfc3339, window


def _alert(row: dict[str, Any]) -> dict[str, Any]:
    try:
        failed = json.loads(row["failed_expectations"] or "[]")
    except ValueError:
        failed = []
    return {
        "pipeline": row["pipeline"],
        **window(row["window_start"], row["window_end"]),
        "kind": row.get("kind") or ("dq_failure" if row["window_start"] else "unreadable_file"),
        "level": row.get("level") or "error",
        "alert_id": row_id(row),
        "raised_at": rfc3339(row["raised_at"]),
        "message": row["message"],
        "failed": failed,
        "docs_url": row.get("docs_url"),
    }


def _history_entry(row: dict[str, Any]) -> dict[str, Any]:
    """An alert of the history: its pending shape, with what became of it."""
    return {
        **_alert(row),
        "status": status(row["channels"]),
        "channels": [] if row["channels"] in (PENDING, NO_CHANNEL) else row["channels"].split(","),
        "delivered_at": rfc3339(row.get("delivered_at")),
    }


SENT = "sent"
STATUSES = (SENT, NO_CHANNEL, PENDING)


def status(channels: str) -> str:
    """``pending``, ``none`` (recorded while no channel was configured) or ``sent``."""
    return channels if channels in (PENDING, NO_CHANNEL) else SENT


def alert_history(
    settings: Settings,
    pipeline: str | None = None,
    *,
    kinds: Sequence[str] = (),
    statuses: Sequence[str] = (),
    since: datetime | None = None,
) -> list[dict[str, Any]]:
    """Every alert recorded, oldest first, one per alert_id, filtered by kind, status and raised time."""
    seen: set[str] = set()
    out = []
    for row in read_outbox(settings, pipeline):
        alert = _history_entry(row)
        if alert["alert_id"] in seen:
            continue
        seen.add(alert["alert_id"])
        raised = row["raised_at"]
        if since is not None and raised is not None and _aware(raised) < since:
            continue
        if (kinds and alert["kind"] not in kinds) or (statuses and alert["status"] not in statuses):
            continue
        out.append(alert)
    return out


def _aware(value: datetime) -> datetime:
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)  # Arrow hands back naive UTC


def render_history(alerts: list[dict[str, Any]], pipeline: str | None, filtered: bool) -> str:
    scope = f" of {pipeline}" if pipeline else ""
    if not alerts:
        return f"no alerts{scope}" + (" match the filters" if filtered else " recorded")
    counts = {s: sum(1 for a in alerts if a["status"] == s) for s in STATUSES}
    head = (f"{len(alerts)} alert(s){scope}: {counts[SENT]} sent, {counts[NO_CHANNEL]} with no channel "
            f"configured (none), {counts[PENDING]} pending")
    rows = [("raised", "pipeline", "kind", "status", "message")]
    rows += [(_short(a["raised_at"]), a["pipeline"], a["kind"], _status_text(a), a["message"]) for a in alerts]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ["  " + "  ".join(c.ljust(w) for c, w in zip(r[:4], widths, strict=True)) + "  " + r[4] for r in rows]
    return "\n".join([head, *lines])


def _status_text(alert: dict[str, Any]) -> str:
    return f"sent ({','.join(alert['channels'])})" if alert["status"] == SENT else alert["status"]


def pending_alerts(settings: Settings, pipeline: str | None = None) -> list[dict[str, Any]]:
    """The undelivered alerts, oldest first, one per alert_id."""
    seen: set[str] = set()
    out = []
    for row in read_outbox(settings, pipeline):
        if row["channels"] == PENDING and row_id(row) not in seen:
            seen.add(row_id(row))
            out.append(_alert(row))
    return out


def deliver(settings: Settings, pipeline: str | None = None) -> tuple[list[dict[str, Any]], list[str]]:
    """Send the pending alerts through the configured channels. Returns the alerts handled (each with the
    ``channels`` that delivered it; an alert every channel failed stays pending) and the channels that were
    configured. Refuses, leaving every alert pending, when no channel is configured: delivery would mark
    them sent to nowhere."""
    pending = pending_alerts(settings, pipeline)
    if not pending:
        return [], []
    from sluice.alerting.notifiers import SMTP_CONN_ID, WEBHOOK_CONN_ID, configured_channels  # loads Airflow

    channels = configured_channels()
    if not channels:
        raise ConfigError(
            f"no alert channel is configured, so the {len(pending)} pending alert(s) stay pending; define the "
            f"Airflow connection {WEBHOOK_CONN_ID} and/or {SMTP_CONN_ID}, e.g. AIRFLOW_CONN_SLUICE_WEBHOOK="
            "'{\"conn_type\": \"http\", \"host\": \"https://hooks.example.com/sluice\"}'"
        )
    by_id = {a["alert_id"]: a for a in pending}
    sent: list[dict[str, Any]] = []
    for name in sorted({a["pipeline"] for a in pending}):
        report = deliver_pending(settings, name)
        for alert_id, took in report.channels.items():
            if alert_id in by_id:
                sent.append({**by_id[alert_id], "channels": took})
    return sent, channels


def render_alerts(pending: list[dict[str, Any]], pipeline: str | None) -> str:
    scope = f" for {pipeline}" if pipeline else ""
    if not pending:
        return f"no pending alerts{scope}"
    lines = [f"{len(pending)} pending alert(s){scope}, recorded in ops/alerts but not delivered yet "
             "(`sluice alerts --deliver` sends them):"]
    lines += [f"  raised {_short(a['raised_at'])}  {a['message']}" for a in pending]
    return "\n".join(lines)


def render_delivered(sent: list[dict[str, Any]], channels: list[str]) -> str:
    if not sent and not channels:
        return "no pending alerts to deliver"
    lines = []
    for alert in sent:
        missed = [c for c in channels if c not in alert["channels"]]
        how = f"FAILED via {', '.join(missed)}" if missed else f"sent via {', '.join(alert['channels'])}"
        lines.append(f"  {how}: {alert['message']}")
    complete = sum(1 for line in lines if line.startswith("  sent"))
    head = f"delivered {complete} of {len(sent)} alert(s) through every configured channel ({', '.join(channels)}):"
    return "\n".join([head, *lines])


def _short(value: str | None) -> str:
    return fmt_ts(datetime.fromisoformat(value)) if value else "-"
