"""``make airflow``: Airflow with sluice's DAGs on this machine, from any shell (``python -m
sluice.airflow.standalone``).

It starts what ``airflow standalone`` starts (the api-server, scheduler, dag-processor and triggerer, SQLite and
the LocalExecutor in ``AIRFLOW_HOME``, default ``$SLUICE_HOME/airflow``), each in a session of its own with its
log in ``$AIRFLOW_HOME/standalone/logs``, and prints the URL, the user and the file that holds the password. Ctrl-C
or SIGTERM stops them all; so does any one of them exiting, and then it exits 1 with one line that says which and
what to do. Unlike ``airflow standalone``:

- it does not depend on the caller's PATH: the components run ``airflow`` from this venv;
- nothing listens beyond 127.0.0.1 unless asked: the api-server binds ``AIRFLOW_HOST`` (default 127.0.0.1) on
  ``AIRFLOW_PORT`` (default 8080); the scheduler's and the triggerer's own log servers, which Airflow binds to
  every interface, give way to one on 127.0.0.1 (:func:`serve_logs`), and the tasks' Spark drivers bind
  ``SPARK_LOCAL_IP`` (default 127.0.0.1);
- ``AIRFLOW__CORE__PARALLELISM`` defaults to the machine's CPU count, not Airflow's 32 (one worker process each).

The platform (:mod:`sluice.platform.launcher`) serves its task logs the same way.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NoReturn

from sluice.core.processes import LOOPBACK_HOSTNAME, Daemon, free_port, stop_all

# name: the ``airflow`` command. The log server (LOG_SERVER) serves the scheduler's and the triggerer's logs.
COMPONENTS = {"api-server": ["api-server"], "scheduler": ["scheduler", "--skip-serve-logs"],
              "dag-processor": ["dag-processor"], "triggerer": ["triggerer", "--skip-serve-logs"]}
LOG_SERVER = "log-server"
# [core] hostname_callable of the components sluice starts (see loopback_hostname).
READY_WITHIN_S = 300
STOP_WITHIN_S = 30  # then SIGKILL: on SIGTERM, a task only runs its operator's on_kill() and goes on
# Every Airflow component imports svcs, which imports starlette's test client, which warns that it wants httpx2.
QUIET = "ignore:Using `httpx` with `starlette.testclient` is deprecated"
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # nothing between us and 127.0.0.1


def loopback_hostname() -> str:
    """``[core] hostname_callable`` of the processes sluice starts: the api-server fetches a running task's log
    from ``http://<hostname>:<log server port>``, and the log server listens on 127.0.0.1 only."""
    return "127.0.0.1"


def serve_logs() -> None:
    """Airflow's log server (what ``airflow scheduler`` and ``airflow triggerer`` start unless given
    ``--skip-serve-logs``), on 127.0.0.1 only: Airflow's own binds every interface, whatever the config says."""
    import uvicorn
    from airflow.configuration import conf

    uvicorn.run("airflow.utils.serve_logs.log_server:get_app", factory=True, host="127.0.0.1",
                port=conf.getint("logging", "worker_log_server_port"), access_log=False)


class Failed(Exception):
    """What stops ``make airflow``, as the one line it prints."""


class Stopped(Exception):
    """SIGINT or SIGTERM."""


def _stop(signum: int, frame: Any) -> NoReturn:
    raise Stopped(signal.Signals(signum).name)


def url(host: str, port: str | int) -> str:
    """Where this machine reaches a server that listens on ``host`` (a wildcard: on loopback)."""
    reach = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    return f"http://[{reach}]:{port}" if ":" in reach else f"http://{reach}:{port}"


