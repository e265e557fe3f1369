"""Every DAG run end to end with ``dag.test()`` (the Airflow 3 SDK way; what ``airflow dags test`` does) on
generated data: the Spark tasks run pyspark's own spark-submit in local mode (no ``spark_default`` is defined),
SLUICE_HOME and SLUICE_NOW come from the environment, and alerts reach a real HTTP server and a real SMTP server
on 127.0.0.1. Nothing is mocked."""

from __future__ import annotations

import json
import os
import shutil
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from sluice.core.windows import Window
from sluice_tools.generate import GenerateOptions, generate
from support.lake import read_rows
from support.logs import logged
from support.servers import (
    SmtpServer,
    WebhookServer,
    smtp_server_fixture,  # noqa: F401 (pytest fixture ``smtp_server``)
    webhook_fixture,  # noqa: F401 (pytest fixture ``webhook``)
)

START = datetime(2024, 5, 1, tzinfo=UTC)
HOUR = timedelta(hours=1)

PROXIES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")

# Every dag.test() needs its own logical date in the shared metadata DB.
_LOGICAL = iter(datetime(2025, 1, 1, tzinfo=UTC) + timedelta(hours=i) for i in range(10_000))


def logical_date() -> datetime:
    return next(_LOGICAL)


# ------------------------------------------------------------------------------------------------ helpers
def rows(home: Path, table: str) -> list[dict[str, Any]]:
    path = home / "lake" / table
    if not DeltaTable.is_deltatable(str(path)):
        return []
    return read_rows(path)


def utc(value: datetime) -> datetime:
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def window(row: dict[str, Any]) -> Window:
    return (utc(row["window_start"]), utc(row["window_end"]))


def ledger(home: Path, pipeline: str) -> dict[Window, str]:
    out = {}
    for r in rows(home, "ops/window_ledger"):
        if r["pipeline"] == pipeline:
            assert window(r) not in out, f"two ledger rows for {window(r)}"
            out[window(r)] = r["state"]
    return out


def sorted_rows(home: Path, table: str) -> list[tuple[Any, ...]]:
    return sorted(tuple(sorted(r.items())) for r in rows(home, table))


def delta_version(home: Path, table: str) -> int:
    return DeltaTable(str(home / "lake" / table)).version()


def task_states(dag_run: Any) -> dict[str, str]:
    return {ti.task_id: str(getattr(ti.state, "value", ti.state)) for ti in dag_run.get_task_instances()}


def run_state(dag_run: Any) -> str:
    return str(getattr(dag_run.state, "value", dag_run.state))


def hours(n: int) -> list[Window]:
    return [(START + i * HOUR, START + (i + 1) * HOUR) for i in range(n)]


def rfc3339(value: datetime) -> str:
    return value.isoformat().replace("+00:00", "Z")


def assert_dq_recorded(home: Path, pipeline: str, windows: list[Window], *, success: bool | None = True) -> None:
    dq = [r for r in rows(home, "ops/dq_results") if r["pipeline"] == pipeline]
    by_window = Counter(window(r) for r in dq)
    assert set(by_window) == set(windows), f"dq_results windows {sorted(by_window)} != {windows}"
    expectations = {r["expectation"] for r in dq}
    assert len(expectations) >= 3, expectations  # completeness, validity and lateness at least
    if success is not None:
        failing = [(window(r), r["expectation"], r["observed_value"]) for r in dq if r["success"] is not success]
        assert not failing, failing


# ------------------------------------------------------------------------------------------------ tests
@dataclass
class ScheduledRun:
    home: Path
    now: datetime
    dag_run: Any
    orchestration_log: list[str]
    quiet_run: Any  # a second run at the same clock, with nothing new landed
    # A copy of ``home`` as the two runs left it, for the maintenance DAG: the backfill test rewrites ``home``
    # (one commit per gold table, nothing left to compact), and maintenance must not touch what the others read.
    snapshot: Path


