"""Alerts against real servers on 127.0.0.1: an HTTP server for the webhook and a small SMTP server.

Connections come only from ``AIRFLOW_CONN_*`` environment variables, as in the ``sluice`` CLI: no Airflow
metadata DB or API server is involved. Every socket has a timeout and every test a time limit.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from airflow.sdk import Connection, TaskInstanceState

from sluice.alerting.notifiers import (
    Alert,
    SluiceSmtpHook,
    SluiceWebhookNotifier,
    configured_channels,
    send_alert,
    webhook_url,
)
from support.servers import (
    SmtpServer,
    WebhookServer,
    smtp_server_fixture,  # noqa: F401 (pytest fixture ``smtp_server``)
    webhook_fixture,  # noqa: F401 (pytest fixture ``webhook``)
)

pytestmark = pytest.mark.timeout(120)


# -- environment -------------------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No connections or proxies leaking in from the environment running the tests."""
    for name in ("AIRFLOW_CONN_SLUICE_WEBHOOK", "AIRFLOW_CONN_SLUICE_SMTP"):
        monkeypatch.delenv(name, raising=False)
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)


def set_webhook(monkeypatch: pytest.MonkeyPatch, url: str) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_SLUICE_WEBHOOK", json.dumps({"conn_type": "http", "host": url}))


def set_smtp(monkeypatch: pytest.MonkeyPatch, port: int, **fields: Any) -> None:
    conn: dict[str, Any] = {
        "conn_type": "smtp",
        "host": "127.0.0.1",
        "port": port,
        "extra": {"from_email": "sluice@example.com", "to": "oncall@example.com; data@example.com", "timeout": 10},
    }
    conn.update(fields)
    monkeypatch.setenv("AIRFLOW_CONN_SLUICE_SMTP", json.dumps(conn))


@pytest.fixture
def alert() -> Alert:
    return Alert(
        pipeline="ad_clicks_hourly",
        window_start=datetime(2024, 5, 1, 10, 0),  # naive, as Spark hands them back: means UTC
        window_end=datetime(2024, 5, 1, 11, 0),
        failed=[
            {"expectation": "completeness:impressions", "observed_value": "gold=10 bronze=12"},
            {"expectation": "lateness", "observed_value": "dlq_ratio=0.05 > 0.01"},
        ],
        docs_url="https://airflow.example.com/sluice/docs/index.html",
        raised_at=datetime(2024, 5, 1, 12, 5, 30, tzinfo=UTC),
    )


# -- the alert itself --------------------------------------------------------------------------------------


def test_message_is_one_readable_line(alert: Alert) -> None:
    assert alert.message == (
        "sluice: ad_clicks_hourly window 2024-05-01 10:00-11:00 UTC failed 2 checks: "
        "completeness:impressions (gold=10 bronze=12), lateness (dlq_ratio=0.05 > 0.01)"
    )
    multi = Alert("p", datetime(2024, 5, 1, 23, tzinfo=UTC), datetime(2024, 5, 2, tzinfo=UTC),
                  [{"expectation": "x", "observed_value": "a\nb"}], None, datetime(2024, 5, 2, tzinfo=UTC))
    assert multi.message == "sluice: p window 2024-05-01 23:00-00:00 UTC failed 1 check: x (a b)"


def test_payload_fields(alert: Alert) -> None:
    payload = alert.payload()
    assert payload["pipeline"] == "ad_clicks_hourly"
    assert payload["window_start"] == "2024-05-01T10:00:00Z"
    assert payload["window_end"] == "2024-05-01T11:00:00Z"
    assert payload["raised_at"] == "2024-05-01T12:05:30Z"
    assert payload["failed"] == alert.failed
    assert payload["docs_url"] == "https://airflow.example.com/sluice/docs/index.html"
    assert payload["message"] == alert.message
    json.dumps(payload)  # serialisable as is


# -- delivery ----------------------------------------------------------------------------------------------


def test_webhook_posts_json(monkeypatch: pytest.MonkeyPatch, webhook: WebhookServer, alert: Alert) -> None:
    set_webhook(monkeypatch, webhook.url)
    assert send_alert(alert) == ["webhook"]
    assert len(webhook.requests) == 1
    request = webhook.requests[0]
    assert request.method == "POST"
    assert request.path == "/hook"
    assert request.headers["content-type"] == "application/json"
    body = request.json()
    assert body["pipeline"] == "ad_clicks_hourly"
    assert body["window_start"] == "2024-05-01T10:00:00Z"
    assert body["window_end"] == "2024-05-01T11:00:00Z"
    assert body["failed"] == [
        {"expectation": "completeness:impressions", "observed_value": "gold=10 bronze=12"},
        {"expectation": "lateness", "observed_value": "dlq_ratio=0.05 > 0.01"},
    ]
    assert body["docs_url"] == "https://airflow.example.com/sluice/docs/index.html"
    assert body["message"] == alert.message


