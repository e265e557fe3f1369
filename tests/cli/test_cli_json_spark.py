"""``--json`` on the commands that run Spark: ``run`` (in a real subprocess, so stdout must hold nothing but the
document, whatever the JVM prints), then ``alerts`` and ``status`` on what it left; ``backfill`` and ``check``
in this process, on the suite's Spark session."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from sluice.cli.main import main
from support.shell import as_the_user, user_shell

pytestmark = pytest.mark.spark

RFC3339_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$")
PIPELINE = "user_activity_hourly"  # one stream (events): the cheapest full cycle


def sluice(home: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = {**user_shell(), "SLUICE_HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "sluice.cli", *args], env=env, capture_output=True, text=True,
                          timeout=timeout)


def generate(home: Path, *options: str) -> None:
    done = sluice(home, "generate", "--hours", "1", "--streams", "events", "--seed", "5", *options)
    assert done.returncode == 0, done.stderr


def timestamps(doc: Any) -> list[str]:
    """Every value of a key that holds a time, anywhere in the document."""
    found: list[str] = []
    if isinstance(doc, dict):
        for key, value in doc.items():
            if isinstance(value, str) and (key in {"now", "start", "end", "watermark", "last_arrival", "raised_at"}
                                           or key.startswith("window_")):
                found.append(value)
            else:
                found += timestamps(value)
    elif isinstance(doc, list):
        for item in doc:
            found += timestamps(item)
    return found


@pytest.mark.slow
def test_run_json_with_failing_windows_then_alerts_and_status(tmp_path: Path) -> None:
    generate(tmp_path, "--late-share", "0.05")  # 5 % late: the 1 % lateness check fails
    run = sluice(tmp_path, "run", PIPELINE, "--now", "2024-05-01T02:00:00Z", "--no-deliver", "--json")
    assert run.returncode == 2, run.stderr[-3000:]
    doc = json.loads(run.stdout)  # stdout is exactly one JSON document: logs and JVM output went to stderr
    assert list(doc) == ["pipeline", "outcome", "exit_code", "now", "seconds", "streams", "warnings",
                         "windows_closed", "windows_amended", "windows_corrected", "quality", "alerts"]
    assert all(isinstance(w, str) and "arrived after now" not in w for w in doc["warnings"])
    # --no-deliver: one alert per failed window, recorded and not sent.
    failed = doc["quality"]["failed"]
    assert failed and doc["alerts"] == {"sent": 0, "no_channel": 0, "pending": len(failed)}
    assert doc["windows_amended"] == doc["windows_corrected"] == []
    assert doc["pipeline"] == PIPELINE and doc["outcome"] == "checks_failed" and doc["exit_code"] == 2
    assert doc["now"] == "2024-05-01T02:00:00Z"
    [events] = doc["streams"]
    assert events["stream"] == "events" and events["this_cycle"] == events["total"]
    assert events["total"]["lines"] == sum(events["total"][k] for k in ("accepted", "quarantined", "late",
                                                                        "duplicates"))
    assert events["total"]["late"] > 0
    assert {"window_start": "2024-05-01T00:00:00Z", "window_end": "2024-05-01T01:00:00Z"} in doc["windows_closed"]
    failed = doc["quality"]["failed"]
    assert failed and failed[0]["window_start"] == "2024-05-01T00:00:00Z"
    assert any(f["expectation"].startswith("lateness") for f in failed[0]["failures"])
    assert doc["quality"]["alerts_sent_via"] == []  # --no-deliver
    assert all(RFC3339_UTC.match(ts) for ts in timestamps(doc)), timestamps(doc)

    alerts = sluice(tmp_path, "alerts", "--json")
    assert alerts.returncode == 0, alerts.stderr[-3000:]
    pending = json.loads(alerts.stdout)["pending"]
    assert [(a["pipeline"], a["window_start"]) for a in pending] == [(PIPELINE, w["window_start"]) for w in failed]

    status = sluice(tmp_path, "status", "--json")
    assert status.returncode == 0, status.stderr[-3000:]
    state = json.loads(status.stdout)
    watermark = next(s for s in state["streams"] if s["stream"] == "events")["watermark"]
    assert RFC3339_UTC.match(watermark) and watermark >= "2024-05-01T01:00:00Z"
    assert [w["window_start"] for w in state["failed_windows"]] == [w["window_start"] for w in failed]
    assert next(p for p in state["pipelines"] if p["pipeline"] == PIPELINE)["windows"]["failed"] == len(failed)


def _main_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any]]:
    code = main(list(argv))
    out = capsys.readouterr().out
    return code, json.loads(out)


def test_backfill_and_check_json(spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    as_the_user(monkeypatch)
    generate(tmp_path)
    home = ["--home", str(tmp_path)]
    code, run = _main_json(capsys, *home, "run", PIPELINE, "--now", "2024-05-01T02:00:00Z", "--json")
    assert code == 0 and run["outcome"] == "passed" and run["quality"]["failed"] == []

    code, backfill = _main_json(capsys, *home, "backfill", PIPELINE, "--start", "2024-05-01T00:00:00Z",
                                "--end", "2024-05-01T01:00:00Z", "--now", "2024-05-01T02:00:00Z", "--json")
    assert code == 0
    assert list(backfill) == ["pipeline", "outcome", "exit_code", "start", "end", "include_late", "seconds",
                              "windows", "rows", "skipped_open", "gold_versions", "late_waiting", "quality",
                              "alerts"]
    assert backfill["outcome"] == "passed" and backfill["exit_code"] == 0
    assert (backfill["start"], backfill["end"], backfill["include_late"]) == (
        "2024-05-01T00:00:00Z", "2024-05-01T01:00:00Z", False)
    assert backfill["windows"] == [{"window_start": "2024-05-01T00:00:00Z", "window_end": "2024-05-01T01:00:00Z"}]
    assert backfill["rows"][PIPELINE] > 0
    assert backfill["quality"]["checked"] == 1 and backfill["quality"]["passed"] == 1

    code, check = _main_json(capsys, *home, "check", PIPELINE, "--now", "2024-05-01T02:00:00Z", "--json")
    assert code == 0
    assert check == {"pipeline": PIPELINE, "outcome": "passed", "exit_code": 0,
                     "quality": {"checked": 0, "passed": 0, "failed": [], "data_docs": check["quality"]["data_docs"],
                                 "alerts_sent_via": []},
                     "alerts": {"sent": 0, "no_channel": 0, "pending": 0}}
