"""The one typed place for sluice configuration.

Precedence, lowest first: shipped defaults (SPEC section 3) < YAML file (``SLUICE_CONFIG``, or
``$SLUICE_HOME/sluice.yaml`` when it exists) < environment variables < explicit overrides passed by the
CLI.  Invalid values fail fast with a :class:`ConfigError` naming the key and what is allowed.

Environment variables:

=================================  ==========================================================
``SLUICE_HOME``                    root of everything (default ``./.sluice``)
``SLUICE_LANDING``                 landing zone (default ``$SLUICE_HOME/landing``)
``SLUICE_LAKE``                    Delta lake root (default ``$SLUICE_HOME/lake``)
``SLUICE_NOW``                     injectable "now", RFC 3339 (default: the wall clock)
``SLUICE_CONFIG``                  YAML file with any of the keys below
``SLUICE_PIPELINES``               the pipelines folder (YAML ``pipelines_path``; default ``pipelines/``)
``SLUICE_<STREAM>_<KEY>``          per-stream override, e.g. ``SLUICE_READINGS_WATERMARK_DELAY=15m``
``SLUICE_<KEY>``                   global key, e.g. ``SLUICE_MAX_FILES_PER_TRIGGER=50``
``SLUICE_<PIPELINE>_<KEY>``        per-pipeline policy, e.g. ``SLUICE_DEVICE_TEMPS_CORRECTIONS=auto``
``SLUICE_KAFKA_BOOTSTRAP``         Kafka's servers, for streams on a topic (YAML ``kafka: {bootstrap.servers: ..}``)
``SLUICE_KAFKA_<PROPERTY>``        any other Kafka client property, ``_`` for ``.``, e.g. ``SLUICE_KAFKA_SASL_USERNAME``
=================================  ==========================================================
"""

from __future__ import annotations

import os
import re
from collections.abc import Collection, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import yaml

from sluice.config.settings import Settings
from sluice.config.values import (
    Convert,
    _absolute_folder,
    _choice,
    _lease_ttl,
    _memory,
    _path,
    _positive_duration,
    _retired_engine,
    _root,
    _share,
    _text,
    _timestamp,
    _whole,
    parse_time,
)
from sluice.core.api import CORRECTION_POLICIES
from sluice.core.errors import ConfigError
from sluice.core.lake import Credentials, Lake, mount, parse_root
from sluice.core.registry import Registry, default_pipelines_path, load_registry
from sluice.core.timeutil import parse_duration