def test_webhook_uri_form(monkeypatch: pytest.MonkeyPatch, webhook: WebhookServer, alert: Alert) -> None:
    # Airflow splits a URI into host/port/schema; the URL must come back whole.
    monkeypatch.setenv("AIRFLOW_CONN_SLUICE_WEBHOOK", webhook.url)
    assert send_alert(alert) == ["webhook"]
    assert [r.path for r in webhook.requests] == ["/hook"]


def test_smtp_sends_email(monkeypatch: pytest.MonkeyPatch, smtp_server: SmtpServer, alert: Alert) -> None:
    set_smtp(monkeypatch, smtp_server.port)
    assert send_alert(alert) == ["smtp"]
    assert len(smtp_server.mails) == 1
    mail = smtp_server.mails[0]
    assert mail.mail_from == "sluice@example.com"
    assert mail.rcpt_to == ["oncall@example.com", "data@example.com"]
    subject = mail.message["Subject"]
    assert "ad_clicks_hourly" in subject
    assert "2024-05-01 10:00-11:00" in subject
    body = mail.text()
    assert "ad_clicks_hourly" in body
    assert "2024-05-01T10:00:00Z" in body and "2024-05-01T11:00:00Z" in body
    assert "completeness:impressions" in body and "gold=10 bronze=12" in body
    assert "&gt; 0.01" in body  # observed values are escaped, not markup
    assert 'href="https://airflow.example.com/sluice/docs/index.html"' in body


def test_smtp_defaults_sender_is_recipient(monkeypatch: pytest.MonkeyPatch, smtp_server: SmtpServer,
                                           alert: Alert) -> None:
    # A bare relay connection (URI form, no extras) must work: plain SMTP, default sender and recipient.
    monkeypatch.setenv("AIRFLOW_CONN_SLUICE_SMTP", f"smtp://127.0.0.1:{smtp_server.port}")
    assert send_alert(alert) == ["smtp"]
    (mail,) = smtp_server.mails
    assert mail.mail_from.startswith("sluice@")
    assert mail.rcpt_to == [mail.mail_from]


def test_both_channels_deliver_exactly_once(monkeypatch: pytest.MonkeyPatch, webhook: WebhookServer,
                                            smtp_server: SmtpServer, alert: Alert) -> None:
    set_webhook(monkeypatch, webhook.url)
    set_smtp(monkeypatch, smtp_server.port)
    assert configured_channels() == ["webhook", "smtp"]
    assert send_alert(alert) == ["webhook", "smtp"]
    assert len(webhook.requests) == 1
    assert len(smtp_server.mails) == 1


def test_no_channel_warns_and_succeeds(caplog: pytest.LogCaptureFixture, alert: Alert) -> None:
    with caplog.at_level(logging.WARNING, logger="sluice.alerts"):
        assert send_alert(alert) == []
    assert configured_channels() == []
    warning = [r for r in caplog.records if r.name == "sluice.alerts" and r.levelno == logging.WARNING]
    assert warning and "went nowhere" in warning[0].getMessage()
    assert alert.message in warning[0].getMessage()


def test_webhook_500_does_not_stop_smtp(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
                                        webhook: WebhookServer, smtp_server: SmtpServer, alert: Alert) -> None:
    webhook.status = 500
    set_webhook(monkeypatch, webhook.url)
    set_smtp(monkeypatch, smtp_server.port)
    with caplog.at_level(logging.ERROR, logger="sluice.alerts"):
        assert send_alert(alert) == ["smtp"]
    assert len(webhook.requests) == 1  # tried once, not retried
    assert len(smtp_server.mails) == 1
    errors = [r.getMessage() for r in caplog.records if r.name == "sluice.alerts" and r.levelno >= logging.ERROR]
    assert any("NOT DELIVERED via webhook" in m and "HTTP 500" in m for m in errors)
    assert any("FAILED via webhook" in m for m in errors)


def test_unreachable_smtp_does_not_stop_webhook(monkeypatch: pytest.MonkeyPatch, webhook: WebhookServer,
                                                smtp_server: SmtpServer, alert: Alert) -> None:
    port = smtp_server.port
    smtp_server.shutdown()
    smtp_server.server_close()  # nothing listens on the port any more: connection refused
    set_webhook(monkeypatch, webhook.url)
    set_smtp(monkeypatch, port)
    assert send_alert(alert) == ["webhook"]
    assert len(webhook.requests) == 1


def test_login_without_starttls_is_refused(monkeypatch: pytest.MonkeyPatch, smtp_server: SmtpServer,
                                           alert: Alert) -> None:
    # A password is never sent in clear unless the connection says disable_tls explicitly.
    set_smtp(monkeypatch, smtp_server.port, login="user", password="secret")
    assert send_alert(alert) == []
    assert smtp_server.mails == []


