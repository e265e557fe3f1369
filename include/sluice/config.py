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
=================================  ==========================================================
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml

from sluice.core.api import CORRECTION_POLICIES
from sluice.core.errors import ConfigError
from sluice.core.lake import Credentials, Lake, Root, mount, parse_root
from sluice.core.model import PipelineDef, StreamSpec
from sluice.core.registry import Registry, default_pipelines_path, load_registry
from sluice.core.timeutil import parse_duration, parse_timestamp
from sluice.core.windows import WindowSpec


@dataclass(frozen=True)
class Settings:
    """Resolved configuration for one process. Storage roots are always injected, never hard-coded."""

    home: Path
    # The two roots (SPEC 1): a local folder or an object-storage prefix. Every table, checkpoint and landing
    # folder is named from them; nothing under them is a hard-coded path.
    landing: Root
    lake: Lake
    now_override: datetime | None = None
    # The pipelines folder (SPEC 8); its streams and pipelines are the registry.
    pipelines_path: Path = field(default_factory=default_pipelines_path)
    # How far back (in event time, behind the watermark) record ids are remembered for dedup. This is
    # the memory bound of dedup: ids older than watermark - dedup_retention are forgotten.
    dedup_retention: timedelta = timedelta(hours=24)
    # Files per Spark micro-batch during catch-up. Lateness is still judged file by file (in arrival
    # order), so this only trades latency for throughput; it never changes results.
    max_files_per_trigger: int = 1000
    # One shuffle partition per core of the default master (see default_shuffle_partitions): every stateful
    # operator keeps one state store per partition, and each micro-batch loads and commits all of them, so
    # partitions beyond the cores only add fixed cost per batch (a cycle on local[2]: 20% slower with 4).
    shuffle_partitions: int = 2
    # A fresh pipeline query facing at least this many closable windows computes them as one Spark batch
    # (same transforms, same rows) and streams only from there on: batch is 2-3x faster than replaying a
    # backlog through stateful operators. 0 = always stream.
    catchup_min_windows: int = 6
    spark_master: str = "local[2]"
    driver_memory: str = "2g"
    # spark.executor.memory on a cluster (a local master runs its tasks in the driver's heap). None leaves it to
    # Spark (1g), or to spark-submit's --executor-memory. make platform sets it to its workers' memory: with
    # Spark's 1g, a 10M-event catch-up's micro-batch of 1000 files ran the executors out of heap.
    executor_memory: str | None = None
    # A folder that holds sluice's pinned jars on every worker of the cluster (the jar cache of the workers'
    # image, laid out as SLUICE_JARS_DIR is). Set, the executors load Delta's and s3a's jars from there
    # (spark.executor.extraClassPath) and the driver ships them none: shipped, every application's executors
    # each copied ~700 MB (the AWS SDK bundle) before their first task. None: the driver ships them.
    executor_jars: str | None = None
    # Where Spark keeps the stateful operators' state between micro-batches: hdfs (Spark's default provider:
    # in executor memory, versioned to the checkpoint) or rocksdb (on local disk, for state beyond the heap).
    # A query keeps the store of its first run (its checkpoint records it), so this only shapes new queries.
    state_store: str = "hdfs"
    # sluice_maintenance's vacuum keeps unreferenced files this long (never less than a day).
    vacuum_retention_hours: int = 168
    # Data quality: the share of DLQ records in a window above which the window fails (SPEC 5: 1%).
    lateness_threshold: float = 0.01
    # A lock's lease on a lake on object storage: its holder renews it every third of this, and a holder killed
    # with SIGKILL blocks the others for at most this long (README "Object storage").
    lease_ttl: timedelta = timedelta(seconds=60)
    # Overrides of the definitions' time semantics: stream -> {watermark_delay|early_tolerance|idle_timeout}
    # and pipeline -> (window size, hop), from YAML or the environment.
    stream_overrides: Mapping[str, Mapping[str, timedelta]] = field(default_factory=dict)
    windows: Mapping[str, tuple[timedelta, timedelta | None]] = field(default_factory=dict)
    # Corrections of closed windows (README "Operations"): at most this many per pipeline and cycle, so a
    # flood of late data cannot starve the schedule. Per pipeline in YAML ``pipelines.<name>``.
    max_corrections_per_run: int = 24
    # pipeline -> {corrections, correction_max_age, max_corrections_per_run, freshness_grace}, from YAML or
    # the environment; they override the pipeline's declaration.
    policies: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    # Where alerts point for Data Docs: a URL base under which the Data Docs pages are served. Default:
    # the Airflow plugin's path (``/sluice/docs``) on Airflow's ``[api] base_url``.
    data_docs_url: str | None = None

    # The registry as loaded for these settings: one consistent view of the definitions for the whole run,
    # instead of re-scanning the pipelines folder on every stream or pipeline lookup.
    _registry: Registry | None = field(default=None, repr=False, compare=False)

    @property
    def registry(self) -> Registry:
        """The pipelines and streams of the pipelines folder, loaded once for these settings."""
        if self._registry is None:
            object.__setattr__(self, "_registry", load_registry(self.pipelines_path))
        assert self._registry is not None
        return self._registry

    @property
    def streams(self) -> dict[str, StreamSpec]:
        """Every declared stream, with configuration overrides applied."""
        out = {}
        for name, spec in self.registry.streams.items():
            overrides: dict[str, Any] = dict(self.stream_overrides.get(name) or {})
            if overrides:
                spec = replace(spec, **overrides)
            out[name] = spec
        return out

    def pipeline(self, name: str) -> PipelineDef:
        """The pipeline definition with any configured window; unknown names fail with the known ones."""
        definition = self.registry.pipeline(name)
        if name in self.windows:
            size, hop = self.windows[name]
            definition = replace(definition, window=WindowSpec(size, hop))
        policy = {"max_corrections_per_run": self.max_corrections_per_run, **dict(self.policies.get(name) or {})}
        return replace(definition, **policy)

    def docs_url(self, page: str = "index.html") -> str:
        """The URL of a Data Docs page (relative to the Data Docs folder) for alerts and the CLI."""
        base = self.data_docs_url
        if base is None:
            base = _airflow_base_url().rstrip("/") + "/sluice/docs"
        return base.rstrip("/") + "/" + page.lstrip("/")

    def now(self) -> datetime:
        """The injectable "now": ``SLUICE_NOW``/``--now`` if given, else the wall clock (UTC)."""
        return self.now_override or datetime.now(UTC)

    def stream(self, name: str) -> StreamSpec:
        streams = self.streams
        try:
            return streams[name]
        except KeyError:
            known = ", ".join(sorted(streams)) or "none"
            raise ConfigError(
                f"unknown stream {name!r}; choose one of: {known} (streams are declared by the pipelines in "
                f"{self.pipelines_path})"
            ) from None

    def landing_dir(self, stream: str) -> Path:
        return self.landing.local(stream)

    @property
    def checkpoints(self) -> Path:
        return self.lake.local("_checkpoints")

    def check_roots(self, *, writable: bool) -> None:
        """Fail fast, naming the path, when the home or a local lake cannot be used (see :func:`check_folder`)."""
        check_folder(self.home, "SLUICE_HOME", writable=writable, hint="SLUICE_HOME (or --home)")
        if self.lake.is_local:
            check_folder(self.lake.local(), "lake", writable=writable, hint="SLUICE_LAKE (or the YAML key lake)")


