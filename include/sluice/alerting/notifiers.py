"""Data-quality alerts through Airflow notifiers (SPEC sections 5 and 7).

A closed window that fails its checks raises exactly one :class:`Alert`. :func:`send_alert` delivers it
through every channel whose Airflow connection is defined:

``sluice_webhook`` (:class:`SluiceWebhookNotifier`)
    One HTTP POST of :meth:`Alert.payload` as JSON. The connection's ``host`` holds the full URL, e.g.
    ``AIRFLOW_CONN_SLUICE_WEBHOOK='{"conn_type": "http", "host": "http://127.0.0.1:8080/hook"}'``. A URI
    (``AIRFLOW_CONN_SLUICE_WEBHOOK='http://127.0.0.1:8080/hook'``) also works: Airflow splits it into
    host/port/schema and the URL is rebuilt from them (a query string cannot survive that split; use the
    JSON form for such URLs). Optional: ``login``/``password`` (HTTP basic auth), extra ``headers``
    (a dict, e.g. an ``Authorization`` header) and extra ``timeout`` (seconds, default 10). Any answer
    other than 2xx is a failure; redirects are not followed (they would turn the POST into a GET).

``sluice_smtp`` (:class:`SluiceSmtpNotifier`)
    One email through the smtp provider's :class:`SmtpHook` (connect, optional login, send). ``host`` and
    ``port`` as usual; extras:

    - ``from_email``: the sender (the provider's key). Default: ``login`` if it is an address, else
      ``sluice@<hostname>``.
    - ``to``: recipients, a list or a ``,``/``;`` separated string; ``cc``/``bcc`` likewise. Default
      recipient: the sender (an alert mailbox that mails itself), so a bare relay connection still works.
    - ``disable_ssl`` / ``disable_tls``: the provider's switches, honoured when present (``"false"`` as a
      string, as URIs produce it, means false). When absent sluice derives them instead of the provider's
      "SSL and STARTTLS on" default, which cannot talk to a plain local server (port 25/1025):
      implicit SSL only on port 465; STARTTLS on port 587 or whenever a login is set (a password is never
      sent in clear unless ``disable_tls`` says so explicitly); otherwise plain SMTP.
    - ``timeout`` (seconds, default 30), ``ssl_context`` (``default``/``none``) as in the provider;
      ``retry_limit`` defaults to 0 here (the provider's 5 re-sends could duplicate the one alert).

Connections are looked up with the Task SDK (``airflow.sdk.BaseHook.get_connection``). Outside a task
(the ``sluice`` CLI, tests) it reads the ``AIRFLOW_CONN_*`` environment variables and any external
secrets backend configured in ``[secrets]``; it never needs the metadata DB or an API server. Inside a task
it tries the environment first, then the Execution API. A connection that is absent is simply a channel
that is off; an ``AIRFLOW_CONN_*`` variable that is set but unparsable is a failed channel (the SDK alone
would report it as absent and the alert would vanish quietly).

Delivery policy: every configured channel is tried, one failing never stops the other. A failure is logged
at ERROR with the alert text and traceback and is left out of the returned list; :func:`send_alert` does
not raise. By the time it runs, the window is already ``failed`` in the ledger and the CLI exits 2, so the
failure is recorded either way; raising would turn "a window failed" into "the cycle crashed" and a retried
task would re-send the channel that did work. Compare the result with :func:`configured_channels` to spot
a failed channel. With no channel configured, a WARNING carrying the alert text says it went nowhere.

The notifiers are ordinary Airflow notifiers: DAGs can pass them as ``on_failure_callback`` (with no alert
in the context they report the failed task instead), and ``send_alert`` runs them exactly as Airflow does,
``notifier(context)``, with the alert under ``context["sluice_alert"]``. No plugin is needed to use them.
"""

from __future__ import annotations

import hashlib
import html
import json
import logging
import os
import socket
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import urlsplit

import httpx
from airflow.providers.smtp.hooks.smtp import SmtpHook
from airflow.sdk import BaseHook, BaseNotifier
from airflow.sdk.exceptions import AirflowNotFoundException

