"""docker-compose.yaml and the images it builds, checked without Docker (fast tier).

* Schema: the file is validated against the official Compose Specification JSON schema
  (compose-spec/compose-spec ``schema/compose-spec.json``), as vendored by ``check-jsonschema``
  (pinned in requirements.txt) and selected with ``--builtin-schema vendor.compose-spec``.
* The topology: the file describes the services of ``sluice.platform.topology.TOPOLOGY`` (the one description
  ``make platform`` starts as processes) with its settings: the service names, the Spark workers' cores and
  memory, every Airflow component's command and shared settings, the lake and the landing zone in the S3
  server, whose identity is the one its clients sign with. A compose file that drifts from it fails here.
* Semantics the schema cannot see: no disk shared between drivers and executors, native Delta everywhere
  Spark runs, both images fetching the jars pinned in include/sluice/core/jars.lock (and no Delta version of
  their own), and build paths that exist.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
import yaml

from sluice.platform.topology import TOPOLOGY

REPO = Path(__file__).resolve().parents[1]
COMPOSE = REPO / "docker-compose.yaml"

# The long-running services, by role, named as TOPOLOGY names them.
AIRFLOW_COMMANDS = {f"airflow-{component}": component for component in TOPOLOGY.airflow_components}
SPARK_WORKERS = tuple(TOPOLOGY.worker_names)
SPARK_SERVICES = ("spark-master", *SPARK_WORKERS)
S3 = "s3"
# Where Spark code runs: the scheduler hosts the drivers (LocalExecutor + client mode), the workers
# host the executors, the master schedules them.
SPARK_RUNNING = ("airflow-scheduler", *SPARK_SERVICES)
INIT = "airflow-init"
# Every container that runs sluice's code, hence reads the lake and the landing zone.
SLUICE_SERVICES = (INIT, *AIRFLOW_COMMANDS, *SPARK_SERVICES)
DELTA_EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"
# The one list of sluice's JVM jars and the stdlib-only tool that fetches them; the images run the tool.
JARS_TOOL = "include/sluice/core/jars.py"
JARS_LOCK = "include/sluice/core/jars.lock"
DELTA_CATALOG = "org.apache.spark.sql.delta.catalog.DeltaCatalog"


# -- helpers ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    # PyYAML resolves the anchors and `<<` merge keys the file uses, as Compose does.
    return yaml.safe_load(COMPOSE.read_text())


def _services(compose: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    return compose["services"]


def _env(service: Mapping[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):  # ["KEY=value", ...]
        env = dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {key: "" if value is None else str(value) for key, value in env.items()}


def _interpolate(value: str) -> str:
    """What Compose makes of ``value`` in an environment that sets none of its variables (no shell overrides,
    no .env): ``${VAR:-default}`` and ``${VAR-default}`` become the default, ``$$`` a ``$``."""

    def resolve(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name, operator, default = match.group("name") or match.group("bare"), match.group("op"), match.group("arg")
        assert operator in (None, ":-", "-"), f"${{{name}{operator}...}} needs the variable set"
        return default or ""

    pattern = r"\$\$|\$\{(?P<name>\w+)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}|\$(?P<bare>\w+)"
    return re.sub(pattern, resolve, value)


def _resolved_env(service: Mapping[str, Any]) -> dict[str, str]:
    return {key: _interpolate(value) for key, value in _env(service).items()}


def _flag(command: list[str], flag: str) -> str:
    assert command.count(flag) == 1, (flag, command)
    return command[command.index(flag) + 1]


def _master_url(compose: Mapping[str, Any]) -> str:
    master = _services(compose)["spark-master"]
    command = _command(master)
    return f"spark://{_flag(command, '--host')}:{_flag(command, '--port')}"


def _mebibytes(size: str) -> int:
    """A JVM/Spark memory size (``512m``, ``2g``) in MiB."""
    match = re.fullmatch(r"(\d+)([mg])", size.strip().lower())
    assert match, size
    return int(match.group(1)) * (1024 if match.group(2) == "g" else 1)


def _spark_defaults() -> dict[str, str]:
    conf = (REPO / "docker/spark/conf/spark-defaults.conf").read_text()
    return {key: value.strip() for key, value in (
        line.split(None, 1) for line in conf.splitlines() if line.strip() and not line.startswith("#"))}


def _command(service: Mapping[str, Any]) -> list[str]:
    command = service.get("command") or []
    return shlex.split(command) if isinstance(command, str) else [str(part) for part in command]


def _mounts(service: Mapping[str, Any]) -> Iterator[tuple[str, str, str]]:
    """(type, source, target) of each volume entry, short or long syntax."""
    for entry in service.get("volumes") or []:
        if isinstance(entry, str):
            source, target = entry.split(":")[:2]
            kind = "bind" if source.startswith((".", "/", "~")) else "volume"
        else:
            kind, source, target = entry["type"], entry.get("source", ""), entry["target"]
        yield kind, source, target


def _dockerfile(service: Mapping[str, Any]) -> tuple[Path, Path]:
    build = service["build"]
    context = REPO / (build if isinstance(build, str) else build.get("context", "."))
    name = "Dockerfile" if isinstance(build, str) else build.get("dockerfile", "Dockerfile")
    return context, context / name


def _instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with comments dropped and line continuations joined. A heredoc's body
    (``RUN python3 - <<'PY'`` ... ``PY``) belongs to its instruction, after a newline, so that its lines
    (``import sys``, ``from x import y``) are not taken for instructions."""
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    out = []
    lines = iter(text.splitlines())
    for line in lines:
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        keyword, _, rest = line.partition(" ")
        for delimiter in re.findall(r"(?<!<)<<(?!<)-?\s*[\"']?(\w+)[\"']?", rest):
            body = []
            for body_line in lines:
                if body_line.strip() == delimiter:
                    break
                body.append(body_line)
            else:
                raise AssertionError(f"{dockerfile}: heredoc {delimiter} is never closed")
            rest = rest + "\n" + "\n".join(body)
        out.append((keyword.upper(), rest.strip()))
    return out


