"""``make airflow`` (README, "Orchestration"), run as a new user runs it: from a plain shell whose PATH lacks the
venv, with a fresh AIRFLOW_HOME. It comes up on 127.0.0.1 and says how to log in; nothing it starts listens beyond
loopback; it starts no more task workers than the machine has cores; Ctrl-C stops all of it. A component that
cannot start ends the target at once, with one line that names it, and leaves nothing running."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
import pytest

from sluice.core.processes import free_port

REPO = Path(__file__).resolve().parents[2]
PLAIN_PATH = "/usr/bin:/bin"  # no venv: `airflow` is not on it
LOOPBACK = {"127.0.0.1", "::1", "::ffff:127.0.0.1"}


def _shell(tmp: Path, **variables: str) -> dict[str, str]:
    """A user's plain shell: no venv on PATH, nothing of the suite's Airflow, sluice or make settings."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AIRFLOW", "SLUICE_", "AWS_", "VIRTUAL_ENV", "MAKE", "MFLAGS", "PYTHON"))}
    return {**env, "PATH": PLAIN_PATH, "SLUICE_HOME": str(tmp / "home"), **variables}


def _make_airflow(env: dict[str, str], out: Path) -> subprocess.Popen[bytes]:
    """``make airflow`` in a session of its own, as a terminal runs it (Ctrl-C goes to its whole group)."""
    with out.open("wb") as log:
        return subprocess.Popen(["make", "-s", "--no-print-directory", "airflow"], cwd=REPO, env=env, stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)


def _processes_of(home: Path) -> list[psutil.Process]:
    """Every live process whose AIRFLOW_HOME is ``home``: whatever make airflow started, wherever it went."""
    found = []
    for p in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if p.status() != psutil.STATUS_ZOMBIE and p.environ().get("AIRFLOW_HOME") == str(home):
                found.append(p)
    return found


def _kill_what_is_left(home: Path) -> None:
    left = _processes_of(home)
    for p in left:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(left, timeout=30)


def _listening(processes: list[psutil.Process]) -> list[tuple[str, str, int]]:
    """(process, address, port) of every TCP socket in LISTEN state that one of ``processes`` holds."""
    found = []
    for p in processes:
        with contextlib.suppress(psutil.Error):
            found += [(" ".join(p.cmdline())[:120], c.laddr.ip, c.laddr.port)
                      for c in p.net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN]
    return found


@dataclass
class Started:
    make: subprocess.Popen[bytes]
    out: Path
    home: Path
    port: int

    def output(self) -> str:
        return self.out.read_text(errors="replace")

    def tree(self) -> list[psutil.Process]:
        root = psutil.Process(self.make.pid)
        return [root, *root.children(recursive=True)]

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def login(self, http: httpx.Client) -> dict[str, str]:
        """The REST API's headers for the admin user, with the password from the file make airflow named."""
        password = json.loads((self.home / "simple_auth_manager_passwords.json.generated").read_text())["admin"]
        login = http.post("/auth/token", json={"username": "admin", "password": password})
        assert login.status_code == 201, login.text
        return {"Authorization": f"Bearer {login.json()['access_token']}"}

    def stop(self) -> None:
        if self.make.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.make.pid, signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.make.wait(timeout=90)
        _kill_what_is_left(self.home)


def _start(tmp: Path, **variables: str) -> Started:
    """``make airflow`` from a plain shell, on a free port, once it says it is up."""
    assert shutil.which("airflow", path=PLAIN_PATH) is None
    port = free_port()
    env = _shell(tmp, AIRFLOW_PORT=str(port), **variables)
    started = Started(_make_airflow(env, tmp / "make.out"), tmp / "make.out", tmp / "home" / "airflow", port)
    deadline = time.monotonic() + 300
    while "Airflow is up" not in started.output():
        logs = "".join(f"\n== {f}\n{f.read_text(errors='replace')[-3000:]}"
                       for f in sorted(started.home.glob("standalone/logs/*.log")))
        if started.make.poll() is not None or time.monotonic() > deadline:
            started.stop()
            pytest.fail(f"make airflow did not come up (exit {started.make.returncode}):\n"
                        f"{started.output()[-5000:]}{logs}")
        time.sleep(1)
    return started


