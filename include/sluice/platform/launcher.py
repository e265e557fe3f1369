"""``make platform`` / ``make platform-down``: the topology of :mod:`sluice.platform.topology` as processes on
127.0.0.1, under one folder (``PLATFORM_DIR``, default ``.platform`` in the clone):

- ``pg/``: PostgreSQL's cluster (``initdb`` on first start), Airflow's metadata database;
- ``s3/``: the S3 server's buckets; the lake and the landing zone are ``s3://sluice/lake`` and ``.../landing``;
- ``spark/``: the standalone master's and workers' folders (each worker has its own: no shared disk), and
  ``spark/jars/``, the workers' copy of sluice's pinned jars (what their image holds in a deployment): the
  executors load Delta's and s3a's jars from there (``SLUICE_EXECUTOR_JARS``), and no driver ships them;
- ``airflow/``: AIRFLOW_HOME (config through the environment, logs, the simple auth manager's passwords);
- ``home/``: SLUICE_HOME of the Airflow tasks (caches only: everything kept lives in the lake);
- ``run/`` and ``logs/``: one record (pid, process group, start time) and one log per service;
- ``platform.json``: ports and secrets; ``env.sh``: the same as shell variables, for ``airflow`` and ``sluice``
  commands against the platform (``source .platform/env.sh``).

Every port is a free one, chosen on first start and kept. ``down`` stops, by pid, what ``up`` recorded.
"""

from __future__ import annotations

import json
import os
import secrets
import shlex
import shutil
import subprocess
import sys
import urllib.request
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from sluice.core.processes import LOOPBACK_HOSTNAME, Daemon, PlatformError, free_port, listening, wait_until
from sluice.platform.kafka_server import broker_command, cluster_id, format_command, server_properties
from sluice.platform.s3server import s3proxy_command
from sluice.platform.topology import TOPOLOGY, Topology

# Passed from the shell that runs `make platform` to its services: where Java is, Spark's own variable for the
# driver JVM's options (spark-submit reads it), and Java's own one for every JVM the platform starts (the java
# launcher reads it): the master, the workers and, through the workers' environment, their executors.
FROM_THE_CALLER = ("JAVA_HOME", "SPARK_SUBMIT_OPTS", "JDK_JAVA_OPTIONS")
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # nothing between us and 127.0.0.1
S3_ACCESS_KEY = "sluice-platform"
# The scheduler's log server: Airflow's own listens on every interface, this one on 127.0.0.1 only
# (sluice.airflow.standalone.serve_logs). A process of the launcher, not a service of the topology.
LOG_SERVER = "airflow-log-server"


def _get_json(url: str) -> Any:
    with _DIRECT.open(url, timeout=10) as response:
        return json.loads(response.read())