def _shell_commands(run: str) -> list[list[str]]:
    """The commands of a RUN instruction's shell line (its heredoc body left out), split at ``&&``/``;``."""
    commands: list[list[str]] = [[]]
    for token in shlex.split(run.split("\n", 1)[0]):
        if token in {"&&", ";", "||"}:
            commands.append([])
        else:
            commands[-1].append(token)
    return [command for command in commands if command]


def _env_settings(dockerfile: Path) -> dict[str, str]:
    """The ENV instructions' variables (``ENV A=1 B=2`` form), later ones winning."""
    settings: dict[str, str] = {}
    for keyword, rest in _instructions(dockerfile):
        if keyword == "ENV":
            for token in shlex.split(rest):
                name, sep, value = token.partition("=")
                if sep:
                    settings[name] = value
    return settings


def _arg_defaults(dockerfile: Path) -> dict[str, str]:
    defaults: dict[str, str] = {}
    for keyword, rest in _instructions(dockerfile):
        if keyword == "ARG" and "=" in rest:
            name, _, value = rest.partition("=")
            defaults.setdefault(name.strip(), value.strip().strip('"'))
    return defaults


def _base_images(dockerfile: Path) -> list[str]:
    args = _arg_defaults(dockerfile)
    images = []
    for keyword, rest in _instructions(dockerfile):
        if keyword == "FROM":
            image = re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), m.group(0)), rest.split()[0])
            images.append(image)
    return images


def _pin(package: str) -> str:
    for line in (REPO / "requirements.txt").read_text().splitlines():
        name, _, version = line.strip().partition("==")
        if name.lower().replace("_", "-") == package:
            return version
    raise AssertionError(f"{package} is not pinned in requirements.txt")