from sluice.core.logsetup import reclaim_from_airflow

if TYPE_CHECKING:
    from airflow.sdk import Connection, Context

reclaim_from_airflow()  # importing Airflow (above) pointed the logs at stdout
log = logging.getLogger("sluice.alerts")

WEBHOOK_CONN_ID = "sluice_webhook"
SMTP_CONN_ID = "sluice_smtp"
#: Where ``send_alert`` puts the :class:`Alert` in the notifier context.
CONTEXT_KEY = "sluice_alert"

_FALSE_STRINGS = frozenset({"", "0", "false", "no", "off", "none", "null"})


def _utc(value: datetime) -> datetime:
    # Window bounds come back from Spark/Arrow naive but mean UTC; aware values may be in any zone.
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _rfc3339(value: datetime) -> str:
    """``2024-05-01T10:00:00Z``; fractional seconds only when there are some."""
    moment = _utc(value)
    return moment.isoformat(timespec="microseconds" if moment.microsecond else "seconds").replace("+00:00", "Z")


def _one_line(value: object) -> str:
    # Observed values may be multi-line reprs; the alert message must stay one line for logs and subjects.
    return " ".join(str(value).split())


#: Alert kinds: a closed window failed its checks; landing files could not be read (quarantined whole); a
#: closed window was re-computed with its late records (a notice, level info); a window stayed open past
#: end + lateness_bound + freshness_grace; an Airflow task of sluice crashed.
DQ_FAILURE = "dq_failure"
UNREADABLE_FILE = "unreadable_file"
CORRECTION = "correction"
STALE = "stale"
TASK_FAILURE = "task_failure"
#: The level of each kind: only notices are informational.
LEVELS = {DQ_FAILURE: "error", UNREADABLE_FILE: "error", CORRECTION: "info", STALE: "error", TASK_FAILURE: "error"}


