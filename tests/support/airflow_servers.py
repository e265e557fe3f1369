"""Airflow's own processes (``api-server``, ``scheduler``, ``dag-processor``) on 127.0.0.1 for a test, started
as a user starts them, each in a session of its own so that teardown stops it with everything it started
(API workers, executor workers, task processes, spark-submit and its JVM), and nothing else."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from sluice.core.processes import free_port as free_port  # the tests import it from here

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # no proxy between the test and 127.0.0.1


def sqlite_metadata_db(airflow_home: Path) -> dict[str, str]:
    """The metadata DB in SQLite, as ``airflow db migrate`` creates it by default, with one change: a writer
    waits up to a minute for the lock instead of SQLite's 5 seconds. The scheduler, the api-server and a CLI
    command (``airflow backfill create``) all write it, and on a busy 2-core machine a scheduler loop can hold
    the lock longer than 5 s: the CLI then failed with ``database is locked``."""
    return {"AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{airflow_home / 'airflow.db'}?timeout=60"}


@dataclass
class Servers:
    """Processes of one test, logs in ``<root>/<name>.log``, all with the same environment."""

    root: Path
    env: dict[str, str]
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def spawn(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        with (self.root / f"{name}.log").open("wb") as log:
            proc = subprocess.Popen(list(args), env=self.env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        self.procs[name] = proc
        return proc

    def start(self, name: str, *args: str) -> None:
        """``airflow <name> <args>``, watched by :meth:`assert_alive` until the test ends."""
        self.spawn(name, str(VENV_BIN / "airflow"), name, *args)

    def airflow(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([str(VENV_BIN / "airflow"), *args], env=self.env, cwd=REPO, capture_output=True,
                              text=True, timeout=timeout, check=False)
        assert done.returncode == 0, f"airflow {' '.join(args)} failed ({done.returncode}):\n" \
            f"{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
        return done

    def log(self, name: str) -> str:
        path = self.root / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def assert_alive(self, *names: str) -> None:
        for name in names or ("api-server", "scheduler", "dag-processor"):
            proc = self.procs.get(name)
            assert proc is None or proc.poll() is None, \
                f"airflow {name} exited ({proc.returncode}):\n{self.log(name)[-5000:]}"

    def wait_healthy(self, base_url: str, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while True:
            self.assert_alive()
            with contextlib.suppress(OSError), \
                    _DIRECT.open(f"{base_url}/api/v2/monitor/health", timeout=5) as response:
                if response.status == 200:
                    return
            assert time.monotonic() < deadline, f"api-server not healthy after {timeout:.0f}s:\n" \
                f"{self.log('api-server')[-5000:]}"
            time.sleep(1)

    def stop(self) -> None:
        procs = list(self.procs.values())
        for proc in procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
        # What the servers started (task processes, spark-submit and its JVM) is in their sessions: make sure
        # none of it outlives the test.
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
