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
``SLUICE_<STREAM>_<KEY>``          per-stream override, e.g. ``SLUICE_CLICKS_WATERMARK_DELAY=15m``
``SLUICE_<KEY>``                   global key, e.g. ``SLUICE_MAX_FILES_PER_TRIGGER=50``
=================================  ==========================================================
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the key and what is allowed."""


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|sec|secs|seconds?|m|min|mins|minutes?|h|hours?|d|days?)?\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(value: object, key: str) -> timedelta:
    """``"10m"``, ``"30 min"``, ``"1h"``, ``"90s"``, ``600`` (seconds) or a timedelta."""
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    else:
        m = _DURATION.match(str(value))
        if not m:
            raise ConfigError(
                f"{key}: {value!r} is not a duration; use e.g. '10m', '30 min', '1h', '90s' or seconds"
            )
        unit = (m.group(2) or "s").lower()
        unit_key = "ms" if unit == "ms" else unit[0]
        seconds = float(m.group(1)) * _UNIT_SECONDS[unit_key]
    if seconds < 0:
        raise ConfigError(f"{key}: {value!r} is negative; durations must be >= 0")
    return timedelta(seconds=seconds)


def parse_timestamp(value: object, key: str) -> datetime:
    """An RFC 3339 timestamp (``Z`` or a numeric offset), normalised to aware UTC."""
    if isinstance(value, datetime):
        ts = value
    else:
        text = str(value).strip()
        if text.endswith(("Z", "z")):
            text = text[:-1] + "+00:00"
        try:
            ts = datetime.fromisoformat(text)
        except ValueError:
            raise ConfigError(
                f"{key}: {value!r} is not an RFC 3339 timestamp; use e.g. 2024-05-01T12:00:00Z"
            ) from None
    if ts.tzinfo is None:
        ts = ts.replace(tzinfo=UTC)
    return ts.astimezone(UTC)


def _positive_int(value: object, key: str, minimum: int = 1) -> int:
    try:
        number = int(str(value))
    except ValueError:
        raise ConfigError(f"{key}: {value!r} is not an integer; use a whole number >= {minimum}") from None
    if number < minimum:
        raise ConfigError(f"{key}: {value!r} must be >= {minimum}")
    return number


@dataclass(frozen=True)
class StreamSpec:
    """A landing stream: its id column, required fields and time semantics."""

    name: str
    id_field: str
    required: tuple[str, ...]
    optional: tuple[str, ...]
    watermark_delay: timedelta
    early_tolerance: timedelta = timedelta(minutes=5)
    idle_timeout: timedelta = timedelta(minutes=30)

    @property
    def fields(self) -> tuple[str, ...]:
        """All payload fields in their declared order (event_time last)."""
        ordered = [f for f in (*self.required, *self.optional) if f != "event_time"]
        return (*sorted(set(ordered), key=ordered.index), "event_time")


STREAM_KEYS = ("watermark_delay", "early_tolerance", "idle_timeout")

DEFAULT_STREAMS: dict[str, StreamSpec] = {
    "impressions": StreamSpec(
        name="impressions",
        id_field="impression_id",
        required=("impression_id", "ad_id", "event_time"),
        optional=("user_id",),
        watermark_delay=timedelta(minutes=10),
    ),
    "clicks": StreamSpec(
        name="clicks",
        id_field="click_id",
        required=("click_id", "impression_id", "ad_id", "event_time"),
        optional=("user_id",),
        watermark_delay=timedelta(minutes=10),
    ),
    "events": StreamSpec(
        name="events",
        id_field="event_id",
        required=("event_id", "user_id", "event_time"),
        optional=("event_type",),
        watermark_delay=timedelta(minutes=5),
    ),
}

# Which landing streams each pipeline reads (SPEC section 4).
PIPELINE_STREAMS: dict[str, tuple[str, ...]] = {
    "ad_clicks_hourly": ("impressions", "clicks"),
    "user_activity_hourly": ("events",),
}


def pipeline_streams(pipeline: str) -> tuple[str, ...]:
    """The streams of a pipeline, or a clear error listing the known pipelines."""
    try:
        return PIPELINE_STREAMS[pipeline]
    except KeyError:
        known = ", ".join(sorted(PIPELINE_STREAMS))
        raise ConfigError(f"unknown pipeline {pipeline!r}; choose one of: {known}") from None


@dataclass(frozen=True)
class Settings:
    """Resolved configuration for one process. Storage roots are always injected, never hard-coded."""

    home: Path
    landing: Path
    lake: Path
    now_override: datetime | None = None
    streams: Mapping[str, StreamSpec] = field(default_factory=lambda: dict(DEFAULT_STREAMS))
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
    # Data quality: the share of DLQ records in a window above which the window fails (SPEC 5: 1%).
    lateness_threshold: float = 0.01
    # pipeline -> (window size, hop); hop None = tumbling. Default: hourly tumbling windows.
    windows: Mapping[str, tuple[timedelta, timedelta | None]] = field(default_factory=dict)

    def window_for(self, pipeline: str) -> Any:
        """The pipeline's configured WindowSpec, or None for the pipeline's default (hourly tumbling)."""
        if pipeline not in self.windows:
            return None
        from sluice.pipelines.base import WindowSpec

        size, hop = self.windows[pipeline]
        return WindowSpec(size, hop)

    def now(self) -> datetime:
        """The injectable "now": ``SLUICE_NOW``/``--now`` if given, else the wall clock (UTC)."""
        return self.now_override or datetime.now(UTC)

    def stream(self, name: str) -> StreamSpec:
        try:
            return self.streams[name]
        except KeyError:
            known = ", ".join(sorted(self.streams))
            raise ConfigError(f"unknown stream {name!r}; choose one of: {known}") from None

    def landing_dir(self, stream: str) -> Path:
        return self.landing / stream

    def table_path(self, *parts: str) -> Path:
        """Path of a Delta table under the lake, e.g. ``table_path("bronze", "clicks")``."""
        return self.lake.joinpath(*parts)

    @property
    def checkpoints(self) -> Path:
        return self.lake / "_checkpoints"


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except FileNotFoundError:
        raise ConfigError(f"SLUICE_CONFIG: file {path} does not exist") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"SLUICE_CONFIG: {path} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"SLUICE_CONFIG: {path} must hold a mapping of keys, got {type(data).__name__}")
    return data


def _with_duration(spec: StreamSpec, key: str, value: timedelta) -> StreamSpec:
    if key == "watermark_delay":
        return replace(spec, watermark_delay=value)
    if key == "early_tolerance":
        return replace(spec, early_tolerance=value)
    return replace(spec, idle_timeout=value)


_GLOBAL_KEYS = (
    "dedup_retention",
    "max_files_per_trigger",
    "shuffle_partitions",
    "catchup_min_windows",
    "spark_master",
    "lateness_threshold",
)


def load_settings(
    env: Mapping[str, str] | None = None,
    *,
    home: str | Path | None = None,
    now: str | datetime | None = None,
) -> Settings:
    """Resolve settings from defaults, an optional YAML file, the environment and explicit overrides."""
    env = os.environ if env is None else env
    home_path = Path(home or env.get("SLUICE_HOME") or ".sluice").absolute()
    config_file = env.get("SLUICE_CONFIG")
    raw: dict[str, Any] = {}
    if config_file:
        raw = _read_yaml(Path(config_file))
    elif (home_path / "sluice.yaml").exists():
        raw = _read_yaml(home_path / "sluice.yaml")

    top_keys = {*_GLOBAL_KEYS, "streams", "pipelines", "landing", "lake", "now"}
    unknown = set(raw) - top_keys
    if unknown:
        allowed = ", ".join(sorted(top_keys))
        raise ConfigError(f"config: unknown key(s) {sorted(unknown)}; allowed keys: {allowed}")

    streams = dict(DEFAULT_STREAMS)
    yaml_streams = raw.get("streams") or {}
    if not isinstance(yaml_streams, dict):
        raise ConfigError("streams: must be a mapping of stream name to settings")
    for name, overrides in yaml_streams.items():
        if name not in streams:
            raise ConfigError(f"streams.{name}: unknown stream; choose one of: {', '.join(streams)}")
        bad = set(overrides or {}) - set(STREAM_KEYS)
        if bad:
            raise ConfigError(f"streams.{name}: unknown key(s) {sorted(bad)}; allowed: {', '.join(STREAM_KEYS)}")
        for key, value in (overrides or {}).items():
            streams[name] = _with_duration(streams[name], key, parse_duration(value, f"streams.{name}.{key}"))
    for name in list(streams):
        for key in STREAM_KEYS:
            env_key = f"SLUICE_{name.upper()}_{key.upper()}"
            if env_key in env:
                streams[name] = _with_duration(streams[name], key, parse_duration(env[env_key], env_key))

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
        except ValueError:
            threshold = -1.0
        if not 0.0 <= threshold <= 1.0:
            raise ConfigError(
                f"lateness_threshold: {values['lateness_threshold']!r} must be a share between 0 and 1 (0.01 = 1%)"
            )
        typed["lateness_threshold"] = threshold
    if "spark_master" in values:
        typed["spark_master"] = str(values["spark_master"])

    windows: dict[str, tuple[timedelta, timedelta | None]] = {}
    yaml_pipelines = raw.get("pipelines") or {}
    if not isinstance(yaml_pipelines, dict):
        raise ConfigError("pipelines: must be a mapping of pipeline name to settings")
    for pipeline in PIPELINE_STREAMS:
        conf = (yaml_pipelines.get(pipeline) or {}).get("window") or {}
        prefix = f"SLUICE_{pipeline.upper()}_WINDOW_"
        size = env.get(prefix + "SIZE", conf.get("size"))
        hop = env.get(prefix + "HOP", conf.get("hop"))
        if size is not None or hop is not None:
            size_td = parse_duration(size or "1h", f"pipelines.{pipeline}.window.size")
            hop_td = parse_duration(hop, f"pipelines.{pipeline}.window.hop") if hop else None
            if size_td <= timedelta(0) or (hop_td is not None and hop_td <= timedelta(0)):
                raise ConfigError(f"pipelines.{pipeline}.window: size and hop must be > 0")
            windows[pipeline] = (size_td, hop_td)
    unknown_pipelines = set(yaml_pipelines) - set(PIPELINE_STREAMS)
    if unknown_pipelines:
        raise ConfigError(f"pipelines: unknown {sorted(unknown_pipelines)}; choose from {', '.join(PIPELINE_STREAMS)}")

    now_value = now if now is not None else env.get("SLUICE_NOW") or raw.get("now")
    landing = env.get("SLUICE_LANDING") or raw.get("landing") or home_path / "landing"
    lake = env.get("SLUICE_LAKE") or raw.get("lake") or home_path / "lake"
    return Settings(
        home=home_path,
        landing=Path(landing).absolute(),
        lake=Path(lake).absolute(),
        now_override=parse_timestamp(now_value, "SLUICE_NOW") if now_value else None,
        streams=streams,
        windows=windows,
        **typed,
    )