@dataclass(frozen=True)
class Alert:
    """One data-quality failure of one closed window of one pipeline (kind ``dq_failure``), or the landing
    files a cycle of it could not read (kind ``unreadable_file``: no window, one item per file)."""

    pipeline: str
    window_start: datetime | None
    window_end: datetime | None
    failed: list[dict[str, str]]  # each {"expectation": ..., "observed_value": ...}
    docs_url: str | None  # the Data Docs page to look at (a URL, never a server path)
    raised_at: datetime
    kind: str = DQ_FAILURE
    # With pipeline, window and kind, the alert's key in the ops/alerts outbox: a window's n-th validation
    # round (or correction) raises attempt n, so a retried task re-raises the same alert, not a new one.
    attempt: int = 1

    @property
    def level(self) -> str:
        """``error`` for failures, ``info`` for notices (corrections)."""
        return LEVELS.get(self.kind, "error")

    @property
    def alert_id(self) -> str:
        """The outbox key as one stable string: ``<pipeline>/<start>/<end>/<kind>/<attempt>``. Alerts with no
        window (unreadable files, task failures) add a digest of what they report, so that the same files
        or the same failed task instance give the same id on a retry, and different ones do not collide."""
        start = _rfc3339(self.window_start) if self.window_start else "-"
        end = _rfc3339(self.window_end) if self.window_end else "-"
        key = f"{self.pipeline}/{start}/{end}/{self.kind}/{self.attempt}"
        if self.window_start is None:
            items = json.dumps(self.failed, sort_keys=True).encode("utf-8")
            key += "/" + hashlib.sha256(items).hexdigest()[:12]
        return key

    @classmethod
    def unreadable_files(cls, pipeline: str, files: Iterable[tuple[str, str]], raised_at: datetime) -> Alert:
        """``files``: (stream, path) of each landing file quarantined whole in one cycle."""
        failed = [{"expectation": f"{UNREADABLE_FILE}:{stream}", "observed_value": path} for stream, path in files]
        return cls(pipeline, None, None, failed, None, raised_at, UNREADABLE_FILE)

    @classmethod
    def stale(cls, pipeline: str, window: tuple[datetime, datetime], due: datetime, holding: Mapping[str, Any],
              raised_at: datetime, docs_url: str | None = None) -> Alert:
        """The window was due closed at ``due`` (end + lateness_bound + freshness_grace) and is still open;
        ``holding``: the stream(s) whose watermark holds it back -> that watermark (None: no data yet)."""
        failed = [{"expectation": f"freshness:{stream}",
                   "observed_value": f"watermark {_rfc3339(mark) if mark else 'none yet'}, window due closed by "
                                     f"{_rfc3339(due)}"}
                  for stream, mark in sorted(holding.items())]
        return cls(pipeline, window[0], window[1], failed, docs_url, raised_at, STALE)

    @classmethod
    def task_failure(cls, pipeline: str, context: Mapping[str, Any], raised_at: datetime) -> Alert:
        """An Airflow task of the pipeline failed for good (its retries used up): its on_failure_callback."""
        event = _task_event(context)
        ti = context.get("ti") or context.get("task_instance")
        try_number = getattr(ti, "try_number", None)
        failed = [{"expectation": f"task:{event['dag_id']}.{event['task_id']}",
                   "observed_value": f"run {event['run_id']}"
                                     + (f" try {try_number}" if try_number else "")
                                     + (f": {event['exception']}" if event["exception"] else "")}]
        return cls(pipeline, None, None, failed, None, raised_at, TASK_FAILURE)

    @property
    def window_label(self) -> str:
        """``2024-05-01 10:00-11:00 UTC``; the end gets its date too when the window spans a day or more."""
        if self.window_start is None or self.window_end is None:
            return "-"
        start, end = _utc(self.window_start), _utc(self.window_end)
        end_format = "%H:%M" if timedelta(0) < end - start < timedelta(days=1) else "%Y-%m-%d %H:%M"
        return f"{start:%Y-%m-%d %H:%M}-{end.strftime(end_format)} UTC"

    @property
    def summary(self) -> str:
        """Pipeline, window and the number of failed checks: the email subject."""
        count = len(self.failed)
        if self.kind == CORRECTION:
            return f"sluice: {self.pipeline} window {self.window_label} corrected with its late records"
        if self.kind == STALE:
            return f"sluice: {self.pipeline} window {self.window_label} is stale: not closed in time"
        if self.kind == TASK_FAILURE:
            return f"sluice: {self.pipeline}: an Airflow task failed"
        if self.kind == UNREADABLE_FILE:
            files = "1 landing file could not be read and was" if count == 1 else (
                f"{count} landing files could not be read and were")
            return f"sluice: {self.pipeline}: {files} quarantined whole (unreadable_file)"
        checks = f"{count} check" if count == 1 else f"{count} checks"
        return f"sluice: {self.pipeline} window {self.window_label} failed {checks}"

    @property
    def message(self) -> str:
        """One readable line, e.g. ``sluice: p window 2024-05-01 10:00-11:00 UTC failed 1 check: c (x=1)``."""
        details = []
        for item in self.failed:
            name = _one_line(item.get("expectation", "?"))
            observed = _one_line(item.get("observed_value", ""))
            details.append(f"{name} ({observed})" if observed else name)
        return f"{self.summary}: {', '.join(details)}" if details else self.summary

    def payload(self) -> dict[str, Any]:
        """The webhook JSON body."""
        return {
            "event": "sluice.dq_failure" if self.kind == DQ_FAILURE else f"sluice.{self.kind}",
            "pipeline": self.pipeline,
            "window_start": _rfc3339(self.window_start) if self.window_start else None,
            "window_end": _rfc3339(self.window_end) if self.window_end else None,
            "failed": [
                {"expectation": str(item.get("expectation", "")), "observed_value": str(item.get("observed_value", ""))}
                for item in self.failed
            ],
            "docs_url": self.docs_url,
            "message": self.message,
            "raised_at": _rfc3339(self.raised_at),
            "kind": self.kind,
            "level": self.level,
            "attempt": self.attempt,
            # Receivers can drop repeats by this id: delivery is at-least-once when a crash falls between
            # sending and recording the delivery.
            "alert_id": self.alert_id,
        }

    def email(self) -> tuple[str, str]:
        """(subject, HTML body). Everything is escaped: observed values are data, not markup."""
        rows = "".join(
            f"<li><b>{html.escape(str(item.get('expectation', '?')))}</b>: "
            f"{html.escape(str(item.get('observed_value', '')))}</li>"
            for item in self.failed
        )
        docs = (f'<p>Data Docs: <a href="{html.escape(self.docs_url)}">{html.escape(self.docs_url)}</a></p>'
                if self.docs_url else "")
        window = (
            f"<br>Window: {html.escape(_rfc3339(self.window_start))} to {html.escape(_rfc3339(self.window_end))}"
            if self.window_start and self.window_end else ""
        )
        heading = {DQ_FAILURE: "Failed expectations", UNREADABLE_FILE: "Files quarantined whole",
                   CORRECTION: "What changed (before -> after)", STALE: "Streams holding it back",
                   TASK_FAILURE: "Failed task"}.get(self.kind, "Details")
        body = (
            f"<p>{html.escape(self.message)}</p>"
            f"<p>Pipeline: <b>{html.escape(self.pipeline)}</b>{window}</p>"
            f"<p>{heading}:</p><ul>{rows}</ul>{docs}"
            f"<p>Raised at {html.escape(_rfc3339(self.raised_at))}.</p>"
        )
        return self.summary, body