@pytest.fixture(scope="module")
def ad_clicks_scheduled(tmp_path_factory: pytest.TempPathFactory, run_dag: Callable[..., Any]) -> ScheduledRun:
    """One scheduled ad_clicks_hourly run on two hours of data, shared by the scheduled-run test, the backfill
    DAG test that follows it and (on a copy) the maintenance DAG test (a Spark DAG run costs minutes)."""
    home = tmp_path_factory.mktemp("ad-clicks-dag") / "sluice-home"
    now = START + 4 * HOUR
    with pytest.MonkeyPatch.context() as mp:
        for name in list(os.environ):
            if name.startswith(("SLUICE_", "AIRFLOW_CONN_")) or name in PROXIES:
                mp.delenv(name)
        mp.setenv("SLUICE_HOME", str(home))
        mp.setenv("SLUICE_NOW", rfc3339(now))
        # The run streams (no batch close of small cycles): its gold is written in several commits, which the
        # maintenance test then compacts.
        mp.setenv("SLUICE_BATCH_CLOSE_ROWS", "0")
        options = GenerateOptions(hours=2, impressions_per_hour=300, streams=("impressions", "clicks"))
        generate(home / "landing", options)
        with logged("sluice.orchestration") as messages:  # sluice's Airflow glue, run in-process
            dag_run = run_dag("ad_clicks_hourly", logical_date())
            quiet_run = run_dag("ad_clicks_hourly", logical_date())
    snapshot = tmp_path_factory.mktemp("ad-clicks-snapshot") / "sluice-home"
    shutil.copytree(home, snapshot)
    return ScheduledRun(home, now, dag_run, messages, quiet_run, snapshot)


