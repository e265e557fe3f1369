"""``make platform``, ``make platform-demo`` and ``make platform-down`` (SPEC section 7, Make targets): the
production topology on 127.0.0.1 from the project's own files. PostgreSQL holds Airflow's metadata, s3proxy
holds the lake and the landing zone, a Spark master has its 2 workers, and Airflow's api-server, scheduler and
dag-processor share one configuration.

The test starts it as a user does and checks each part through its own interface (SQL, S3, the master's JSON,
Airflow's REST API with and without a login). It then drives a few generated hours through the scheduler
(``make platform-demo``): the runs' states come from the REST API, the applications from the master, and the
gold tables in the bucket must equal those of a local ``sluice run`` of the same files, arrived at the same
times. Last, it stops the platform and finds no process left behind."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from sluice.platform.launcher import LOG_SERVER, Platform
from sluice.platform.topology import TOPOLOGY
from support.lake import read_rows
from support.shell import as_the_user

pytestmark = [pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
DEMO_HOURS = 3
# How long the workers keep a finished application's folder in this test (make platform's default: 15 min),
# so that the folders of the demo's first applications are gone before it ends.
APP_DATA_TTL_S = 60


def _make(target: str, root: Path, timeout: float = 900, **variables: str) -> subprocess.CompletedProcess[str]:
    # A user's shell: nothing of the suite's own Airflow or sluice settings.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "SLUICE_", "AWS_"))}
    # The suite's drivers compile with C1 only (tests/conftest.py, SPARK_SUBMIT_OPTS); here every JVM of the
    # platform does: the executors live as briefly as their drivers (one application per DAG run, on tiny
    # data), and the master and workers idle. C2's compiler threads cost more CPU than their code saves.
    if "SPARK_SUBMIT_OPTS" in env:
        env.setdefault("JDK_JAVA_OPTIONS", env["SPARK_SUBMIT_OPTS"])
    args = [f"{k}={v}" for k, v in {"PLATFORM_DIR": str(root), **variables}.items()]
    return subprocess.run(["make", "--no-print-directory", target, *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout, check=False)


def _recorded(root: Path) -> dict[str, psutil.Process]:
    platform = Platform(root).load()
    found = {}
    for name in TOPOLOGY.services:
        running = platform.daemon(name).running()  # the recorded process, if it is still that one
        if running is not None:
            found[name] = running[0]
    return found


def _listening(platform: Platform) -> list[tuple[str, str, int]]:
    """(process, address, port) of every TCP socket in LISTEN state held by a recorded process of the platform
    or by a process it started."""
    processes = []
    for name in [*TOPOLOGY.services, LOG_SERVER]:
        running = platform.daemon(name).running()
        if running is not None:
            processes += [running[0], *running[0].children(recursive=True)]
    found = []
    for p in processes:
        found += [(" ".join(p.cmdline())[:120], c.laddr.ip, c.laddr.port)
                  for c in p.net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN]
    return found


def _left_behind(root: Path, before: dict[str, psutil.Process]) -> list[str]:
    """Processes of the platform still running: a recorded one, or anything whose command line names the folder."""
    left = [f"{name} (pid {p.pid})" for name, p in before.items() if p.is_running()
            and p.status() != psutil.STATUS_ZOMBIE]
    for p in psutil.process_iter(["pid", "cmdline", "status"]):
        if p.info["status"] != psutil.STATUS_ZOMBIE and str(root) in " ".join(p.info["cmdline"] or []):
            left.append(f"{' '.join(p.info['cmdline'])[:200]} (pid {p.pid})")
    return left


@pytest.fixture
def platform_dir() -> Iterator[Path]:
    # PostgreSQL runs as its own user when the suite runs as root: it must be able to reach its folder, and
    # pytest's tmp_path is private to root.
    root = Path(tempfile.mkdtemp(prefix="sluice-platform-"))
    root.chmod(0o755)
    yield root
    _make("platform-down", root, timeout=300)
    shutil.rmtree(root, ignore_errors=True)


@pytest.mark.spark
@pytest.mark.timeout(3000)
@pytest.mark.usefixtures("spark")  # the local reference's commands run on it
def test_the_platform_runs_a_demo_through_its_scheduler_and_stops_leaving_nothing(
    platform_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Only the demo's runs: the scheduler creates none from the schedules, which would add a run of each DAG
    # per quarter hour of the test, and the runs it creates wait for them (one active run per DAG).
    up = _make("platform", platform_dir, PLATFORM_ARGS=f"--no-schedules --app-data-ttl {APP_DATA_TTL_S}")
    assert up.returncode == 0, f"{up.stdout[-4000:]}\n{up.stderr[-6000:]}"
    platform = Platform(platform_dir).load()
    # It says where the UI is, how to log in and how to land files.
    assert platform.api_url in up.stdout and f"admin / {platform.secret('admin')}" in up.stdout, up.stdout
    assert "s3://sluice/landing" in up.stdout and "make platform-down" in up.stdout

    running = _recorded(platform_dir)
    assert sorted(running) == sorted(TOPOLOGY.services), running
    # Nothing of it listens beyond loopback (the scheduler's task log server included).
    listening = _listening(platform)
    assert {platform.port(name) for name in ("postgres", "s3", "kafka", "api_server", "log_server")} <= \
        {port for _, _, port in listening}, listening
    assert [entry for entry in listening if entry[1] not in ("127.0.0.1", "::1", "::ffff:127.0.0.1")] == []
    log_server = platform.daemon(LOG_SERVER).running()
    assert log_server is not None

    # PostgreSQL is Airflow's metadata database.
    import psycopg2

    with psycopg2.connect(host="127.0.0.1", port=platform.port("postgres"), dbname="airflow", user="airflow",
                          password=platform.secret("postgres")) as db, db.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM dag")
        (dags,) = cursor.fetchone()  # type: ignore[misc]
    assert dags >= 1, "the dag-processor put no DAG into PostgreSQL"

    # The bucket of the lake and the landing zone.
    s3 = platform.s3_client()
    assert TOPOLOGY.bucket in {b["Name"] for b in s3.list_buckets()["Buckets"]}

    # The Kafka broker that every task finds through kafka_default.
    from confluent_kafka.admin import AdminClient

    assert AdminClient({"bootstrap.servers": platform.kafka_bootstrap}).list_topics(timeout=30).brokers
    assert json.loads(platform.env()["AIRFLOW_CONN_KAFKA_DEFAULT"]) == \
        TOPOLOGY.kafka_connection(platform.kafka_bootstrap)
    assert platform.kafka_bootstrap in up.stdout

    # The master has its workers, one core and 2 GB each, each with a work folder of its own.
    workers = platform.alive_workers()
    assert len(workers) == TOPOLOGY.spark_workers, workers
    assert {(w["cores"], w["memory"]) for w in workers} == {(1, 2048)}, workers

    # Airflow: healthy, on PostgreSQL; the ledger page answers a logged-in user, and no one else.
    with httpx.Client(base_url=platform.api_url, trust_env=False, timeout=60) as http:
        health = http.get("/api/v2/monitor/health").json()
        assert {part: health[part]["status"] for part in ("metadatabase", "scheduler", "dag_processor")} == \
            dict.fromkeys(("metadatabase", "scheduler", "dag_processor"), "healthy"), health
        assert http.get("/sluice/ledger").status_code == 401
        login = http.post("/auth/token", json={"username": "admin", "password": platform.secret("admin")})
        assert login.status_code == 201, login.text
        auth = {"Authorization": f"Bearer {login.json()['access_token']}"}
        assert http.get("/sluice/ledger", headers=auth).status_code == 200
        dags = {d["dag_id"] for d in http.get("/api/v2/dags", headers=auth).json()["dags"]}
        assert {"ad_clicks_hourly", "user_activity_hourly", "sluice_backfill", "sluice_maintenance"} <= dags, dags

    apps_before = {a["id"] for a in platform.master_state()["completedapps"]}
    demo = _make("platform-demo", platform_dir, timeout=2400, DEMO_HOURS=str(DEMO_HOURS), DEMO_SLICES="1")
    assert demo.returncode in (0, 2), f"{demo.stdout[-6000:]}\n{demo.stderr[-6000:]}"
    assert "where every record went:" in demo.stdout and "windows and data quality:" in demo.stdout, demo.stdout
    _check_the_demo(platform, demo.stdout, apps_before, tmp_path, monkeypatch)
    _check_the_workers_remove_finished_applications(platform)

    # A second `make platform` finds it running and starts nothing twice.
    again = _make("platform", platform_dir)
    assert again.returncode == 0, again.stderr[-4000:]
    assert {n: p.pid for n, p in _recorded(platform_dir).items()} == {n: p.pid for n, p in running.items()}

    down = _make("platform-down", platform_dir, timeout=300)
    assert down.returncode == 0, down.stderr[-4000:]
    assert all(name in down.stdout for name in TOPOLOGY.services), down.stdout
    everything = {**running, LOG_SERVER: log_server[0]}
    assert not _left_behind(platform_dir, everything), _left_behind(platform_dir, everything)
    assert _recorded(platform_dir) == {}


def _check_the_demo(platform: Platform, stdout: str, apps_before: set[str], tmp_path: Path,
                    monkeypatch: pytest.MonkeyPatch) -> None:
    from sluice_tools.platform_demo import KAFKA_PIPELINE, Api

    api = Api(platform)
    pipelines = ("ad_clicks_hourly", "user_activity_hourly", KAFKA_PIPELINE)
    # The scheduler ran the runs: every manual and backfill run finished, and each one's Spark task succeeded
    # (a run may still fail on purpose: check_quality fails it when a window failed its checks).
    with_work, in_flight = 0, 0
    for dag_id in pipelines:
        runs = api.runs(dag_id)
        kinds = [r["run_type"] for r in runs]
        # One part landed: a run of each DAG; then the late file's run of user_activity_hourly, a later one.
        assert kinds.count("manual") >= (2 if dag_id == "user_activity_hourly" else 1), kinds
        if dag_id == "ad_clicks_hourly":
            assert "backfill" in kinds, kinds
        for run in runs:
            if run["run_type"] == "scheduled" and run["state"] not in ("success", "failed"):
                in_flight += 1
                continue  # the scheduler's own runs go on while the demo ends
            # A backfill run whose interval holds no window start (the shipped windows are hours: it starts off
            # the hour) has nothing to rewrite and starts no Spark application.
            with_work += 1 if run["run_type"] != "backfill" or datetime.fromisoformat(
                run["data_interval_start"].replace("Z", "+00:00")).minute == 0 else 0
            tasks = api.task_states(dag_id, run["dag_run_id"])
            assert run["state"] in ("success", "failed") and "failed" not in {
                tasks.get("choose_path"), tasks.get("run_cycle"), tasks.get("reprocess_interval"),
                tasks.get("send_alerts")}, (dag_id, run, tasks)
    # On the cluster, one application per DAG run that has work (issue 13): its cycle or its backfill, which
    # also validates the windows it closed; check_quality finds none left and starts no Spark. (Read after
    # the runs: a run still going may have finished its application already.)
    apps = [a for a in platform.master_state()["completedapps"] if a["id"] not in apps_before]
    assert with_work <= len(apps) <= with_work + in_flight, (with_work, in_flight, apps)
    assert all(a["state"] == "FINISHED" and a["cores"] == TOPOLOGY.app_cores for a in apps), apps
    # The executors loaded Delta's and s3a's jars from the workers' own copy (SLUICE_EXECUTOR_JARS): each
    # executor's command names it, and no application's folder holds a jar its driver shipped (~700 MB each).
    executors = [p for w in TOPOLOGY.worker_names for p in (platform.root / "spark" / w).glob("app-*/*")
                 if (p / "stderr").is_file()]
    assert executors, "no executor folder left on the workers"
    commands = [line for p in executors for line in (p / "stderr").read_text(errors="replace").splitlines()
                if line.startswith("Spark Executor Command:")]
    assert len(commands) == len(executors), commands
    assert all(f"{platform.worker_jars}/io/delta/" in c and "hadoop-aws" in c for c in commands), commands[:1]
    assert not [j for p in executors for j in p.glob("*.jar")], executors
    # The executors wrote to the bucket: no table file on a local disk of the platform.
    assert re.search(r"tables: [1-9][0-9]* Parquet objects in s3://sluice/lake; 0 on the local disks", stdout), stdout
    # The late file was corrected by the next run, by itself.
    from sluice.config import load_settings
    from sluice.windows.ledger import read_ledger

    env = platform.env()
    s3_settings = load_settings(env, home=Path(env["SLUICE_HOME"]))
    corrected = [r for r in read_ledger(s3_settings, "user_activity_hourly") if r.state == "reprocessed"]
    assert corrected, [(r.window_start, r.state) for r in read_ledger(s3_settings, "user_activity_hourly")]

    _check_the_kafka_pipeline(platform, api, s3_settings)

    # The same files, arrived at the same times, in a local home, through the same steps: the same gold tables.
    local = _local_reference(platform, tmp_path, monkeypatch)
    for table in ("gold/ad_clicks_hourly", "gold/unmatched_clicks_hourly", "gold/user_activity_hourly"):
        assert _rows(s3_settings, table) == _rows(local, table), table


def _check_the_kafka_pipeline(platform: Platform, api: Any, s3_settings: Any) -> None:
    """The demo produced the events to the broker's topic as well (issue 57): the Kafka twin of
    user_activity_hourly read them through kafka_default on the cluster, every record accounted for."""
    from sluice_tools.platform_demo import KAFKA_PIPELINE, TOPIC

    (steps_file,) = (platform.root / "demo").glob("*/steps.json")
    steps = json.loads(steps_file.read_text())
    produced = sum(step["produced"]["records"] for step in steps if "produced" in step)
    assert produced > 0, steps
    runs = [r for r in api.runs(KAFKA_PIPELINE) if r["run_type"] == "manual"]
    assert len(runs) == sum(len(step.get("kafka_runs", [])) for step in steps) >= 1, runs
    for run in runs:
        tasks = api.task_states(KAFKA_PIPELINE, run["dag_run_id"])
        assert tasks.get("run_cycle") == "success" and tasks.get("send_alerts") == "success", (run, tasks)
    batches = [r for r in read_rows(str(s3_settings.lake.table("ops/ingest_batches")))
               if r["stream"] == "events_live"]
    assert batches and all(b["source_file"].startswith(f"kafka://{TOPIC}/") for b in batches), batches
    assert sum(b["lines"] for b in batches) == produced, (produced, batches)
    for b in batches:
        assert b["lines"] == b["accepted"] + b["quarantined"] + b["late"] + b["duplicates"], b
    assert _rows(s3_settings, f"gold/{KAFKA_PIPELINE}"), "the Kafka pipeline wrote no gold"
    assert {r["source_file"].rsplit("/", 2)[0] for r in read_rows(str(s3_settings.lake.table("bronze/events_live")))
            } <= {f"kafka://{TOPIC}"}


def _check_the_workers_remove_finished_applications(platform: Platform) -> None:
    """Each application leaves a folder on its worker (executor logs, and a copy of every jar its driver ships:
    none from sluice's tasks, ~700 MB for a job that ships the AWS SDK); the workers remove it once it has
    finished for the TTL, by their periodic clean-up, which says so in its log. (The demo's first applications
    finished minutes before this runs.)"""
    import time

    # A folder's last file is written when its application ends; the clean-up runs every min(120 s, TTL).
    grace_ms = (APP_DATA_TTL_S + min(TOPOLOGY.worker_cleanup_interval_s, APP_DATA_TTL_S) + 30) * 1000
    now_ms = time.time() * 1000
    finished = [a["id"] for a in platform.master_state()["completedapps"]
                if a["starttime"] + a["duration"] < now_ms - grace_ms]
    assert finished, "no application finished long enough ago to check the workers' clean-up"
    folders = {p.name: p for w in TOPOLOGY.worker_names for p in (platform.root / "spark" / w).glob("app-*")}
    assert not [app for app in finished if app in folders], (finished, sorted(folders))
    logs = "".join(platform.daemon(w).log.read_text(errors="replace") for w in TOPOLOGY.worker_names)
    removed = set(re.findall(r"Removing directory: \S*/(app-[\w-]+)", logs))
    assert set(finished) <= removed, (finished, sorted(removed))


def _local_reference(platform: Platform, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The demo's steps (its ``steps.json``) replayed on a local home: the same objects, as files whose
    modification time is the object's ``LastModified``, landed in the same parts, each followed by a ``sluice
    run`` of each pipeline at the clock of the DAG run it stands for; the backfill through ``sluice backfill``.
    The commands run in this process, on the suite's Spark session: what is compared is the tables, and a cold
    JVM per command would only cost the suite minutes."""
    from sluice.cli.main import main
    from sluice.config import load_settings

    client = platform.s3_client()
    (steps_file,) = (platform.root / "demo").glob("*/steps.json")
    home = tmp_path / "local-home"
    home.mkdir()
    shutil.copy(Path(platform.env()["SLUICE_HOME"]) / "sluice.yaml", home / "sluice.yaml")
    # A user's shell on the local home: none of the suite's or the platform's settings.
    as_the_user(monkeypatch)

    def command(now: str, *args: str) -> None:
        code = main(["--home", str(home), args[0], *args[1:], "--now", now])
        assert code in (0, 2), f"sluice {' '.join(args)}: exit {code}"

    now = ""
    for step in json.loads(steps_file.read_text()):
        for key in step.get("landed", []):
            target = home / "landing" / key.removeprefix(f"{TOPOLOGY.landing_prefix}/")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(client.get_object(Bucket=TOPOLOGY.bucket, Key=key)["Body"].read())
            arrival = client.head_object(Bucket=TOPOLOGY.bucket, Key=key)["LastModified"].timestamp()
            os.utime(target, (arrival, arrival))
        for run in step.get("runs", []):
            now = run["now"]
            command(now, "run", run["dag_id"])
        if "backfill" in step:
            backfill = step["backfill"]
            command(now, "backfill", backfill["dag_id"], "--start", backfill["start"], "--end", backfill["end"],
                    *(["--include-late"] if backfill["include_late"] else []))
    return load_settings({}, home=home)


def _rows(settings: Any, table: str) -> list[tuple[str, ...]]:
    return sorted(tuple(str(v) for v in row.values()) for row in read_rows(str(settings.lake.table(table))))