# -- what a notifier reports -------------------------------------------------------------------------------


def _alert_in(context: Context | Mapping[str, Any]) -> Alert | None:
    # Context is a TypedDict without our key; read it as the plain mapping it is at runtime.
    value = cast("Mapping[str, Any]", context).get(CONTEXT_KEY)
    return value if isinstance(value, Alert) else None


def _task_event(context: Context | Mapping[str, Any]) -> dict[str, Any]:
    """What to report when a notifier runs as an Airflow callback with no sluice alert in the context."""
    ctx = cast("Mapping[str, Any]", context)
    ti = ctx.get("ti") or ctx.get("task_instance")
    dag_id = getattr(ti, "dag_id", None) or getattr(ctx.get("dag"), "dag_id", None) or "?"
    task_id = getattr(ti, "task_id", None) or "?"
    run_id = ctx.get("run_id") or getattr(ti, "run_id", None) or "?"
    state = getattr(ti, "state", None) or "failed"
    state = getattr(state, "value", state)  # TaskInstanceState is an enum whose str() is "TaskInstanceState.X"
    exception = ctx.get("exception")
    message = f"sluice: Airflow task {dag_id}.{task_id} (run {run_id}) {state}"
    if exception:
        message += f": {_one_line(exception)}"
    return {
        "event": "sluice.task_callback",
        "dag_id": str(dag_id),
        "task_id": str(task_id),
        "run_id": str(run_id),
        "state": str(state),
        "exception": _one_line(exception) if exception else None,
        "message": message,
        "raised_at": _rfc3339(datetime.now(UTC)),
    }


# -- connections -------------------------------------------------------------------------------------------


class ConnectionConfigError(RuntimeError):
    """An ``AIRFLOW_CONN_*`` variable is set but Airflow cannot read it as a connection."""


def _lookup(conn_id: str) -> Connection | None:
    """The connection, or None when it is not defined anywhere. Other lookup errors propagate."""
    try:
        return BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        # The SDK swallows parse errors of every backend and reports "not defined", so a typo in the
        # variable would silently switch the channel off. It is a broken channel, not an absent one.
        variable = f"AIRFLOW_CONN_{conn_id.upper()}"
        if os.environ.get(variable, "").strip():
            raise ConnectionConfigError(
                f"{variable} is set but Airflow could not parse it into a connection (use a JSON object such as "
                '{"conn_type": "http", "host": "http://..."} or a URI)'
            ) from None
        return None


def _truthy(value: object) -> bool:
    # Connection URIs deliver extras as strings, where bool("false") would be True.
    if isinstance(value, str):
        return value.strip().lower() not in _FALSE_STRINGS
    return bool(value)


