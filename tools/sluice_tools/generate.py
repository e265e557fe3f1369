"""Deterministic synthetic landing data for ``sluice generate``, with a manifest of the expected outcome.

Every stream is cut into consecutive *slices* of event time (``file_minutes`` each). One slice becomes one
file whose modification time (the SPEC's arrival time) is the slice end plus a small lag, so the files of a
stream arrive in slice order. The product judges lateness file by file in arrival order, so the data is
built around that rule and is unambiguous by construction:

* on-time records of a file lie in its slice, shifted back by at most ``disorder`` seconds. The watermark a
  file meets is at most ``slice start - watermark_delay``, and ``disorder`` is kept at least a minute below
  the delay, so on-time records are never late;
* late records sit at least ``max(30 min, delay + 20 min)`` below the newest accepted event time of the
  earlier files, far below the watermark, and always have fresh ids;
* early records lie two hours or more after their file's arrival time, far beyond the early tolerance;
* duplicates are byte-identical copies of accepted lines: either later in the same file, or in the next
  file when the original is still clearly above the watermark that file meets;
* malformed lines are unmistakable: truncated or non-JSON text, a dropped required field (never
  ``event_time``, which could read as a bad timestamp), or an ``event_time`` no parser accepts.

Further bad-input classes of SPEC section 2, all off by default (the default output stays byte-identical):

* ``bad_type``: a string field (an id, ``ad_id``, ``user_id``, ...) holding an object, an array or a
  boolean; every other field is valid, so ``bad_type`` is the only reason that applies;
* ``bad_encoding``: a line that is not valid UTF-8 (a stray byte-order mark ``ff fe``, a Latin-1 ``e9``, a lone
  continuation byte), in a string value or between the fields of an otherwise valid record. Lines are
  kept as ``str`` with the bad bytes as lone surrogates (``surrogateescape``) and written as those bytes;
* ancient event times (year 1, or any time before 1970-01-01T00:00:00Z): quarantined as ``bad_timestamp``;
* ``unreadable_file``: extra ``.jsonl.gz`` files that cannot be read at all (truncated, not gzip at all, or
  a failing CRC), each arriving between two regular files. Each counts as one line and one quarantine row
  and leaves the watermark alone;
* odd file names: some files are named with ':', '%', '#', a space or non-ASCII letters.

Bad records of these classes always carry fresh ids, sit in the slice of their file like on-time records
and are never chosen as the original of a duplicate.

The manifest is only as right as these rules, so :func:`generate` re-checks every margin before writing
and fails loudly instead of writing a manifest that could be wrong.

It is exact for any sequence of cycles as long as ``file_minutes + 2 min + disorder <= idle_timeout +
watermark_delay`` (true for the defaults). Then no idle heartbeat can push the watermark past the on-time
records of the next file, even when a cycle runs inside the idle gap.

Generating overwrites files of the same name but never deletes anything, so generate into an empty
landing zone when you need the manifest to describe the whole zone.
"""

from __future__ import annotations

import argparse
import bisect
import gzip
import io
import json
import os
import random
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from sluice.config import ConfigError, StreamSpec, parse_duration, parse_timestamp

# The example streams this generator writes, with their shipped time semantics (pipelines/*.py declares the
# same); a caller passes the resolved specs (``settings.streams``) to honour configured overrides.
DEFAULT_STREAMS: dict[str, StreamSpec] = {
    "impressions": StreamSpec("impressions", "impression_id", ("impression_id", "ad_id", "event_time"), ("user_id",),
                              timedelta(minutes=10)),
    "clicks": StreamSpec("clicks", "click_id", ("click_id", "impression_id", "ad_id", "event_time"), ("user_id",),
                         timedelta(minutes=10)),
    "events": StreamSpec("events", "event_id", ("event_id", "user_id", "event_time"), ("event_type",),
                         timedelta(minutes=5)),
}

STREAMS: tuple[str, ...] = ("impressions", "clicks", "events")
# The manifest's reasons: the classic ones first (their order is kept), then the classes added by issue 14.
QUARANTINE_REASONS: tuple[str, ...] = (
    "malformed_json", "missing_field", "bad_timestamp", "early", "bad_type", "bad_encoding", "unreadable_file",
)
MALFORMED_KINDS: tuple[str, ...] = ("malformed_json", "missing_field", "bad_timestamp")
# Line kinds a file can hold (an unreadable file holds no lines the product can see; it is counted apart).
LINE_KINDS: tuple[str, ...] = ("accepted", "duplicate", "late", "early", *MALFORMED_KINDS, "bad_type", "bad_encoding")

# The stream-stream join bound of SPEC section 4: impression <= click <= impression + 30 min.
JOIN_BOUND_SECONDS = 30 * 60
# Distance that keeps on-time records and cross-file duplicates clearly above the watermark.
SAFETY_MARGIN_SECONDS = 60
# Late records sit at least this far below the newest accepted event time of the earlier files.
MIN_LATENESS_SECONDS = 30 * 60
# Early records sit at least this far beyond arrival time + early tolerance.
EARLY_MARGIN_SECONDS = 2 * 3600

# Unparsable in every RFC 3339 parser (month 13, words, slashes). An empty string is avoided: a consumer
# could fairly read it as a missing field instead.
BAD_TIMESTAMPS: tuple[str, ...] = ("yesterday", "2024-13-45T99:00:00Z", "01/05/2024 10:00", "not a timestamp")
# Valid RFC 3339 timestamps before 1970-01-01T00:00:00Z, the earliest event time the product accepts: Go's
# zero time (year 1) and other producer bugs. Quarantined as bad_timestamp. No positive offset in year 1
# (its UTC instant would be in year 0, which no datetime can hold).
ANCIENT_TIMESTAMPS: tuple[str, ...] = (
    "0001-01-01T00:00:00Z",
    "0001-01-01T00:00:00.000Z",
    "1969-12-31T23:59:59Z",
    "1900-01-01T12:00:00+02:00",
    "1066-10-14T09:30:00-01:00",
)
# JSON values that no string field can hold (SPEC section 2). Numbers are not among them: a number given
# for a string field is accepted as its canonical text.
BAD_TYPE_VALUES: tuple[Any, ...] = ({"a": 1}, ["x"], True, False, {"id": "nested"}, [1, 2])
# Byte sequences that are invalid UTF-8 wherever they appear, as lone surrogates (``surrogateescape``):
# a UTF-16 byte-order mark, a Latin-1 'e acute' (a 3-byte lead byte followed by ASCII), a lone continuation
# byte, and 0xff alone. None of them holds a line break.
BAD_BYTES: tuple[bytes, ...] = (b"\xff\xfe", b"caf\xe9", b"\x80", b"\xff")
# Styles of odd file names (odd_file_names); style 0 keeps the usual name, so most files stay ordinary.
ODD_NAME_STYLES = 6
# How an unreadable .gz file is broken, in turn.
UNREADABLE_KINDS: tuple[str, ...] = ("truncated", "not_gzip", "bad_crc")
# Non-UTC offsets for records that spell the same instant with a numeric offset.
OFFSET_MINUTES: tuple[int, ...] = (120, -300, 330, 540, -210, 60)
EVENT_TYPES: tuple[str, ...] = ("view", "scroll", "click", "add_to_cart", "purchase", "login")
# Unknown fields a real producer might add; consumers must ignore them (SPEC section 2).
EXTRA_FIELDS: dict[str, tuple[Any, ...]] = {
    "sdk": ("ios-4.2.1", "android-7.0.3", "web-2024.5"),
    "experiment": ("exp-a", "exp-b"),
    "geo": ("DE", "US", "BR", "IN"),
    "schema_version": (2, 3),
}
# Small fixed shares that make the records look like real traffic (extra fields must be ignored,
# optional fields may be absent); they never change a record's classification.
EXTRA_FIELD_SHARE = 0.05
OMIT_OPTIONAL_SHARE = 0.03
# Share of duplicates placed in the next file rather than the same file, when the next file allows it.
CROSS_FILE_DUPLICATE_SHARE = 0.5

