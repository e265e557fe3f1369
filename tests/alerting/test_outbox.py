"""The ops/alerts outbox against a real HTTP server on 127.0.0.1 and a real Delta table: recorded once per
key, delivered once, kept pending while every channel fails. No Spark is involved (delta-rs only)."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from sluice.alerting.alert import CORRECTION, DQ_FAILURE, Alert
from sluice.alerting.outbox import deliver_pending, raise_alert, read_outbox, record_alerts
from sluice.config import Settings, load_settings
from support.lake import read_rows
from support.servers import WebhookServer, webhook_fixture  # noqa: F401 (pytest fixture ``webhook``)

pytestmark = pytest.mark.timeout(120)

T0 = datetime(2024, 5, 1, 10, tzinfo=UTC)
T1 = datetime(2024, 5, 1, 11, tzinfo=UTC)
RAISED = datetime(2024, 5, 1, 12, 5, tzinfo=UTC)


@pytest.fixture
def settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    for name in ("AIRFLOW_CONN_SLUICE_WEBHOOK", "AIRFLOW_CONN_SLUICE_SMTP"):
        monkeypatch.delenv(name, raising=False)
    return load_settings({}, home=tmp_path)


def failure(attempt: int = 1, *, kind: str = DQ_FAILURE) -> Alert:
    return Alert("orders_hourly", T0, T1, [{"expectation": "completeness:orders", "observed_value": "9 != 10"}],
                 "https://airflow.example.com/sluice/docs/index.html", RAISED, kind=kind, attempt=attempt)


def use_webhook(monkeypatch: pytest.MonkeyPatch, webhook: WebhookServer) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_SLUICE_WEBHOOK", json.dumps({"conn_type": "http", "host": webhook.url}))


def test_an_alert_is_recorded_once_per_key_and_delivered_once(
    settings: Settings, webhook: WebhookServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_webhook(monkeypatch, webhook)
    assert record_alerts(settings, [failure()]) == [failure()]
    assert record_alerts(settings, [failure()]) == []  # a retried task: the same key, nothing new
    [row] = read_outbox(settings)
    assert row["channels"] == "pending" and row["kind"] == DQ_FAILURE and row["attempt"] == 1
    assert row["alert_id"] == "orders_hourly/2024-05-01T10:00:00Z/2024-05-01T11:00:00Z/dq_failure/1"

    delivered = deliver_pending(settings, "orders_hourly")
    assert [a.alert_id for a in delivered.delivered] == [row["alert_id"]]
    [post] = webhook.posts()
    assert post["alert_id"] == row["alert_id"] and post["level"] == "error"
    assert post["docs_url"] == "https://airflow.example.com/sluice/docs/index.html"
    [row] = read_outbox(settings)
    assert row["channels"] == "webhook" and row["delivered_at"] is not None

    # Delivering again, or recording the delivered alert again, sends nothing.
    assert deliver_pending(settings, "orders_hourly").delivered == []
    assert raise_alert(settings, failure(), deliver=True) == []
    assert len(webhook.requests) == 1
    # A later validation round of the same window is a new alert.
    assert raise_alert(settings, failure(attempt=2), deliver=True) == ["webhook"]
    assert len(webhook.requests) == 2 and len(read_outbox(settings)) == 2


def test_an_alert_every_channel_failed_stays_pending_until_delivered(
    settings: Settings, webhook: WebhookServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_webhook(monkeypatch, webhook)
    webhook.status = 500
    assert raise_alert(settings, failure(), deliver=True) == []
    report = deliver_pending(settings, "orders_hourly")
    assert report.delivered == [] and [a.alert_id for a in report.undelivered] == [failure().alert_id]
    assert [r["channels"] for r in read_outbox(settings)] == ["pending"]
    webhook.status = 200
    assert [a.alert_id for a in deliver_pending(settings, "orders_hourly").delivered] == [failure().alert_id]
    assert [r["channels"] for r in read_outbox(settings)] == ["webhook"]
    assert len(webhook.requests) == 3  # two failed attempts, one delivery


def test_with_no_channel_an_alert_is_marked_none_and_notices_are_info(settings: Settings) -> None:
    notice = failure(kind=CORRECTION)
    raise_alert(settings, notice, deliver=True)
    [row] = read_outbox(settings)
    assert row["channels"] == "none" and row["level"] == "info" and row["kind"] == CORRECTION
    assert notice.message.startswith("sluice: orders_hourly window 2024-05-01 10:00-11:00 UTC corrected")


def test_an_older_alerts_table_gains_the_outbox_columns(settings: Settings, webhook: WebhookServer,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    import pyarrow as pa
    from deltalake import write_deltalake

    path = settings.lake.local() / "ops" / "alerts"
    old = pa.schema([("pipeline", pa.string()), ("window_start", pa.timestamp("us", tz="UTC")),
                     ("window_end", pa.timestamp("us", tz="UTC")), ("raised_at", pa.timestamp("us", tz="UTC")),
                     ("message", pa.string()), ("channels", pa.string()), ("failed_expectations", pa.string())])
    row = {"pipeline": "orders_hourly", "window_start": T0, "window_end": T1, "raised_at": RAISED,
           "message": failure().message, "channels": "pending", "failed_expectations": "[]"}
    write_deltalake(str(path), pa.Table.from_pylist([row, row], schema=old))
    use_webhook(monkeypatch, webhook)
    assert len(deliver_pending(settings, "orders_hourly").delivered) == 1  # the duplicate rows are one alert
    rows = read_rows(path)
    assert len(rows) == 1 and rows[0]["channels"] == "webhook" and rows[0]["kind"] == DQ_FAILURE
    assert len(webhook.requests) == 1


def test_recording_an_alert_does_not_load_airflow(tmp_path: Path) -> None:
    """Data quality records its failures in the outbox in the Spark application of a cycle or a backfill;
    Airflow (seconds to import) is loaded only by whoever delivers them. A cycle's summary of what became of
    its alerts (which names the connections) does not load it either."""
    script = (
        "import sys\n"
        "from datetime import UTC, datetime\n"
        "from sluice.alerting.alert import Alert\n"
        "from sluice.alerting.outbox import read_outbox, record_alerts\n"
        "from sluice.config import load_settings\n"
        "import sluice.quality.checker, sluice.quality.freshness, sluice.streaming.corrections\n"
        f"settings = load_settings({{}}, home={str(tmp_path)!r})\n"
        "t = datetime(2024, 5, 1, 10, tzinfo=UTC)\n"
        "record_alerts(settings, [Alert('p', t, t, [{'expectation': 'e', 'observed_value': 'v'}], None, t)])\n"
        "assert [r['channels'] for r in read_outbox(settings)] == ['pending']\n"
        "from sluice.alerting.outbox import AlertTally\n"
        "assert 'sluice_webhook' in AlertTally(unrouted=1).render()[0]\n"
        "print(sorted(m for m in sys.modules if m == 'airflow' or m.startswith('airflow.')))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_a_run_says_what_became_of_the_alerts_it_recorded(
    settings: Settings, webhook: WebhookServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 29 section 5: alerts recorded with no channel configured are said in one line, not lost in a log."""
    from sluice.alerting.outbox import alerts_recorded_since, outbox_snapshot

    before = outbox_snapshot(settings, "orders_hourly")
    for attempt in range(1, 8):
        raise_alert(settings, failure(attempt), deliver=True)
    tally = alerts_recorded_since(settings, "orders_hourly", before)
    assert (tally.sent, tally.unrouted, tally.pending) == (0, 7, 0)
    assert tally.render() == ["7 alerts recorded, no channel configured (sluice_webhook, sluice_smtp); "
                              "`sluice alerts --all` lists them"]

    # The next run: alerts recorded before it are not counted again; one pending, one sent.
    before = outbox_snapshot(settings, "orders_hourly")
    raise_alert(settings, failure(8), deliver=False)
    use_webhook(monkeypatch, webhook)
    raise_alert(settings, failure(kind=CORRECTION), deliver=False)
    deliver_pending(settings, "orders_hourly")
    raise_alert(settings, failure(9), deliver=False)
    tally = alerts_recorded_since(settings, "orders_hourly", before)
    assert (tally.sent, tally.unrouted, tally.pending) == (2, 0, 1)
    assert tally.render() == ["2 alerts recorded and sent",
                              "1 alert recorded, not delivered yet; `sluice alerts --deliver` sends them"]