def _addresses(value: object) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        items = value.replace(";", ",").split(",")
    else:
        items = [str(item) for item in cast("Iterable[Any]", value)]
    return [item.strip() for item in items if item.strip()]


def webhook_url(conn: Connection) -> str:
    """The URL to POST to: ``host`` when it is a full URL, else rebuilt from a URI-style connection."""
    host = (conn.host or "").strip()
    if "://" in host:
        return host
    if not host:
        raise ValueError(f"connection {conn.conn_id!r} has no host; put the full webhook URL in `host`")
    scheme = "https" if (conn.conn_type or "").lower() == "https" else "http"
    netloc = f"{host}:{conn.port}" if conn.port else host
    return f"{scheme}://{netloc}/{(conn.schema or '').lstrip('/')}"


def _redacted(url: str) -> str:
    # Webhook URLs often carry their secret in the path (Slack, Teams) and Airflow does not mask `host`.
    parts = urlsplit(url)
    netloc = parts.hostname or ""
    if parts.port:
        netloc += f":{parts.port}"
    return f"{parts.scheme}://{netloc}/..." if parts.path not in ("", "/") else f"{parts.scheme}://{netloc}/"


class WebhookError(RuntimeError):
    """The webhook answered, but not with 2xx."""


# -- notifiers ---------------------------------------------------------------------------------------------


class SluiceWebhookNotifier(BaseNotifier):
    """POST the alert (or, as a task callback, the task event) as JSON to the ``sluice_webhook`` URL."""

    template_fields = ("webhook_conn_id",)

    def __init__(self, webhook_conn_id: str = WEBHOOK_CONN_ID, *, timeout: float | None = None) -> None:
        super().__init__()
        self.webhook_conn_id = webhook_conn_id
        self.timeout = timeout

    def notify(self, context: Context) -> None:
        alert = _alert_in(context)
        payload = alert.payload() if alert else _task_event(context)
        # Looked up at send time, never at DAG parse time: the DAG processor must not depend on it.
        conn = BaseHook.get_connection(self.webhook_conn_id)
        url = webhook_url(conn)
        extra = conn.extra_dejson
        headers = {"Content-Type": "application/json", "User-Agent": "sluice-alerts"}
        headers.update({str(k): str(v) for k, v in (extra.get("headers") or {}).items()})
        auth = (conn.login, conn.password or "") if conn.login else None
        timeout = self.timeout if self.timeout is not None else float(extra.get("timeout", 10))
        body = json.dumps(payload, default=str).encode("utf-8")
        # One attempt only: a retry after a timeout could deliver the one alert twice.
        response = httpx.post(url, content=body, headers=headers, auth=auth, timeout=timeout, follow_redirects=False)
        if not response.is_success:
            raise WebhookError(
                f"webhook {self.webhook_conn_id} at {_redacted(url)} answered HTTP {response.status_code}: "
                f"{_one_line(response.text)[:200]}"
            )
        self.log.info("Alert posted to webhook %s at %s (HTTP %s)", self.webhook_conn_id, _redacted(url),
                      response.status_code)


class SluiceSmtpHook(SmtpHook):
    """The provider's SmtpHook with sluice's TLS defaults and no re-sends (see the module docstring)."""

    @property
    def _extra(self) -> dict[str, Any]:
        return cast("dict[str, Any]", self.conn.extra_dejson)

    @property
    def use_ssl(self) -> bool:
        extra = self._extra
        if "disable_ssl" in extra:
            return not _truthy(extra["disable_ssl"])
        return self.conn.port is not None and int(self.conn.port) == 465

    @property
    def smtp_starttls(self) -> bool:
        if self.use_ssl:
            return False  # already TLS; STARTTLS inside SMTP_SSL is not a thing servers offer
        extra = self._extra
        if "disable_tls" in extra:
            return not _truthy(extra["disable_tls"])
        return (self.conn.port is not None and int(self.conn.port) == 587) or bool(self.conn.login)

    @property
    def smtp_retry_limit(self) -> int:
        return int(self._extra.get("retry_limit", 0))


