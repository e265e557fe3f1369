"""The `sluice` command line for people and for scripts (issue 12): help, --version, exit codes, --json,
errors without tracebacks, the status warning for a missing home, and `sluice alerts`. None of these tests
starts Spark."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from sluice.alerting.alert import Alert
from sluice.cli.main import main
from sluice.config import load_settings
from sluice.reports.status import status_data
from support.lake import read_rows
from support.servers import (
    WebhookServer,
    webhook_fixture,  # noqa: F401 (pytest fixture ``webhook``)
)
from support.shell import as_the_user, user_shell


def sluice(*args: str, home: Path | None = None, env: dict[str, str] | None = None,
           timeout: float = 120) -> subprocess.CompletedProcess[str]:
    environment = user_shell()
    if home is not None:
        environment["SLUICE_HOME"] = str(home)
    environment.update(env or {})
    return subprocess.run([sys.executable, "-m", "sluice.cli", *args], env=environment, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(autouse=True)
def _no_sluice_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """In-process main() reads the environment: nothing from the caller's shell leaks in."""
    as_the_user(monkeypatch)


def run_main(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``main(argv)`` in this process: (exit code, stdout, stderr); a SystemExit (usage, --help) is its code."""
    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


# -- help and version --------------------------------------------------------------------------------------


def test_help_is_written_for_users_with_examples_and_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_main(capsys, "--help")
    assert code == 0
    assert "``" not in out and "Airflow tasks call the same functions" not in out  # no developer docstring
    assert "examples:\n  sluice pipelines" in out
    # The examples name the pipeline of the guide (SPEC 8's device_temps), not one that exists nowhere.
    assert "sluice run device_temps --now 2024-05-01T07:00:00Z" in out and "orders" not in out
    codes = out[out.index("exit codes:"):]
    for line in ("0   done", "1   the command failed", "2   done, but some windows failed", "64  wrong usage"):
        assert line in codes
    assert "SLUICE_HOME" in out and "SLUICE_NOW" in out and "--json" in out
    assert "alerts" in out  # every command is listed, alerts included


@pytest.mark.parametrize("command", ["run", "backfill", "check", "status", "pipelines", "alerts"])
def test_each_command_has_examples_and_a_json_option(capsys: pytest.CaptureFixture[str], command: str) -> None:
    code, out, _ = run_main(capsys, command, "--help")
    assert code == 0
    assert "examples:\n  sluice " + command in out
    assert "--json" in out


def test_run_help_gives_its_exit_codes_and_where_undelivered_alerts_go(capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = run_main(capsys, "run", "--help")
    assert "exit codes:" in out and "2   some windows failed their checks" in out
    assert "sluice alerts --deliver" in " ".join(out.split())  # the command --no-deliver points to exists


def test_version_is_the_installed_distributions() -> None:
    result = sluice("--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"sluice {version('sluice')}"


# -- exit codes: usage errors are 64, never 2 (2 means "windows failed their checks") ------------------------


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        ([], "required: <command>"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
        (["run"], "required: pipeline"),
        (["run", "ad_clicks_hourly", "--nwo", "2024-05-01T00:00:00Z"], "unrecognized arguments: --nwo"),
        (["backfill", "ad_clicks_hourly", "--start", "2024-05-01T00:00:00Z"], "required: --end"),
        (["backfill", "ad_clicks_hourly", "--start", "2024-05-01T00:00:00Z", "--end", "2024-05-01T01:00:00Z",
          "--include-late", "maybe"], "expected true or false"),
    ],
)
def test_usage_errors_exit_64(capsys: pytest.CaptureFixture[str], tmp_path: Path, argv: list[str],
                              fragment: str) -> None:
    code, out, err = run_main(capsys, "--home", str(tmp_path / "home"), *argv)
    assert code == 64, err
    assert out == ""
    assert "usage: sluice" in err and fragment in err
    assert not (tmp_path / "home").exists()


def test_usage_error_exit_code_of_the_real_command(tmp_path: Path) -> None:
    result = sluice("run", home=tmp_path)
    assert result.returncode == 64
    assert "sluice run: error: the following arguments are required: pipeline" in result.stderr
    assert "see `sluice run --help`" in result.stderr


def test_global_options_also_work_after_the_command(tmp_path: Path) -> None:
    home = tmp_path / "elsewhere"
    home.mkdir()
    result = sluice("status", "--home", str(home), "--json", home=tmp_path / "not-this-one")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["home"] == str(home)


# -- status: a home that does not exist is a warning, not silence ------------------------------------------


def test_status_on_a_missing_home_warns_naming_the_path_and_still_reports(tmp_path: Path) -> None:
    home = tmp_path / "typo"
    result = sluice("status", home=home)
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if line.startswith("sluice: warning: ")]
    assert len(warnings) == 1, result.stderr
    assert f"SLUICE_HOME {home} does not exist" in warnings[0]
    assert "set SLUICE_HOME or pass --home" in warnings[0]
    assert "streams (where every line went)" in result.stdout  # what it can still say
    assert not home.exists()  # status never creates the home
    home.mkdir()
    again = sluice("status", home=home)
    assert again.returncode == 0 and "warning" not in again.stderr, again.stderr


# -- --json --------------------------------------------------------------------------------------------------

STATUS_KEYS = ["now", "home", "home_exists", "lake", "landing", "pipelines_path", "warnings", "streams", "substreams",
               "pipelines", "failed_windows", "unreadable_files", "older_definitions", "load_errors", "tables"]


def test_status_json_is_one_document_with_stable_keys(tmp_path: Path) -> None:
    home = tmp_path / "missing"
    result = sluice("status", "--json", home=home, env={"SLUICE_NOW": "2024-05-01T07:00:00+02:00"})
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)  # the whole of stdout is one JSON document
    assert list(doc) == STATUS_KEYS
    assert doc["now"] == "2024-05-01T05:00:00Z"  # RFC 3339, UTC
    assert doc["home"] == str(home) and doc["home_exists"] is False
    assert len(doc["warnings"]) == 1 and str(home) in doc["warnings"][0]
    assert "sluice: warning:" in result.stderr  # and on stderr, for people
    assert [s["stream"] for s in doc["streams"]] == ["impressions", "clicks", "events"]
    assert doc["streams"][0] == {"stream": "impressions", "lines": 0, "accepted": 0, "quarantined": 0, "late": 0,
                                 "duplicates": 0, "balanced": True, "watermark": None, "last_arrival": None}
    assert doc["pipelines"][0] == {
        "pipeline": "ad_clicks_hourly",
        "windows": {"open": 0, "closed": 0, "validated": 0, "failed": 0, "reprocessed": 0, "late_waiting": 0},
        "closed_up_to": None, "oldest_open": None,
    }
    assert {"table": "ops/alerts", "rows": None} in doc["tables"]


def test_status_data_is_a_plain_dict_an_api_can_serve(tmp_path: Path) -> None:
    settings = load_settings({}, home=tmp_path, now="2024-05-01T05:00:00Z")
    data = status_data(settings)
    assert list(data) == STATUS_KEYS
    assert json.loads(json.dumps(data)) == data  # plain JSON types only
    assert data["home_exists"] is True and data["warnings"] == []


def test_pipelines_json_lists_streams_windows_outputs_and_checks(tmp_path: Path) -> None:
    result = sluice("pipelines", "--json", home=tmp_path)
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert list(doc) == ["pipelines_path", "pipelines", "load_errors"]
    by_name = {p["name"]: p for p in doc["pipelines"]}
    assert sorted(by_name) == ["ad_clicks_hourly", "user_activity_hourly"]
    ad = by_name["ad_clicks_hourly"]
    assert ad["window"] == {"size_seconds": 3600, "hop_seconds": 3600, "tumbling": True}
    assert ad["lateness_bound_seconds"] == 1800
    assert ad["corrections"] == {"policy": "manual", "max_age_seconds": 7 * 86400, "max_per_run": 24}
    assert ad["freshness_grace_seconds"] == 3600
    clicks = next(s for s in ad["streams"] if s["name"] == "clicks")
    assert clicks["id"] == "click_id" and clicks["watermark_delay_seconds"] == 600
    assert {"name": "click_id", "type": "string", "required": True} in clicks["fields"]
    assert [o["table"] for o in ad["outputs"]] == ["gold/ad_clicks_hourly", "gold/unmatched_clicks_hourly"]
    assert all(c["name"] and c["description"] for o in ad["outputs"] for c in o["checks"])
    assert doc["load_errors"] == []


def test_pipelines_json_reports_files_that_failed_to_load(tmp_path: Path) -> None:
    folder = tmp_path / "pipelines"
    folder.mkdir()
    (folder / "broken.py").write_text("import not_a_module_anywhere\n")
    result = sluice("--pipelines", str(folder), "pipelines", "--json", "--strict", home=tmp_path / "home")
    assert result.returncode == 1
    doc = json.loads(result.stdout)
    assert doc["pipelines"] == []
    assert [e["file"] for e in doc["load_errors"]] == [str(folder / "broken.py")]
    assert "not_a_module_anywhere" in doc["load_errors"][0]["message"]


# -- errors: one line, no traceback unless --debug --------------------------------------------------------


def _corrupt_lake(home: Path) -> None:
    """A Delta log that is not JSON: what a half-copied or hand-edited lake looks like to delta-rs."""
    log = home / "lake" / "ops" / "ingest_batches" / "_delta_log"
    log.mkdir(parents=True)
    (log / "00000000000000000000.json").write_text("not json\n")


def test_an_unexpected_error_is_one_line_naming_its_type(tmp_path: Path) -> None:
    _corrupt_lake(tmp_path)
    result = sluice("status", home=tmp_path)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert re.fullmatch(r"sluice: error: DeltaError: .*json.* \(rerun with --debug for the traceback\)", lines[0],
                        flags=re.IGNORECASE), lines[0]


def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    _corrupt_lake(tmp_path)
    result = sluice("--debug", "status", home=tmp_path)
    assert result.returncode == 1
    assert "Traceback (most recent call last)" in result.stderr
    assert result.stderr.rstrip().splitlines()[-1].startswith("sluice: error: DeltaError: ")
    assert "--debug" not in result.stderr.rstrip().splitlines()[-1]


def test_a_failure_with_json_prints_an_error_document(tmp_path: Path) -> None:
    _corrupt_lake(tmp_path)
    result = sluice("status", "--json", home=tmp_path)
    assert result.returncode == 1
    doc = json.loads(result.stdout)
    assert doc["outcome"] == "failed" and doc["exit_code"] == 1
    assert doc["error"]["type"] == "DeltaError" and doc["error"]["message"]


def test_configuration_errors_stay_one_line_without_the_debug_hint(tmp_path: Path) -> None:
    result = sluice("run", "ad_clicks_daily", "--json", home=tmp_path)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "sluice: error: unknown pipeline 'ad_clicks_daily'; choose one of: ad_clicks_hourly, user_activity_hourly "
        f"(pipelines folder {Path.cwd() / 'pipelines'})"
    ]
    doc = json.loads(result.stdout)
    assert doc["error"]["type"] == "ConfigError" and doc["error"]["message"].startswith("unknown pipeline")


# -- sluice alerts --------------------------------------------------------------------------------------------

ALERTS_SCHEMA = pa.schema([
    ("pipeline", pa.string()), ("window_start", pa.timestamp("us", tz="UTC")),
    ("window_end", pa.timestamp("us", tz="UTC")), ("raised_at", pa.timestamp("us", tz="UTC")),
    ("message", pa.string()), ("channels", pa.string()), ("failed_expectations", pa.string()),
])


def _hour(h: int) -> datetime:
    return datetime(2024, 5, 1, h, tzinfo=UTC)


def _alert_row(pipeline: str, hour: int, channels: str) -> dict[str, Any]:
    failed = [{"expectation": "lateness", "observed_value": "0.05"}]
    alert = Alert(pipeline=pipeline, window_start=_hour(hour), window_end=_hour(hour + 1), failed=failed,
                  docs_url=None, raised_at=_hour(7))
    return {"pipeline": pipeline, "window_start": _hour(hour), "window_end": _hour(hour + 1),
            "raised_at": _hour(7), "message": alert.message, "channels": channels,
            "failed_expectations": json.dumps(failed, sort_keys=True)}


@pytest.fixture
def alerts_home(tmp_path: Path) -> Path:
    """ops/alerts as runs with --no-deliver leave it: two pending alerts of ad_clicks_hourly (one recorded
    twice), one of user_activity_hourly, and one already delivered."""
    rows = [
        _alert_row("ad_clicks_hourly", 2, "pending"),
        _alert_row("ad_clicks_hourly", 2, "pending"),  # the same alert recorded twice counts once
        _alert_row("ad_clicks_hourly", 3, "pending"),
        _alert_row("user_activity_hourly", 4, "pending"),
        _alert_row("ad_clicks_hourly", 1, "webhook"),
    ]
    write_deltalake(str(tmp_path / "lake" / "ops" / "alerts"), pa.Table.from_pylist(rows, schema=ALERTS_SCHEMA))
    return tmp_path


def _channels(home: Path) -> list[tuple[str, str, str]]:
    table = read_rows(home / "lake" / "ops" / "alerts")
    return sorted((r["pipeline"], f"{r['window_start']:%H}", r["channels"]) for r in table)


def test_alerts_lists_the_pending_ones(alerts_home: Path) -> None:
    result = sluice("alerts", home=alerts_home)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("3 pending alert(s)")
    assert len(lines) == 4
    assert "ad_clicks_hourly" in lines[1] and "02:00" in lines[1] and "lateness" in lines[1]
    assert "user_activity_hourly" in lines[3]


def test_alerts_json_for_one_pipeline(alerts_home: Path) -> None:
    result = sluice("alerts", "ad_clicks_hourly", "--json", home=alerts_home)
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert list(doc) == ["pipeline", "pending", "delivered"]
    assert doc["pipeline"] == "ad_clicks_hourly" and doc["delivered"] == []
    assert [(a["window_start"], a["window_end"]) for a in doc["pending"]] == [
        ("2024-05-01T02:00:00Z", "2024-05-01T03:00:00Z"), ("2024-05-01T03:00:00Z", "2024-05-01T04:00:00Z")]
    first = doc["pending"][0]
    assert list(first) == ["pipeline", "window_start", "window_end", "kind", "level", "alert_id", "raised_at",
                           "message", "failed", "docs_url"]
    assert first["kind"] == "dq_failure" and first["level"] == "error"
    assert first["raised_at"] == "2024-05-01T07:00:00Z"
    assert first["failed"] == [{"expectation": "lateness", "observed_value": "0.05"}]


def test_alerts_of_an_unknown_pipeline(alerts_home: Path) -> None:
    result = sluice("alerts", "ad_clicks_daily", home=alerts_home)
    assert result.returncode == 1
    assert "unknown pipeline 'ad_clicks_daily'" in result.stderr and "Traceback" not in result.stderr


def test_alerts_on_a_home_without_alerts(tmp_path: Path) -> None:
    result = sluice("alerts", home=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "no pending alerts"


def test_deliver_without_a_channel_keeps_them_pending(alerts_home: Path) -> None:
    before = _channels(alerts_home)
    result = sluice("alerts", "--deliver", home=alerts_home)
    assert result.returncode == 1
    message = result.stderr.strip().splitlines()[-1]
    assert message.startswith("sluice: error: no alert channel is configured, so the 3 pending alert(s) stay pending")
    assert "sluice_webhook" in message and "sluice_smtp" in message
    assert _channels(alerts_home) == before


def test_deliver_sends_each_pending_alert_once_and_marks_it(alerts_home: Path, webhook: WebhookServer) -> None:
    conn = json.dumps({"conn_type": "http", "host": webhook.url})
    result = sluice("alerts", "ad_clicks_hourly", "--deliver", "--json", home=alerts_home,
                    env={"AIRFLOW_CONN_SLUICE_WEBHOOK": conn})
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["pending"] == []
    assert [(a["window_start"], a["channels"]) for a in doc["delivered"]] == [
        ("2024-05-01T02:00:00Z", ["webhook"]), ("2024-05-01T03:00:00Z", ["webhook"])]
    assert len(webhook.posts()) == 2
    assert _channels(alerts_home) == [
        # The alert an older version recorded twice is one outbox row once delivered.
        ("ad_clicks_hourly", "01", "webhook"), ("ad_clicks_hourly", "02", "webhook"),
        ("ad_clicks_hourly", "03", "webhook"),
        ("user_activity_hourly", "04", "pending"),  # another pipeline's alert is left alone
    ]
    again = sluice("alerts", home=alerts_home)
    assert again.stdout.splitlines()[0].startswith("1 pending alert(s)")


def test_deliver_that_fails_on_a_channel_exits_1(alerts_home: Path, webhook: WebhookServer) -> None:
    webhook.status = 500
    conn = json.dumps({"conn_type": "http", "host": webhook.url})
    result = sluice("alerts", "user_activity_hourly", "--deliver", home=alerts_home,
                    env={"AIRFLOW_CONN_SLUICE_WEBHOOK": conn})
    assert result.returncode == 1
    assert "not delivered through every configured channel (webhook)" in result.stderr
    assert result.stdout.splitlines()[:2] == [
        "delivered 0 of 1 alert(s) through every configured channel (webhook):",
        "  FAILED via webhook: " + _alert_row("user_activity_hourly", 4, "pending")["message"],
    ]
    assert "ALERT NOT DELIVERED" in result.stderr  # logs, Airflow's included, stay on stderr
    assert "2024" not in result.stdout.splitlines()[0] and "notification" not in result.stdout


# -- sluice alerts --all: the history, with what became of each alert (issue 29 section 5) ---------------------


@pytest.fixture
def history_home(alerts_home: Path) -> Path:
    """alerts_home, plus an alert recorded, later, while no channel was configured (``none``)."""
    unrouted = {**_alert_row("ad_clicks_hourly", 5, "none"), "raised_at": _hour(9)}
    table = read_rows(alerts_home / "lake" / "ops" / "alerts")
    rows = [*table, unrouted]
    write_deltalake(str(alerts_home / "lake" / "ops" / "alerts"), pa.Table.from_pylist(rows, schema=ALERTS_SCHEMA),
                    mode="overwrite")
    return alerts_home


def test_alerts_all_lists_every_alert_with_what_became_of_it(history_home: Path) -> None:
    result = sluice("alerts", "--all", home=history_home)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "5 alert(s): 1 sent, 1 with no channel configured (none), 3 pending"
    assert lines[1].split() == ["raised", "pipeline", "kind", "status", "message"]
    statuses = [(line.split()[2], line.split()[4]) for line in lines[2:]]
    # Oldest first (raised at 07:00, then 09:00); the recorded-twice alert is one line.
    assert statuses == [("ad_clicks_hourly", "sent"), ("ad_clicks_hourly", "pending"),
                        ("ad_clicks_hourly", "pending"), ("user_activity_hourly", "pending"),
                        ("ad_clicks_hourly", "none")]
    assert "sent (webhook)" in lines[2]


@pytest.mark.parametrize(
    ("filters", "expected"),
    [
        (["--status", "none"], [("ad_clicks_hourly", "none")]),
        (["--status", "pending", "ad_clicks_hourly"], [("ad_clicks_hourly", "pending")] * 2),
        (["--status", "sent", "--status", "none"], [("ad_clicks_hourly", "sent"), ("ad_clicks_hourly", "none")]),
        (["--since", "2024-05-01T08:00:00Z"], [("ad_clicks_hourly", "none")]),
        (["--kind", "stale"], []),
        (["--kind", "dq_failure", "--since", "2024-05-01T10:00:00+02:00"], [("ad_clicks_hourly", "none")]),
    ],
)
def test_alerts_all_filters_by_status_kind_time_and_pipeline(
    history_home: Path, filters: list[str], expected: list[tuple[str, str]]
) -> None:
    result = sluice("alerts", "--all", "--json", *filters, home=history_home)
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert [(a["pipeline"], a["status"]) for a in doc["alerts"]] == expected
    text = sluice("alerts", "--all", *filters, home=history_home).stdout
    assert text.startswith(f"{len(expected)} alert(s)") if expected else text.strip().endswith("match the filters")


def test_alerts_all_json_carries_channels_and_delivery(history_home: Path) -> None:
    doc = json.loads(sluice("alerts", "--all", "--json", "--status", "sent", home=history_home).stdout)
    [sent] = doc["alerts"]
    assert sent["status"] == "sent" and sent["channels"] == ["webhook"] and sent["kind"] == "dq_failure"
    assert list(sent)[:10] == ["pipeline", "window_start", "window_end", "kind", "level", "alert_id", "raised_at",
                               "message", "failed", "docs_url"]


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["alerts", "--status", "none"], "add --all"),
        (["alerts", "--all", "--deliver"], "run them one at a time"),
        (["alerts", "--all", "--since", "2024-05-01T08:00"], "--since"),
        (["alerts", "--all", "--kind", "nonsense"], "invalid choice: 'nonsense'"),
        (["retry", "ad_clicks_hourly", "--check-only", "--include-late"], "cannot bring in late data"),
    ],
)
def test_alerts_and_retry_option_mistakes_are_usage_errors(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, argv: list[str], fragment: str
) -> None:
    code, _, err = run_main(capsys, "--home", str(tmp_path), *argv)
    assert code == 64 and fragment in err


def test_retry_with_no_failed_windows_says_so_without_starting_spark(tmp_path: Path) -> None:
    result = sluice("retry", "ad_clicks_hourly", "--json", home=tmp_path)
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["outcome"] == "passed" and doc["windows"] == [] and doc["backfills"] == []
    text = sluice("retry", "ad_clicks_hourly", home=tmp_path).stdout.strip()
    assert text == "sluice retry ad_clicks_hourly: no failed windows; nothing to retry"