# Timestamps sluice accepts for "now" and backfill ranges. From 1900 on, Spark stores timestamps in Parquet
# without Julian/Gregorian rebasing; up to 9999-01-01 leaves a year for window, join and lateness margins
# before Python's datetime (and Spark's TimestampType) end.
TIMESTAMP_MIN = datetime(1900, 1, 1, tzinfo=UTC)
TIMESTAMP_MAX = datetime(9999, 1, 1, tzinfo=UTC)


def parse_time(value: object, key: str) -> datetime:
    """An RFC 3339 timestamp (as :func:`parse_timestamp`) within ``TIMESTAMP_MIN..TIMESTAMP_MAX``."""
    try:
        ts: datetime | None = parse_timestamp(value, key)
    except OverflowError:  # e.g. 0001-01-01T00:00:00+01:00, which is before year 1 in UTC
        ts = None
    if ts is None or not TIMESTAMP_MIN <= ts <= TIMESTAMP_MAX:
        shown = value.isoformat() if isinstance(value, datetime) else repr(value)
        raise ConfigError(
            f"{key}: {shown} is outside the supported range; use a time from {TIMESTAMP_MIN:%Y-%m-%dT%H:%M:%SZ} "
            f"to {TIMESTAMP_MAX:%Y-%m-%dT%H:%M:%SZ}"
        )
    return ts