class SluiceSmtpNotifier(BaseNotifier):
    """Email the alert (or, as a task callback, the task event) through the ``sluice_smtp`` connection.

    Not the provider's ``SmtpNotifier``: that one needs ``to`` when the DAG is parsed (sluice reads it from
    the connection at send time), Jinja-renders subject and body (observed values are data and may contain
    ``{{``), keeps per-send state on the instance, and uses the provider's TLS defaults.
    """

    template_fields = ("smtp_conn_id", "to", "from_email")

    def __init__(
        self,
        smtp_conn_id: str = SMTP_CONN_ID,
        *,
        to: str | list[str] | None = None,
        from_email: str | None = None,
    ) -> None:
        super().__init__()
        self.smtp_conn_id = smtp_conn_id
        self.to = to
        self.from_email = from_email

    def notify(self, context: Context) -> None:
        alert = _alert_in(context)
        if alert:
            subject, body = alert.email()
        else:
            event = _task_event(context)
            subject, body = event["message"], f"<p>{html.escape(event['message'])}</p>"
        with SluiceSmtpHook(smtp_conn_id=self.smtp_conn_id) as smtp:  # connects, STARTTLS, logs in
            conn = smtp.conn
            extra = cast("dict[str, Any]", conn.extra_dejson)
            sender = self.from_email or extra.get("from_email") or _default_sender(conn)
            recipients = _addresses(self.to) or _addresses(extra.get("to")) or [sender]
            smtp.send_email_smtp(
                to=recipients,
                from_email=sender,
                subject=subject,
                html_content=body,
                cc=_addresses(extra.get("cc")) or None,
                bcc=_addresses(extra.get("bcc")) or None,
            )
        self.log.info("Alert emailed via %s to %d recipient(s)", self.smtp_conn_id, len(recipients))


def _default_sender(conn: Connection) -> str:
    if conn.login and "@" in conn.login:
        return conn.login
    return f"sluice@{socket.gethostname() or 'localhost'}"


# -- delivery ----------------------------------------------------------------------------------------------

_CHANNELS: list[tuple[str, str, Callable[[], BaseNotifier]]] = [
    ("webhook", WEBHOOK_CONN_ID, SluiceWebhookNotifier),
    ("smtp", SMTP_CONN_ID, SluiceSmtpNotifier),
]


def configured_channels() -> list[str]:
    """The channels whose connection is defined, e.g. ``["webhook", "smtp"]``."""
    channels = []
    for name, conn_id, _ in _CHANNELS:
        try:
            defined = _lookup(conn_id) is not None
        except Exception:
            defined = True  # meant to be configured, just broken; send_alert reports it as failed
        if defined:
            channels.append(name)
    return channels


def send_alert(alert: Alert) -> list[str]:
    """Deliver ``alert`` through every configured channel; return those that delivered. Never raises."""
    delivered: list[str] = []
    failed: list[str] = []
    for name, conn_id, make_notifier in _CHANNELS:
        try:
            if _lookup(conn_id) is None:
                continue
            # Exactly what Airflow does with a callback notifier: render template fields, then notify.
            notifier = make_notifier()
            notifier(cast("Context", {CONTEXT_KEY: alert}))
        except Exception as exc:
            failed.append(name)
            log.error("ALERT NOT DELIVERED via %s (connection %s): %s: %s -- alert was: %s", name, conn_id,
                      type(exc).__name__, exc, alert.message, exc_info=True)
        else:
            delivered.append(name)
    if failed:
        log.error("Alert for %s %s: delivered via %s, FAILED via %s", alert.pipeline, alert.window_label,
                  ", ".join(delivered) or "nothing", ", ".join(failed))
    elif not delivered:
        log.warning("Alert went nowhere: neither Airflow connection %s nor %s is defined (set "
                    "AIRFLOW_CONN_SLUICE_WEBHOOK and/or AIRFLOW_CONN_SLUICE_SMTP). Alert was: %s",
                    WEBHOOK_CONN_ID, SMTP_CONN_ID, alert.message)
    else:
        log.info("Alert for %s %s delivered via %s", alert.pipeline, alert.window_label, ", ".join(delivered))
    return delivered
