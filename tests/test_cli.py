"""The `sluice` command line: fail fast on bad input (before any JVM starts) and exit codes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest


def sluice(home: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SLUICE_HOME": str(home)}
    return subprocess.run(
        [sys.executable, "-m", "sluice.cli", *args], env=env, capture_output=True, text=True, timeout=timeout
    )


def test_unknown_pipeline_fails_fast_with_the_known_ones(tmp_path: Path) -> None:
    started = time.monotonic()
    result = sluice(tmp_path, "run", "ad_clicks_daily", "--now", "2024-05-01T00:00:00Z")
    assert result.returncode == 1
    assert "unknown pipeline 'ad_clicks_daily'" in result.stderr
    assert "ad_clicks_hourly, user_activity_hourly" in result.stderr
    assert time.monotonic() - started < 60
    assert not (tmp_path / "lake").exists()  # nothing was started or written


@pytest.mark.parametrize(
    ("start", "end", "message"),
    [
        ("2024-05-01T05:00:00Z", "2024-05-01T02:00:00Z", "must be before end"),
        ("2024-05-01T02:30:00Z", "2024-05-01T05:00:00Z", "not aligned"),
        ("not-a-time", "2024-05-01T05:00:00Z", "start"),
    ],
)
def test_bad_backfill_ranges_fail_fast(tmp_path: Path, start: str, end: str, message: str) -> None:
    result = sluice(tmp_path, "backfill", "ad_clicks_hourly", "--start", start, "--end", end)
    assert result.returncode == 1
    assert message in result.stderr
    assert not (tmp_path / "lake").exists()


def test_generate_then_status_without_spark(tmp_path: Path) -> None:
    result = sluice(tmp_path, "generate", "--hours", "1", "--streams", "events", "--seed", "3")
    assert result.returncode == 0, result.stderr
    assert list((tmp_path / "landing" / "events").glob("*.jsonl"))
    status = sluice(tmp_path, "status")
    assert status.returncode == 0, status.stderr
    assert "streams (where every line went)" in status.stdout
    assert "ad_clicks_hourly" in status.stdout