DEFAULT_START = datetime(2024, 5, 1, tzinfo=UTC)


def rfc3339(ts: datetime | int | None) -> str | None:
    """``2024-05-01T00:00:00Z`` for an aware datetime or epoch seconds; None stays None."""
    if ts is None:
        return None
    dt = datetime.fromtimestamp(ts, UTC) if isinstance(ts, int) else ts.astimezone(UTC)
    return dt.strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class GenerateOptions:
    """Everything that shapes the generated data; the same options always give the same bytes.

    Shares of late, early, duplicate and malformed lines are fractions of a stream's on-time records.
    """

    seed: int = 7
    start: datetime = DEFAULT_START
    hours: float = 3.0
    impressions_per_hour: int = 1200
    # Clicks per impression. Clicks reference real (accepted) impression ids and carry their ad_id.
    click_rate: float = 0.1
    # Of the clicks: shares outside the 30 min join bound, and shares naming an impression that never existed.
    click_outside_share: float = 0.03
    click_unknown_share: float = 0.02
    users: int = 50
    ads: int = 20
    events_per_hour: int = 600
    file_minutes: int = 10
    # Seconds an on-time record may trail its position in the files (out of order across files, too).
    disorder: int = 120
    # Small by default so that the 1 % lateness check of SPEC section 5 passes on the default data.
    late_share: float = 0.002
    early_share: float = 0.002
    duplicate_share: float = 0.01
    malformed_share: float = 0.005
    idle_gap_minutes: int = 0
    streams: tuple[str, ...] = STREAMS
    offset_timestamps: float = 0.1
    gzip: bool = False
    # Bad-input classes of issue 14, all off by default so that the default output stays byte-identical.
    # Shares are, like the others, fractions of a stream's on-time records (at least one when positive).
    bad_type_share: float = 0.0
    bad_encoding_share: float = 0.0
    # Event times before 1970 (year 1 and others), quarantined as bad_timestamp.
    ancient_share: float = 0.0
    # Corrupt or truncated .jsonl.gz files per stream; each counts as one line (reason unreadable_file).
    unreadable_files: int = 0
    # Name some files with ':', '%', '#', a space or non-ASCII letters.
    odd_file_names: bool = False

    def __post_init__(self) -> None:
        start = self.start if self.start.tzinfo else self.start.replace(tzinfo=UTC)
        # Whole seconds keep every timestamp exact in JSON, in Spark and in file modification times.
        object.__setattr__(self, "start", start.astimezone(UTC).replace(microsecond=0))
        object.__setattr__(self, "streams", tuple(self.streams))
        self._validate()

    def _validate(self) -> None:
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ConfigError(f"--seed: {self.seed!r} is not an integer")
        if not self.hours > 0:
            raise ConfigError(f"--hours: {self.hours!r} must be > 0")
        for flag, value in (
            ("--late-share", self.late_share),
            ("--early-share", self.early_share),
            ("--duplicate-share", self.duplicate_share),
            ("--malformed-share", self.malformed_share),
            ("--offset-timestamps", self.offset_timestamps),
            ("--click-rate", self.click_rate),
            ("--click-outside-share", self.click_outside_share),
            ("--click-unknown-share", self.click_unknown_share),
            ("--bad-type-share", self.bad_type_share),
            ("--bad-encoding-share", self.bad_encoding_share),
            ("--ancient-share", self.ancient_share),
        ):
            if not 0 <= value <= 1:
                raise ConfigError(f"{flag}: {value!r} is out of range; use a share in [0, 1]")
        if self.click_outside_share + self.click_unknown_share > 1:
            raise ConfigError("--click-outside-share plus --click-unknown-share must not exceed 1")
        for flag, number, low in (
            ("--impressions-per-hour", self.impressions_per_hour, 0),
            ("--events-per-hour", self.events_per_hour, 0),
            ("--users", self.users, 1),
            ("--ads", self.ads, 1),
            ("--file-minutes", self.file_minutes, 1),
            ("--disorder", self.disorder, 0),
            ("--idle-gap-minutes", self.idle_gap_minutes, 0),
            ("--unreadable-files", self.unreadable_files, 0),
        ):
            if isinstance(number, bool) or not isinstance(number, int) or number < low:
                raise ConfigError(f"{flag}: {number!r} must be a whole number >= {low}")
        if not self.streams:
            raise ConfigError(f"--streams: choose at least one of: {', '.join(STREAMS)}")
        for name in self.streams:
            if name not in STREAMS:
                raise ConfigError(f"--streams: unknown stream {name!r}; choose from: {', '.join(STREAMS)}")
        if len(set(self.streams)) != len(self.streams):
            raise ConfigError(f"--streams: {','.join(self.streams)} names a stream twice")
        if self.idle_gap_minutes:
            slices = _slice_count(self)
            gap = _gap_slice_count(self)
            if slices - gap < 2:
                raise ConfigError(
                    f"--idle-gap-minutes: {self.idle_gap_minutes} leaves no files on both sides of the gap "
                    f"in {self.hours} h of {self.file_minutes}-min files; use a shorter gap or more --hours"
                )

        _check_disorder(self, DEFAULT_STREAMS)

    @property
    def end(self) -> datetime:
        return self.start + timedelta(hours=self.hours)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["start"] = rfc3339(self.start)
        data["streams"] = list(self.streams)
        return data


def _check_disorder(options: GenerateOptions, specs: Mapping[str, StreamSpec]) -> None:
    for name in options.streams:
        limit = int(specs[name].watermark_delay.total_seconds()) - SAFETY_MARGIN_SECONDS
        if options.disorder > limit:
            raise ConfigError(
                f"--disorder: {options.disorder} s is too large for {name}; use at most {max(limit, 0)} s "
                f"(its watermark delay minus {SAFETY_MARGIN_SECONDS} s); on-time records must never be late"
            )