@pytest.fixture(scope="module")
def airflow(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Started]:
    started = _start(tmp_path_factory.mktemp("make-airflow"))
    try:
        yield started
    finally:
        started.stop()


@pytest.mark.slow
def test_it_comes_up_from_a_shell_without_the_venv_and_says_how_to_log_in(airflow: Started) -> None:
    passwords = airflow.home / "simple_auth_manager_passwords.json.generated"
    out = airflow.output()
    assert f"Airflow is up: {airflow.base} " in out and "user: admin " in out, out
    assert f"password file: {passwords}\n" in out, out
    with httpx.Client(base_url=airflow.base, trust_env=False, timeout=30) as http:
        assert http.get("/api/v2/version").status_code == 200
        auth = airflow.login(http)
        # sluice's DAGs, from the repo (the dag-processor may still be parsing the last of them).
        deadline = time.monotonic() + 120
        while not {"ad_clicks_hourly", "sluice_backfill"} <= {
                d["dag_id"] for d in http.get("/api/v2/dags", headers=auth).json()["dags"]}:
            assert time.monotonic() < deadline, "sluice's DAGs did not appear in 120 s"
            time.sleep(2)
    # Only the launcher's own lines: no component's log, no warning of Airflow's (the "production" shape of
    # SimpleAuthManager, starlette's httpx deprecation) and no traceback.
    for noise in ("looks like production", "httpx", "Traceback", "Warning", "standalone |"):
        assert noise not in out, out


@pytest.mark.slow
def test_nothing_it_starts_listens_beyond_loopback_and_workers_match_the_cpus(airflow: Started) -> None:
    tree = airflow.tree()
    listening = _listening(tree)
    assert airflow.port in {port for _, _, port in listening}, listening
    assert len(listening) >= 2, listening  # the api-server and the task log server
    assert [entry for entry in listening if entry[1] not in LOOPBACK] == []
    # The LocalExecutor starts no more workers than the machine has cores (Airflow's default: 32).
    workers = [p for p in tree if "LocalExecutor" in " ".join(p.cmdline())]
    assert 1 <= len(workers) <= (os.cpu_count() or 1), [" ".join(p.cmdline()) for p in workers]


@pytest.mark.slow
def test_ctrl_c_stops_everything_it_started(airflow: Started) -> None:
    tree = airflow.tree()
    assert len(tree) > 5 and _processes_of(airflow.home)
    os.killpg(airflow.make.pid, signal.SIGINT)
    airflow.make.wait(timeout=90)
    _, alive = psutil.wait_procs(tree, timeout=10)
    assert alive == [] and _processes_of(airflow.home) == [], alive
    assert airflow.output().rstrip().endswith("make airflow: stopped"), airflow.output()[-2000:]
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # past the connections in TIME_WAIT
        s.bind(("127.0.0.1", airflow.port))  # nothing listens on the port any more


PROBE_DAG = """
import os
import time
from datetime import datetime

from airflow.sdk import dag, task


@dag(schedule=None, start_date=datetime(2024, 1, 1), catchup=False)
def log_probe():
    @task
    def talk():
        print("probe: started", flush=True)
        deadline = time.monotonic() + 300
        while not os.path.exists({done!r}) and time.monotonic() < deadline:  # running until the test has its log
            time.sleep(0.2)

    talk()


log_probe()
"""


