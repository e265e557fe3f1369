"""The `sluice` command line: fail fast on bad input (before any JVM starts) and exit codes."""

from __future__ import annotations

import json
import os
import shutil
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


def test_the_installed_command_ends_at_once_with_its_whole_output_and_its_exit_code(tmp_path: Path) -> None:
    """``sluice`` (the console script) ends its process without Python's teardown once a command returns: the
    document still reaches a pipe whole, the log lines reach stderr, and the exit code is the command's."""
    command = Path(sys.executable).with_name("sluice")
    env = {**os.environ, "SLUICE_HOME": str(tmp_path)}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(command), *args], env=env, capture_output=True, text=True, timeout=120)

    generated = run("generate", "--hours", "1", "--streams", "events", "--seed", "3")
    assert generated.returncode == 0, generated.stderr
    status = run("status", "--json")
    assert status.returncode == 0, status.stderr
    document = json.loads(status.stdout)  # the whole document, up to its last brace
    assert "user_activity_hourly" in json.dumps(document)
    failed = run("run", "ad_clicks_daily", "--now", "2024-05-01T00:00:00Z")
    assert failed.returncode == 1
    assert "sluice: error: unknown pipeline 'ad_clicks_daily'" in failed.stderr, failed.stderr


# -- wrong configuration and parameters: one line naming the key or path, no traceback (issue 14) ---------


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    """The single ``sluice: error: ...`` line of a failed command (exit 1, never 0 or 2), without the prefix."""
    assert result.returncode == 1, (result.returncode, result.stderr[-2000:])
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sluice: error: "), result.stderr[-2000:]
    return lines[0].removeprefix("sluice: error: ")


@pytest.mark.parametrize(
    ("yaml_text", "key"),
    [
        ("streams: {clicks: 5}\n", "streams.clicks"),
        ("landing: 5\n", "landing"),
        ("spark_master: 5\n", "spark_master"),
        ("pipelines: {ad_clicks_hourly: {window: {size: [1h]}}}\n", "pipelines.ad_clicks_hourly.window.size"),
    ],
)
def test_yaml_values_of_the_wrong_type_name_the_key_and_the_file(tmp_path: Path, yaml_text: str, key: str) -> None:
    (tmp_path / "sluice.yaml").write_text(yaml_text)
    message = one_error_line(sluice(tmp_path, "run", "ad_clicks_hourly", "--now", "2024-05-01T06:00:00Z"))
    assert message.startswith(f"{key}: ")
    assert message.endswith(f"(in {tmp_path / 'sluice.yaml'})")
    assert not (tmp_path / "lake").exists()


def test_sluice_config_naming_a_directory(tmp_path: Path) -> None:
    env = {**os.environ, "SLUICE_HOME": str(tmp_path), "SLUICE_CONFIG": str(tmp_path)}
    result = subprocess.run([sys.executable, "-m", "sluice.cli", "status"], env=env, capture_output=True, text=True,
                            timeout=120)
    message = one_error_line(result)
    assert message.startswith(f"SLUICE_CONFIG: {tmp_path} is a directory")


@pytest.mark.parametrize("command", [["status"], ["run", "ad_clicks_hourly", "--now", "2024-05-01T06:00:00Z"]])
def test_a_home_under_a_regular_file_fails_naming_both(tmp_path: Path, command: list[str]) -> None:
    (tmp_path / "afile").write_text("not a folder\n")
    started = time.monotonic()
    message = one_error_line(sluice(tmp_path / "afile" / "home", *command))
    assert message.startswith(f"SLUICE_HOME: {tmp_path / 'afile' / 'home'} lies under {tmp_path / 'afile'}, "
                              "which is a file")
    assert time.monotonic() - started < 60  # before any Spark work


def test_a_home_that_is_a_regular_file(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("not a folder\n")
    message = one_error_line(sluice(tmp_path / "afile", "run", "ad_clicks_hourly", "--now", "2024-05-01T06:00:00Z"))
    assert message.startswith(f"SLUICE_HOME: {tmp_path / 'afile'} is a file, not a folder")


def _without_root_privileges() -> list[str]:
    """A command prefix under which permission bits apply: none for a normal user; for root, setpriv dropping
    the capabilities that bypass them."""
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: permission bits do not apply")
    return ["setpriv", "--bounding-set", "-dac_override,-dac_read_search"]


@pytest.mark.parametrize(
    ("home", "fragment"),
    [("ro", "is not writable"), ("ro/home", "does not exist and cannot be created")],
)
def test_a_home_that_is_not_writable_fails_naming_it(tmp_path: Path, home: str, fragment: str) -> None:
    prefix = _without_root_privileges()
    (tmp_path / "ro").mkdir()
    (tmp_path / "ro").chmod(0o555)
    env = {**os.environ, "SLUICE_HOME": str(tmp_path / home)}
    try:
        result = subprocess.run(
            [*prefix, sys.executable, "-m", "sluice.cli", "run", "ad_clicks_hourly", "--now", "2024-05-01T06:00:00Z"],
            env=env, capture_output=True, text=True, timeout=180,
        )
    finally:
        (tmp_path / "ro").chmod(0o755)
    message = one_error_line(result)
    assert message.startswith(f"SLUICE_HOME: {tmp_path / home} {fragment}")


def test_backfill_on_a_home_without_bronze_says_there_is_nothing_yet(tmp_path: Path) -> None:
    started = time.monotonic()
    message = one_error_line(sluice(tmp_path, "backfill", "ad_clicks_hourly",
                                    "--start", "2024-05-01T00:00:00Z", "--end", "2024-05-01T03:00:00Z"))
    assert message.startswith("nothing to backfill: no bronze table for impressions, clicks")
    assert str(tmp_path / "lake" / "bronze") in message and f"SLUICE_HOME ({tmp_path})" in message
    assert "sluice run ad_clicks_hourly" in message
    assert time.monotonic() - started < 60  # no Spark
    assert not (tmp_path / "lake").exists()


@pytest.mark.parametrize(
    ("start", "end", "key"),
    [
        ("0001-01-01T00:00:00Z", "0001-01-01T03:00:00Z", "start"),
        ("9999-12-31T00:00:00Z", "9999-12-31T23:00:00Z", "start"),
        ("2024-05-01T00:00:00Z", "9999-12-31T23:00:00Z", "end"),
    ],
)
def test_backfill_outside_the_timestamp_range_gives_the_range(tmp_path: Path, start: str, end: str, key: str) -> None:
    message = one_error_line(sluice(tmp_path, "backfill", "ad_clicks_hourly", "--start", start, "--end", end))
    assert message.startswith(f"{key}: '")
    assert "use a time from 1900-01-01T00:00:00Z to 9999-01-01T00:00:00Z" in message
    assert not (tmp_path / "lake").exists()
