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
=================================  ==========================================================
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml

from sluice.core.errors import ConfigError
from sluice.core.model import PipelineDef, StreamSpec
from sluice.core.registry import Registry, default_pipelines_path, load_registry
from sluice.core.timeutil import parse_duration, parse_timestamp
from sluice.core.windows import WindowSpec


def _positive_int(value: object, key: str, minimum: int = 1) -> int:
    try:
        number = int(str(value))
    except ValueError:
        raise ConfigError(f"{key}: {value!r} is not an integer; use a whole number >= {minimum}") from None
    if number < minimum:
        raise ConfigError(f"{key}: {value!r} must be >= {minimum}")
    return number


STREAM_KEYS = ("watermark_delay", "early_tolerance", "idle_timeout")


@dataclass(frozen=True)
class Settings:
    """Resolved configuration for one process. Storage roots are always injected, never hard-coded."""

    home: Path
    landing: Path
    lake: Path
    now_override: datetime | None = None
    # The pipelines folder (SPEC 8); its streams and pipelines are the registry.
    pipelines_path: Path = field(default_factory=default_pipelines_path)
    # How far back (in event time, behind the watermark) record ids are remembered for dedup. This is
    # the memory bound of dedup: ids older than watermark - dedup_retention are forgotten.
    dedup_retention: timedelta = timedelta(hours=24)
    # Files per Spark micro-batch during catch-up. Lateness is still judged file by file (in arrival
    # order), so this only trades latency for throughput; it never changes results.
    max_files_per_trigger: int = 1000
    shuffle_partitions: int = 4
    # A fresh pipeline query facing at least this many closable windows computes them as one Spark batch
    # (same transforms, same rows) and streams only from there on: batch is 2-3x faster than replaying a
    # backlog through stateful operators. 0 = always stream.
    catchup_min_windows: int = 6
    spark_master: str = "local[2]"
    driver_memory: str = "2g"
    # The Delta engine behind the one seam: rs (delta-rs), native (delta-spark jars) or auto (native when
    # its classes are on the classpath).
    delta_engine: str = "auto"
    # sluice_maintenance's vacuum keeps unreferenced files this long (never less than a day).
    vacuum_retention_hours: int = 168
    # Data quality: the share of DLQ records in a window above which the window fails (SPEC 5: 1%).
    lateness_threshold: float = 0.01
    # Overrides of the definitions' time semantics: stream -> {watermark_delay|early_tolerance|idle_timeout}
    # and pipeline -> (window size, hop), from YAML or the environment.
    stream_overrides: Mapping[str, Mapping[str, timedelta]] = field(default_factory=dict)
    windows: Mapping[str, tuple[timedelta, timedelta | None]] = field(default_factory=dict)

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
        return definition

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
        return self.landing / stream

    def table_path(self, *parts: str) -> Path:
        """Path of a Delta table under the lake, e.g. ``table_path("bronze", "readings")``."""
        return self.lake.joinpath(*parts)

    @property
    def checkpoints(self) -> Path:
        return self.lake / "_checkpoints"


def _read_yaml(path: Path) -> dict[str, Any]:
    if path.is_dir():
        raise ConfigError(f"SLUICE_CONFIG: {path} is a directory; point it at a YAML file")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except FileNotFoundError:
        raise ConfigError(f"SLUICE_CONFIG: file {path} does not exist") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"SLUICE_CONFIG: {path} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"SLUICE_CONFIG: {path} must hold a mapping of keys, got {type(data).__name__}")
    return data


_GLOBAL_KEYS = (
    "dedup_retention",
    "max_files_per_trigger",
    "shuffle_partitions",
    "catchup_min_windows",
    "spark_master",
    "driver_memory",
    "delta_engine",
    "vacuum_retention_hours",
    "lateness_threshold",
)
DELTA_ENGINES = ("rs", "native", "auto")
MIN_RETENTION_HOURS = 24