def check_folder(path: Path, key: str, *, writable: bool, hint: str | None = None) -> None:
    """Fail fast, naming the path, when ``path`` cannot be a folder of sluice's: it is a file or lies under
    one, or (``writable``) neither it nor, while it does not exist yet, the folder it would be created in is
    writable. Nothing is created."""
    fix = f"point {hint or key} at a folder you can {'write to' if writable else 'read'}"
    existing = path
    try:
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        is_dir = existing.is_dir()
    except OSError as exc:  # e.g. a parent folder that may not be searched
        raise ConfigError(f"{key}: {path} cannot be reached ({exc.strerror}); {fix}") from None
    if not is_dir:
        where = "is a file" if existing == path else f"lies under {existing}, which is a file"
        raise ConfigError(f"{key}: {path} {where}, not a folder; {fix}")
    if existing == path and not os.access(path, os.R_OK | os.X_OK):
        raise ConfigError(f"{key}: {path} is not readable; {fix}, or make it readable")
    if writable and not os.access(existing, os.W_OK | os.X_OK):
        if existing == path:
            raise ConfigError(f"{key}: {path} is not writable; {fix}, or make it writable")
        raise ConfigError(f"{key}: {path} does not exist and cannot be created ({existing} is not writable); {fix}")


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


# -- typed values -----------------------------------------------------------------------------------------
# One converter per kind of value, shared by the YAML file and the environment. ``key`` is the name the user
# wrote: the dotted YAML key (``streams.clicks.idle_timeout``) or the environment variable.

Convert = Callable[[Any, str], Any]


def _whole(minimum: int, why: str = "") -> Convert:
    def convert(value: Any, key: str) -> int:
        number = None
        if isinstance(value, int | str) and not isinstance(value, bool):
            with suppress(ValueError):
                number = int(str(value).strip())
        if number is None:
            raise ConfigError(f"{key}: {value!r} is not a whole number; use an integer >= {minimum}")
        if number < minimum:
            raise ConfigError(f"{key}: {value!r} must be >= {minimum}{why}")
        return number

    return convert


def _share(value: Any, key: str) -> float:
    share = float("nan")
    if isinstance(value, int | float | str) and not isinstance(value, bool):
        with suppress(ValueError):
            share = float(value)
    if not 0.0 <= share <= 1.0:
        raise ConfigError(f"{key}: {value!r} must be a share between 0 and 1 (0.01 = 1%)")
    return share


def _text(example: str) -> Convert:
    def convert(value: Any, key: str) -> str:
        if not isinstance(value, str) or not value.strip():
            raise ConfigError(f"{key}: {value!r} is not text; use e.g. {example}")
        return value

    return convert


def _absolute_folder(example: str) -> Convert:
    """A folder as an absolute POSIX path: it names a place on other hosts (the workers), so nothing here can
    resolve a relative one or check that it exists."""

    def convert(value: Any, key: str) -> str:
        if not isinstance(value, str) or not value.strip().startswith("/"):
            raise ConfigError(f"{key}: {value!r} is not an absolute folder; use e.g. {example}")
        return value.strip().rstrip("/") or "/"

    return convert