def asset_events(run: Any) -> list[tuple[str, str | None, tuple[str, ...], dict[str, Any]]]:
    """(asset uri, source task, source aliases, extra) of every Asset event a DAG run emitted."""
    from airflow.models.asset import AssetEvent
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        events = session.scalars(select(AssetEvent).where(AssetEvent.source_run_id == run.run_id)).all()
        return sorted((e.asset.uri, e.source_task_id, tuple(a.name for a in e.source_aliases), dict(e.extra))
                      for e in events)


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_ad_clicks_hourly_dag_run(ad_clicks_scheduled: ScheduledRun) -> None:
    """The scheduled DAG fills both gold tables, the ledger (validated windows), DQ results and Data Docs."""
    home, run = ad_clicks_scheduled.home, ad_clicks_scheduled.dag_run
    windows = hours(2)
    assert task_states(run) == {
        "choose_path": "success", "run_cycle": "success", "check_quality": "success",
        "reprocess_interval": "skipped", "send_alerts": "success",
    }
    assert run_state(run) == "success"

    gold = rows(home, "gold/ad_clicks_hourly")
    assert {window(r) for r in gold} == set(windows)
    assert sum(r["impressions"] for r in gold) >= 500  # ~300 impressions an hour were generated
    assert sum(r["clicks"] for r in gold) > 0
    assert all(0 <= r["ctr"] <= 1 for r in gold)
    assert rows(home, "gold/unmatched_clicks_hourly"), "unknown-impression clicks must be counted"
    assert ledger(home, "ad_clicks_hourly") == {w: "validated" for w in windows}
    assert_dq_recorded(home, "ad_clicks_hourly", windows)
    assert (home / "lake" / "_data_docs" / "index.html").is_file()
    assert rows(home, "ops/alerts") == []
    # SLUICE_NOW, set in the environment, wins over the run's data interval (issue 11): the idle streams'
    # heartbeats sit at SLUICE_NOW - 30 min (2024), where the interval's clock (2025) would have put them a year on.
    beats = {utc(r["max_event_time"]) for r in rows(home, "ops/ingest_batches") if r["is_heartbeat"]}
    assert beats == {ad_clicks_scheduled.now - timedelta(minutes=30)}, beats
    # One Spark application per run (issue 13): run_cycle validated what it closed; check_quality had
    # nothing left and did not start Spark.
    log = ad_clicks_scheduled.orchestration_log
    assert any("nothing to check, Spark not started" in m for m in log), log

    # Issue 29 section 5: one Asset event per gold table, carrying the windows the cycle closed, their rows
    # and states; the next run, which closed nothing, emits none.
    events = asset_events(run)
    assert [(uri, task, aliases) for uri, task, aliases, _ in events] == [
        ("sluice://gold/ad_clicks_hourly", "run_cycle", ("sluice_ad_clicks_hourly_gold",)),
        ("sluice://gold/unmatched_clicks_hourly", "run_cycle", ("sluice_ad_clicks_hourly_gold",))]
    extra = events[0][3]
    assert events[1][3] == extra
    assert (extra["pipeline"], extra["window_count"], extra["states"]) == ("ad_clicks_hourly", 2, {"validated": 2})
    assert [(w["window_start"], w["state"]) for w in extra["windows"]] == [
        (rfc3339(start), "validated") for start, _end in windows]
    assert extra["rows"] == sum(w["rows"] for w in extra["windows"]) == len(gold) + len(
        rows(home, "gold/unmatched_clicks_hourly"))
    # The ledger names the Airflow task that closed and validated each window (the ledger page links them).
    for r in rows(home, "ops/window_ledger"):
        for recorded in (r["closed_by"], r["validated_by"]):
            task = json.loads(recorded)
            assert (task["dag_id"], task["run_id"], task["task_id"]) == ("ad_clicks_hourly", run.run_id, "run_cycle")
    quiet = ad_clicks_scheduled.quiet_run
    assert task_states(quiet)["run_cycle"] == "success" and run_state(quiet) == "success"
    assert asset_events(quiet) == []
    assert any("ad_clicks_hourly: no window's gold changed: no asset event" in m for m in log), log


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.usefixtures("spark")  # the cycle that skips its checks runs on it
def test_check_quality_validates_the_windows_a_cycle_left_unchecked(
    sluice_home: Any, run_dag: Callable[..., Any]
) -> None:
    """A cycle that closed windows without checking them (here ``sluice run --skip-quality``; in production a
    run_cycle that failed after its close) leaves them ``closed``; the next DAG run's check_quality finds
    them in the ledger and validates them in its own Spark application."""
    from sluice.cli.main import main

    home = sluice_home.home
    sluice_home.generate(GenerateOptions(hours=2, events_per_hour=200, streams=("events",)))
    # The CLI's command in this process, on the suite's Spark session: what matters here is the ledger it
    # leaves, and a cold JVM would cost the suite a minute.
    assert main(["run", "user_activity_hourly", "--skip-quality"]) == 0
    assert ledger(home, "user_activity_hourly") == {w: "closed" for w in hours(2)}

    run = run_dag("user_activity_hourly", logical_date(), mark_success_pattern="^run_cycle$")
    assert task_states(run) == {
        "choose_path": "success", "run_cycle": "success", "check_quality": "success",
        "reprocess_interval": "skipped", "send_alerts": "success",
    }
    assert run_state(run) == "success"
    assert ledger(home, "user_activity_hourly") == {w: "validated" for w in hours(2)}
    assert_dq_recorded(home, "user_activity_hourly", hours(2))


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_backfill_dag_after_a_scheduled_run(
    ad_clicks_scheduled: ScheduledRun, run_dag: Callable[..., Any], monkeypatch: pytest.MonkeyPatch, clean_env: None
) -> None:
    """The backfill DAG rewrites the range (identical content: no late data brought in), re-runs DQ and marks
    the windows ``reprocessed``."""
    home = ad_clicks_scheduled.home
    monkeypatch.setenv("SLUICE_HOME", str(home))
    monkeypatch.setenv("SLUICE_NOW", rfc3339(ad_clicks_scheduled.now))
    windows = hours(2)
    gold_before = {t: sorted_rows(home, t) for t in ("gold/ad_clicks_hourly", "gold/unmatched_clicks_hourly")}
    versions_before = {t: delta_version(home, t) for t in (*gold_before, "ops/dq_results", "ops/window_ledger")}

    conf = {"pipeline": "ad_clicks_hourly", "start": rfc3339(START), "end": rfc3339(START + 2 * HOUR),
            "include_late": False}
    backfill = run_dag("sluice_backfill", logical_date(), run_conf=conf)
    assert task_states(backfill) == {"validate_params": "success", "backfill": "success", "send_alerts": "success",
                                     "check_quality": "success"}
    assert run_state(backfill) == "success"

    assert ledger(home, "ad_clicks_hourly") == {w: "reprocessed" for w in windows}
    for table, before in gold_before.items():
        assert sorted_rows(home, table) == before, f"{table}: a backfill without late data changed the content"
    for table, version in versions_before.items():
        assert delta_version(home, table) > version, f"{table} was not rewritten by the backfill"
    assert_dq_recorded(home, "ad_clicks_hourly", windows)

    # Issue 11: the backfill emits an Asset event for each gold table of the chosen pipeline, with its range
    # and the windows' states, and nothing for the other pipelines' gold tables (their DAGs declare them too).
    extra = {"pipeline": "ad_clicks_hourly", "start": rfc3339(START), "end": rfc3339(START + 2 * HOUR),
             "include_late": "false", "window_count": len(windows), "states": {"reprocessed": len(windows)}}
    emitted = [(uri, task, aliases, {k: e[k] for k in extra}) for uri, task, aliases, e in asset_events(backfill)]
    assert emitted == [(f"sluice://gold/{table}", "backfill", ("sluice_backfill_gold",), extra)
                       for table in ("ad_clicks_hourly", "unmatched_clicks_hourly")], emitted


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_maintenance_dag_compacts_the_lake_without_changing_what_its_tables_hold(
    ad_clicks_scheduled: ScheduledRun, run_dag: Callable[..., Any], monkeypatch: pytest.MonkeyPatch, clean_env: None
) -> None:
    """sluice_maintenance (compact, vacuum, clean_checkpoints) on the tables a scheduled run wrote - a copy of the
    ad_clicks_hourly home, since a cycle of its own would cost one Spark DAG run more: it bin-packs the gold table
    the cycle wrote in several commits, and no table's rows change."""
    home = ad_clicks_scheduled.snapshot
    monkeypatch.setenv("SLUICE_HOME", str(home))
    monkeypatch.setenv("SLUICE_NOW", rfc3339(ad_clicks_scheduled.now))
    # Maintenance goes table by table, some seconds for each table Spark writes: the copy keeps the bronze, gold
    # and ops tables (four of Spark's, as many as one stream's lake has) and drops the dlq and quarantine ones,
    # which delta-spark compacts and vacuums exactly as it does bronze.
    for layer in ("dlq", "quarantine"):
        shutil.rmtree(home / "lake" / layer)
    tables = sorted(str(log.parent.relative_to(home / "lake")) for log in (home / "lake").glob("*/*/_delta_log"))
    assert tables == ["bronze/clicks", "bronze/impressions", "gold/ad_clicks_hourly", "gold/unmatched_clicks_hourly",
                      "ops/alerts", "ops/dq_results", "ops/ingest_batches", "ops/window_ledger"], tables
    before = {t: sorted_rows(home, t) for t in tables}
    assert before["gold/ad_clicks_hourly"] and before["bronze/impressions"] and before["bronze/clicks"]
    gold_version = delta_version(home, "gold/ad_clicks_hourly")

    maintenance = run_dag("sluice_maintenance", logical_date())
    assert task_states(maintenance) == {"compact": "success", "vacuum": "success", "clean_checkpoints": "success"}
    assert run_state(maintenance) == "success"
    # Housekeeping never changes what the tables hold, ...
    for table, rows_before in before.items():
        assert sorted_rows(home, table) == rows_before, f"{table}: maintenance changed the content"
    # ... also where it rewrote the files (without a rewrite, the comparison above would prove nothing).
    history = DeltaTable(str(home / "lake" / "gold/ad_clicks_hourly")).history()
    assert "OPTIMIZE" in [c["operation"] for c in history if c["version"] > gold_version], history


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_failing_windows_alert_through_webhook_and_smtp(
    sluice_home: Any, run_dag: Callable[..., Any], webhook: WebhookServer, smtp_server: SmtpServer
) -> None:
    """SPEC 5: a window that fails DQ raises one alert (webhook + email via the Airflow connections), gets an
    ops/alerts row and is ``failed`` in the ledger; send_alerts delivers it and the run's check_quality task fails,
    so Airflow shows the outcome where a data check's failure belongs (issue 53)."""
    home = sluice_home.home
    sluice_home.generate(GenerateOptions(hours=2, events_per_hour=200, late_share=0.03, streams=("events",)))
    sluice_home.setenv("SLUICE_LATENESS_THRESHOLD", "0")  # any DLQ record fails its window
    sluice_home.setenv("AIRFLOW_CONN_SLUICE_WEBHOOK", json.dumps({"conn_type": "http", "host": webhook.url}))
    sluice_home.setenv("AIRFLOW_CONN_SLUICE_SMTP", json.dumps({
        "conn_type": "smtp", "host": "127.0.0.1", "port": smtp_server.port,
        "extra": {"from_email": "sluice@example.com", "to": "oncall@example.com", "timeout": 10},
    }))

    run = run_dag("user_activity_hourly", logical_date())
    assert task_states(run) == {
        "choose_path": "success", "run_cycle": "success", "check_quality": "failed",
        "reprocess_interval": "skipped", "send_alerts": "success",
    }
    assert run_state(run) == "failed"

    closed = ledger(home, "user_activity_hourly")
    assert set(closed) == set(hours(2))
    # The run's own run_cycle (not marked successful, as in the check_quality test) ingested the events and wrote
    # gold for every hour, failing or not: the checks judge the gold that was written.
    assert rows(home, "bronze/events")
    gold = rows(home, "gold/user_activity_hourly")
    assert {window(r) for r in gold} == set(hours(2))
    assert all(r["user_id"] and r["avg_events_per_10min"] >= 1 for r in gold)
    late_windows = {
        w for w in closed for r in rows(home, "dlq/events") if w[0] <= utc(r["event_time"]) < w[1]
    }
    assert late_windows, "the generated data must put late records into a closed window"
    failed = {w for w, state in closed.items() if state == "failed"}
    assert failed == late_windows
    assert all(state == "validated" for w, state in closed.items() if w not in failed)

    # Exactly one POST per failing window, with pipeline, window and the failed expectation.
    posts = webhook.posts()
    assert len(posts) == len(failed), posts
    assert {(datetime.fromisoformat(p["window_start"]), datetime.fromisoformat(p["window_end"])) for p in posts} \
        == failed
    for post in posts:
        assert post["pipeline"] == "user_activity_hourly"
        names = [f["expectation"] for f in post["failed"]]
        assert any("lateness" in n for n in names), names
        assert "user_activity_hourly" in post["message"]

    # One email per failing window, to the connection's recipient.
    assert len(smtp_server.mails) == len(failed)
    for mail in smtp_server.mails:
        assert mail.rcpt_to == ["oncall@example.com"]
        assert "user_activity_hourly" in mail.message["Subject"]
        assert "lateness" in mail.text()
    subjects = sorted(m.message["Subject"] for m in smtp_server.mails)
    assert subjects == sorted({s for s in subjects}), "an alert was emailed twice"

    alerts = [r for r in rows(home, "ops/alerts") if r["pipeline"] == "user_activity_hourly"]
    assert sorted(window(r) for r in alerts) == sorted(failed)
    assert all(r["message"] and r["raised_at"] for r in alerts)
    assert {r["channels"] for r in alerts} == {"webhook,smtp"}, "alerts must be marked delivered"
    dq_failed = {window(r) for r in rows(home, "ops/dq_results") if not r["success"]}
    assert dq_failed == failed

    # Delivered exactly once: nothing is left pending for a re-run of the alert step.
    from sluice.quality.checker import deliver_pending_alerts

    assert deliver_pending_alerts(sluice_home.settings, "user_activity_hourly") == []
    assert len(webhook.requests) == len(failed)