def _env_name(name: str) -> str:
    return name.upper().replace("-", "_")


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
    raw: dict[str, Any] = {}
    if config_file:
        raw = _read_yaml(Path(config_file))
    elif (home_path / "sluice.yaml").is_file():
        raw = _read_yaml(home_path / "sluice.yaml")

    top_keys = {*_GLOBAL_KEYS, "streams", "pipelines", "landing", "lake", "now", "pipelines_path"}
    unknown = set(raw) - top_keys
    if unknown:
        allowed = ", ".join(sorted(top_keys))
        raise ConfigError(f"config: unknown key(s) {sorted(unknown)}; allowed keys: {allowed}")

    pipelines_value = pipelines or env.get("SLUICE_PIPELINES") or raw.get("pipelines_path")
    if pipelines_value is not None and not isinstance(pipelines_value, str | Path):
        raise ConfigError(f"pipelines_path: {pipelines_value!r} must be a folder path")
    pipelines_path = Path(pipelines_value).absolute() if pipelines_value else default_pipelines_path()
    registry = load_registry(pipelines_path)
    declared_streams = set(registry.streams)

    overrides: dict[str, dict[str, timedelta]] = {}
    yaml_streams = raw.get("streams") or {}
    if not isinstance(yaml_streams, dict):
        raise ConfigError(
            "streams: must be a mapping of stream name to settings, e.g. {my_stream: {watermark_delay: 15m}}"
        )
    for name, stream_values in yaml_streams.items():
        if name not in declared_streams:
            raise ConfigError(f"streams.{name}: unknown stream; choose one of: {', '.join(sorted(declared_streams))}")
        if stream_values is not None and not isinstance(stream_values, dict):
            raise ConfigError(f"streams.{name}: must be a mapping of settings ({', '.join(STREAM_KEYS)}), "
                              f"got {stream_values!r}")
        bad = set(stream_values or {}) - set(STREAM_KEYS)
        if bad:
            raise ConfigError(f"streams.{name}: unknown key(s) {sorted(bad)}; allowed: {', '.join(STREAM_KEYS)}")
        for key, value in (stream_values or {}).items():
            overrides.setdefault(name, {})[key] = parse_duration(value, f"streams.{name}.{key}")
    for name in sorted(declared_streams):
        for key in STREAM_KEYS:
            env_key = f"SLUICE_{_env_name(name)}_{key.upper()}"
            if env_key in env:
                overrides.setdefault(name, {})[key] = parse_duration(env[env_key], env_key)

    values: dict[str, Any] = {k: raw[k] for k in _GLOBAL_KEYS if k in raw}
    for key in _GLOBAL_KEYS:
        if f"SLUICE_{key.upper()}" in env:
            values[key] = env[f"SLUICE_{key.upper()}"]
    typed: dict[str, Any] = {}
    if "dedup_retention" in values:
        typed["dedup_retention"] = parse_duration(values["dedup_retention"], "dedup_retention")
    for key in ("max_files_per_trigger", "shuffle_partitions"):
        if key in values:
            typed[key] = _positive_int(values[key], key)
    if "catchup_min_windows" in values:
        typed["catchup_min_windows"] = _positive_int(values["catchup_min_windows"], "catchup_min_windows", 0)
    if "lateness_threshold" in values:
        try:
            threshold = float(values["lateness_threshold"])
        except (TypeError, ValueError):
            threshold = -1.0
        if not 0.0 <= threshold <= 1.0:
            raise ConfigError(
                f"lateness_threshold: {values['lateness_threshold']!r} must be a share between 0 and 1 (0.01 = 1%)"
            )
        typed["lateness_threshold"] = threshold
    for key in ("spark_master", "driver_memory"):
        if key in values:
            typed[key] = str(values[key])
    if "delta_engine" in values:
        engine = str(values["delta_engine"]).lower()
        if engine not in DELTA_ENGINES:
            raise ConfigError(f"SLUICE_DELTA_ENGINE={values['delta_engine']!r}; allowed: {', '.join(DELTA_ENGINES)}")
        typed["delta_engine"] = engine
    if "vacuum_retention_hours" in values:
        raw_hours = values["vacuum_retention_hours"]
        try:
            hours = int(str(raw_hours))
        except ValueError:
            raise ConfigError(f"SLUICE_VACUUM_RETENTION_HOURS: {raw_hours!r} is not a whole number of hours") from None
        if hours < MIN_RETENTION_HOURS:
            raise ConfigError(
                f"SLUICE_VACUUM_RETENTION_HOURS: {hours} is unsafe; use >= {MIN_RETENTION_HOURS} so running readers "
                "and retried writes never lose files"
            )
        typed["vacuum_retention_hours"] = hours

    windows: dict[str, tuple[timedelta, timedelta | None]] = {}
    yaml_pipelines = raw.get("pipelines") or {}
    if not isinstance(yaml_pipelines, dict):
        raise ConfigError("pipelines: must be a mapping of pipeline name to settings")
    unknown_pipelines = set(yaml_pipelines) - set(registry.pipelines)
    if unknown_pipelines:
        raise ConfigError(f"pipelines: unknown {sorted(unknown_pipelines)}; "
                          f"choose from {', '.join(sorted(registry.pipelines))}")
    for pipeline in sorted(registry.pipelines):
        conf = yaml_pipelines.get(pipeline) or {}
        if not isinstance(conf, dict):
            raise ConfigError(f"pipelines.{pipeline}: must be a mapping such as {{window: {{size: 1h}}}}")
        window_conf = conf.get("window") or {}
        if not isinstance(window_conf, dict):
            raise ConfigError(f"pipelines.{pipeline}.window: must be a mapping with size and/or hop")
        prefix = f"SLUICE_{_env_name(pipeline)}_WINDOW_"
        size = env.get(prefix + "SIZE", window_conf.get("size"))
        hop = env.get(prefix + "HOP", window_conf.get("hop"))
        if size is not None or hop is not None:
            declared = registry.pipelines[pipeline].window
            size_td = parse_duration(size, f"pipelines.{pipeline}.window.size") if size else declared.size
            # A size alone keeps the declared hop (if any): hopping windows stay hopping.
            hop_td = parse_duration(hop, f"pipelines.{pipeline}.window.hop") if hop else declared.hop
            if size_td <= timedelta(0) or (hop_td is not None and hop_td <= timedelta(0)):
                raise ConfigError(f"pipelines.{pipeline}.window: size and hop must be > 0")
            windows[pipeline] = (size_td, hop_td)

    now_value = now if now is not None else env.get("SLUICE_NOW") or raw.get("now")
    landing = env.get("SLUICE_LANDING") or raw.get("landing") or home_path / "landing"
    lake = env.get("SLUICE_LAKE") or raw.get("lake") or home_path / "lake"
    for key, value in (("landing", landing), ("lake", lake)):
        if not isinstance(value, str | Path):
            raise ConfigError(f"{key}: {value!r} must be a path")
    return Settings(
        home=home_path,
        landing=Path(landing).absolute(),
        lake=Path(lake).absolute(),
        now_override=parse_timestamp(now_value, "SLUICE_NOW") if now_value else None,
        pipelines_path=pipelines_path,
        _registry=registry,
        stream_overrides=overrides,
        windows=windows,
        **typed,
    )


__all__ = [
    "ConfigError",
    "Settings",
    "StreamSpec",
    "load_settings",
    "parse_duration",
    "parse_timestamp",
]