def postgres_bin() -> Path:
    """The newest installed PostgreSQL server's programs (Debian: /usr/lib/postgresql/<major>/bin)."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parts[-3]))
    if found:
        return found[-1].parent
    initdb = shutil.which("initdb")
    if initdb:
        return Path(initdb).resolve().parent
    raise PlatformError("no PostgreSQL server is installed (initdb not found): `make platform` installs Debian's "
                        "postgresql; elsewhere install the PostgreSQL server and re-run")


@dataclass
class Platform:
    root: Path
    topology: Topology = TOPOLOGY
    state: dict[str, Any] = field(default_factory=dict)
    # False: the scheduler creates no runs from the DAGs' schedules; it still runs every triggered and
    # backfill run (a test that drives the runs itself, and wants only those).
    schedules: bool = True

    # ----------------------------------------------------------------------------------- state and env
    @property
    def state_file(self) -> Path:
        return self.root / "platform.json"

    def load(self) -> Platform:
        """Ports and secrets: those of the last start, or new ones."""
        if self.state_file.exists():
            self.state = json.loads(self.state_file.read_text())
            # A platform folder from before a service existed: that service gets its ports now.
            missing = [n for n in self._port_names() if n.replace("-", "_") not in self.state["ports"]]
            if missing:
                self.state["ports"].update({n.replace("-", "_"): free_port() for n in missing})
                self.state_file.write_text(json.dumps(self.state, indent=2) + "\n")
            return self
        self.state = {
            "ports": {name.replace("-", "_"): free_port() for name in self._port_names()},
            "secrets": {name: secrets.token_urlsafe(24) for name in ("postgres", "s3", "jwt", "admin")},
        }
        self.root.mkdir(parents=True, exist_ok=True)
        self.state_file.write_text(json.dumps(self.state, indent=2) + "\n")
        self.state_file.chmod(0o600)
        return self

    def _port_names(self) -> list[str]:
        return ["postgres", "s3", "kafka", "kafka_controller", "spark_master", "spark_master_ui", "api_server",
                "log_server", *(f"{w}_ui" for w in self.topology.worker_names)]

    def port(self, name: str) -> int:
        return int(self.state["ports"][name.replace("-", "_")])

    def secret(self, name: str) -> str:
        return str(self.state["secrets"][name])

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port('api_server')}"

    @property
    def s3_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port('s3')}"

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.port('spark_master')}"

    @property
    def master_ui(self) -> str:
        return f"http://127.0.0.1:{self.port('spark_master_ui')}"

    def aws_env(self) -> dict[str, str]:
        return {"AWS_ENDPOINT_URL": self.s3_endpoint, "AWS_ACCESS_KEY_ID": S3_ACCESS_KEY,
                "AWS_SECRET_ACCESS_KEY": self.secret("s3"), "AWS_REGION": self.topology.region,
                "AWS_ALLOW_HTTP": "true"}

    def s3_client(self) -> Any:
        """A boto3 client of the platform's S3 server (path-style, as a server on loopback needs)."""
        import boto3
        from botocore.config import Config

        return boto3.client("s3", endpoint_url=self.s3_endpoint, aws_access_key_id=S3_ACCESS_KEY,
                            aws_secret_access_key=self.secret("s3"), region_name=self.topology.region,
                            config=Config(s3={"addressing_style": "path"}))

    def env(self) -> dict[str, str]:
        """What the Airflow components, their tasks and a user's shell against the platform share."""
        from sluice.airflow.defaults import airflow_env

        airflow_home = self.root / "airflow"
        database = (f"postgresql+psycopg2://{self.topology.database_user}:{self.secret('postgres')}"
                    f"@127.0.0.1:{self.port('postgres')}/{self.topology.database}")
        venv_bin = str(Path(sys.executable).parent)
        return {
            "PATH": f"{venv_bin}{os.pathsep}{os.environ.get('PATH', '')}",
            # The caller's Java, and the Java options of the Spark drivers that the DAGs' tasks start (and of
            # every JVM, when the caller sets JDK_JAVA_OPTIONS).
            **{key: os.environ[key] for key in FROM_THE_CALLER if key in os.environ},
            "TZ": "UTC",
            "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable,
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SLUICE_HOME": str(self.root / "home"),
            **self.topology.sluice_settings(),
            "SLUICE_EXECUTOR_JARS": str(self.worker_jars),
            **self.aws_env(),
            "AIRFLOW_HOME": str(airflow_home),
            **airflow_env({}),
            **self.topology.airflow_settings(),
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": database,
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(airflow_home / "passwords.json"),
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(self.port("api_server")),
            "AIRFLOW__API__BASE_URL": self.api_url,
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.api_url}/execution/",
            # The scheduler signs the tasks' tokens and the api-server checks them: one secret for both.
            "AIRFLOW__API_AUTH__JWT_SECRET": self.secret("jwt"),
            "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(self.port("log_server")),
            # The api-server fetches a running task's log from http://<its hostname>:<log_server>, on 127.0.0.1.
            "AIRFLOW__CORE__HOSTNAME_CALLABLE": LOOPBACK_HOSTNAME,
            "AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE": str(self.schedules),
            # The pipeline DAGs' Spark tasks go to the cluster (SPEC section 7: spark_default when defined).
            "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "spark://127.0.0.1",
                                                      "port": self.port("spark_master"),
                                                      "extra": {"deploy-mode": "client"}}),
            # Streams that read a topic find the platform's broker through kafka_default (SPEC 2).
            "AIRFLOW_CONN_KAFKA_DEFAULT": json.dumps(self.topology.kafka_connection(self.kafka_bootstrap)),
        }

    @property
    def kafka_bootstrap(self) -> str:
        return f"127.0.0.1:{self.port('kafka')}"

    def daemon(self, name: str) -> Daemon:
        return Daemon(self.root, name)

    # ------------------------------------------------------------------------------------------ services
    def _as_postgres_user(self, argv: list[str]) -> list[str]:
        """PostgreSQL refuses to run as root: as root, run its programs as Debian's ``postgres`` user."""
        return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else argv

    def start_postgres(self) -> None:
        daemon = self.daemon("postgres")
        if daemon.alive():
            return
        bin_dir = postgres_bin()
        data, sockets = self.root / "pg" / "data", self.root / "pg" / "run"
        sockets.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            shutil.chown(self.root / "pg", "postgres")
            shutil.chown(sockets, "postgres")
        if not (data / "PG_VERSION").exists():
            password = self.root / "pg" / ".password"
            password.write_text(self.secret("postgres") + "\n")
            password.chmod(0o600)
            if os.geteuid() == 0:
                shutil.chown(password, "postgres")
            done = subprocess.run(self._as_postgres_user([
                str(bin_dir / "initdb"), "-D", str(data), "-U", self.topology.database_user,
                "--auth=scram-sha-256", f"--pwfile={password}", "--encoding=UTF8", "--locale=C.UTF-8"]),
                capture_output=True, text=True, check=False)
            password.unlink()
            if done.returncode != 0:
                raise PlatformError(f"initdb failed ({done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-3000:]}")
        daemon.log.parent.mkdir(parents=True, exist_ok=True)
        log = self.root / "pg" / "postgres.log"
        options = f"-p {self.port('postgres')} -c listen_addresses=127.0.0.1 -k {sockets}"
        done = subprocess.run(self._as_postgres_user([
            str(bin_dir / "pg_ctl"), "-D", str(data), "-l", str(log), "-o", options, "-w", "-t", "120", "start"]),
            capture_output=True, text=True, check=False, start_new_session=True)
        if done.returncode != 0:
            tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
            raise PlatformError(f"PostgreSQL did not start ({done.returncode}):\n{done.stderr[-2000:]}\n{tail}")
        daemon.adopt(int((data / "postmaster.pid").read_text().split()[0]))
        self._create_database()

    def _create_database(self) -> None:
        import psycopg2

        connection = psycopg2.connect(host="127.0.0.1", port=self.port("postgres"), dbname="postgres",
                                      user=self.topology.database_user, password=self.secret("postgres"))
        try:
            connection.autocommit = True
            with connection.cursor() as cursor:
                cursor.execute("SELECT 1 FROM pg_database WHERE datname = %s", (self.topology.database,))
                if cursor.fetchone() is None:
                    cursor.execute(f'CREATE DATABASE "{self.topology.database}"')
        finally:
            connection.close()

    def start_s3(self) -> None:
        daemon = self.daemon("s3")
        if not daemon.alive():
            daemon.spawn(s3proxy_command(self.root / "s3", self.port("s3"), S3_ACCESS_KEY, self.secret("s3"),
                                         self.topology.region), os.environ)
            wait_until(lambda: listening(self.port("s3")), daemon, "S3 endpoint")
        client = self.s3_client()
        if self.topology.bucket not in {b["Name"] for b in client.list_buckets().get("Buckets", [])}:
            client.create_bucket(Bucket=self.topology.bucket)

    def start_kafka(self) -> None:
        """The broker of ``sluice.platform.kafka_server``, its log folder formatted once (a restart keeps the
        topics), as a daemon of the platform."""
        daemon = self.daemon("kafka")
        if daemon.alive():
            return
        folder = self.root / "kafka"
        folder.mkdir(parents=True, exist_ok=True)
        properties = server_properties(folder, self.port("kafka"), self.port("kafka_controller"))
        if not (folder / "logs" / "meta.properties").exists():
            subprocess.run(format_command(properties, cluster_id(str(folder))), check=True, capture_output=True)
        daemon.spawn(broker_command(properties), os.environ)
        wait_until(lambda: listening(self.port("kafka")), daemon, "Kafka broker")

    def _spark_daemon(self, name: str, java_class: str, instance: int, *args: str) -> None:
        """``spark-daemon.sh start <class> <instance> <args>`` (the pyspark wheel has no start-master.sh),
        with the pid file and logs in the platform folder."""
        import pyspark

        daemon = self.daemon(name)
        if daemon.alive():
            return
        spark_home = Path(pyspark.__file__).parent
        pids, logs = self.root / "spark" / "pids", self.root / "logs" / "spark"
        env = {**self.env(), "SPARK_HOME": str(spark_home), "SPARK_PID_DIR": str(pids), "SPARK_LOG_DIR": str(logs),
               "SPARK_IDENT_STRING": "sluice", "SPARK_MASTER_OPTS": self.topology.master_options(),
               "SPARK_WORKER_OPTS": self.topology.worker_options()}
        done = subprocess.run(["bash", str(spark_home / "sbin" / "spark-daemon.sh"), "start", java_class,
                               str(instance), *args], env=env, capture_output=True, text=True, check=False,
                              cwd=self.root, timeout=120, start_new_session=True)
        pid_file = pids / f"spark-sluice-{java_class}-{instance}.pid"
        if done.returncode != 0 or not pid_file.exists():
            raise PlatformError(f"{name} did not start ({done.returncode}):\n{done.stdout[-2000:]}"
                                f"{done.stderr[-2000:]}")
        daemon.adopt(int(pid_file.read_text().split()[0]))
        # spark-daemon.sh writes the JVM's output to its own .out file: link it where the other logs are.
        for out in logs.glob(f"spark-sluice-{java_class}-{instance}-*.out"):
            daemon.log.unlink(missing_ok=True)
            daemon.log.symlink_to(out)

    @property
    def worker_jars(self) -> Path:
        return self.root / "spark" / "jars"

    def install_worker_jars(self) -> None:
        """The workers' own copy of the pinned jars (``delta``, ``s3`` and ``kafka``: the platform's tasks have
        kafka_default, so their sessions name Spark's Kafka source too), laid out as the machine's cache:
        hard links where the cache is on the same file system, else copies. Each application's executors
        then start without fetching ~700 MB from their driver."""
        from sluice.core.jars import cache_dir, jar_paths

        cache = cache_dir()
        for source in jar_paths(("delta", "s3", "kafka")):
            target = self.worker_jars / source.relative_to(cache)
            if target.is_file() and target.stat().st_size == source.stat().st_size:
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            target.unlink(missing_ok=True)
            try:
                os.link(source, target)
            except OSError:
                shutil.copyfile(source, target)

    def start_spark(self) -> None:
        self.install_worker_jars()
        self._spark_daemon("spark-master", "org.apache.spark.deploy.master.Master", 1, "--host", "127.0.0.1",
                           "--port", str(self.port("spark_master")),
                           "--webui-port", str(self.port("spark_master_ui")))
        master = self.daemon("spark-master")
        wait_until(lambda: listening(self.port("spark_master_ui")), master, "master UI")
        for n, name in enumerate(self.topology.worker_names, start=1):
            work = self.root / "spark" / name
            work.mkdir(parents=True, exist_ok=True)
            self._spark_daemon(name, "org.apache.spark.deploy.worker.Worker", n, self.master_url,
                               "--host", "127.0.0.1", "--cores", str(self.topology.worker_cores),
                               "--memory", self.topology.worker_memory, "--work-dir", str(work),
                               "--webui-port", str(self.port(f"{name}_ui")))
        wait_until(lambda: len(self.alive_workers()) >= self.topology.spark_workers, master,
                   f"{self.topology.spark_workers} workers registered", timeout=240)

    def master_state(self) -> dict[str, Any]:
        """The standalone master's JSON status: its workers, active and completed applications."""
        return dict(_get_json(f"{self.master_ui}/json/"))

    def alive_workers(self) -> list[dict[str, Any]]:
        try:
            workers = self.master_state().get("workers", [])
        except OSError:
            return []
        return [w for w in workers if w.get("state") == "ALIVE"]

    def start_airflow(self) -> None:
        env = self.env()
        home = Path(env["AIRFLOW_HOME"])
        home.mkdir(parents=True, exist_ok=True)
        passwords = home / "passwords.json"
        passwords.write_text(json.dumps({self.topology.airflow_admin: self.secret("admin")}) + "\n")
        passwords.chmod(0o600)
        airflow = str(Path(sys.executable).parent / "airflow")
        components = [self.daemon(f"airflow-{component}") for component in self.topology.airflow_components]
        log_server = self.daemon(LOG_SERVER)
        if all(daemon.alive() for daemon in [*components, log_server]):
            return  # running on a database they migrated when they started: nothing to do twice
        migrate = subprocess.run([airflow, "db", "migrate"], env=env, capture_output=True, text=True,
                                 check=False, timeout=900)
        if migrate.returncode != 0:
            raise PlatformError(f"airflow db migrate failed ({migrate.returncode}):\n{migrate.stderr[-4000:]}")
        for component, daemon in zip(self.topology.airflow_components, components, strict=True):
            if not daemon.alive():
                args = {"api-server": ["--workers", "1"], "scheduler": ["--skip-serve-logs"]}.get(component, [])
                daemon.spawn([airflow, component, *args], env, cwd=self.root)
        if not log_server.alive():
            log_server.spawn([sys.executable, "-m", "sluice.airflow.standalone", "--serve-logs"], env, cwd=self.root)
        wait_until(lambda: listening(self.port("log_server")), log_server, "task log server")
        api = self.daemon("airflow-api-server")
        wait_until(self.api_healthy, api, "healthy api-server", timeout=300)

    def api_healthy(self) -> bool:
        try:
            health = _get_json(f"{self.api_url}/api/v2/monitor/health")
        except OSError:
            return False
        return all(health.get(part, {}).get("status") == "healthy" for part in ("metadatabase", "scheduler"))

    # ---------------------------------------------------------------------------------------- whole
    def up(self) -> None:
        self.load()
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "home").mkdir(exist_ok=True)
        self.start_postgres()
        self.start_s3()
        self.start_kafka()
        self.start_spark()
        self.start_airflow()
        self.write_env_sh()

    def down(self) -> list[str]:
        """Stop every recorded service, the last started first; return the names of those that were running."""
        stopped = []
        for name in [LOG_SERVER, *reversed(self.topology.services)]:
            daemon = self.daemon(name)
            if daemon.alive():
                stopped.append(name)
            if name == "postgres" and daemon.alive():
                self._stop_postgres()
            daemon.stop()
        return stopped

    def _stop_postgres(self) -> None:
        # pg_ctl's fast shutdown first (a clean checkpoint); Daemon.stop signals whatever is left.
        subprocess.run(self._as_postgres_user([str(postgres_bin() / "pg_ctl"), "-D", str(self.root / "pg" / "data"),
                                               "-m", "fast", "-w", "-t", "60", "stop"]),
                       capture_output=True, check=False)

    def write_env_sh(self) -> None:
        target = self.root / "env.sh"
        lines = ["# source this file to run `airflow` and `sluice` commands against the platform"]
        lines += [f"export {key}={shlex.quote(value)}" for key, value in self.env().items()]
        target.write_text("\n".join(lines) + "\n")
        target.chmod(0o600)

    def summary(self) -> str:
        env_sh = self.root / "env.sh"
        return "\n".join([
            f"sluice platform is up (folder {self.root})",
            f"  Airflow UI      {self.api_url}   login: {self.topology.airflow_admin} / {self.secret('admin')}",
            f"  Spark master    {self.master_url}   UI: {self.master_ui}",
            f"  S3 endpoint     {self.s3_endpoint}   lake {self.topology.lake}, landing {self.topology.landing}",
            f"  PostgreSQL      127.0.0.1:{self.port('postgres')}   database {self.topology.database}",
            f"  Kafka           {self.kafka_bootstrap}   Airflow connection kafka_default",
            "",
            f"Commands against it (airflow, sluice status, any S3 client): source {env_sh}",
            "Land files with any S3 client, one folder per stream (`sluice pipelines` lists the streams), e.g.:",
            f"  aws --endpoint-url $AWS_ENDPOINT_URL s3 cp <file>.jsonl {self.topology.landing}/<stream>/",
            "Run a pipeline through the scheduler:",
            "  airflow dags unpause <pipeline> && airflow dags trigger <pipeline>",
            f"Logs: {self.root / 'logs'}      Stop: make platform-down",
        ])


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m sluice.platform", description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=("up", "down", "env"))
    parser.add_argument("--root", default=os.environ.get("PLATFORM_DIR", ".platform"),
                        help="the platform's folder (default: $PLATFORM_DIR or .platform)")
    parser.add_argument("--no-schedules", action="store_true",
                        help="up: the scheduler runs only triggered and backfill runs, none from the schedules")
    parser.add_argument("--app-data-ttl", type=int, default=TOPOLOGY.app_data_ttl_s, metavar="SECONDS",
                        help="up: how long the Spark workers keep a finished application's folder (its logs and "
                             f"jars; default {TOPOLOGY.app_data_ttl_s})")
    args = parser.parse_args(argv)
    if args.app_data_ttl < 1:
        parser.error("--app-data-ttl must be a positive number of seconds")
    topology = replace(TOPOLOGY, app_data_ttl_s=args.app_data_ttl,
                       worker_cleanup_interval_s=min(TOPOLOGY.worker_cleanup_interval_s, args.app_data_ttl))
    platform = Platform(Path(args.root).resolve(), topology=topology, schedules=not args.no_schedules)
    if args.command == "down":
        stopped = platform.down()
        print(f"stopped: {', '.join(stopped)}" if stopped else "nothing of the platform was running")
        return 0
    if args.command == "env":
        print((platform.load().root / "env.sh").read_text(), end="")
        return 0
    try:
        platform.up()
    except PlatformError as error:
        print(f"ERROR: {error}\nThe services that did start are still up: `make platform-down` stops them.",
              file=sys.stderr)
        return 1
    print(platform.summary())
    return 0