BAD_CONFS = {
    "reversed": {"pipeline": "ad_clicks_hourly", "start": "2024-05-01T02:00:00Z", "end": "2024-05-01T01:00:00Z"},
    "empty": {"pipeline": "ad_clicks_hourly", "start": "2024-05-01T01:00:00Z", "end": "2024-05-01T01:00:00Z"},
    "misaligned": {"pipeline": "user_activity_hourly", "start": "2024-05-01T00:30:00Z",
                   "end": "2024-05-01T02:00:00Z"},
    "unknown_pipeline": {"pipeline": "no_such_pipeline", "start": "2024-05-01T00:00:00Z",
                         "end": "2024-05-01T01:00:00Z"},
    "not_a_timestamp": {"pipeline": "ad_clicks_hourly", "start": "yesterday", "end": "2024-05-01T01:00:00Z"},
}


@pytest.mark.timeout(600)
@pytest.mark.parametrize("case", sorted(BAD_CONFS))
def test_backfill_dag_refuses_bad_params_before_spark(
    case: str, sluice_home: Any, run_dag: Callable[..., Any]
) -> None:
    """Bad params never reach the backfill task: either Airflow's param validation refuses the run, or the
    validate_params task fails, alerts (as every task that fails does), and the Spark task never runs."""
    from airflow.sdk.exceptions import ParamValidationError

    home = sluice_home.home
    sluice_home.set_now(START + 6 * HOUR)
    conf = {**BAD_CONFS[case], "include_late": False}
    try:
        run = run_dag("sluice_backfill", logical_date(), run_conf=conf)
    except ParamValidationError as exc:
        assert case in ("unknown_pipeline", "not_a_timestamp"), f"valid-looking params refused by Airflow: {exc}"
        assert "pipeline" in str(exc) or "start" in str(exc)
    else:
        assert run_state(run) == "failed"
        states = task_states(run)
        assert states["validate_params"] == "failed"
        assert states["backfill"] == "upstream_failed", "the Spark task ran despite bad params"
        # Its one trace in the lake is the task_failure alert of validate_params.
        [alert] = rows(home, "ops/alerts")
        assert (alert["kind"], alert["pipeline"]) == ("task_failure", conf["pipeline"]), alert
        assert "task:sluice_backfill.validate_params" in alert["failed_expectations"], alert
        assert sorted(p.name for p in (home / "lake").iterdir()) == ["ops"]
        assert sorted(p.name for p in (home / "lake" / "ops").iterdir()) == ["alerts"]
        return
    assert not (home / "lake").exists(), "bad params must be refused before any Spark work"
