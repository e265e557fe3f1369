"""A small pure-Python model of sluice's time semantics (SPEC 3, 4 and 8; README "The closing rule"), for the
two-stream pipeline of :mod:`support.two_streams`. No Spark, no sluice code: it is what the contract says,
written out, so that tests can compare the product with it record by record.

Per stream (SPEC 3):

* the landing files of a cycle are taken in arrival order: modification time, then path;
* a line is *early* (quarantined) when ``event_time > arrival + early_tolerance``; an early line is not a
  record: it neither advances the watermark nor makes a later copy of its id a duplicate;
* a valid record whose id was already accepted or dead-lettered (in an earlier file, or earlier in this
  file) is a *duplicate*;
* every other valid record is judged against the stream's watermark *before its file* (the max event time
  accepted in earlier files, minus ``watermark_delay``): ``event_time < watermark`` is *late* (the DLQ, with
  that watermark), everything else is *accepted* (``event_time == watermark`` included);
* after the file, the watermark is ``max(watermark, max event time of its accepted records - delay)``: it
  never moves backwards;
* after the cycle's files, a stream that has received a file and whose latest arrival is at least
  ``idle_timeout`` before ``now`` gets a heartbeat at event time ``now - idle_timeout``, which moves the
  watermark exactly as a record would. A stream that has never received a file has no watermark and gets
  no heartbeat.

Per pipeline (README, "The closing rule"): ``W`` is the minimum of the streams' watermarks (none until every
stream has one); a window ``[s, e)`` is final, and in gold, exactly when ``W >= e + lateness_bound``, for
every output alike. A final window of an output holds the output's aggregate over the accepted records in
``[s, e)`` (ids counted once); a window with no rows has no gold row.

Substreams (SPEC 3, "Substreams"; every stream keyed by ``device_id`` with the same ``skew_tolerance``):

* per stream and key ``k``: ``W_k`` is the largest event time of ``k``'s records accepted in earlier files, minus
  ``watermark_delay``; the floor ``F`` is the stream's largest event time over earlier files, heartbeats
  included, minus ``skew_tolerance`` (``W + watermark_delay - skew_tolerance``);
* a record of ``k`` is late when ``event_time < E_k = max(W_k, F)`` (``F`` alone for a key the stream has not
  accepted a record of; nothing is late in the stream's first file); its DLQ row holds ``E_k`` and the key;
* per pipeline: ``E_k`` is the minimum over its streams of each stream's ``E_k`` (a stream that never accepted
  a record of ``k`` gives its ``F``), and the pipeline's watermark is the minimum of the streams' floors. The
  gold rows of window ``w`` for key ``k`` are final once ``E_k >= end(w) + lateness_bound``; the window as a
  whole (its ledger row) once the pipeline's floor is.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sluice.core.windows import Window

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
STREAMS = ("readings", "txns")
ID_FIELD = {"readings": "reading_id", "txns": "txn_id"}
TIME_FIELD = {"readings": "event_time", "txns": "ts"}
VALUE_FIELD = {"readings": "temp_c", "txns": "amount"}



def iso(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def hm(t: datetime | None) -> str:
    """A short rendering for messages: ``10:05`` or ``10:05:30``."""
    if t is None:
        return "-"
    return t.strftime("%H:%M:%S") if t.second else t.strftime("%H:%M")


@dataclass(frozen=True)
class Rec:
    """One record as a producer writes it (a line of a landing file)."""

    stream: str
    rid: str
    device: str
    t: datetime
    value: float

    def line(self) -> dict[str, Any]:
        return {ID_FIELD[self.stream]: self.rid, "device_id": self.device, VALUE_FIELD[self.stream]: self.value,
                TIME_FIELD[self.stream]: iso(self.t)}


@dataclass
class LandedFile:
    stream: str
    name: str
    arrival: datetime
    records: list[Rec]
    kinds: list[str] = field(default_factory=list)  # how the generator meant each line (for messages only)


@dataclass
class Cycle:
    now: datetime
    files: list[LandedFile]


@dataclass(frozen=True)
class Outcome:
    """What the model says happened to one line."""

    status: str  # accepted | late | early | duplicate
    watermark: datetime | None  # the stream's watermark before the line's file (with substreams: the key's E_k)
    floor: datetime | None = None  # with substreams: the stream's floor F before the line's file
    own: datetime | None = None  # with substreams: the key's own W_k before the line's file (None: a new key)


@dataclass
class StreamModel:
    name: str
    delay: timedelta
    early_tolerance: timedelta = timedelta(minutes=5)
    idle_timeout: timedelta = timedelta(minutes=30)
    watermark: datetime | None = None
    last_arrival: datetime | None = None
    seen: set[str] = field(default_factory=set)  # ids accepted or dead-lettered
    accepted: dict[str, Rec] = field(default_factory=dict)
    late: dict[str, datetime] = field(default_factory=dict)  # id -> the watermark it missed
    early: list[str] = field(default_factory=list)
    duplicates: int = 0
    at_watermark: list[str] = field(default_factory=list)  # accepted with event_time == watermark (E_k)
    heartbeats: list[datetime] = field(default_factory=list)  # those that moved the watermark
    skew: timedelta | None = None  # substreams (keyed by device): skew_tolerance; None: no substreams
    key_max: dict[str, datetime] = field(default_factory=dict)  # per key: the largest accepted event time
    dead: dict[str, Rec] = field(default_factory=dict)  # the late records themselves (their key)

    @property
    def floor(self) -> datetime | None:
        """``F``: the largest event time over the files so far (heartbeats included) minus ``skew_tolerance``;
        without substreams, the watermark itself."""
        if self.watermark is None or self.skew is None:
            return self.watermark
        return self.watermark + self.delay - self.skew

    def mark(self, key: str) -> datetime | None:
        """The watermark the next file's records of substream ``key`` are judged by: ``E_k = max(W_k, F)``, ``F``
        for a key never accepted; without substreams, the stream's watermark."""
        floor = self.floor
        own = self.key_max.get(key)
        if self.skew is None or floor is None or own is None:
            return floor
        return max(own - self.delay, floor)

    def ingest(self, files: Iterable[LandedFile]) -> dict[tuple[str, int], Outcome]:
        """One cycle's files of this stream, in arrival order (mtime, then path). Returns each line's fate,
        keyed by (file name, line index)."""
        fates: dict[tuple[str, int], Outcome] = {}
        for f in sorted(files, key=lambda f: (f.arrival, f.name)):
            floor = self.floor if self.skew is not None else None
            top: datetime | None = None
            keyed: dict[str, datetime] = {}  # this file's accepted maxima per key: they judge later files only
            for i, rec in enumerate(f.records):
                before = self.mark(rec.device)
                known = floor is not None and rec.device in self.key_max
                own = self.key_max[rec.device] - self.delay if known else None
                if rec.t > f.arrival + self.early_tolerance:
                    self.early.append(rec.rid)
                    fates[(f.name, i)] = Outcome("early", before, floor, own)
                    continue
                if rec.rid in self.seen:
                    self.duplicates += 1
                    fates[(f.name, i)] = Outcome("duplicate", before, floor, own)
                    continue
                self.seen.add(rec.rid)
                top = rec.t if top is None else max(top, rec.t)
                if before is not None and rec.t < before:
                    self.late[rec.rid] = before
                    self.dead[rec.rid] = rec
                    fates[(f.name, i)] = Outcome("late", before, floor, own)
                    continue
                self.accepted[rec.rid] = rec
                keyed[rec.device] = max(keyed.get(rec.device, rec.t), rec.t)
                if before is not None and rec.t == before:
                    self.at_watermark.append(rec.rid)
                fates[(f.name, i)] = Outcome("accepted", before, floor, own)
            for key, t in keyed.items():
                self.key_max[key] = max(self.key_max.get(key, t), t)
            if top is not None:
                self._advance(top)
            self.last_arrival = f.arrival if self.last_arrival is None else max(self.last_arrival, f.arrival)
        return fates

    def heartbeat(self, now: datetime) -> datetime | None:
        """The idle heartbeat after a cycle's files, if the stream gets one (its event time)."""
        if self.last_arrival is None or now - self.last_arrival < self.idle_timeout:
            return None
        beat = now - self.idle_timeout
        if self._advance(beat):
            self.heartbeats.append(beat)
            return beat
        return None

    def _advance(self, event_time: datetime) -> bool:
        candidate = event_time - self.delay
        if self.watermark is None or candidate > self.watermark:
            self.watermark = candidate
            return True
        return False


