"""Durations and timestamps as users write them, parsed once for config, definitions and the CLI."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from sluice.core.errors import ConfigError

# The earliest event time a record may carry (SPEC 2: records before it are quarantined as bad_timestamp).
# Earlier ones are producer bugs (Go's zero time is year 1), and their windows cannot be represented
# downstream (a window reaching before year 1 has no Python datetime).
EARLIEST_EVENT_TIME = datetime(1970, 1, 1, tzinfo=UTC)

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


def format_duration(value: timedelta) -> str:
    """A duration as users write it: the largest whole unit (``7d``, ``90m``, ``45s``)."""
    seconds = int(value.total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds and seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


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
        if not isinstance(value, datetime):
            # Never guessed: a time without a zone may be local time, and taken as UTC it would shift every
            # window and watermark it touches by the zone's offset.
            raise ConfigError(
                f"{key}: {value!r} has no timezone; add Z for UTC ({ts.isoformat()}Z) or an offset such as +02:00"
            )
        ts = ts.replace(tzinfo=UTC)
    return ts.astimezone(UTC)
