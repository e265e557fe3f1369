"""``sluice alerts``: the alerts recorded in ops/alerts but not delivered yet (a run with ``--no-deliver``,
or the DAGs, whose ``send_alerts`` task delivers them), and ``--deliver`` to send them now.

Reading is pure delta-rs (no Spark); delivery is :func:`sluice.quality.checker.deliver_pending_alerts`,
the function the DAG's task calls, so both mark the same rows delivered."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from sluice.cli.output import rfc3339, window
from sluice.cli.report import fmt_ts
from sluice.config import ConfigError, Settings
from sluice.quality.checker import PENDING, deliver_pending_alerts
from sluice.storage import tables
from sluice.storage.engine import read_small_table


def _rows(settings: Settings, pipeline: str | None) -> list[dict[str, Any]]:
    data = read_small_table(tables.ALERTS.path(settings))
    rows = [r for r in (data.to_pylist() if data is not None else []) if pipeline is None or r["pipeline"] == pipeline]
    return sorted(rows, key=lambda r: (_epoch(r["raised_at"]), r["pipeline"], r["message"] or ""))


def _epoch(value: datetime | None) -> float:
    return (value.replace(tzinfo=UTC) if value.tzinfo is None else value).timestamp() if value else 0.0


def _alert(row: dict[str, Any]) -> dict[str, Any]:
    try:
        failed = json.loads(row["failed_expectations"] or "[]")
    except ValueError:
        failed = []
    return {
        "pipeline": row["pipeline"],
        **window(row["window_start"], row["window_end"]),
        "raised_at": rfc3339(row["raised_at"]),
        "message": row["message"],
        "failed": failed,
    }


def pending_alerts(settings: Settings, pipeline: str | None = None) -> list[dict[str, Any]]:
    """The undelivered alerts, oldest first. Rows with the same message are one alert (delivery sends it
    once and marks them all)."""
    seen: set[tuple[str, str]] = set()
    out = []
    for row in _rows(settings, pipeline):
        key = (row["pipeline"], row["message"])
        if row["channels"] == PENDING and key not in seen:
            seen.add(key)
            out.append(_alert(row))
    return out


def deliver(settings: Settings, pipeline: str | None = None) -> tuple[list[dict[str, Any]], list[str]]:
    """Send the pending alerts through the configured channels. Returns the alerts sent (each with the
    ``channels`` that delivered it) and the channels that were configured. Refuses, leaving every alert
    pending, when no channel is configured: delivery would mark them sent to nowhere."""
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
    for name in sorted({a["pipeline"] for a in pending}):
        deliver_pending_alerts(settings, name)
    # deliver_pending_alerts marks each alert it handled with the channels that took it ("none" when every
    # one failed): the alerts pending before and not after are the ones handled, read back with their marks.
    before = {(a["pipeline"], a["message"]) for a in pending}
    sent: dict[tuple[str, str], dict[str, Any]] = {}
    for row in _rows(settings, pipeline):
        key = (row["pipeline"], row["message"])
        if key in before and key not in sent and row["channels"] != PENDING:
            sent[key] = {**_alert(row), "channels": [c for c in (row["channels"] or "").split(",") if c != "none"]}
    return list(sent.values()), channels


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