@dataclass
class TwoStreamsModel:
    """The two-stream pipeline: per-device counts and sums of each stream, and (optionally) the join of a
    reading with the same device's transactions ``reading <= txn <= reading + bound``, in the reading's
    windows."""

    size: timedelta
    hop: timedelta
    bound: timedelta
    delays: Mapping[str, timedelta]
    with_join: bool
    skew: timedelta | None = None  # substreams keyed by device_id, with this skew_tolerance; None: none
    streams: dict[str, StreamModel] = field(default_factory=dict)
    fates: dict[tuple[str, str, int], Outcome] = field(default_factory=dict)  # (stream, file, line) -> fate

    def __post_init__(self) -> None:
        self.streams = {s: StreamModel(s, self.delays[s], skew=self.skew) for s in STREAMS}

    @property
    def outputs(self) -> tuple[str, ...]:
        return ("readings", "txns", "joined") if self.with_join else ("readings", "txns")

    def run_cycle(self, cycle: Cycle) -> None:
        for name, stream in self.streams.items():
            fates = stream.ingest(f for f in cycle.files if f.stream == name)
            self.fates.update({(name, *key): fate for key, fate in fates.items()})
            stream.heartbeat(cycle.now)

    @property
    def watermark(self) -> datetime | None:
        """The pipeline watermark ``W``: the minimum of the streams' watermarks (with substreams: of their
        floors ``F``)."""
        marks = [s.floor for s in self.streams.values()]
        return None if any(m is None for m in marks) else min(m for m in marks if m is not None)

    @property
    def boundary(self) -> datetime | None:
        """Windows ending at or before this are final as a whole (``W - lateness_bound``)."""
        w = self.watermark
        return None if w is None else w - self.bound

    def clock(self, key: str) -> datetime | None:
        """With substreams, the pipeline's ``E_k``: the minimum over its streams of each one's ``E_k`` (its ``F``
        when it never accepted a record of ``key``); None while a stream has no watermark. Without substreams, the
        pipeline watermark."""
        if self.watermark is None:
            return None
        marks = [s.mark(key) for s in self.streams.values()]
        return min(m for m in marks if m is not None)

    def clocks(self) -> dict[str, datetime]:
        """With substreams: ``E_k`` of every key some stream accepted a record of (none before every stream has a
        watermark)."""
        if self.skew is None or self.watermark is None:
            return {}
        keys = {k for s in self.streams.values() for k in s.key_max}
        return {k: c for k in keys if (c := self.clock(k)) is not None}

    def windows_of(self, t: datetime) -> Iterator[Window]:
        """Every window ``[s, s + size)`` on the epoch-aligned grid of ``hop`` that holds ``t``."""
        start = EPOCH + ((t - EPOCH) // self.hop) * self.hop
        while start + self.size > t:
            yield (start, start + self.size)
            start -= self.hop

    def is_final(self, window: Window, key: str | None = None) -> bool:
        """Whether the window is final: as a whole (``key`` None, or no substreams), or for one key's rows."""
        if self.skew is None or key is None:
            b = self.boundary
        else:
            c = self.clock(key)
            b = None if c is None else c - self.bound
        return b is not None and window[1] <= b

    def ledger(self) -> set[Window]:
        """The windows closed as a whole that have rows in some output."""
        return {(s, e) for out in self.outputs for s, e, _k in self.gold(out) if self.is_final((s, e))}

    # -- expected gold ------------------------------------------------------------------------------------
    def contributions(self, output: str) -> dict[tuple[datetime, datetime, str], list[tuple[str, float]]]:
        """Per (window_start, window_end, device) of every window (final or not): the contributing items,
        (record id, value) for the per-stream outputs, (reading id + txn id, 1) for the join."""
        out: dict[tuple[datetime, datetime, str], list[tuple[str, float]]] = {}
        if output == "joined":
            txns = list(self.streams["txns"].accepted.values())
            for r in self.streams["readings"].accepted.values():
                for t in txns:
                    if t.device == r.device and r.t <= t.t <= r.t + self.bound:
                        for s, e in self.windows_of(r.t):
                            out.setdefault((s, e, r.device), []).append((f"{r.rid}+{t.rid}", 1.0))
            return out
        for rec in self.streams[output].accepted.values():
            for s, e in self.windows_of(rec.t):
                out.setdefault((s, e, rec.device), []).append((rec.rid, rec.value))
        return out

    def gold(self, output: str) -> dict[tuple[datetime, datetime, str], tuple[Any, ...]]:
        """The expected gold rows of an output: key (window_start, window_end, device) -> metrics, for the
        final windows only (with substreams, final for the row's key). ``output`` is ``readings``, ``txns`` or
        ``joined``."""
        rows: dict[tuple[datetime, datetime, str], tuple[Any, ...]] = {}
        for key, items in self.contributions(output).items():
            if not self.is_final((key[0], key[1]), key[2]):
                continue
            if output == "joined":
                rows[key] = (len(items),)
            else:
                rows[key] = (len(items), sum(v for _rid, v in items))
        return rows
