"""docker-compose.yaml and the images it builds, checked without Docker (fast tier).

* Schema: the file is validated against the official Compose Specification JSON schema
  (compose-spec/compose-spec ``schema/compose-spec.json``), as vendored by ``check-jsonschema``
  (pinned in requirements.txt) and selected with ``--builtin-schema vendor.compose-spec``.
* Semantics the schema cannot see: the services sluice needs, one lake volume at one path for drivers
  and executors, native Delta everywhere Spark runs, Delta jars baked into the Spark image, and build
  paths that exist.
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

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
COMPOSE = REPO / "docker-compose.yaml"

AIRFLOW_COMMANDS = {
    "airflow-apiserver": "api-server",
    "airflow-scheduler": "scheduler",
    "airflow-dag-processor": "dag-processor",
    "airflow-triggerer": "triggerer",
}
SPARK_SERVICES = ("spark-master", "spark-worker")
# Where Spark code runs: the scheduler hosts the drivers (LocalExecutor + client mode), the worker
# hosts the executors, the master schedules them.
SPARK_RUNNING = ("airflow-scheduler", *SPARK_SERVICES)
INIT = "airflow-init"
DELTA_EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"
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
    """(INSTRUCTION, arguments) with comments dropped and line continuations joined."""
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            out.append((keyword.upper(), rest.strip()))
    return out


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
    broken["services"]["spark-worker"]["depends_on"]["spark-master"]["condition"] = "service_up"
    broken["services"]["postgres"]["restart_policy"] = "always"
    path = tmp_path / "docker-compose.yaml"
    path.write_text(yaml.safe_dump(broken))
    result = _validate(path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "restart_policy" in result.stdout and "service_up" in result.stdout, result.stdout


# -- services -----------------------------------------------------------------------------------------
def test_required_services_exist(compose: dict[str, Any]) -> None:
    services = _services(compose)
    for name in ("postgres", INIT, *AIRFLOW_COMMANDS, *SPARK_SERVICES):
        assert name in services, f"missing service {name}"
    for name, command in AIRFLOW_COMMANDS.items():
        assert _command(services[name])[-1:] == [command], (name, services[name].get("command"))
    assert "org.apache.spark.deploy.master.Master" in _command(services["spark-master"])
    worker = _command(services["spark-worker"])
    assert "org.apache.spark.deploy.worker.Worker" in worker
    assert "spark://spark-master:7077" in worker


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


def test_init_migrates_and_configures_the_admin(compose: dict[str, Any]) -> None:
    services = _services(compose)
    init = services[INIT]
    script = " ".join(_command(init))
    assert "airflow db migrate" in script
    env = _env(init)
    assert env["AIRFLOW__CORE__AUTH_MANAGER"].endswith("SimpleAuthManager")
    assert "SIMPLE_AUTH_MANAGER_PASSWORDS_FILE" in script
    assert env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS"].endswith(":admin")
    assert init.get("restart") == "no"
    for name in AIRFLOW_COMMANDS:
        assert services[name]["depends_on"][INIT] == {"condition": "service_completed_successfully"}, name
    assert _services(compose)["airflow-apiserver"]["ports"] == ["8080:8080"]


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
    assert "airflow-init" not in (services["postgres"].get("depends_on") or {})
    # The drivers need a live master; the worker needs it too.
    assert services["airflow-scheduler"]["depends_on"]["spark-master"]["condition"] == "service_healthy"
    assert services["spark-worker"]["depends_on"]["spark-master"]["condition"] == "service_healthy"


# -- one lake, native Delta -------------------------------------------------------------------------
def test_airflow_and_spark_share_the_lake_volume_at_the_same_path(compose: dict[str, Any]) -> None:
    services = _services(compose)
    lakes = set()
    for name in (INIT, *AIRFLOW_COMMANDS, *SPARK_SERVICES):
        env = _env(services[name])
        home = env.get("SLUICE_HOME")
        assert home, f"{name}: SLUICE_HOME is not set"
        volumes = [(source, target) for kind, source, target in _mounts(services[name]) if target == home]
        assert len(volumes) == 1, f"{name}: nothing mounted at SLUICE_HOME={home}"
        lakes.add(volumes[0])
    assert lakes == {("sluice-lake", "/opt/sluice")}, lakes
    assert "sluice-lake" in compose["volumes"]
    # Drivers and executors write the same files: same uid/gid everywhere.
    users = {services[name]["user"] for name in (*AIRFLOW_COMMANDS, *SPARK_SERVICES)}
    assert len(users) == 1, users


def test_native_delta_engine_wherever_spark_runs(compose: dict[str, Any]) -> None:
    services = _services(compose)
    for name in (*AIRFLOW_COMMANDS, *SPARK_RUNNING):
        env = _env(services[name])
        assert env.get("SLUICE_DELTA_ENGINE") == "native", name
        # spark-defaults.conf (Delta extension + catalog) reaches every Spark JVM through SPARK_CONF_DIR.
        conf_dir = env["SPARK_CONF_DIR"]
        binds = {target: source for kind, source, target in _mounts(services[name]) if kind == "bind"}
        assert (REPO / binds[conf_dir]).resolve() == REPO / "docker/spark/conf", name
    conf = (REPO / "docker/spark/conf/spark-defaults.conf").read_text()
    settings = dict(line.split(None, 1) for line in conf.splitlines() if line.strip() and not line.startswith("#"))
    assert settings["spark.sql.extensions"].strip() == DELTA_EXTENSION
    assert settings["spark.sql.catalog.spark_catalog"].strip() == DELTA_CATALOG


def test_spark_default_connection_points_at_the_master(compose: dict[str, Any]) -> None:
    services = _services(compose)
    master = services["spark-master"]
    for name in AIRFLOW_COMMANDS:
        conn = json.loads(_env(services[name])["AIRFLOW_CONN_SPARK_DEFAULT"])
        assert conn["conn_type"] == "spark"
        # What SparkSubmitHook builds from a UI-style spark connection: host (full URL) + port.
        assert f"{conn['host']}:{conn['port']}" == "spark://spark-master:7077"
        assert conn.get("extra", {}).get("deploy-mode", "client") == "client"
    command = _command(master)
    assert master.get("hostname") == "spark-master" or "spark-master" in command
    assert command[command.index("--port") + 1] == "7077"


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


def test_spark_image_bakes_in_the_delta_jars(compose: dict[str, Any]) -> None:
    services = _services(compose)
    spark_dockerfile = _dockerfile(services["spark-worker"])[1]
    assert spark_dockerfile == REPO / "docker/spark/Dockerfile"
    assert _dockerfile(services["spark-master"])[1] == spark_dockerfile
    airflow_dockerfile = _dockerfile(services["airflow-scheduler"])[1]
    installer = REPO / "docker/delta/install-delta-jars.sh"
    script = installer.read_text()

    # Both images (driver and executor classpaths) run the installer with the same coordinates.
    args = {services[name]["build"]["args"]["DELTA_SPARK_ARTIFACT"] for name in (*SPARK_SERVICES, *AIRFLOW_COMMANDS)}
    versions = {services[name]["build"]["args"]["DELTA_VERSION"] for name in (*SPARK_SERVICES, *AIRFLOW_COMMANDS)}
    assert len(args) == 1 and len(versions) == 1, (args, versions)
    artifact, delta_version = args.pop(), versions.pop()
    for dockerfile in (spark_dockerfile, airflow_dockerfile):
        defaults = _arg_defaults(dockerfile)
        assert (defaults["DELTA_SPARK_ARTIFACT"], defaults["DELTA_VERSION"]) == (artifact, delta_version)
        runs = " ".join(rest for keyword, rest in _instructions(dockerfile) if keyword == "RUN")
        assert "install-delta-jars.sh" in runs, dockerfile
        assert any(
            keyword == "COPY" and "docker/delta/install-delta-jars.sh" in rest
            for keyword, rest in _instructions(dockerfile)
        ), dockerfile

    # The artifact is the delta-spark build for the Spark minor the project pins (Scala 2.13).
    match = re.fullmatch(r"delta-spark_(\d+\.\d+)_2\.13", artifact)
    assert match, artifact
    assert match.group(1) == ".".join(_pin("pyspark").split(".")[:2]), (artifact, _pin("pyspark"))
    assert re.fullmatch(r"\d+\.\d+\.\d+", delta_version)

    # The installer resolves delta-spark and delta-storage into $SPARK_HOME/jars and checks both landed;
    # the Spark image's SPARK_HOME is /opt/spark.
    assert "io.delta:${DELTA_SPARK_ARTIFACT}:${DELTA_VERSION}" in script
    assert "io.delta:delta-storage:${DELTA_VERSION}" in script
    assert 'jars_dir="${SPARK_HOME}/jars"' in script
    assert "delta-storage-${DELTA_VERSION}.jar" in script
    assert "SPARK_HOME=/opt/spark" in spark_dockerfile.read_text()


def test_driver_and_executor_python_match() -> None:
    """PySpark refuses executors whose Python minor version differs from the driver's."""
    airflow = _base_images(REPO / "docker/airflow/Dockerfile")[-1]
    spark = _base_images(REPO / "docker/spark/Dockerfile")[-1]
    assert airflow.endswith("-python3.11"), airflow
    assert spark.startswith("python:3.11"), spark
    assert "requirements.txt" in (REPO / "docker/spark/Dockerfile").read_text()