@pytest.mark.slow
def test_a_running_tasks_log_comes_through_the_loopback_log_server(tmp_path: Path) -> None:
    """The UI shows a running task's log from the log server that make airflow runs on 127.0.0.1 (Airflow's own
    would listen on every interface): the api-server finds it by the task's hostname, 127.0.0.1."""
    dags = tmp_path / "dags"
    dags.mkdir()
    done = tmp_path / "done"
    (dags / "log_probe.py").write_text(PROBE_DAG.format(done=str(done)))
    log_port = free_port()
    started = _start(tmp_path, AIRFLOW__CORE__DAGS_FOLDER=str(dags),
                     AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT=str(log_port))
    try:
        with httpx.Client(base_url=started.base, trust_env=False, timeout=30) as http:
            auth = started.login(http)
            deadline = time.monotonic() + 120
            while http.patch("/api/v2/dags/log_probe", json={"is_paused": False}, headers=auth).status_code != 200:
                assert time.monotonic() < deadline, "the probe DAG did not appear in 120 s"
                time.sleep(2)
            run = http.post("/api/v2/dags/log_probe/dagRuns", json={"logical_date": None}, headers=auth)
            assert run.status_code == 200, run.text
            task = f"/api/v2/dags/log_probe/dagRuns/{run.json()['dag_run_id']}/taskInstances/talk"
            text = ""
            while "probe: started" not in text:
                state = http.get(task, headers=auth).json().get("state")
                assert state in (None, "scheduled", "queued", "running"), (state, text)
                assert time.monotonic() < deadline + 120, f"the probe task did not log in time: {state}\n{text}"
                if state == "running":
                    text = http.get(f"{task}/logs/1", headers=auth, params={"full_content": True}).text
                time.sleep(1)
            assert f"http://127.0.0.1:{log_port}/log/" in text, text
            assert "Could not read served logs" not in text, text
            # And the task reports its end through the execution API, on make airflow's port.
            done.touch()
            while (state := http.get(task, headers=auth).json().get("state")) == "running":
                assert time.monotonic() < deadline + 240, "the probe task did not end"
                time.sleep(1)
            assert state == "success", state
    finally:
        started.stop()


def _fails(env: dict[str, str], tmp: Path, timeout: float) -> tuple[int | None, str, list[str]]:
    """Run make airflow to its end (or ``timeout``): its exit code, its output, and what it left running."""
    make = _make_airflow(env, tmp / "make.out")
    home = Path(env["SLUICE_HOME"]) / "airflow"
    try:
        code = make.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        code = None
        os.killpg(make.pid, signal.SIGKILL)
        make.wait()
    left = [" ".join(p.cmdline()) for p in _processes_of(home)]
    _kill_what_is_left(home)
    return code, (tmp / "make.out").read_text(errors="replace"), left


def _one_line(out: str) -> str:
    """The one line that says why make airflow ended."""
    lines = [line for line in out.splitlines() if line.startswith("make airflow: ") and "starting" not in line]
    assert len(lines) == 1, out
    return lines[0]


def test_a_taken_port_ends_it_at_once_with_one_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, out, left = _fails(_shell(tmp_path, AIRFLOW_PORT=str(port)), tmp_path, timeout=120)
    assert code not in (0, None), out
    line = _one_line(out)
    assert f"127.0.0.1:{port}" in line and "in use" in line and "AIRFLOW_PORT=" in line, line
    assert left == [], left


@pytest.mark.slow
def test_a_component_that_dies_stops_the_others_and_ends_it_with_one_line(tmp_path: Path) -> None:
    """The task log server cannot bind its port: the components already started are stopped, and make
    airflow fails, naming it, with nothing left running."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        env = _shell(tmp_path, AIRFLOW_PORT=str(free_port()),
                     AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT=str(taken.getsockname()[1]))
        code, out, left = _fails(env, tmp_path, timeout=240)
    assert code not in (0, None), out
    line = _one_line(out)
    assert line.startswith("make airflow: the log-server exited") and "address already in use" in line, line
    assert str(tmp_path / "home" / "airflow" / "standalone" / "logs" / "log-server.log") in line, line
    assert left == [], left
