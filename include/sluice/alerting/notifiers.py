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

import html
import json
import logging
import os
import socket
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import urlsplit

import httpx
from airflow.providers.smtp.hooks.smtp import SmtpHook
from airflow.sdk import BaseHook, BaseNotifier
from airflow.sdk.exceptions import AirflowNotFoundException

# The alert itself lives in an Airflow-free module, so that building and recording alerts never loads Airflow.
from sluice.alerting.alert import SMTP_CONN_ID, WEBHOOK_CONN_ID, Alert, one_line, task_event
from sluice.core.logsetup import reclaim_from_airflow

if TYPE_CHECKING:
    from airflow.sdk import Connection, Context

reclaim_from_airflow()  # importing Airflow (above) pointed the logs at stdout
log = logging.getLogger("sluice.alerts")

#: Where ``send_alert`` puts the :class:`Alert` in the notifier context.
CONTEXT_KEY = "sluice_alert"

_FALSE_STRINGS = frozenset({"", "0", "false", "no", "off", "none", "null"})


# -- what a notifier reports -------------------------------------------------------------------------------


def _alert_in(context: Context | Mapping[str, Any]) -> Alert | None:
    # Context is a TypedDict without our key; read it as the plain mapping it is at runtime.
    value = cast("Mapping[str, Any]", context).get(CONTEXT_KEY)
    return value if isinstance(value, Alert) else None


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
        payload = alert.payload() if alert else task_event(context)
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
                f"{one_line(response.text)[:200]}"
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
            event = task_event(context)
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