def test_malformed_connection_is_reported(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
                                          alert: Alert) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_SLUICE_WEBHOOK", '{"conn_type": "http", "host": ')
    with caplog.at_level(logging.ERROR, logger="sluice.alerts"):
        assert send_alert(alert) == []
    assert configured_channels() == ["webhook"]  # meant to be on: a broken channel, not an absent one
    errors = [r.getMessage() for r in caplog.records if r.name == "sluice.alerts" and r.levelno >= logging.ERROR]
    assert any("AIRFLOW_CONN_SLUICE_WEBHOOK is set but" in m for m in errors)
    assert any("FAILED via webhook" in m for m in errors)


def test_notifier_as_task_callback(monkeypatch: pytest.MonkeyPatch, webhook: WebhookServer) -> None:
    # How a DAG uses it: on_failure_callback=SluiceWebhookNotifier(); Airflow calls notifier(context).
    set_webhook(monkeypatch, webhook.url)
    ti = SimpleNamespace(dag_id="ad_clicks_hourly", task_id="quality", run_id="manual__1",
                         state=TaskInstanceState.FAILED)
    SluiceWebhookNotifier()({"ti": ti, "run_id": "manual__1", "exception": ValueError("bad\ninput")})
    (request,) = webhook.requests
    body = request.json()
    assert body["event"] == "sluice.task_callback"
    assert body["message"] == "sluice: Airflow task ad_clicks_hourly.quality (run manual__1) failed: bad input"


def test_fresh_process_with_only_env_vars(tmp_path: Path, webhook: WebhookServer, smtp_server: SmtpServer) -> None:
    """As the ``sluice`` CLI runs: a new process, an empty AIRFLOW_HOME, no reachable DB or API server."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "_AIRFLOW"))}
    env.update(
        AIRFLOW_HOME=str(tmp_path / "airflow"),
        # Any attempt to use them would fail (no such directory; nothing listens on port 9).
        AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{tmp_path}/no-such-dir/airflow.db",
        AIRFLOW__CORE__EXECUTION_API_SERVER_URL="http://127.0.0.1:9/execution/",
        AIRFLOW_CONN_SLUICE_WEBHOOK=json.dumps({"conn_type": "http", "host": webhook.url}),
        AIRFLOW_CONN_SLUICE_SMTP=json.dumps({"conn_type": "smtp", "host": "127.0.0.1", "port": smtp_server.port}),
    )
    script = (
        "from datetime import datetime, UTC\n"
        "from sluice.alerting.notifiers import Alert, send_alert\n"
        "a = Alert('ad_clicks_hourly', datetime(2024, 5, 1, 10), datetime(2024, 5, 1, 11),\n"
        "          [{'expectation': 'validity:ctr', 'observed_value': '1.5'}], None, datetime.now(UTC))\n"
        "print(','.join(send_alert(a)))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=90,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "webhook,smtp", done.stderr
    assert len(webhook.requests) == 1 and len(smtp_server.mails) == 1
    assert not (tmp_path / "no-such-dir").exists()


# -- connection conventions --------------------------------------------------------------------------------


def _hook(**conn: Any) -> SluiceSmtpHook:
    hook = SluiceSmtpHook(smtp_conn_id="sluice_smtp")
    hook.smtp_connection = Connection(conn_id="sluice_smtp", conn_type="smtp", host="mail", **conn)
    return hook


@pytest.mark.parametrize(
    ("conn", "ssl", "starttls"),
    [
        ({"port": 1025}, False, False),
        ({"port": 25}, False, False),
        ({}, False, False),
        ({"port": 465}, True, False),
        ({"port": 587}, False, True),
        ({"port": 25, "login": "u", "password": "p"}, False, True),
        ({"port": 25, "login": "u", "extra": json.dumps({"disable_tls": "true"})}, False, False),
        ({"port": 587, "extra": json.dumps({"disable_tls": "false"})}, False, True),
        ({"port": 2525, "extra": json.dumps({"disable_ssl": False})}, True, False),
        ({"port": 465, "extra": json.dumps({"disable_ssl": "true"})}, False, False),
    ],
)
def test_smtp_tls_conventions(conn: dict[str, Any], ssl: bool, starttls: bool) -> None:
    hook = _hook(**conn)
    assert (hook.use_ssl, hook.smtp_starttls) == (ssl, starttls)
    assert hook.smtp_retry_limit == 0


def test_webhook_url_forms() -> None:
    full = Connection(conn_id="w", conn_type="http", host="https://hooks.example.com/a/b?x=1")
    assert webhook_url(full) == "https://hooks.example.com/a/b?x=1"
    split = Connection(conn_id="w", conn_type="https", host="hooks.example.com", port=8443, schema="a/b")
    assert webhook_url(split) == "https://hooks.example.com:8443/a/b"