def _read_yaml(path: Path) -> dict[str, Any]:
    if path.is_dir():
        raise ConfigError(f"SLUICE_CONFIG: {path} is a directory; point it at a YAML file")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except FileNotFoundError:
        raise ConfigError(f"SLUICE_CONFIG: file {path} does not exist; point it at a YAML file") from None
    except NotADirectoryError:
        raise ConfigError(f"SLUICE_CONFIG: {path} lies under a file, not a folder; point it at a YAML file") from None
    except OSError as exc:
        raise ConfigError(f"SLUICE_CONFIG: {path} cannot be read ({exc.strerror}); point it at a readable YAML "
                          "file") from None
    except UnicodeDecodeError:
        raise ConfigError(f"SLUICE_CONFIG: {path} is not a UTF-8 text file; point it at a YAML file") from None
    except yaml.YAMLError as exc:
        detail = " ".join(str(exc).split())
        raise ConfigError(f"SLUICE_CONFIG: {path} is not valid YAML: {detail}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"SLUICE_CONFIG: {path} must hold a mapping of keys, got {type(data).__name__}")
    return data


STREAM_KEYS = ("watermark_delay", "early_tolerance", "idle_timeout")
STATE_STORES = ("hdfs", "rocksdb")
MIN_RETENTION_HOURS = 24

# Global keys: YAML ``key`` or environment ``SLUICE_<KEY>``.
_GLOBALS: dict[str, Convert] = {
    "dedup_retention": parse_duration,
    "max_files_per_trigger": _whole(1),
    "shuffle_partitions": _whole(1),
    "catchup_min_windows": _whole(0),
    "batch_close_rows": _whole(0),
    "spark_master": _text("local[2] or spark://host:7077"),
    "driver_memory": _memory("2g"),
    "executor_memory": _memory("2g"),
    "executor_jars": _absolute_folder("/opt/sluice-jars"),
    "delta_engine": _retired_engine,
    "state_store": _choice(STATE_STORES),
    "vacuum_retention_hours": _whole(
        MIN_RETENTION_HOURS, " hours, so that running readers and retried writes never lose files"
    ),
    "lateness_threshold": _share,
    "lease_ttl": _lease_ttl,
    "max_corrections_per_run": _whole(1),
    "data_docs_url": _text("https://airflow.example.com/sluice/docs"),
}

# Per-pipeline policy keys (YAML ``pipelines.<name>.<key>``, env ``SLUICE_<PIPELINE>_<KEY>``) and the
# PipelineDef field each sets.
POLICY_KEYS: dict[str, str] = {
    "corrections": "corrections",
    "max_age": "correction_max_age",
    "max_corrections_per_run": "max_corrections_per_run",
    "freshness_grace": "freshness_grace",
}


@dataclass(frozen=True)
class _Section:
    """A YAML mapping with fixed keys, each a converter or a nested section."""

    keys: Mapping[str, Any]
    example: str


@dataclass(frozen=True)
class _Each:
    """A YAML mapping from declared names (streams, pipelines) to one section each."""

    what: str
    names: Collection[str]
    item: _Section
    example: str


_POLICY: dict[str, Convert] = {
    "corrections": _choice(CORRECTION_POLICIES),
    "max_age": _positive_duration,
    "max_corrections_per_run": _whole(1),
    "freshness_grace": parse_duration,
}


def _kafka_properties(value: Any, key: str) -> dict[str, str]:
    """YAML ``kafka``: Kafka client properties as the Airflow connection ``kafka_default`` holds them."""
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise ConfigError(f"{key}: expected a mapping of Kafka client properties, e.g. "
                          "{bootstrap.servers: 'broker:9092', security.protocol: SASL_SSL}")
    return {k: str(v) for k, v in value.items() if v is not None}


KAFKA_PREFIX = "SLUICE_KAFKA_"


def kafka_properties(env: Mapping[str, str], conf: Mapping[str, str] | None = None) -> dict[str, str]:
    """Kafka client properties (librdkafka's names, as the Apache Kafka provider's connection ``kafka_default``
    holds them): YAML ``kafka``, then ``SLUICE_KAFKA_BOOTSTRAP`` (``bootstrap.servers``) and every other
    ``SLUICE_KAFKA_<PROPERTY>`` (``SLUICE_KAFKA_SECURITY_PROTOCOL`` -> ``security.protocol``)."""
    out = dict(conf or {})
    for name, value in env.items():
        if name.startswith(KAFKA_PREFIX) and value:
            prop = name[len(KAFKA_PREFIX):].lower().replace("_", ".")
            out["bootstrap.servers" if prop == "bootstrap" else prop] = value
    return out


def _schema(registry: Registry) -> _Section:
    """Every key the YAML file accepts, with its type."""
    stream = min(registry.streams, default="my_stream")
    pipeline = min(registry.pipelines, default="my_pipeline")
    window = _Section({"size": _positive_duration, "hop": _positive_duration}, "{size: 1h, hop: 30m}")
    return _Section(
        {
            "landing": _root,
            "lake": _root,
            "now": _timestamp,
            "pipelines_path": _path,
            "kafka": _kafka_properties,
            **_GLOBALS,
            "streams": _Each(
                "stream", set(registry.streams),
                _Section({k: parse_duration for k in STREAM_KEYS}, "{watermark_delay: 15m, idle_timeout: 1h}"),
                f"{{{stream}: {{watermark_delay: 15m}}}}",
            ),
            "pipelines": _Each(
                "pipeline", set(registry.pipelines),
                _Section({"window": window, **_POLICY}, "{window: {size: 1h, hop: 30m}, corrections: auto}"),
                f"{{{pipeline}: {{window: {{size: 1h}}}}}}",
            ),
        },
        "{dedup_retention: 12h}",
    )


def _validate(value: Any, schema: Any, key: str) -> Any:
    """``value`` checked against ``schema`` and converted; errors name the dotted key. ``key:`` with no value
    (YAML null) means "not set"."""
    if value is None:
        return None
    if not isinstance(schema, _Section | _Each):
        return schema(value, key)
    if not isinstance(value, dict):
        raise ConfigError(f"{key}: expected a mapping such as {schema.example}, got {value!r}")
    out: dict[Any, Any] = {}
    for name, item in value.items():
        sub = f"{key}.{name}" if key else str(name)
        if isinstance(schema, _Each):
            if name not in schema.names:
                known = ", ".join(sorted(schema.names)) or "none"
                raise ConfigError(f"{sub}: unknown {schema.what}; choose one of: {known}")
            checked = _validate(item, schema.item, sub)
        else:
            if name not in schema.keys:
                raise ConfigError(f"{sub}: unknown key; allowed: {', '.join(schema.keys)}")
            checked = _validate(item, schema.keys[name], sub)
        if checked is not None:
            out[name] = checked
    return out


@contextmanager
def _naming(source: Path | None) -> Iterator[None]:
    """Errors about YAML values also name the file they came from."""
    try:
        yield
    except ConfigError as exc:
        if source is None:
            raise
        raise ConfigError(f"{exc} (in {source})") from None


def _is_file(path: Path) -> bool:
    """Whether ``path`` is a file; False where it cannot be reached (the home's check names that)."""
    try:
        return path.is_file()
    except OSError:
        return False


def _env_name(name: str) -> str:
    return name.upper().replace("-", "_")


# Variables named SLUICE_* that belong to the machine, not to a home's settings: where the pinned jars are
# cached and fetched from (sluice.core.jars). A clean environment for a child process keeps them.
MACHINE_VARIABLES = frozenset({"SLUICE_JARS_DIR", "SLUICE_MAVEN_REPO"})


def without_settings(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` without sluice's settings (``SLUICE_*``), for a child process that must not inherit the
    caller's home, pipelines or clock; the machine's variables (:data:`MACHINE_VARIABLES`) stay."""
    return {k: v for k, v in environ.items() if not k.startswith("SLUICE_") or k in MACHINE_VARIABLES}


def default_shuffle_partitions(master: str) -> int:
    """Shuffle partitions when none are configured: the cores of a local master (``local[N]``, ``local[*]``),
    else 4. A Spark streaming query keeps the count of its first run in its checkpoint, so this only shapes new
    queries. On a cluster, set SLUICE_SHUFFLE_PARTITIONS to its cores."""
    match = re.fullmatch(r"local\[(\d+|\*)(?:,\s*\d+)?\]", master.strip())
    if match is None:
        return 1 if master.strip() == "local" else 4
    if match.group(1) == "*":
        return os.cpu_count() or 2
    return max(1, int(match.group(1)))


def load_settings(
    env: Mapping[str, str] | None = None,
    *,
    home: str | Path | None = None,
    now: str | datetime | None = None,
    pipelines: str | Path | None = None,
) -> Settings:
    """Resolve settings from defaults, an optional YAML file, the environment and explicit overrides."""
    env = os.environ if env is None else env
    home_path = Path(home or env.get("SLUICE_HOME") or ".sluice").absolute()
    config_file = env.get("SLUICE_CONFIG")
    source: Path | None = None
    if config_file:
        source = Path(config_file)
    elif _is_file(home_path / "sluice.yaml"):
        source = home_path / "sluice.yaml"
    raw = _read_yaml(source) if source is not None else {}

    # The pipelines folder first: its definitions name the streams and pipelines the YAML may configure.
    with _naming(source):
        yaml_pipelines_path = _validate(raw.get("pipelines_path"), _path, "pipelines_path")
    if pipelines or env.get("SLUICE_PIPELINES"):
        pipelines_path = Path(pipelines or env["SLUICE_PIPELINES"]).absolute()
    elif yaml_pipelines_path is not None:
        pipelines_path = yaml_pipelines_path.absolute()
    else:
        pipelines_path = default_pipelines_path()
    registry = load_registry(pipelines_path)
    with _naming(source):
        conf: dict[str, Any] = _validate(raw, _schema(registry), "") or {}

    typed: dict[str, Any] = {}
    for key, convert in _GLOBALS.items():
        env_key = f"SLUICE_{key.upper()}"
        if env_key in env:
            typed[key] = convert(env[env_key], env_key)
        elif key in conf:
            typed[key] = conf[key]

    overrides: dict[str, dict[str, timedelta]] = {name: dict(v) for name, v in conf.get("streams", {}).items()}
    for name in sorted(registry.streams):
        for key in STREAM_KEYS:
            env_key = f"SLUICE_{_env_name(name)}_{key.upper()}"
            if env_key in env:
                overrides.setdefault(name, {})[key] = parse_duration(env[env_key], env_key)
    overrides = {name: values for name, values in overrides.items() if values}

    windows: dict[str, tuple[timedelta, timedelta | None]] = {}
    for pipeline in sorted(registry.pipelines):
        window_conf = conf.get("pipelines", {}).get(pipeline, {}).get("window", {})
        prefix = f"SLUICE_{_env_name(pipeline)}_WINDOW_"
        size = _positive_duration(env[prefix + "SIZE"], prefix + "SIZE") if env.get(prefix + "SIZE") else None
        hop = _positive_duration(env[prefix + "HOP"], prefix + "HOP") if env.get(prefix + "HOP") else None
        size = size or window_conf.get("size")
        hop = hop or window_conf.get("hop")
        if size is not None or hop is not None:
            declared = registry.pipelines[pipeline].window
            # A size alone keeps the declared hop (if any): hopping windows stay hopping.
            windows[pipeline] = (size or declared.size, hop or declared.hop)

    policies: dict[str, dict[str, Any]] = {}
    for pipeline in sorted(registry.pipelines):
        section = conf.get("pipelines", {}).get(pipeline, {})
        for key, target in POLICY_KEYS.items():
            env_key = f"SLUICE_{_env_name(pipeline)}_{key.upper()}"
            if env.get(env_key):
                policies.setdefault(pipeline, {})[target] = _POLICY[key](env[env_key], env_key)
            elif key in section:
                policies.setdefault(pipeline, {})[target] = section[key]

    if now is not None:
        now_value: datetime | None = parse_time(now, "--now" if isinstance(now, str) else "now")
    elif env.get("SLUICE_NOW"):
        now_value = parse_time(env["SLUICE_NOW"], "SLUICE_NOW")
    else:
        now_value = conf.get("now")
    typed.pop("delta_engine", None)  # validated above; there is no choice left to make
    if "shuffle_partitions" not in typed:
        typed["shuffle_partitions"] = default_shuffle_partitions(typed.get("spark_master", Settings.spark_master))
    landing = (parse_root(env["SLUICE_LANDING"], "SLUICE_LANDING") if env.get("SLUICE_LANDING")
               else conf.get("landing") or parse_root(home_path / "landing", "SLUICE_HOME"))
    lake = (parse_root(env["SLUICE_LAKE"], "SLUICE_LAKE") if env.get("SLUICE_LAKE")
            else conf.get("lake") or parse_root(home_path / "lake", "SLUICE_HOME"))
    credentials = Credentials.from_env(env)
    # Code that holds only a URI under either root (a table's, a landing file's) finds these credentials.
    mount(lake, credentials)
    mount(landing, credentials)
    return Settings(
        home=home_path,
        landing=landing,
        lake=Lake(lake, credentials),
        now_override=now_value,
        pipelines_path=pipelines_path,
        _registry=registry,
        stream_overrides=overrides,
        windows=windows,
        policies=policies,
        kafka=kafka_properties(env, conf.get("kafka")),
        **typed,
    )