# -- the Compose Specification schema -----------------------------------------------------------------
def _validate(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.compose-spec", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_compose_file_validates_against_the_compose_spec_schema() -> None:
    result = _validate(COMPOSE)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_schema_check_rejects_an_invalid_compose_file(tmp_path: Path) -> None:
    """Control: the vendored schema is the Compose Specification and the validator really rejects."""
    from importlib.resources import files

    schema = json.loads((files("check_jsonschema") / "builtin_schemas/vendor/compose-spec.json").read_text())
    assert schema["title"] == "Compose Specification"
    broken = yaml.safe_load(COMPOSE.read_text())
    broken["services"][SPARK_WORKERS[0]]["depends_on"]["spark-master"]["condition"] = "service_up"
    broken["services"]["postgres"]["restart_policy"] = "always"
    path = tmp_path / "docker-compose.yaml"
    path.write_text(yaml.safe_dump(broken))
    result = _validate(path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "restart_policy" in result.stdout and "service_up" in result.stdout, result.stdout


# -- the topology: TOPOLOGY, described once ----------------------------------------------------------------
def test_the_services_are_the_topologys(compose: dict[str, Any]) -> None:
    """The long-running services are TOPOLOGY.services (no triggerer, no single spark-worker, no other
    name for the api-server), plus the one-shot init."""
    services = _services(compose)
    assert set(services) == set(TOPOLOGY.services) | {INIT}
    for name in TOPOLOGY.services:
        assert services[name].get("restart") == "always", name
    assert services[INIT].get("restart") == "no"
    assert "org.apache.spark.deploy.master.Master" in _command(services["spark-master"])


@pytest.mark.parametrize("worker", TOPOLOGY.worker_names)
def test_each_spark_worker_is_the_topologys(compose: dict[str, Any], worker: str) -> None:
    service = _services(compose)[worker]
    command = _command(service)
    assert "org.apache.spark.deploy.worker.Worker" in command, command
    assert _flag(command, "--cores") == str(TOPOLOGY.worker_cores), command
    assert _flag(command, "--memory") == TOPOLOGY.worker_memory, command
    # The master URL is the worker's one positional argument.
    assert _master_url(compose) in command, command
    assert service["depends_on"]["spark-master"] == {"condition": "service_healthy"}
    # Its own work folder, inside the container: no volume shared with anyone.
    work = _flag(command, "--work-dir")
    assert not [target for _kind, _source, target in _mounts(service) if work.startswith(target)], work
    # It removes a finished application's folder as make platform's workers do (a disk fills otherwise).
    assert _env(service)["SPARK_WORKER_OPTS"] == TOPOLOGY.worker_options(), _env(service)
    # And keeps the sluice settings of every Spark container beside it.
    assert _env(service)["SLUICE_LAKE"] == TOPOLOGY.lake, _env(service)


def test_published_host_ports_are_distinct(compose: dict[str, Any]) -> None:
    """Two workers (and their UIs) side by side: no two services publish the same host port."""
    published = [
        (name, str(port).split(":")[-2])
        for name, service in _services(compose).items()
        for port in service.get("ports") or []
    ]
    hosts = [port for _name, port in published]
    assert len(hosts) == len(set(hosts)), published
    assert {name for name, _port in published} >= {*SPARK_SERVICES, "airflow-api-server", S3}, published


@pytest.mark.parametrize("component", TOPOLOGY.airflow_components)
def test_each_airflow_component_is_the_topologys(compose: dict[str, Any], component: str) -> None:
    service = _services(compose)[f"airflow-{component}"]
    assert _command(service)[:1] == [component], service.get("command")
    env = _resolved_env(service)
    for key, value in TOPOLOGY.airflow_settings().items():
        assert env.get(key) == value, (component, key, env.get(key), value)


def test_init_has_the_airflow_settings_too(compose: dict[str, Any]) -> None:
    """airflow-init migrates the database with the configuration the components run with."""
    env = _resolved_env(_services(compose)[INIT])
    assert {key: env.get(key) for key in TOPOLOGY.airflow_settings()} == TOPOLOGY.airflow_settings()


@pytest.mark.parametrize("name", SLUICE_SERVICES)
def test_every_sluice_container_has_the_topologys_lake_and_landing(compose: dict[str, Any], name: str) -> None:
    env = _resolved_env(_services(compose)[name])
    for key, value in TOPOLOGY.sluice_settings().items():
        assert env.get(key) == value, (name, key, env.get(key), value)
    assert env.get("AWS_REGION") == TOPOLOGY.region, name


def test_the_s3_server_is_the_one_the_clients_sign_for(compose: dict[str, Any]) -> None:
    """Every sluice container reaches the `s3` service at its port and signs with the identity it checks,
    with or without the S3_ACCESS_KEY / S3_SECRET_KEY overrides (the same expressions on both sides)."""
    services = _services(compose)
    server = _env(services[S3])
    assert server["S3PROXY_AUTHORIZATION"] in {"aws-v4", "aws-v2-or-v4"}, server["S3PROXY_AUTHORIZATION"]
    assert server["JCLOUDS_PROVIDER"] == "filesystem"
    server_port = urlparse(server.get("S3PROXY_ENDPOINT", "http://0.0.0.0:80")).port or 80
    volumes = {target: (kind, source) for kind, source, target in _mounts(services[S3])}
    basedir = server["JCLOUDS_FILESYSTEM_BASEDIR"]
    assert volumes.get(basedir, ("", ""))[0] == "volume", (basedir, volumes)
    assert volumes[basedir][1] in compose["volumes"], volumes[basedir]
    for name in SLUICE_SERVICES:
        client = _env(services[name])
        assert client["AWS_ACCESS_KEY_ID"] == server["S3PROXY_IDENTITY"], name
        assert client["AWS_SECRET_ACCESS_KEY"] == server["S3PROXY_CREDENTIAL"], name
        assert _interpolate(client["AWS_ACCESS_KEY_ID"]) and _interpolate(client["AWS_SECRET_ACCESS_KEY"]), name
        endpoint = urlparse(client["AWS_ENDPOINT_URL"])
        assert (endpoint.scheme, endpoint.hostname, endpoint.port or 80) == ("http", S3, server_port), name
        # Plain HTTP inside the compose network: delta-rs refuses it unless told.
        assert client["AWS_ALLOW_HTTP"] == "true", name
    health = " ".join(services[S3]["healthcheck"]["test"])
    assert f"/{server_port}" in health and "/healthz" in health, health


def test_the_s3_server_is_the_locked_s3proxy() -> None:
    """The image of the `s3` service is s3proxy at the version jars.lock pins for `make platform` and the
    object-storage tests: one S3 server, one version (its 4.x line has the conditional puts sluice needs)."""
    from sluice.core.jars import locked

    (jar,) = locked(["s3proxy"])
    assert (jar.group, jar.artifact) == ("org.gaul", "s3proxy"), jar
    assert jar.version.startswith("4."), jar.version
    image = yaml.safe_load(COMPOSE.read_text())["services"][S3]["image"]
    assert image == f"andrewgaul/s3proxy:{jar.version}", (image, jar.version)


def test_the_kafka_broker_is_the_locked_kafka_and_every_airflow_container_reaches_it(compose: dict[str, Any]) -> None:
    """The `kafka` service runs the Kafka that jars.lock pins for `make platform` and the Kafka tests, in KRaft
    combined mode on a volume, and every Airflow container's kafka_default connection (the Apache Kafka
    provider's type) names its PLAINTEXT listener, after the broker is healthy."""
    from sluice.core.jars import locked

    (broker,) = [j for j in locked(["kafka-broker"]) if j.artifact == "kafka_2.13"]
    services = _services(compose)
    kafka = services["kafka"]
    assert kafka["image"] == f"apache/kafka:{broker.version}", (kafka["image"], broker.version)
    env = _env(kafka)
    assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"
    assert "PLAINTEXT://kafka:9092" in env["KAFKA_ADVERTISED_LISTENERS"].split(",")
    volumes = {target: (kind, source) for kind, source, target in _mounts(kafka)}
    assert volumes[env["KAFKA_LOG_DIRS"]][1] in compose["volumes"], volumes
    for name in (INIT, *AIRFLOW_COMMANDS):
        connection = json.loads(_env(services[name])["AIRFLOW_CONN_KAFKA_DEFAULT"])
        assert connection == TOPOLOGY.kafka_connection("kafka:9092"), (name, connection)
    for name in AIRFLOW_COMMANDS:
        assert services[name]["depends_on"]["kafka"]["condition"] == "service_healthy", name


def test_spark_defaults_fit_the_topologys_workers() -> None:
    """Each executor fits on a worker, and the cluster holds two sluice applications at once (the two hourly
    DAGs fire together): with spark.cores.max unset the first one would take every core."""
    conf = _spark_defaults()
    executor_cores = int(conf["spark.executor.cores"])
    assert executor_cores <= TOPOLOGY.worker_cores, conf
    assert _mebibytes(conf["spark.executor.memory"]) <= _mebibytes(TOPOLOGY.worker_memory), conf
    # The heap sluice's own sessions ask for (SLUICE_EXECUTOR_MEMORY) and a session started by hand get the same.
    assert conf["spark.executor.memory"] == TOPOLOGY.sluice_settings()["SLUICE_EXECUTOR_MEMORY"], conf
    executors = TOPOLOGY.spark_workers * (TOPOLOGY.worker_cores // executor_cores)
    per_application = int(conf["spark.cores.max"]) // executor_cores
    assert per_application >= 1 and executors // per_application >= 2, (conf, TOPOLOGY)
    # The same share per application as make platform's master gives (spark.deploy.defaultCores).
    assert int(conf["spark.cores.max"]) == TOPOLOGY.app_cores, (conf, TOPOLOGY.master_options())


# -- services -----------------------------------------------------------------------------------------
def test_airflow_services_use_the_project_airflow_image(compose: dict[str, Any]) -> None:
    services = _services(compose)
    dockerfiles = {_dockerfile(services[name])[1] for name in (INIT, *AIRFLOW_COMMANDS)}
    assert len(dockerfiles) == 1, dockerfiles
    dockerfile = dockerfiles.pop()
    assert dockerfile == REPO / "docker/airflow/Dockerfile"
    bases = _base_images(dockerfile)
    airflow = f"apache/airflow:{_pin('apache-airflow')}-python3.11"
    assert bases[-1] == airflow, bases
    text = dockerfile.read_text()
    assert "requirements.txt" in text
    assert re.search(r"pip install .*-e /opt/project", text), "the project must be installed in the image"
    # A Java 17 runtime for spark-submit in client mode.
    assert any(base.startswith("eclipse-temurin:17") for base in bases), bases
    assert "JAVA_HOME=/opt/java/openjdk" in text


def test_init_migrates_configures_the_admin_and_creates_the_bucket(compose: dict[str, Any]) -> None:
    services = _services(compose)
    init = services[INIT]
    script = " ".join(_command(init))
    assert "airflow db migrate" in script
    env = _env(init)
    assert env["AIRFLOW__CORE__AUTH_MANAGER"].endswith("SimpleAuthManager")
    assert "SIMPLE_AUTH_MANAGER_PASSWORDS_FILE" in script
    assert env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS"].endswith(":admin")
    # The bucket of the lake and the landing zone, from their URIs, once the S3 server answers.
    assert "create_bucket" in script and "SLUICE_LAKE" in script and "SLUICE_LANDING" in script, script
    assert init["depends_on"][S3] == {"condition": "service_healthy"}
    for name in AIRFLOW_COMMANDS:
        assert services[name]["depends_on"][INIT] == {"condition": "service_completed_successfully"}, name
    assert services["airflow-api-server"]["ports"] == ["8080:8080"]


def test_healthchecks_and_depends_on_conditions(compose: dict[str, Any]) -> None:
    services = _services(compose)
    for name, service in services.items():
        if name != INIT:
            assert service.get("healthcheck", {}).get("test"), f"{name} has no healthcheck"
        depends = service.get("depends_on") or {}
        assert isinstance(depends, dict), f"{name}: depends_on needs conditions"
        for target, spec in depends.items():
            assert target in services and target != name, (name, target)
            condition = spec["condition"]
            if condition == "service_healthy":
                assert "healthcheck" in services[target], (name, target)
            else:
                assert (target, condition) == (INIT, "service_completed_successfully"), (name, target)
    assert not services["postgres"].get("depends_on") and not services[S3].get("depends_on")
    # Everything that runs sluice's code needs the bucket up.
    for name in SLUICE_SERVICES:
        assert services[name]["depends_on"][S3] == {"condition": "service_healthy"}, name
    # The drivers need a live master; the workers need it too.
    for name in ("airflow-scheduler", *SPARK_WORKERS):
        assert services[name]["depends_on"]["spark-master"]["condition"] == "service_healthy", name


# -- the lake in the bucket, native Delta ---------------------------------------------------------------
def test_no_disk_is_shared_with_the_spark_services(compose: dict[str, Any]) -> None:
    """The lake and the landing zone are s3:// URIs, the same in every Airflow and Spark container: executors
    share no disk with the drivers, so no Spark service mounts a volume, nor anything at SLUICE_HOME."""
    services = _services(compose)
    assert "sluice-lake" not in compose["volumes"]
    for name in SPARK_SERVICES:
        home = _env(services[name])["SLUICE_HOME"]
        for kind, source, target in _mounts(services[name]):
            assert kind == "bind", (name, source, target)
            assert not (home + "/").startswith(target.rstrip("/") + "/"), (name, target, home)
    # The Airflow containers keep SLUICE_HOME (local caches) on a volume of their own.
    for name in (INIT, *AIRFLOW_COMMANDS):
        home = _env(services[name])["SLUICE_HOME"]
        assert [s for kind, s, target in _mounts(services[name]) if target == home and kind == "volume"], name
    roots = {
        (env["SLUICE_LAKE"], env["SLUICE_LANDING"], env["AWS_ENDPOINT_URL"])
        for env in (_resolved_env(services[name]) for name in SLUICE_SERVICES)
    }
    assert len(roots) == 1, roots
    ((lake, landing, _endpoint),) = roots
    assert lake.startswith("s3://") and landing.startswith("s3://"), roots
    # Drivers and executors write the same objects: same uid/gid everywhere.
    users = {services[name]["user"] for name in (*AIRFLOW_COMMANDS, *SPARK_SERVICES)}
    assert len(users) == 1, users


def test_native_delta_engine_wherever_spark_runs(compose: dict[str, Any]) -> None:
    services = _services(compose)
    for name in (*AIRFLOW_COMMANDS, *SPARK_RUNNING):
        env = _env(services[name])
        # spark-defaults.conf (Delta extension + catalog) reaches every Spark JVM through SPARK_CONF_DIR.
        conf_dir = env["SPARK_CONF_DIR"]
        binds = {target: source for kind, source, target in _mounts(services[name]) if kind == "bind"}
        assert (REPO / binds[conf_dir]).resolve() == REPO / "docker/spark/conf", name
    settings = _spark_defaults()
    assert settings["spark.sql.extensions"] == DELTA_EXTENSION
    assert settings["spark.sql.catalog.spark_catalog"] == DELTA_CATALOG


def test_spark_default_connection_points_at_the_master(compose: dict[str, Any]) -> None:
    services = _services(compose)
    master = services["spark-master"]
    for name in AIRFLOW_COMMANDS:
        conn = json.loads(_env(services[name])["AIRFLOW_CONN_SPARK_DEFAULT"])
        assert conn["conn_type"] == "spark"
        # What SparkSubmitHook builds from a UI-style spark connection: host (full URL) + port.
        assert f"{conn['host']}:{conn['port']}" == _master_url(compose) == "spark://spark-master:7077"
        assert conn.get("extra", {}).get("deploy-mode", "client") == "client"
    command = _command(master)
    assert master.get("hostname") == "spark-master" or "spark-master" in command
    assert command[command.index("--port") + 1] == "7077"


def test_tasks_reach_the_api_servers_execution_api(compose: dict[str, Any]) -> None:
    services = _services(compose)
    for name in (INIT, *AIRFLOW_COMMANDS):
        url = urlparse(_env(services[name])["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"])
        assert (url.hostname, url.port, url.path) == ("airflow-api-server", 8080, "/execution/"), (name, url)


# -- images -----------------------------------------------------------------------------------------
def test_build_contexts_and_dockerfiles_exist(compose: dict[str, Any]) -> None:
    builds = [(name, s) for name, s in _services(compose).items() if "build" in s]
    assert {name for name, _ in builds} >= {INIT, *AIRFLOW_COMMANDS, *SPARK_SERVICES}
    for name, service in builds:
        context, dockerfile = _dockerfile(service)
        assert context.is_dir(), f"{name}: build context {context} missing"
        assert dockerfile.is_file(), f"{name}: {dockerfile} missing"
        # Every COPY source (other than from another stage/image) exists in the context.
        for keyword, rest in _instructions(dockerfile):
            if keyword in {"COPY", "ADD"} and "--from=" not in rest:
                parts = [p for p in rest.split() if not p.startswith("--")]
                for source in parts[:-1]:
                    assert (context / source).exists(), f"{dockerfile}: COPY source {source} missing"
    # Bind-mounted configuration exists (dags/, jobs/, plugins/ are created by Compose if absent).
    for name, service in _services(compose).items():
        for kind, source, _target in _mounts(service):
            if kind == "bind" and source.lstrip("./") not in {"dags", "jobs", "plugins"}:
                assert (REPO / source).exists(), f"{name}: bind source {source} missing"


def test_both_images_fetch_the_delta_jars_of_the_lock(compose: dict[str, Any]) -> None:
    """Drivers (Airflow image) and anything started in the Spark image get delta-spark from jars.lock:
    each image copies jars.py + jars.lock and runs ``jars.py fetch --set delta`` into its SLUICE_JARS_DIR,
    the cache sluice's sessions read at run time. No Delta version of their own, no second copy in
    $SPARK_HOME/jars."""
    services = _services(compose)
    users = {
        REPO / "docker/airflow/Dockerfile": (INIT, *AIRFLOW_COMMANDS),
        REPO / "docker/spark/Dockerfile": SPARK_SERVICES,
    }
    for dockerfile, names in users.items():
        assert {_dockerfile(services[name])[1] for name in names} == {dockerfile}, names

    # No Delta version outside the lock: no x-delta-* anchor, no Delta build args.
    assert not [key for key in compose if "delta" in key.lower()], list(compose)
    for name, service in services.items():
        build = service.get("build")
        args = (build.get("args") if isinstance(build, dict) else None) or {}
        assert not [arg for arg in args if "DELTA" in str(arg).upper()], (name, args)

    jar_dirs = set()
    for dockerfile, names in users.items():
        instructions = _instructions(dockerfile)
        assert not [name for name in _arg_defaults(dockerfile) if "DELTA" in name], dockerfile
        assert not [rest for _, rest in instructions if "install-delta-jars" in rest], dockerfile

        # jars.py and jars.lock copied side by side (jars.py reads the jars.lock next to itself).
        copies = [
            (index, [part for part in rest.split() if not part.startswith("--")])
            for index, (keyword, rest) in enumerate(instructions)
            if keyword == "COPY" and JARS_TOOL in rest.split()
        ]
        assert len(copies) == 1, (dockerfile, copies)
        copied_at, parts = copies[0]
        assert JARS_LOCK in parts[:-1], (dockerfile, parts)
        assert parts[-1].endswith("/"), (dockerfile, parts)
        tool = parts[-1] + "jars.py"

        # SLUICE_JARS_DIR set by ENV (so it holds at run time too) before the fetch.
        env_at = [i for i, (k, rest) in enumerate(instructions) if k == "ENV" and "SLUICE_JARS_DIR=" in rest]
        jars_dir = _env_settings(dockerfile).get("SLUICE_JARS_DIR", "")
        assert env_at and jars_dir.startswith("/"), (dockerfile, jars_dir)
        jar_dirs.add(jars_dir)

        fetches = [
            (index, command, commands)
            for index, (keyword, rest) in enumerate(instructions)
            if keyword == "RUN"
            for commands in [_shell_commands(rest)]
            for command in commands
            if command[:3] in (["python3", tool, "fetch"], ["python", tool, "fetch"])
        ]
        assert len(fetches) == 1, (dockerfile, fetches)
        fetched_at, fetch, commands = fetches[0]
        assert copied_at < fetched_at and env_at[0] < fetched_at, dockerfile
        sets = [fetch[i + 1] for i, token in enumerate(fetch) if token == "--set"]
        assert "delta" in sets, fetch
        # Only what jars.lock names (locked() rejects unknown sets), and only into SLUICE_JARS_DIR.
        from sluice.core.jars import locked

        assert locked(sets), sets
        assert not [token for token in fetch if token.startswith("--into")], fetch
        # The containers run as AIRFLOW_UID (any uid, gid 0): the jars must be readable by all.
        readable = ["chmod", "-R", "a+rX"]
        assert [c[3:] for c in commands if c[:3] == readable] in ([[jars_dir]], [["${SLUICE_JARS_DIR}"]]), commands
        # Nothing else puts jars on $SPARK_HOME's classpath.
        for keyword, rest in instructions:
            if keyword in {"RUN", "COPY"}:
                assert not re.search(r"(SPARK_HOME\}?|/opt/spark|pyspark)/jars\b", rest), (dockerfile, rest)

        # No bind mount or volume hides the image's cache, and compose does not point elsewhere.
        for name in names:
            for _kind, _source, target in _mounts(services[name]):
                assert not (jars_dir + "/").startswith(target.rstrip("/") + "/"), (name, target, jars_dir)
            assert _env(services[name]).get("SLUICE_JARS_DIR", jars_dir) == jars_dir, name
    assert len(jar_dirs) == 1, jar_dirs


@pytest.mark.parametrize("image", ["airflow", "spark"])
def test_each_image_fetches_the_s3a_jars_for_a_lake_in_the_bucket(compose: dict[str, Any], image: str) -> None:
    """A session for an s3:// lake needs jars.lock's `s3` set (the s3a file system) besides `delta`: the drivers
    in the Airflow image (LocalExecutor, client mode), and the executors in the Spark image, which load them
    from its own copy. Both images fetch both sets at build time."""
    from sluice.core.jars import locked

    assert _env(_services(compose)["airflow-scheduler"])["SLUICE_LAKE"].startswith("s3://")
    fetches = [
        command
        for keyword, rest in _instructions(REPO / f"docker/{image}/Dockerfile")
        if keyword == "RUN"
        for command in _shell_commands(rest)
        if command[:1] in (["python3"], ["python"]) and command[2:3] == ["fetch"]
    ]
    assert len(fetches) == 1, fetches
    sets = {fetches[0][i + 1] for i, token in enumerate(fetches[0]) if token == "--set"}
    assert sets >= {"delta", "s3"}, fetches[0]
    assert locked(["s3"]), "jars.lock has no s3 set"
    # The containers have kafka_default, so their sessions take Spark's Kafka source (sluice.runtime.spark).
    assert "kafka" in sets, fetches[0]


@pytest.mark.parametrize("name", SLUICE_SERVICES)
def test_the_executors_load_the_jars_of_the_spark_image(compose: dict[str, Any], name: str) -> None:
    """Every container that starts Spark sessions names the Spark image's jar folder as the executors'
    (SLUICE_EXECUTOR_JARS): its sessions put it on the executors' class path and ship no jar."""
    spark_jars = _env_settings(REPO / "docker/spark/Dockerfile")["SLUICE_JARS_DIR"]
    assert _resolved_env(_services(compose)[name]).get("SLUICE_EXECUTOR_JARS") == spark_jars, name


def test_the_locked_delta_jars_match_the_pinned_spark_and_delta_spark() -> None:
    """The delta-spark jar in jars.lock is Delta's build for the Spark minor requirements.txt pins for
    pyspark (Delta names its artifacts delta-spark_<spark major.minor>_<scala> since 4.x; Spark 4 is Scala
    2.13 only), of the same release as delta-storage and as the delta-spark Python package."""
    from sluice.core.jars import locked

    jars = locked(["delta"])
    assert {jar.group for jar in jars} == {"io.delta"}, jars
    builds = [m for jar in jars if (m := re.fullmatch(r"delta-spark_(\d+\.\d+)_(\d+\.\d+)", jar.artifact))]
    assert len(builds) == 1, [jar.coordinate for jar in jars]
    spark_minor, scala = builds[0].groups()
    pyspark = _pin("pyspark")
    assert spark_minor == ".".join(pyspark.split(".")[:2]), (builds[0].string, pyspark)
    assert scala == "2.13", builds[0].string
    assert {jar.artifact for jar in jars} == {builds[0].string, "delta-storage"}, jars
    versions = {jar.version for jar in jars}
    assert len(versions) == 1, versions
    delta_version = versions.pop()
    assert re.fullmatch(r"\d+\.\d+\.\d+", delta_version), delta_version
    assert delta_version == _pin("delta-spark"), (delta_version, _pin("delta-spark"))


def test_driver_and_executor_python_match() -> None:
    """PySpark refuses executors whose Python minor version differs from the driver's."""
    airflow = _base_images(REPO / "docker/airflow/Dockerfile")[-1]
    spark = _base_images(REPO / "docker/spark/Dockerfile")[-1]
    assert airflow.endswith("-python3.11"), airflow
    assert spark.startswith("python:3.11"), spark
    assert "requirements.txt" in (REPO / "docker/spark/Dockerfile").read_text()
