"""Daemons of the platform (and of ``make airflow``): started in sessions of their own, logged to
``<root>/logs/<name>.log`` and recorded in ``<root>/run/<name>.json`` (pid, process group, start time), so that
``make platform-down`` stops exactly what ``make platform`` started, by pid, and nothing else: a recorded pid that
now belongs to another process (the same pid, a different start time) is left alone."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

# Airflow's [core] hostname_callable for the processes sluice starts: tasks report 127.0.0.1, so the
# api-server fetches a running task's log over loopback (the function is sluice.airflow.standalone's).
LOOPBACK_HOSTNAME = "sluice.airflow.standalone.loopback_hostname"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def listening(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        return True
    return False


class PlatformError(RuntimeError):
    """A service of the platform did not start, with the end of its log."""


@dataclass(frozen=True)
class Daemon:
    """One recorded process tree of the platform."""

    root: Path
    name: str

    @property
    def record(self) -> Path:
        return self.root / "run" / f"{self.name}.json"

    @property
    def log(self) -> Path:
        return self.root / "logs" / f"{self.name}.log"

    def log_tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else f"(no log at {self.log})"

    def spawn(self, argv: Sequence[str], env: Mapping[str, str], cwd: Path | None = None) -> subprocess.Popen[bytes]:
        """Start ``argv`` in a session of its own (so that stopping it stops what it started) and record it."""
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as out:
            proc = subprocess.Popen(list(argv), env=dict(env), cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        self.adopt(proc.pid)
        return proc

    def adopt(self, pid: int) -> None:
        """Record a process that another program started (``pg_ctl``, ``spark-daemon.sh``)."""
        self.record.parent.mkdir(parents=True, exist_ok=True)
        process = psutil.Process(pid)
        pgid = os.getpgid(pid)
        if pgid == os.getpgrp():
            pgid = pid  # never our own group: stopping the service must not stop whoever started it
        self.record.write_text(json.dumps({"pid": pid, "pgid": pgid,
                                           "started": process.create_time()}) + "\n")

    def running(self) -> tuple[psutil.Process, int] | None:
        """The recorded process if it is still the one recorded, with its process group."""
        if not self.record.exists():
            return None
        saved = json.loads(self.record.read_text())
        try:
            process = psutil.Process(int(saved["pid"]))
            if abs(process.create_time() - float(saved["started"])) > 1 or process.status() == psutil.STATUS_ZOMBIE:
                return None
        except psutil.Error:
            return None
        return process, int(saved["pgid"])

    def alive(self) -> bool:
        return self.running() is not None

    def stop(self, timeout: float = 30) -> None:
        """SIGTERM to the recorded process group, then SIGKILL to what is left of it; forget the record."""
        stop_all([self], timeout)


def stop_group(process: subprocess.Popen[bytes], timeout: float = 30) -> None:
    """Stop a server started in a session of its own (``start_new_session=True``): SIGTERM to its process group,
    then, after ``timeout``, SIGKILL."""
    if process.poll() is not None:
        return
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=timeout)


def stop_all(daemons: Iterable[Daemon], timeout: float = 30) -> None:
    """Stop the recorded daemons at once: SIGTERM to each one's process group and to every process it started
    (a task's process may be in a group of its own), then, after ``timeout``, SIGKILL to what is left; forget
    the records."""
    daemons = list(daemons)
    found = [running for daemon in daemons if (running := daemon.running()) is not None]
    groups = {pgid for _, pgid in found}
    targets = {p for p in psutil.process_iter() if _pgid(p) in groups}
    for process, _ in found:
        targets.add(process)
        with contextlib.suppress(psutil.Error):
            targets.update(process.children(recursive=True))
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for p in targets:
            with contextlib.suppress(psutil.Error):
                p.send_signal(sig)
        _, alive = psutil.wait_procs(list(targets), timeout=timeout)
        targets = set(alive)
        if not targets:
            break
    for daemon in daemons:
        daemon.record.unlink(missing_ok=True)


def _pgid(process: psutil.Process) -> int | None:
    try:
        return os.getpgid(process.pid)
    except OSError:
        return None


def wait_until(ready: Callable[[], bool], daemon: Daemon, what: str, timeout: float = 180) -> None:
    """Poll ``ready`` until it holds; fail with the daemon's log if it died or the time ran out."""
    deadline = time.monotonic() + timeout
    while not ready():
        if not daemon.alive():
            raise PlatformError(f"{daemon.name} exited before {what}; the end of {daemon.log}:\n{daemon.log_tail()}")
        if time.monotonic() > deadline:
            raise PlatformError(f"{daemon.name}: no {what} within {timeout:.0f} s; the end of {daemon.log}:\n"
                                f"{daemon.log_tail()}")
        time.sleep(0.5)