def environment(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` with what the components need; a setting already in ``environ`` is kept."""
    from sluice.airflow.defaults import airflow_env

    env = {**environ, **airflow_env(environ)}
    venv_bin = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join([venv_bin, *(p for p in env.get("PATH", "").split(os.pathsep) if p != venv_bin)])
    env.setdefault("AIRFLOW_HOME", str(Path(env.get("SLUICE_HOME") or ".sluice").resolve() / "airflow"))
    host = env["AIRFLOW__API__HOST"] = env.get("AIRFLOW_HOST") or env.get("AIRFLOW__API__HOST") or "127.0.0.1"
    port = env["AIRFLOW__API__PORT"] = env.get("AIRFLOW_PORT") or env.get("AIRFLOW__API__PORT") or "8080"
    if "AIRFLOW__API__BASE_URL" not in env:  # else Airflow derives the tasks' API from it
        env.setdefault("AIRFLOW__CORE__EXECUTION_API_SERVER_URL", f"{url(host, port)}/execution/")
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    env.setdefault("AIRFLOW__CORE__PARALLELISM", str(cpus or 1))
    env.setdefault("AIRFLOW__CORE__HOSTNAME_CALLABLE", LOOPBACK_HOSTNAME)
    logs = env.setdefault("AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT", str(free_port()))
    env.setdefault("AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT", logs)
    env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    env["PYTHONWARNINGS"] = ",".join(w for w in (env.get("PYTHONWARNINGS"), QUIET) if w)
    return env


def _last_line(path: Path) -> str:
    lines = [line.strip() for line in path.read_text(errors="replace").splitlines() if line.strip()] \
        if path.exists() else []
    return lines[-1][:300] if lines else "(no output)"


def _exited(daemon: Daemon, code: int) -> Failed:
    last = _last_line(daemon.log)
    todo = ("a port it needs is taken: stop what holds it, or choose another port"
            if "address already in use" in last.lower() else "fix what its log says and run make airflow again")
    return Failed(f"the {daemon.name} exited (code {code}): {last} -- {todo}; its log: {daemon.log}")


def _check_port(host: str, port: str) -> None:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does
        try:
            s.bind((host, int(port)))
        except OSError as error:
            raise Failed(f"the api-server cannot listen on {host}:{port} ({error.strerror}): stop what holds "
                         f"the port, or choose another one: AIRFLOW_PORT=<port> make airflow") from None


def _healthy(base: str) -> bool:
    try:
        with _DIRECT.open(f"{base}/api/v2/monitor/health", timeout=5) as response:
            health = json.loads(response.read())
    except (OSError, ValueError):
        return False
    parts = ("metadatabase", "scheduler", "dag_processor", "triggerer")
    return all(health.get(part, {}).get("status") == "healthy" for part in parts if part in health)


def _watch(procs: Mapping[Daemon, subprocess.Popen[bytes]], until: Callable[[], bool] | None = None,
           within: float = float("inf"), late: str = "") -> None:
    """Until ``until()`` holds (or forever): fail as soon as one of ``procs`` exits, or with ``late`` after
    ``within`` seconds."""
    deadline = time.monotonic() + within
    while True:
        for daemon, proc in procs.items():
            if (code := proc.poll()) is not None:
                raise _exited(daemon, code)
        if until is not None and until():
            return
        if time.monotonic() > deadline:
            raise Failed(late)
        time.sleep(0.5)


def _login(home: Path) -> str:
    """Who logs in, and where the password is (Airflow's own settings, read as its components read them)."""
    from airflow.configuration import conf

    if "SimpleAuthManager" not in conf.get("core", "auth_manager"):
        return f"login: through {conf.get('core', 'auth_manager')}"
    if conf.getboolean("core", "simple_auth_manager_all_admins"):
        return "login: none (simple_auth_manager_all_admins)"
    users = ", ".join(user.split(":")[0] for user in conf.getlist("core", "simple_auth_manager_users"))
    passwords = conf.get("core", "simple_auth_manager_passwords_file", fallback=None) or \
        home / "simple_auth_manager_passwords.json.generated"
    return f"user: {users}   password file: {passwords}"


def run(env: dict[str, str]) -> None:
    home = Path(env["AIRFLOW_HOME"])
    daemons = [Daemon(home / "standalone", name) for name in [*COMPONENTS, LOG_SERVER]]
    if left := [d.name for d in daemons if d.alive()]:
        print(f"make airflow: stopping what an earlier start left running in {home}: {', '.join(left)}", flush=True)
    stop_all(daemons)
    host, port = env["AIRFLOW__API__HOST"], env["AIRFLOW__API__PORT"]
    _check_port(host, port)
    airflow = str(Path(sys.executable).parent / "airflow")
    logs = home / "standalone" / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    print(f"make airflow: starting Airflow ({', '.join(COMPONENTS)}) in {home}; logs in {logs}", flush=True)
    with (logs / "db-migrate.log").open("wb") as out:
        migrate = subprocess.run([airflow, "db", "migrate"], env=env, stdout=out, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, check=False)
    if migrate.returncode != 0:
        raise Failed(f"airflow db migrate failed (code {migrate.returncode}): {_last_line(logs / 'db-migrate.log')}"
                     f"; its log: {logs / 'db-migrate.log'}")
    procs = {}
    base = url(host, port)
    try:
        for daemon in daemons:
            daemon.log.unlink(missing_ok=True)  # one log per start
            argv = [sys.executable, "-m", "sluice.airflow.standalone", "--serve-logs"] if daemon.name == LOG_SERVER \
                else [airflow, *COMPONENTS[daemon.name]]
            procs[daemon] = daemon.spawn(argv, env)
        _watch(procs, until=lambda: _healthy(base), within=READY_WITHIN_S,
               late=f"Airflow was not healthy on {base} within {READY_WITHIN_S} s: see the logs in {logs}")
        where = "on 127.0.0.1 only; AIRFLOW_HOST=0.0.0.0 make airflow opens it to the network" \
            if host in ("127.0.0.1", "localhost", "::1") else f"listening on {host}: reachable beyond this machine"
        print(f"Airflow is up: {base} ({where})\n  {_login(home)}\n  Ctrl-C stops it.", flush=True)
        _watch(procs)
    except Stopped:
        print(f"make airflow: stopping (a running task gets up to {STOP_WITHIN_S} s to end)", flush=True)
        raise
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):  # a second Ctrl-C must not cut the stopping short
            signal.signal(signum, signal.SIG_IGN)
        stop_all(daemons, timeout=STOP_WITHIN_S)


def main(argv: list[str] | None = None) -> int:
    if (sys.argv[1:] if argv is None else argv) == ["--serve-logs"]:
        serve_logs()
        return 0
    env = environment(os.environ)
    os.environ.update(env)  # this process reads Airflow's settings as the components do (_login)
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _stop)
    try:
        run(env)
    except Failed as error:
        print(f"make airflow: {error}", file=sys.stderr, flush=True)
        return 1
    except Stopped:
        print("make airflow: stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
