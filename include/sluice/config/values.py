"""Value parsers of sluice's settings: one converter per kind of value, shared by the YAML file and the
environment, plus the checks of times and folders that the CLI applies to its own options too."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from contextlib import suppress
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sluice.core.errors import ConfigError
from sluice.core.lake import Root, parse_root
from sluice.core.timeutil import parse_duration, parse_timestamp

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


MIN_LEASE_TTL = timedelta(seconds=5)


def _lease_ttl(value: Any, key: str) -> timedelta:
    ttl = parse_duration(value, key)
    if ttl < MIN_LEASE_TTL:
        raise ConfigError(f"{key}: {value!r} is too short for a holder to renew its lease over the network; "
                          f"use at least {int(MIN_LEASE_TTL.total_seconds())}s (default 60s)")
    return ttl


def _timestamp(value: Any, key: str) -> datetime:
    return parse_time(value, key)
