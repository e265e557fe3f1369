"""The suite's watchdog (tests/support/watchdog.py) under a real ``pytest -n 1``: a test stuck where pytest-timeout's
alarm cannot reach it (here the alarm signal is blocked, as it is in effect for a thread waiting in native code)
ends its worker with every thread's stack printed, is reported as crashed, and the suite goes on."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SUPPORT = Path(__file__).resolve().parent / "support"

CONFTEST = f"""
import sys
sys.path.insert(0, {str(SUPPORT.parent)!r})
pytest_plugins = ["support.watchdog"]
"""

TESTS = """
import signal, time
import pytest


@pytest.mark.timeout(1)
def test_stuck_out_of_the_alarms_reach():
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
    time.sleep(120)


def test_the_next_one():
    pass
"""


def test_a_test_stuck_in_native_code_ends_its_worker_with_its_stack(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_module.py").write_text(TESTS)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "1", "-p", "no:cacheprovider", "-p", "no:randomly", "-o", "addopts=",
         "-o", "watchdog_grace=1", "-q", str(tmp_path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=100, check=False,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 1, out[-3000:]
    assert "1 failed, 1 passed" in done.stdout, out[-3000:]
    assert "crashed while running 'test_module.py::test_stuck_out_of_the_alarms_reach'" in done.stdout, out[-3000:]
    # The stuck thread's stack, from the worker's own stderr.
    assert "Timeout (0:00:02)!" in out and "in test_stuck_out_of_the_alarms_reach" in out, out[-3000:]