def _memory(example: str) -> Convert:
    """A JVM memory size as Spark reads it: a whole number and a unit (k, m, g, t), e.g. 512m or 2g."""

    def convert(value: Any, key: str) -> str:
        if not isinstance(value, str) or not re.fullmatch(r"[1-9][0-9]*[kmgt]b?", value.strip().lower()):
            raise ConfigError(f"{key}: {value!r} is not a memory size; use a whole number and a unit, e.g. {example}")
        return value.strip().lower()

    return convert


def _choice(choices: Sequence[str]) -> Convert:
    def convert(value: Any, key: str) -> str:
        text = value.strip().lower() if isinstance(value, str) else ""
        if text not in choices:
            raise ConfigError(f"{key}: {value!r} is not allowed; use one of: {', '.join(choices)}")
        return text

    return convert


def _path(value: Any, key: str) -> Path:
    if isinstance(value, Path):
        return value
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{key}: {value!r} is not a path; give a folder path, e.g. /data/sluice")
    return Path(value)


def _root(value: Any, key: str) -> Root:
    if not isinstance(value, str):
        raise ConfigError(f"{key}: {value!r} is not a folder; give a folder path, file:///path or s3://bucket/prefix")
    return parse_root(value, key)


def _retired_engine(value: Any, key: str) -> None:
    """``delta_engine`` chose between delta-rs and delta-spark until sluice 0.3; delta-spark now writes every
    table Spark writes (SPEC section 7). ``native`` still loads; ``rs`` fails, saying so."""
    text = value.strip().lower() if isinstance(value, str) else ""
    if text == "rs":
        raise ConfigError(f"{key}: the delta-rs engine (rs) was retired; delta-spark writes every table that Spark "
                          f"writes. Remove {key}: tables written by either engine read and write as before")
    if text != "native":
        raise ConfigError(f"{key}: {value!r} is not allowed; delta-spark (native) is the only engine, so remove {key}")


def _positive_duration(value: Any, key: str) -> timedelta:
    duration = parse_duration(value, key)
    if duration <= timedelta(0):
        raise ConfigError(f"{key}: {value!r} must be > 0; use e.g. '1h' or '30m'")
    return duration


def _lease_ttl(value: Any, key: str) -> timedelta:
    ttl = parse_duration(value, key)
    if ttl < MIN_LEASE_TTL:
        raise ConfigError(f"{key}: {value!r} is too short for a holder to renew its lease over the network; "
                          f"use at least {int(MIN_LEASE_TTL.total_seconds())}s (default 60s)")
    return ttl


def _timestamp(value: Any, key: str) -> datetime:
    return parse_time(value, key)


STREAM_KEYS = ("watermark_delay", "early_tolerance", "idle_timeout")
STATE_STORES = ("hdfs", "rocksdb")
MIN_RETENTION_HOURS = 24
MIN_LEASE_TTL = timedelta(seconds=5)

# Global keys: YAML ``key`` or environment ``SLUICE_<KEY>``.
_GLOBALS: dict[str, Convert] = {
    "dedup_retention": parse_duration,
    "max_files_per_trigger": _whole(1),
    "shuffle_partitions": _whole(1),
    "catchup_min_windows": _whole(0),
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


def _airflow_base_url() -> str:
    """Airflow's ``[api] base_url`` (where the sluice plugin is served), without importing Airflow when its
    environment variable says it; ``http://localhost:8080`` (Airflow's default) otherwise."""
    url = os.environ.get("AIRFLOW__API__BASE_URL")
    if url:
        return url
    try:
        from airflow.configuration import conf

        from sluice.core.logsetup import reclaim_from_airflow

        reclaim_from_airflow()  # importing Airflow pointed the logs at stdout
        return str(conf.get("api", "base_url", fallback="") or "http://localhost:8080")
    except Exception:  # Airflow not installed or not configured: the default of its config
        return "http://localhost:8080"


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
        **typed,
    )

__all__ = [
    "ConfigError",
    "Settings",
    "StreamSpec",
    "check_folder",
    "load_settings",
    "parse_duration",
    "parse_time",
    "parse_timestamp",
]