@dataclass
class FileManifest:
    """One landed file = one micro-batch, and the expected classification of its lines."""

    name: str
    arrival: datetime
    event_start: datetime
    event_end: datetime
    lines: int
    accepted: int
    quarantined: dict[str, int]
    late: int
    duplicates: int
    watermark_before: datetime | None
    watermark_after: datetime | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "arrival": rfc3339(self.arrival),
            "event_start": rfc3339(self.event_start),
            "event_end": rfc3339(self.event_end),
            "lines": self.lines,
            "accepted": self.accepted,
            "quarantined": dict(self.quarantined),
            "late": self.late,
            "duplicates": self.duplicates,
            "watermark_before": rfc3339(self.watermark_before),
            "watermark_after": rfc3339(self.watermark_after),
        }


@dataclass
class StreamManifest:
    """Expected outcome for one stream when its files are ingested in arrival order."""

    stream: str
    file_details: list[FileManifest] = field(default_factory=list)
    min_event_time: datetime | None = None
    max_event_time: datetime | None = None
    first_arrival: datetime | None = None
    last_arrival: datetime | None = None
    final_watermark: datetime | None = None
    # clicks only: accepted clicks by join outcome (matched / outside_bound / unknown_impression).
    join: dict[str, int] | None = None

    @property
    def files(self) -> int:
        return len(self.file_details)

    @property
    def lines(self) -> int:
        return sum(f.lines for f in self.file_details)

    @property
    def accepted(self) -> int:
        return sum(f.accepted for f in self.file_details)

    @property
    def quarantined(self) -> dict[str, int]:
        return {r: sum(f.quarantined[r] for f in self.file_details) for r in QUARANTINE_REASONS}

    @property
    def quarantined_total(self) -> int:
        return sum(self.quarantined.values())

    @property
    def late(self) -> int:
        return sum(f.late for f in self.file_details)

    @property
    def duplicates(self) -> int:
        return sum(f.duplicates for f in self.file_details)

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "files": self.files,
            "lines": self.lines,
            "accepted": self.accepted,
            "quarantined": self.quarantined,
            "quarantined_total": self.quarantined_total,
            "late": self.late,
            "duplicates": self.duplicates,
            "min_event_time": rfc3339(self.min_event_time),
            "max_event_time": rfc3339(self.max_event_time),
            "first_arrival": rfc3339(self.first_arrival),
            "last_arrival": rfc3339(self.last_arrival),
            "final_watermark": rfc3339(self.final_watermark),
        }
        if self.join is not None:
            data["join"] = dict(self.join)
        data["file_details"] = [f.to_dict() for f in self.file_details]
        return data


@dataclass
class Manifest:
    """What :func:`generate` wrote and how the product must classify every line of it."""

    landing: Path
    options: GenerateOptions
    streams: dict[str, StreamManifest]
    idle_gap: tuple[datetime, datetime] | None = None

    @property
    def lines(self) -> int:
        return sum(s.lines for s in self.streams.values())

    @property
    def last_arrival(self) -> datetime | None:
        arrivals = [s.last_arrival for s in self.streams.values() if s.last_arrival is not None]
        return max(arrivals) if arrivals else None

    def totals(self) -> dict[str, dict[str, int]]:
        """Per stream: files, lines, accepted, each quarantine reason, late, duplicates."""
        return {
            name: {
                "files": s.files,
                "lines": s.lines,
                "accepted": s.accepted,
                **s.quarantined,
                "late": s.late,
                "duplicates": s.duplicates,
            }
            for name, s in self.streams.items()
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "landing": str(self.landing),
            "options": self.options.to_dict(),
            "span": {"start": rfc3339(self.options.start), "end": rfc3339(self.options.end)},
            "idle_gap": (
                {"start": rfc3339(self.idle_gap[0]), "end": rfc3339(self.idle_gap[1])}
                if self.idle_gap
                else None
            ),
            "last_arrival": rfc3339(self.last_arrival),
            "totals": self.totals(),
            "streams": {name: s.to_dict() for name, s in self.streams.items()},
        }

    def write_manifest(self, path: str | Path) -> Path:
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        return target

    def describe(self) -> str:
        """What ``sluice generate`` prints: where the files went, and the table of :meth:`summary`."""
        return f"generated {self.lines} lines under {self.landing}\n{self.summary()}"

    def summary(self) -> str:
        """A small human-readable table for the CLI."""
        rows = [
            f"{'stream':<12}{'files':>6}{'lines':>8}{'accepted':>10}{'quarant.':>10}{'late':>6}{'dups':>6}"
        ]
        for name, s in self.streams.items():
            rows.append(
                f"{name:<12}{s.files:>6}{s.lines:>8}{s.accepted:>10}{s.quarantined_total:>10}"
                f"{s.late:>6}{s.duplicates:>6}"
            )
        return "\n".join(rows)


# --------------------------------------------------------------------------------------------- slices


@dataclass(frozen=True)
class _Slice:
    index: int
    start: int  # epoch seconds, inclusive
    end: int  # epoch seconds, exclusive


