"""Progress of long steps: a bar on an interactive terminal, a log line per tenth otherwise."""

from __future__ import annotations

import fcntl
import logging
import os
import pty
import struct
import subprocess
import sys
import termios

import pytest

from sluice.core.progress import progress


def test_without_a_terminal_a_line_is_logged_at_every_tenth(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="sluice.progress")
    with progress(25, "ingest impressions", "file") as advance:
        for _ in range(25):
            advance(1)
    lines = [r.getMessage() for r in caplog.records if r.name == "sluice.progress"]
    assert lines[0] == "ingest impressions: 2 of 25 files done"
    assert lines[-1] == "ingest impressions: 25 of 25 files done"
    assert len(lines) == 13  # every 2 files (25 // 10), and the last one


def test_a_short_step_logs_no_progress(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="sluice.progress")
    with progress(12, "ingest events", "file") as advance:
        for _ in range(12):
            advance(1)
    assert not [r for r in caplog.records if r.name == "sluice.progress"]


def test_on_a_terminal_a_bar_runs_on_stderr() -> None:
    script = (
        "from sluice.core.progress import progress\n"
        "with progress(20, 'data quality p', 'window') as advance:\n"
        "    for _ in range(20): advance(1)\n"
    )
    leader, follower = pty.openpty()
    # A terminal has a size (a fresh pseudo-terminal is 0x0, where tqdm draws nothing).
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    proc = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=follower)
    os.close(follower)
    chunks = []
    while True:
        try:
            data = os.read(leader, 4096)
        except OSError:  # the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    assert proc.wait(timeout=60) == 0
    shown = b"".join(chunks).decode(errors="replace")
    assert "data quality p" in shown and "0/20" in shown and "window" in shown