def _slice_count(options: GenerateOptions) -> int:
    span = round(options.hours * 3600)
    return max(1, -(-span // (options.file_minutes * 60)))


def _gap_slice_count(options: GenerateOptions) -> int:
    return -(-options.idle_gap_minutes // options.file_minutes) if options.idle_gap_minutes else 0


def _slices(options: GenerateOptions) -> tuple[list[_Slice], tuple[int, int] | None]:
    """The event-time slices that get files, and the skipped idle gap (whole slices mid-span)."""
    start = int(options.start.timestamp())
    end = start + round(options.hours * 3600)
    step = options.file_minutes * 60
    count = _slice_count(options)
    gap = _gap_slice_count(options)
    first_gap = (count - gap) // 2
    slices: list[_Slice] = []
    gap_span: tuple[int, int] | None = None
    for i in range(count):
        lo, hi = start + i * step, min(end, start + (i + 1) * step)
        if gap and first_gap <= i < first_gap + gap:
            gap_span = (gap_span[0] if gap_span else lo, hi)
            continue
        slices.append(_Slice(i, lo, hi))
    return slices, gap_span


class _SlicePicker:
    """Uniform positions over the slices that get files, and the slice that holds a position."""

    def __init__(self, slices: Sequence[_Slice]) -> None:
        self.slices = list(slices)
        self.cumulative: list[int] = []
        total = 0
        for s in self.slices:
            self.cumulative.append(total)
            total += s.end - s.start
        self.total = total
        self.starts = [s.start for s in self.slices]

    def position(self, rng: random.Random) -> int:
        u = rng.randrange(self.total)
        i = bisect.bisect_right(self.cumulative, u) - 1
        return self.slices[i].start + (u - self.cumulative[i])

    def slice_of(self, ts: int) -> _Slice | None:
        i = bisect.bisect_right(self.starts, ts) - 1
        if i < 0 or ts >= self.slices[i].end:
            return None
        return self.slices[i]


# -------------------------------------------------------------------------------------------- records


@dataclass
class _Base:
    """An on-time, valid record: accepted by the product. ``emit`` is where it sits in the files."""

    payload: dict[str, Any]
    event_time: int
    emit: int
    kind: str = ""  # clicks: matched / outside_bound / unknown_impression


@dataclass
class _Line:
    key: int  # position in the file (epoch seconds); ties keep creation order
    seq: int
    # The line without its newline. Bytes that are not UTF-8 (bad_encoding) are lone surrogates, as
    # ``surrogateescape`` decodes them, and are written back as the same bytes.
    text: str
    kind: str  # one of LINE_KINDS
    event_time: int | None = None


@dataclass
class _Unreadable:
    """A .jsonl.gz file that cannot be read at all, landing after regular file ``after`` (its index)."""

    after: int
    mtime: int
    kind: str  # one of UNREADABLE_KINDS
    payload: bytes


@dataclass
class _File:
    slice: _Slice
    mtime: int
    lines: list[_Line] = field(default_factory=list)

    def accepted_times(self) -> list[int]:
        return [ln.event_time for ln in self.lines if ln.kind == "accepted" and ln.event_time is not None]


class _StreamData:
    """Builds one stream's records with its own random generator, so streams never disturb each other."""

    def __init__(self, name: str, options: GenerateOptions, picker: _SlicePicker) -> None:
        self.name = name
        self.options = options
        self.picker = picker
        self.rng = random.Random(f"sluice:{options.seed}:{name}")
        self.start = int(options.start.timestamp())
        self.tag = f"{options.start:%y%m%d%H%M}s{options.seed}"
        self.prefix = {"impressions": "imp", "clicks": "clk", "events": "evt"}[name]
        self.counter = 0

    def new_id(self) -> str:
        self.counter += 1
        return f"{self.prefix}-{self.tag}-{self.counter:06d}"

    def user(self) -> str:
        return f"user-{self.rng.randrange(self.options.users) + 1:04d}"

    def ad(self) -> str:
        return f"ad-{self.rng.randrange(self.options.ads) + 1:03d}"

    def trailing(self, emit: int) -> int:
        """An event time at most ``disorder`` before its position, never before the span start."""
        return max(self.start, emit - self.rng.randint(0, self.options.disorder))


def _build_impressions(data: _StreamData) -> list[_Base]:
    hours = data.picker.total / 3600
    out: list[_Base] = []
    for _ in range(round(data.options.impressions_per_hour * hours)):
        emit = data.picker.position(data.rng)
        payload = {"impression_id": data.new_id(), "ad_id": data.ad(), "user_id": data.user()}
        out.append(_Base(payload, data.trailing(emit), emit))
    return out


def _build_events(data: _StreamData) -> list[_Base]:
    hours = data.picker.total / 3600
    out: list[_Base] = []
    for _ in range(round(data.options.events_per_hour * hours)):
        emit = data.picker.position(data.rng)
        payload = {
            "event_id": data.new_id(),
            "user_id": data.user(),
            "event_type": data.rng.choice(EVENT_TYPES),
        }
        out.append(_Base(payload, data.trailing(emit), emit))
    return out


def _build_clicks(data: _StreamData, impressions: Sequence[_Base]) -> list[_Base]:
    """Clicks on accepted impressions: mostly inside the join bound, some outside, some on unknown ids."""
    opts = data.options
    out: list[_Base] = []
    unknown = 0
    for _ in range(round(opts.click_rate * len(impressions))):
        u = data.rng.random()
        if u < opts.click_unknown_share or not impressions:
            unknown += 1
            kind = "unknown_impression"
            imp_id, ad_id = f"imp-{data.tag}-unknown-{unknown:05d}", data.ad()
            event_time = data.picker.position(data.rng)
        else:
            imp = data.rng.choice(impressions)
            imp_id, ad_id = imp.payload["impression_id"], imp.payload["ad_id"]
            if u < opts.click_unknown_share + opts.click_outside_share:
                kind = "outside_bound"
                # Clear of the bound on either side, so the join outcome is never a matter of a second.
                if data.rng.random() < 0.7:
                    event_time = imp.event_time + data.rng.randint(
                        JOIN_BOUND_SECONDS + 60, 3 * JOIN_BOUND_SECONDS
                    )
                else:
                    event_time = imp.event_time - data.rng.randint(60, 20 * 60)
            else:
                kind = "matched"
                event_time = imp.event_time + data.rng.randint(1, JOIN_BOUND_SECONDS - 1)
        emit = event_time + data.rng.randint(0, opts.disorder)
        user = data.user()
        # A click lands in the file of its position; positions in the idle gap or past the span have no file.
        if event_time < data.start or data.picker.slice_of(emit) is None:
            continue
        payload = {"click_id": data.new_id(), "impression_id": imp_id, "ad_id": ad_id, "user_id": user}
        out.append(_Base(payload, event_time, emit, kind))
    return out


def _extra_factory(data: _StreamData, impressions: Sequence[_Base]) -> Callable[[int], dict[str, Any]]:
    """Fresh payloads (new ids) for late, early and malformed records at a given event time."""
    if data.name == "impressions":
        return lambda _t: {"impression_id": data.new_id(), "ad_id": data.ad(), "user_id": data.user()}
    if data.name == "events":
        return lambda _t: {
            "event_id": data.new_id(),
            "user_id": data.user(),
            "event_type": data.rng.choice(EVENT_TYPES),
        }
    ordered = sorted(impressions, key=lambda b: b.event_time)
    times = [b.event_time for b in ordered]

    def click(t: int) -> dict[str, Any]:
        # The closest impression before the click, if it is within the join bound, so that a late click
        # brought back by a backfill still joins; otherwise an impression id that never existed.
        i = bisect.bisect_right(times, t) - 1
        if i >= 0 and t - times[i] <= JOIN_BOUND_SECONDS - 1:
            imp_id, ad_id = ordered[i].payload["impression_id"], ordered[i].payload["ad_id"]
        else:
            imp_id, ad_id = f"imp-{data.tag}-none-{data.counter + 1:06d}", data.ad()
        return {"click_id": data.new_id(), "impression_id": imp_id, "ad_id": ad_id, "user_id": data.user()}

    return click


def _format_time(rng: random.Random, ts: int, offset_share: float) -> str:
    # Both draws happen whatever the share, so changing --offset-timestamps changes only the spelling of
    # event times and leaves every other byte (and the manifest) as it was.
    draw, minutes = rng.random(), rng.choice(OFFSET_MINUTES)
    if draw < offset_share:
        return datetime.fromtimestamp(ts, timezone(timedelta(minutes=minutes))).isoformat()
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _render(
    data: _StreamData,
    spec: StreamSpec,
    payload: Mapping[str, Any],
    event_time: int | str,
    drop: str | None = None,
    override: tuple[str, Any] | None = None,
) -> str:
    """One JSON line: payload fields, then event_time, sometimes an unknown field or no optional field.
    ``drop`` removes a field, ``override`` sets one (after the optional fields may have been left out)."""
    rng = data.rng
    record = dict(payload)
    if rng.random() < OMIT_OPTIONAL_SHARE:
        for name in spec.optional:
            record.pop(name, None)
    record["event_time"] = (
        event_time
        if isinstance(event_time, str)
        else _format_time(rng, event_time, data.options.offset_timestamps)
    )
    if rng.random() < EXTRA_FIELD_SHARE:
        name = rng.choice(sorted(EXTRA_FIELDS))
        record[name] = rng.choice(EXTRA_FIELDS[name])
    if drop is not None:
        record.pop(drop, None)
    if override is not None:
        record[override[0]] = override[1]
    return json.dumps(record, separators=(",", ":"))


def _bad_bytes(rng: random.Random) -> str:
    """Bytes that are invalid UTF-8 wherever they stand, as the lone surrogates ``surrogateescape`` gives."""
    return rng.choice(BAD_BYTES).decode("utf-8", "surrogateescape")


def _inject_bad_bytes(rng: random.Random, text: str, fields: Sequence[str]) -> str:
    """A valid JSON line made invalid UTF-8: the bad bytes go at the end of a string value (the record
    would otherwise be valid), at the start of the line (a UTF-16 byte-order mark) or between two fields."""
    junk = _bad_bytes(rng)
    where = rng.random()
    if where < 0.6:
        key = f'"{rng.choice(list(fields))}":"'
        start = text.find(key)
        if start >= 0:
            end = text.index('"', start + len(key))
            return text[:end] + junk + text[end:]
    if where < 0.8:
        return junk + text
    comma = text.index(",")
    return text[: comma + 1] + junk + text[comma + 1 :]


def _unreadable_payload(rng: random.Random, kind: str, lines: Sequence[str]) -> bytes:
    """The bytes of a .jsonl.gz file no reader can read to its end (``gzip`` raises on each of them)."""
    plain = ("\n".join(lines) + "\n").encode()
    if kind == "not_gzip":
        # A producer that forgot to compress: JSON Lines under a .gz name.
        return plain
    packed = _gzip_bytes(plain)
    if kind == "truncated":
        # An upload cut off half-way: the header and part of the deflate stream, never the end of it.
        return packed[: rng.randint(len(packed) // 3, len(packed) // 2)]
    # bad_crc: the whole stream with a wrong CRC-32 in the trailer (every line decompresses, then it fails).
    trailer = bytearray(packed[-8:])
    trailer[0] ^= 0xFF
    return packed[:-8] + bytes(trailer)


def _corrupt(rng: random.Random, text: str) -> str:
    """A line no JSON parser accepts (Python's json, Spark/Jackson in any mode)."""
    if rng.random() < 0.7:
        # Every proper prefix of a flat object lacks its closing brace, so it never parses.
        return text[: rng.randint(10, len(text) - 2)]
    pairs = json.loads(text)
    return ";".join(f"{k}={v}" for k, v in pairs.items())


# ------------------------------------------------------------------------------------------- assembly


class _Assembly:
    """One stream's files: on-time records first, then the extras placed against the watermark rule."""

    def __init__(self, data: _StreamData, spec: StreamSpec, base: Sequence[_Base]) -> None:
        self.data = data
        self.spec = spec
        self.base = list(base)
        self.delay = int(spec.watermark_delay.total_seconds())
        self.tolerance = int(spec.early_tolerance.total_seconds())
        self.seq = 0
        self.unreadable: list[_Unreadable] = []
        by_slice: dict[int, list[_Base]] = {}
        for b in base:
            s = data.picker.slice_of(b.emit)
            if s is None:  # cannot happen: positions come from the picker
                raise RuntimeError(f"{data.name}: record outside every slice")
            by_slice.setdefault(s.index, []).append(b)
        self.files: list[_File] = []
        slices = {s.index: s for s in data.picker.slices}
        for index in sorted(by_slice):
            s = slices[index]
            # Arrival a minute or two after the slice ends, as a producer flushing a file would.
            f = _File(s, s.end + data.rng.randint(60, 120))
            for b in by_slice[index]:
                f.lines.append(
                    self._line(b.emit, _render(data, spec, b.payload, b.event_time), "accepted", b.event_time)
                )
            self.files.append(f)
        # Newest accepted event time up to and including each file; on-time records are never late, so
        # this is exactly what the watermark follows.
        self.max_through: list[int] = []
        newest: int | None = None
        for f in self.files:
            times = f.accepted_times()
            newest = max([*times, newest] if newest is not None else times)
            self.max_through.append(newest)

    def _line(self, key: int, text: str, kind: str, event_time: int | None) -> _Line:
        self.seq += 1
        return _Line(key, self.seq, text, kind, event_time)

    def watermark_before(self, k: int) -> int | None:
        return self.max_through[k - 1] - self.delay if k > 0 else None

    def _fresh_line(self, make: Callable[[int], dict[str, Any]]) -> tuple[_File, int, int, dict[str, Any]]:
        """A file, a position in its slice and an on-time event time for a bad record with a fresh id."""
        rng = self.data.rng
        f = rng.choice(self.files)
        key = rng.randrange(f.slice.start, f.slice.end)
        t = self.data.trailing(key)
        return f, key, t, make(t)

    def _string_fields(self) -> list[str]:
        return [f for f in (*self.spec.required, *self.spec.optional)
                if f != "event_time" and self.spec.type_of(f) == "string"]

    def add_bad_type(self, count: int, make: Callable[[int], dict[str, Any]]) -> None:
        """Records whose only fault is a string field holding an object, an array or a boolean."""
        rng = self.data.rng
        fields = self._string_fields()
        for _ in range(count if self.files and fields else 0):
            f, key, t, payload = self._fresh_line(make)
            bad = (rng.choice(fields), rng.choice(BAD_TYPE_VALUES))
            f.lines.append(self._line(key, _render(self.data, self.spec, payload, t, override=bad), "bad_type", None))

    def add_bad_encoding(self, count: int, make: Callable[[int], dict[str, Any]]) -> None:
        """Otherwise valid records with bytes that are not UTF-8 in a value or between fields."""
        rng = self.data.rng
        # Required string fields are always present, so a value to spoil is always found.
        fields = [f for f in self._string_fields() if f in self.spec.required]
        for _ in range(count if self.files else 0):
            f, key, t, payload = self._fresh_line(make)
            text = _inject_bad_bytes(rng, _render(self.data, self.spec, payload, t), fields or ["event_time"])
            f.lines.append(self._line(key, text, "bad_encoding", None))

    def add_ancient(self, count: int, make: Callable[[int], dict[str, Any]]) -> None:
        """Records with a well-formed event time before 1970 (year 1 and others): bad_timestamp."""
        rng = self.data.rng
        for _ in range(count if self.files else 0):
            f, key, _t, payload = self._fresh_line(make)
            text = _render(self.data, self.spec, payload, rng.choice(ANCIENT_TIMESTAMPS))
            f.lines.append(self._line(key, text, "bad_timestamp", None))

    def add_unreadable(self, count: int, make: Callable[[int], dict[str, Any]]) -> None:
        """Unreadable .jsonl.gz files, each arriving strictly between two regular files (after the last
        one only when no two files leave room), so no arrival time is shared and the latest arrival, which
        decides idleness, moves by a minute at most. Their content is fresh valid records, so a product
        that takes in the part it can read counts them as accepted and the totals show it."""
        if count == 0 or not self.files:
            return
        rng = self.data.rng
        mtimes = [f.mtime for f in self.files]
        room = [k for k in range(len(mtimes) - 1) if mtimes[k + 1] - mtimes[k] >= 2]
        taken = set(mtimes)
        for i in range(count):
            for _attempt in range(1000):
                k = rng.choice(room) if room else len(mtimes) - 1
                hi = min(mtimes[k + 1] - 1, mtimes[k] + 60) if room else mtimes[k] + 60
                mtime = rng.randint(mtimes[k] + 1, hi)
                if mtime not in taken:
                    break
            else:
                raise ConfigError(f"--unreadable-files: no room for {count} unreadable files among "
                                  f"{len(mtimes)} {self.data.name} files; use fewer")
            taken.add(mtime)
            s = self.files[k].slice
            lines = []
            for _ in range(rng.randint(20, 40)):
                key = rng.randrange(s.start, s.end)
                t = self.data.trailing(key)
                lines.append(_render(self.data, self.spec, make(t), t))
            kind = UNREADABLE_KINDS[i % len(UNREADABLE_KINDS)]
            self.unreadable.append(_Unreadable(k, mtime, kind, _unreadable_payload(rng, kind, lines)))
        self.unreadable.sort(key=lambda u: u.mtime)

    def add_late(self, count: int, make: Callable[[int], dict[str, Any]]) -> None:
        if count == 0 or len(self.files) < 2:
            return
        rng = self.data.rng
        lateness = max(MIN_LATENESS_SECONDS, self.delay + 20 * 60)
        candidates = list(range(1, len(self.files)))
        # Prefer files where late records still fall inside the span; tiny spans fall back to any file.
        inside = [k for k in candidates if self.max_through[k - 1] - lateness >= self.data.start]
        for _ in range(count):
            k = rng.choice(inside or candidates)
            hi = self.max_through[k - 1] - lateness
            lo = max(self.data.start, hi - 30 * 60) if hi >= self.data.start else hi - 30 * 60
            t = rng.randint(lo, hi)
            f = self.files[k]
            key = rng.randrange(f.slice.start, f.slice.end)
            f.lines.append(self._line(key, _render(self.data, self.spec, make(t), t), "late", t))

    def add_early(self, count: int, make: Callable[[int], dict[str, Any]]) -> None:
        rng = self.data.rng
        for _ in range(count if self.files else 0):
            f = rng.choice(self.files)
            t = f.mtime + self.tolerance + EARLY_MARGIN_SECONDS + rng.randint(0, 3600)
            key = rng.randrange(f.slice.start, f.slice.end)
            f.lines.append(self._line(key, _render(self.data, self.spec, make(t), t), "early", t))

    def add_duplicates(self, count: int) -> None:
        rng = self.data.rng
        originals = [(k, ln) for k, f in enumerate(self.files) for ln in f.lines if ln.kind == "accepted"]
        # Cross-file copies only go to the directly following slice (no idle gap in between, so no idle
        # heartbeat can move the watermark), and only for originals clearly above the watermark that the
        # next file meets, so the copy is a duplicate and never late.
        cross: list[tuple[int, _Line]] = []
        for k in range(len(self.files) - 1):
            if self.files[k + 1].slice.start != self.files[k].slice.end:
                continue
            floor = self.max_through[k] - self.delay + SAFETY_MARGIN_SECONDS
            cross.extend(
                (k, ln)
                for ln in self.files[k].lines
                if ln.kind == "accepted" and (ln.event_time or 0) >= floor
            )
        for _ in range(count if originals else 0):
            if cross and rng.random() < CROSS_FILE_DUPLICATE_SHARE:
                k, orig = rng.choice(cross)
                target = self.files[k + 1]
                key = rng.randrange(target.slice.start, target.slice.end)
            else:
                k, orig = rng.choice(originals)
                target = self.files[k]
                # After its original: ties on the key sort by creation order, and the copy is newer.
                key = rng.randint(orig.key, target.slice.end)
            target.lines.append(self._line(key, orig.text, "duplicate", orig.event_time))

    def add_malformed(self, count: int, make: Callable[[int], dict[str, Any]]) -> None:
        rng = self.data.rng
        droppable = [f for f in self.spec.required if f != "event_time"]
        for i in range(count if self.files else 0):
            kind = MALFORMED_KINDS[i % len(MALFORMED_KINDS)]
            f = rng.choice(self.files)
            key = rng.randrange(f.slice.start, f.slice.end)
            t = self.data.trailing(key)
            payload = make(t)
            if kind == "missing_field":
                text = _render(self.data, self.spec, payload, t, drop=rng.choice(droppable))
            elif kind == "bad_timestamp":
                text = _render(self.data, self.spec, payload, rng.choice(BAD_TIMESTAMPS))
            else:
                text = _corrupt(rng, _render(self.data, self.spec, payload, t))
            f.lines.append(self._line(key, text, kind, None))

    def verify(self) -> None:
        """Re-check every margin the manifest relies on; a violation is a generator bug, never bad luck."""
        for k, f in enumerate(self.files):
            wm = self.watermark_before(k)
            for ln in f.lines:
                t = ln.event_time
                problem = None
                if ln.kind in ("accepted", "duplicate") and t is not None:
                    if wm is not None and t < wm + SAFETY_MARGIN_SECONDS:
                        problem = "on-time record too close to the watermark"
                    elif t > f.mtime:
                        problem = "on-time record after its arrival"
                elif ln.kind == "late" and (wm is None or t is None or t >= wm - SAFETY_MARGIN_SECONDS):
                    problem = "late record not clearly below the watermark"
                elif ln.kind == "early" and (
                    t is None or t <= f.mtime + self.tolerance + SAFETY_MARGIN_SECONDS
                ):
                    problem = "early record not clearly early"
                problem = problem or _encoding_problem(ln)
                if problem:
                    raise RuntimeError(f"{self.data.name}: {problem} in slice {f.slice.index}: {ln.text!r}")
        mtimes = [f.mtime for f in self.files]
        if mtimes != sorted(set(mtimes)):
            raise RuntimeError(f"{self.data.name}: file arrival times are not strictly increasing")
        every = sorted([*mtimes, *(u.mtime for u in self.unreadable)])
        if every != sorted(set(every)):
            raise RuntimeError(f"{self.data.name}: an unreadable file shares an arrival time")
        for u in self.unreadable:
            if _gzip_error(u.payload) is None:
                raise RuntimeError(f"{self.data.name}: an unreadable ({u.kind}) file reads without error")

    def manifest(
        self, names: Sequence[str], unreadable_names: Sequence[str], join: dict[str, int] | None
    ) -> StreamManifest:
        """Per file in arrival order, regular and unreadable ones. An unreadable file is one line, one
        ``unreadable_file`` quarantine row, and leaves the watermark where the file before it left it."""
        out = StreamManifest(self.data.name, join=join)
        accepted_times: list[int] = []
        wm_after: int | None = None
        unreadable = list(zip(self.unreadable, unreadable_names, strict=True))
        for k, (f, name) in enumerate(zip(self.files, names, strict=True)):
            counts = dict.fromkeys(LINE_KINDS, 0)
            for ln in f.lines:
                counts[ln.kind] += 1
            accepted_times.extend(f.accepted_times())
            wm_before = self.watermark_before(k)
            wm_after = self.max_through[k] - self.delay
            out.file_details.append(
                FileManifest(
                    name=name,
                    arrival=_dt(f.mtime),
                    event_start=_dt(f.slice.start),
                    event_end=_dt(f.slice.end),
                    lines=len(f.lines),
                    accepted=counts["accepted"],
                    quarantined={r: counts.get(r, 0) for r in QUARANTINE_REASONS},
                    late=counts["late"],
                    duplicates=counts["duplicate"],
                    watermark_before=_dt(wm_before) if wm_before is not None else None,
                    watermark_after=_dt(wm_after),
                )
            )
            for u, u_name in (pair for pair in unreadable if pair[0].after == k):
                out.file_details.append(
                    FileManifest(
                        name=u_name,
                        arrival=_dt(u.mtime),
                        event_start=_dt(f.slice.start),
                        event_end=_dt(f.slice.end),
                        lines=1,
                        accepted=0,
                        quarantined={r: int(r == "unreadable_file") for r in QUARANTINE_REASONS},
                        late=0,
                        duplicates=0,
                        watermark_before=_dt(wm_after),
                        watermark_after=_dt(wm_after),
                    )
                )
        if self.files:
            out.min_event_time = _dt(min(accepted_times))
            out.max_event_time = _dt(max(accepted_times))
            out.first_arrival = out.file_details[0].arrival
            out.last_arrival = out.file_details[-1].arrival
            out.final_watermark = _dt(wm_after) if wm_after is not None else None
        return out


def _count(share: float, n: int) -> int:
    """``share`` of ``n``, but at least one when both are positive: a small stream (clicks) still shows
    every kind of defect the options ask for."""
    return max(round(share * n), 1) if share > 0 and n > 0 else 0


def _dt(ts: int) -> datetime:
    return datetime.fromtimestamp(ts, UTC)


def _file_stem(stream: str, s: _Slice, odd: bool) -> str:
    """``<stream>-<slice start>``; with ``odd`` names, five slices in six are named with ':', '%', '#',
    a space or non-ASCII letters instead, chosen by the slice index (no random draw)."""
    start = _dt(s.start)
    style = s.index % ODD_NAME_STYLES if odd else 0
    if style == 1:
        return f"{stream}-{start:%Y-%m-%dT%H:%M:%SZ}"
    if style == 2:
        return f"{stream}%20{start:%Y%m%dT%H%M%SZ}"
    if style == 3:
        return f"{stream}#{start:%Y%m%dT%H%M%SZ}"
    if style == 4:
        return f"{stream} {start:%Y%m%dT%H%M%SZ}"
    if style == 5:
        return f"{stream}-ünïcödé-{start:%Y%m%dT%H%M%SZ}"
    return f"{stream}-{start:%Y%m%dT%H%M%SZ}"


def _file_name(stream: str, s: _Slice, compress: bool, odd: bool = False) -> str:
    return _file_stem(stream, s, odd) + ".jsonl" + (".gz" if compress else "")


def _unreadable_name(stream: str, s: _Slice, kind: str, mtime: int, odd: bool) -> str:
    """After the name of the file it follows: ``<stem>.upload-<arrival>-<kind>.jsonl.gz`` ('.u' sorts
    after '.jsonl', so names keep the arrival order of plain names, and the arrival keeps them unique)."""
    return f"{_file_stem(stream, s, odd)}.upload-{_dt(mtime):%H%M%S}-{kind}.jsonl.gz"


def _encode(lines: Sequence[str]) -> bytes:
    """The file content; lone surrogates are the bytes that are not UTF-8 (bad_encoding lines)."""
    return ("\n".join(lines) + "\n").encode("utf-8", "surrogateescape")


def _encoding_problem(ln: _Line) -> str | None:
    """A bad_encoding line must not be UTF-8 and must hold no line break; every other line must be UTF-8."""
    try:
        ln.text.encode("utf-8")
    except UnicodeEncodeError:
        if ln.kind != "bad_encoding":
            return "a line that is not UTF-8"
        if any(c in ln.text for c in "\r\n"):
            return "a line break inside a line"
        return None
    return "a bad_encoding line that is valid UTF-8" if ln.kind == "bad_encoding" else None


def _gzip_bytes(payload: bytes) -> bytes:
    buffer = io.BytesIO()
    # mtime=0 and no file name in the header keep gzip output byte-identical between runs.
    with gzip.GzipFile(filename="", mode="wb", fileobj=buffer, mtime=0) as gz:
        gz.write(payload)
    return buffer.getvalue()


def _gzip_error(payload: bytes) -> str | None:
    """Why ``payload`` cannot be read as gzip to its end, or None when it can."""
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(payload), mode="rb") as gz:
            while gz.read(1 << 20):
                pass
    except (OSError, EOFError, zlib.error) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def _write_file(path: Path, lines: Sequence[str], mtime: int, compress: bool) -> None:
    payload = _encode(lines)
    _write_bytes(path, _gzip_bytes(payload) if compress else payload, mtime)


def _write_bytes(path: Path, payload: bytes, mtime: int) -> None:
    """Write under an in-flight name (leading dot), stamp the arrival time, then rename into place.

    The mtime is set before the rename (a rename keeps it), so the product never sees the file with the
    wall-clock time, and once more after it for file systems that do not keep it.
    """
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(payload)
    os.utime(tmp, (mtime, mtime))
    os.replace(tmp, path)
    os.utime(path, (mtime, mtime))


def generate(
    landing: str | Path,
    options: GenerateOptions | None = None,
    specs: Mapping[str, StreamSpec] | None = None,
) -> Manifest:
    """Write ``<landing>/<stream>/<stream>-<slice start>.jsonl[.gz]`` files and return the manifest.

    ``specs`` supplies the watermark delay and early tolerance per stream (default: SPEC defaults); the
    manifest is exact for those.
    """
    options = options or GenerateOptions()
    specs = {**DEFAULT_STREAMS, **(specs or {})}
    landing = Path(landing)
    _check_disorder(options, specs)
    slices, gap = _slices(options)
    picker = _SlicePicker(slices)

    # Impressions are always built (in memory) because clicks reference them: generating clicks alone
    # gives the same clicks as generating everything.
    imp_data = _StreamData("impressions", options, picker)
    impressions = _build_impressions(imp_data)
    built: dict[str, tuple[_StreamData, list[_Base]]] = {"impressions": (imp_data, impressions)}
    if "clicks" in options.streams:
        click_data = _StreamData("clicks", options, picker)
        built["clicks"] = (click_data, _build_clicks(click_data, impressions))
    if "events" in options.streams:
        event_data = _StreamData("events", options, picker)
        built["events"] = (event_data, _build_events(event_data))

    streams: dict[str, StreamManifest] = {}
    for name in options.streams:
        data, base = built[name]
        spec = specs[name]
        asm = _Assembly(data, spec, base)
        make = _extra_factory(data, impressions)
        n = len(base)
        asm.add_late(_count(options.late_share, n), make)
        asm.add_early(_count(options.early_share, n), make)
        asm.add_duplicates(_count(options.duplicate_share, n))
        # At least one line of each malformed kind whenever malformed lines are asked for at all.
        malformed = _count(options.malformed_share, n)
        asm.add_malformed(max(malformed, len(MALFORMED_KINDS)) if malformed else 0, make)
        # Issue 14's classes come last and draw nothing when off, so the lines above never change.
        asm.add_bad_type(_count(options.bad_type_share, n), make)
        asm.add_bad_encoding(_count(options.bad_encoding_share, n), make)
        asm.add_ancient(_count(options.ancient_share, n), make)
        asm.add_unreadable(options.unreadable_files, make)
        asm.verify()

        directory = landing / name
        directory.mkdir(parents=True, exist_ok=True)
        names: list[str] = []
        for f in asm.files:
            f.lines.sort(key=lambda ln: (ln.key, ln.seq))
            file_name = _file_name(name, f.slice, options.gzip, options.odd_file_names)
            _write_file(directory / file_name, [ln.text for ln in f.lines], f.mtime, options.gzip)
            names.append(file_name)
        unreadable_names: list[str] = []
        for u in asm.unreadable:
            file_name = _unreadable_name(name, asm.files[u.after].slice, u.kind, u.mtime, options.odd_file_names)
            _write_bytes(directory / file_name, u.payload, u.mtime)
            unreadable_names.append(file_name)
        join = None
        if name == "clicks":
            join = {"matched": 0, "outside_bound": 0, "unknown_impression": 0}
            for b in base:
                join[b.kind] += 1
        streams[name] = asm.manifest(names, unreadable_names, join)

    idle_gap = (_dt(gap[0]), _dt(gap[1])) if gap else None
    return Manifest(landing=landing, options=options, streams=streams, idle_gap=idle_gap)


# ------------------------------------------------------------------------------------------------ CLI

_FLAGS: tuple[tuple[str, str, str], ...] = (
    # (flag, attribute, help)
    ("--seed", "seed", "random seed; the same options give byte-identical files and mtimes"),
    ("--start", "start", "event-time start of the span, RFC 3339"),
    ("--hours", "hours", "event-time span in hours"),
    ("--impressions-per-hour", "impressions_per_hour", "on-time impressions per hour"),
    ("--click-rate", "click_rate", "clicks per impression, in [0, 1]"),
    ("--click-outside-share", "click_outside_share", "share of clicks outside the 30 min join bound"),
    ("--click-unknown-share", "click_unknown_share", "share of clicks naming an unknown impression"),
    ("--users", "users", "number of distinct users"),
    ("--ads", "ads", "number of distinct ads"),
    ("--events-per-hour", "events_per_hour", "on-time events per hour"),
    ("--file-minutes", "file_minutes", "event time covered by one file, in minutes"),
    ("--disorder", "disorder", "max on-time disorder in seconds (or e.g. '2m'); below the watermark delay"),
    ("--late-share", "late_share", "late records per on-time record"),
    ("--early-share", "early_share", "early records per on-time record"),
    ("--duplicate-share", "duplicate_share", "duplicate lines per on-time record"),
    ("--malformed-share", "malformed_share", "malformed lines per on-time record (3 kinds)"),
    ("--idle-gap-minutes", "idle_gap_minutes", "minutes without files in the middle of the span (0: none)"),
    ("--streams", "streams", "comma-separated streams to generate"),
    ("--offset-timestamps", "offset_timestamps", "share of event times written with a numeric UTC offset"),
    ("--bad-type-share", "bad_type_share", "records with an object, array or boolean in a string field"),
    ("--bad-encoding-share", "bad_encoding_share", "lines that are not valid UTF-8"),
    ("--ancient-share", "ancient_share", "records with an event time before 1970 (bad_timestamp)"),
    ("--unreadable-files", "unreadable_files", "corrupt or truncated .jsonl.gz files per stream"),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add a flag for every :class:`GenerateOptions` field, plus ``--gzip``, ``--odd-file-names`` and
    ``--manifest``."""
    defaults = GenerateOptions()
    for flag, attr, text in _FLAGS:
        value = getattr(defaults, attr)
        if attr == "start":
            value = rfc3339(value)
        elif attr == "streams":
            value = ",".join(value)
        # Values stay strings here: options_from_args converts and reports errors as ConfigError.
        parser.add_argument(
            flag, dest=attr, default=str(value), metavar=attr.upper(), help=f"{text} (default: {value})"
        )
    parser.add_argument("--gzip", action="store_true", default=False, help="write .jsonl.gz files")
    parser.add_argument(
        "--odd-file-names", action="store_true", default=False,
        help="name some files with ':', '%%', '#', a space or non-ASCII letters",
    )
    parser.add_argument(
        "--manifest", type=Path, default=None, metavar="PATH", help="write the manifest JSON here"
    )


def _number(value: object, flag: str, kind: type[int] | type[float]) -> Any:
    if isinstance(value, kind) and not isinstance(value, bool):
        return value
    try:
        return kind(str(value).strip())
    except ValueError:
        what = "a whole number" if kind is int else "a number"
        raise ConfigError(f"{flag}: {value!r} is not {what}") from None


def options_from_args(ns: argparse.Namespace) -> GenerateOptions:
    """Typed, validated options from parsed flags; missing attributes keep their defaults."""
    defaults = GenerateOptions()
    values: dict[str, Any] = {}
    for flag, attr, _ in _FLAGS:
        raw = getattr(ns, attr, None)
        if raw is None:
            continue
        if attr == "start":
            values[attr] = parse_timestamp(raw, flag)
        elif attr == "streams":
            parts = raw if isinstance(raw, list | tuple) else str(raw).replace(",", " ").split()
            values[attr] = tuple(str(p).strip() for p in parts if str(p).strip())
        elif attr == "disorder":
            seconds = parse_duration(raw, flag).total_seconds()
            if seconds != int(seconds):
                raise ConfigError(f"{flag}: {raw!r} must be whole seconds")
            values[attr] = int(seconds)
        else:
            kind = type(getattr(defaults, attr))
            values[attr] = _number(raw, flag, float if kind is float else kind)
    values["gzip"] = bool(getattr(ns, "gzip", False))
    values["odd_file_names"] = bool(getattr(ns, "odd_file_names", False))
    return GenerateOptions(**values)


def run(
    ns: argparse.Namespace, landing: str | Path, specs: Mapping[str, StreamSpec] | None = None
) -> Manifest:
    """The whole ``sluice generate`` command: options, files, and the manifest file when asked for."""
    manifest = generate(landing, options_from_args(ns), specs)
    target = getattr(ns, "manifest", None)
    if target:
        manifest.write_manifest(target)
    return manifest
