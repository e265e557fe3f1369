"""A seeded randomized differential test of the time semantics (issue 25: "make this class of bug hard to bring
back"), on the two-stream pipeline of :mod:`support.two_streams` (``readings``; ``txns`` with its event time
as ``ts``; one output per stream and, for some seeds, the stream-stream join).

Each seed generates a scenario of 3-4 cycles: landing files whose arrival order differs from their event-time
and name order (arrival-time ties broken by the path; now and then a straggler whose arrival time is older
than the previous cycle), records below the watermark (the DLQ), records *exactly at* the watermark of their
file (accepted: ``event_time < watermark`` is late, ``==`` is not; every default seed has some), early
records and records exactly at the early bound, duplicates, transactions at a reading's time and at the end
of the join bound, idle gaps (heartbeats at ``now - idle_timeout``), sometimes a stream whose first file only
arrives in the second cycle, and window (hopping or tumbling), watermark delays and join bound per seed.

About a third of the seeds are substream scenarios (issue 55, SPEC 3 "Substreams"): both streams declare
``substream="device_id"`` with a ``skew_tolerance`` per seed (every output is keyed by ``device_id``, and the join
joins on it). Their devices' clocks disagree: two on time, one behind by less than ``skew_tolerance`` (on time by
its own ``W_k``), one behind by more (late by the floor ``F`` once the stream has seen it); records exactly at their
key's ``E_k = max(W_k, F)`` (accepted) and just below it (late); new keys below ``F`` (late) and at or above it
(accepted, and from then on a device of their own); and the same idle gaps, which raise ``F``.

The product runs cycle by cycle (land the cycle's files, then one cycle at ``now``). After every cycle the test
checks the following, and fails at the first cycle that shows a difference; the message names the seed and
the cycle and prints the scenario, each line annotated with what the model says happened to it:

* ingest against the model (:mod:`support.model`, written from SPEC 3 and the README): which records are
  accepted, late (with the watermark they missed: with substreams their key's ``E_k``, and the key in the DLQ's
  ``substream`` column), early or duplicates, the per-stream watermarks, the per-substream maxima and the
  heartbeats;
* the closing rule: the pipeline watermark ``W`` and, for **every** output (the single-stream ones too),
  gold holds exactly the windows with ``W >= end + lateness_bound`` that have rows (one set of final windows
  per pipeline; empty windows have no rows, so each output is compared with the model's final windows that
  have rows for it); the window ledger holds the union of those windows;
* with substreams, per key: gold holds exactly key ``k``'s rows of the windows with ``E_k >= end +
  lateness_bound`` (``E_k`` the minimum over the streams, ``F`` for a stream that never accepted ``k``), and the
  ledger the windows with rows that the pipeline's floor (the minimum of the streams' ``F``) closes as a whole;
* gold equals the model's aggregate of the accepted records over those windows, so every accepted record
  is counted in exactly the final windows that hold it (a differing row lists the records that should
  make it up, marking those accepted exactly at the watermark);
* gold equals a batch recomputation from bronze, and that recomputation equals the model (a cross-check of
  the model against sluice's batch path). The recomputation uses sluice's own batch code: ``batch_inputs``
  then the output's build function and ``gold_rows``, the functions that backfills, the batch close and
  catch-up compute with, over the windows the product's own stored watermarks make final (with substreams, each
  key's rows of the windows its stored ``E_k`` makes final, from ``stream_floor`` and the stored substream
  maxima). That is the cheapest honest backfill result: ``run_backfill`` itself would rewrite gold and the
  ledger and run Great Expectations (seconds per call), and would need a copy of the home in every cycle to
  leave the streaming home untouched.

Seeds: ``SLUICE_RANDOM_SEEDS`` is a count (``50``: seeds 0..49) or a comma list (``7,19``; ``7,`` for one
seed). By default the twelve seeds 0..11 (about 20 s each on the suite's warm Spark session), which cover
every shape the generator makes (checked below): hopping and tumbling windows, with and without the join, a
stream whose first file arrives late, and substream scenarios (seeds 1, 3, 7 and 8). Run
``SLUICE_RANDOM_SEEDS=50`` before changing the time semantics.
Changing ingest's ``event_time < watermark`` to ``<=`` fails seeds 2, 5 and 11 (tried 2026-11-26, before the
substream seeds). Judging substreams by ``E_k = W_k`` alone (no floor ``F``) fails seeds 1, 3, 7 and 8, every
substream seed of the default twelve (tried 2026-12-05).
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from sluice.config import Settings
from sluice.core.model import PipelineDef
from sluice.core.spark import collected_utc
from sluice.core.timeutil import parse_duration
from sluice.ingest.state import load_state
from sluice.ingest.substreams import substream_maxima
from sluice.storage.engines import engine_for
from sluice.streaming.batch import batch_inputs, closing_boundary, gold_rows, pipeline_watermark, stream_floor
from sluice.windows.ledger import read_ledger
from support.lake import cycle, land, table
from support.model import STREAMS, Cycle, LandedFile, Outcome, Rec, StreamModel, TwoStreamsModel, hm
from support.two_streams import JOINED_OUT, PIPELINE, READINGS_OUT, TXNS_OUT, two_stream_home

pytestmark = [pytest.mark.spark, pytest.mark.slow]

DEFAULT_SEEDS = tuple(range(12))  # issue 25: at least 12 seeds in CI
T0 = datetime(2024, 5, 1, 10, 0, tzinfo=UTC)
MINUTE = timedelta(minutes=1)
WINDOWS: list[str | tuple[str, str]] = [("15m", "5m"), "10m", ("10m", "5m"), ("20m", "10m")]
DELAYS = ["1m", "2m", "3m", "5m"]
BOUNDS = ["5m", "10m"]
SKEWS = ["15m", "20m", "30m"]  # skew_tolerance of the substream scenarios (at least every watermark delay)
SECOND = timedelta(seconds=1)
OUTPUTS = {READINGS_OUT: "readings", TXNS_OUT: "txns", JOINED_OUT: "joined"}  # gold table -> model output
METRICS = {"readings": ("readings", "sum_temp_c"), "txns": ("txns", "amount"), "joined": ("matches",)}
ID_PREFIX = {"readings": "r", "txns": "t"}


def seeds() -> list[int]:
    raw = os.environ.get("SLUICE_RANDOM_SEEDS", "").strip()
    if not raw:
        return list(DEFAULT_SEEDS)
    if "," in raw:
        return [int(s) for s in raw.split(",") if s.strip()]
    return list(range(int(raw)))


# -- scenarios ------------------------------------------------------------------------------------------
class Scenario:
    def __init__(self, seed: int) -> None:
        rng = random.Random(seed)
        self.seed = seed
        self.window = rng.choice(WINDOWS)
        size, hop = self.window if isinstance(self.window, tuple) else (self.window, self.window)
        self.delays = {s: rng.choice(DELAYS) for s in STREAMS}
        self.bound = rng.choice(BOUNDS)
        self.with_join = rng.random() < 0.4
        self.late_start = rng.choice(STREAMS) if rng.random() < 0.2 else None  # first file in cycle 1 only
        # Issue 55: about a third of the seeds are substream scenarios (both streams keyed by device_id), drawn
        # from a random stream of their own so that the other scenarios stay what they were. The salt puts four
        # of the default seeds there, with and without the join, a window change and a late first file.
        keyed = random.Random(seed * 7919 + 194)
        self.skew = keyed.choice(SKEWS) if keyed.random() < 0.35 else None
        self.devices: dict[str, timedelta] = {}  # substream scenarios: each device's clock offset
        self.cycles: list[Cycle] = []
        self._size, self._hop = parse_duration(size, "size"), parse_duration(hop, "hop")
        self._generate(rng, rng.randint(3, 4))
        # Issue 54: now and then the pipeline's window changes before a later cycle (a random stream of its own,
        # so the scenarios above stay what they were). The run rebuilds every closed window with the new one.
        # Either the window changes (every output is rebuilt, the old windows leave), or one output gains a
        # metric (that output alone is rebuilt; the ledger still counts every output's rows).
        changes = random.Random(seed * 7919 + 54)
        self.change: tuple[int, str | tuple[str, str] | None] | None = None
        draw = changes.random()
        if draw < 0.4:
            self.change = (changes.randrange(1, len(self.cycles)),
                           changes.choice([w for w in WINDOWS if w != self.window]))
        elif draw < 0.65:
            self.change = (changes.randrange(1, len(self.cycles)), None)  # None: the window stays
        # Issue 57: each cycle either streams (batch_close_rows=0) or closes in batch, as a small cycle does by
        # default (a random stream of its own, as above): both paths, and a query that streams again after cycles
        # closed in batch, are held to the model.
        closes = random.Random(seed * 7919 + 57)
        self.streamed = {c for c in range(len(self.cycles)) if closes.random() < 0.5}

    def model(self) -> TwoStreamsModel:
        """A fresh model of this scenario's pipeline."""
        return TwoStreamsModel(size=self._size, hop=self._hop, bound=parse_duration(self.bound, "bound"),
                               delays={s: parse_duration(d, s) for s, d in self.delays.items()},
                               with_join=self.with_join,
                               skew=parse_duration(self.skew, "skew") if self.skew else None)

    def options(self, window: str | tuple[str, str] | None = None, **changed: Any) -> dict[str, Any]:
        return {**changed, "window": window or self.window, "readings_delay": self.delays["readings"],
                "txns_delay": self.delays["txns"], "bound": self.bound, "with_join": self.with_join,
                "skew": self.skew}

    def _generate(self, rng: random.Random, n_cycles: int) -> None:
        # The generator runs the model as it goes, to know each file's watermark: that is how it puts records
        # exactly at it (and below it) on purpose. The test runs a fresh model over the finished scenario.
        sim = self.model()
        counters = dict.fromkeys(STREAMS, 0)
        lines: dict[str, list[Rec]] = {s: [] for s in STREAMS}
        names: set[str] = set()
        if self.skew:
            # Devices whose clocks disagree: two on time (or nearly), one behind by less than skew_tolerance (on
            # its own clock), one behind by more (late by the floor F once the stream has seen it once). New
            # devices join as the scenario goes, below and above F.
            skew = parse_duration(self.skew, "skew")
            self.devices = {"d1": timedelta(0), "d2": -rng.randint(0, 3) * MINUTE,
                            "d3": -(skew - rng.randint(6, 10) * MINUTE), "d4": -(skew + rng.randint(5, 15) * MINUTE)}
        now = T0 + rng.randint(15, 25) * MINUTE
        previous = now - 15 * MINUTE
        for c in range(n_cycles):
            if c:
                # The last cycle comes after a longer gap, so that heartbeats close the last windows.
                steps = [35, 45, 60] if c == n_cycles - 1 else [5, 10, 15, 25, 35, 45, 60]
                previous, now = now, now + rng.choice(steps) * MINUTE
            quiet = (c == n_cycles - 1 and rng.random() < 0.7) or (c > 0 and rng.random() < 0.15)
            files: list[LandedFile] = []
            for stream in STREAMS:
                count = 0 if quiet or (stream == self.late_start and c == 0) else rng.choice([0, 0, 1, 1, 2, 3])
                if (c == 0 and stream != self.late_start) or (c == 1 and stream == self.late_start):
                    count = max(count, 1)  # a stream's first file: in the first cycle, unless it starts late
                planned: list[tuple[datetime, str]] = []
                for _ in range(count):
                    span = max(1, int((now - previous) / MINUTE))
                    arrival = now - rng.randint(0, span - 1) * MINUTE - rng.choice([0, 0, 0, 20]) * timedelta(seconds=1)
                    if c and rng.random() < 0.1:  # a straggler: older than the previous cycle, delivered now
                        arrival = previous - rng.randint(1, 20) * MINUTE
                    if planned and rng.random() < 0.2:  # the same arrival time: the path decides
                        arrival = planned[-1][0]
                    while (name := f"{stream[0]}{rng.randrange(1000):03d}.jsonl") in names:
                        pass
                    names.add(name)
                    planned.append((arrival, name))
                for arrival, name in sorted(planned):
                    make = self._keyed_file if self.skew else self._file
                    f = make(rng, sim, stream, name, arrival, counters, lines[stream], lines["readings"],
                             int(sim.bound / MINUTE))
                    sim.streams[stream].ingest([f])
                    files.append(f)
                sim.streams[stream].heartbeat(now)
            rng.shuffle(files)  # landing order is irrelevant: arrival is the mtime
            self.cycles.append(Cycle(now, files))

    @staticmethod
    def _file(rng: random.Random, sim: TwoStreamsModel, stream: str, name: str, arrival: datetime,
              counters: dict[str, int], lines: list[Rec], readings: list[Rec], bound: int) -> LandedFile:
        wm = sim.streams[stream].watermark
        f = LandedFile(stream, name, arrival, [])
        n = rng.randint(1, 4)
        at_wm = rng.randrange(n) if wm is not None and rng.random() < 0.7 else None
        for i in range(n):
            partners = [r for r in readings[-6:] if stream == "txns"]
            options = (["normal"] * 6 + ["early", "early_edge"] + (["late"] if wm else []) + (["dup"] if lines else [])
                       + (["match"] * 3 if partners else []))
            kind = "at_wm" if i == at_wm else rng.choice(options)
            if kind == "dup":
                rec = rng.choice(lines)
            elif kind == "match":  # a transaction of a recent reading's device, within the join bound (edges too)
                counters[stream] += 1
                partner = rng.choice(partners)
                t = partner.t + rng.choice([0, rng.randint(0, bound), bound]) * MINUTE
                rec = Rec(stream, f"{ID_PREFIX[stream]}{counters[stream]}", partner.device, t, rng.randint(30, 50) / 2)
            else:
                counters[stream] += 1
                if kind == "at_wm":
                    assert wm is not None
                    t = wm
                elif kind == "late":
                    assert wm is not None
                    t = wm - rng.randint(1, 8) * MINUTE
                elif kind == "early":
                    t = arrival + rng.randint(6, 12) * MINUTE
                elif kind == "early_edge":
                    t = arrival + 5 * MINUTE
                else:
                    t = arrival - rng.randint(0, 12) * MINUTE - rng.choice([0, 0, 0, 0, 30]) * timedelta(seconds=1)
                rec = Rec(stream, f"{ID_PREFIX[stream]}{counters[stream]}", rng.choice(["d1", "d2"]), t,
                          rng.randint(30, 50) / 2)
            lines.append(rec)
            f.records.append(rec)
            f.kinds.append(kind)
        return f

    def _keyed_file(self, rng: random.Random, sim: TwoStreamsModel, stream: str, name: str, arrival: datetime,
                    counters: dict[str, int], lines: list[Rec], readings: list[Rec], bound: int) -> LandedFile:
        """A file of a substream scenario: the devices' records on their own clocks, and records exactly at their
        key's ``E_k`` (accepted) and just below it (late), new keys below and above the floor ``F``."""
        judge = sim.streams[stream]
        floor = judge.floor
        f = LandedFile(stream, name, arrival, [])
        n = rng.randint(2, 5)
        at_wm = rng.randrange(n) if floor is not None and rng.random() < 0.7 else None
        for i in range(n):
            partners = [r for r in readings[-6:] if stream == "txns"]
            options = (["normal"] * 6 + ["early", "early_edge"] + (["dup"] if lines else [])
                       + (["match"] * 3 if partners else [])
                       + (["at_wm", "below_wm", "below_wm", "new_below", "new_above"] if floor is not None else []))
            kind = "at_wm" if i == at_wm else rng.choice(options)
            if kind == "dup":
                rec = rng.choice(lines)
            elif kind == "match":  # a transaction of a recent reading's device, within the join bound (edges too)
                counters[stream] += 1
                partner = rng.choice(partners)
                t = partner.t + rng.choice([0, rng.randint(0, bound), bound]) * MINUTE
                rec = Rec(stream, f"{ID_PREFIX[stream]}{counters[stream]}", partner.device, t, rng.randint(30, 50) / 2)
            else:
                counters[stream] += 1
                device = rng.choice(sorted(self.devices))
                if kind in ("new_below", "new_above"):  # a key this stream never accepted a record of: E_k = F
                    assert floor is not None
                    device = f"n{sum(1 for d in self.devices if d.startswith('n')) + 1}"
                    if kind == "new_below":
                        t = floor - rng.choice([SECOND, rng.randint(1, 5) * MINUTE])
                    else:
                        t = floor + rng.choice([0, 0, rng.randint(1, 5)]) * MINUTE
                    self.devices[device] = min(t - arrival, timedelta(0))  # it keeps that clock
                elif kind in ("at_wm", "below_wm"):  # at the key's E_k, or just below it
                    mark = judge.mark(device)
                    assert mark is not None
                    t = mark if kind == "at_wm" else mark - rng.choice([SECOND, rng.randint(1, 8) * MINUTE])
                elif kind == "early":
                    t = arrival + rng.randint(6, 12) * MINUTE
                elif kind == "early_edge":
                    t = arrival + 5 * MINUTE
                else:
                    t = arrival + self.devices[device] - rng.randint(0, 4) * MINUTE - rng.choice([0, 0, 0, 30]) * SECOND
                rec = Rec(stream, f"{ID_PREFIX[stream]}{counters[stream]}", device, t, rng.randint(30, 50) / 2)
            lines.append(rec)
            f.records.append(rec)
            f.kinds.append(kind)
        return f

    def render(self, model: TwoStreamsModel | None = None, upto: int | None = None) -> str:
        out = [f"scenario seed={self.seed}: window={self.window!r} delays={self.delays} bound={self.bound} "
               f"join={self.with_join} late_start={self.late_start} streamed cycles={sorted(self.streamed)} "
               "(the others close in batch)"]
        if self.skew:
            offsets = ", ".join(f"{d} {int(o / MINUTE):+d}m" for d, o in self.devices.items())
            out.append(f"  substreams on device_id, skew_tolerance={self.skew}; clock offsets: {offsets}")
        for c, cyc in enumerate(self.cycles):
            if self.change is not None and c == self.change[0]:
                what = f"window={self.change[1]!r}" if self.change[1] else f"{READINGS_OUT} gains max_temp_c"
                out.append(f"  (the pipeline file changes: {what}; the next run rebuilds)")
            if upto is not None and c > upto:
                out.append(f"  (cycles {c}..{len(self.cycles) - 1} not run)")
                break
            out.append(f"  cycle {c}: now={hm(cyc.now)}")
            for f in sorted(cyc.files, key=lambda f: (f.stream, f.arrival, f.name)):
                parts = []
                for i, (rec, kind) in enumerate(zip(f.records, f.kinds, strict=True)):
                    fate = model.fates.get((f.stream, f.name, i)) if model else None
                    said = f"->{fate.status}" if fate else ""
                    if fate and fate.status == "accepted" and fate.watermark == rec.t:
                        said += "(AT WATERMARK)"
                    if fate and self.skew:
                        said += f" E_k={hm(fate.watermark)}"
                    parts.append(f"{rec.rid}@{hm(rec.t)}/{rec.device}/{rec.value:g} [{kind}{said}]")
                first = model.fates.get((f.stream, f.name, 0)) if model else None
                wm = first.watermark if first else None
                before = f"floor F before {hm(first.floor if first else None)}" if self.skew else \
                    f"watermark before {hm(wm)}"
                out.append(f"    {f.stream:8} {f.name} arrives {hm(f.arrival)} ({before}): " + ", ".join(parts))
        return "\n".join(out)


# -- reading the product's state ---------------------------------------------------------------------------
def utc(value: datetime) -> datetime:
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def gold_of(settings: Settings, output: str) -> tuple[dict[tuple[datetime, datetime, str], tuple[Any, ...]], list[str]]:
    """An output's gold rows, key (window_start, window_end, device) -> metrics, and the keys written twice."""
    kind = OUTPUTS[output]
    rows: dict[tuple[datetime, datetime, str], tuple[Any, ...]] = {}
    twice = []
    for r in table(settings, f"gold/{output}"):
        key = (utc(r["window_start"]), utc(r["window_end"]), r["device_id"])
        if key in rows:
            twice.append(fmt_key(key))
        rows[key] = tuple(r[m] for m in METRICS[kind])
    return rows, twice


def stored_clocks(settings: Settings, definition: PipelineDef) -> tuple[datetime | None, dict[str, datetime]]:
    """A pipeline over substreams, from the product's stored state: its floor (the minimum of its streams' floors
    ``F``) and ``E_k`` of every key a stream accepted a record of (the minimum over its streams of ``max(W_k, F)``,
    ``F`` for a stream that never accepted one), with sluice's own readers (``stream_floor``, the substream
    maxima)."""
    floors = {s: stream_floor(settings, s) for s in definition.streams}
    if any(f is None for f in floors.values()):
        return None, {}
    own: dict[str, dict[str, datetime]] = {}
    for stream in definition.streams:
        spec = settings.stream(stream)
        maxima = substream_maxima(settings, spec)
        rows = [] if maxima is None else maxima.to_pylist()
        own[stream] = {r["substream"]: utc(r["max_event_time"]) - spec.watermark_delay for r in rows}
    keys = {k for per in own.values() for k in per}
    clocks = {k: min(max(own[s].get(k, f), f) for s, f in floors.items() if f is not None) for k in keys}
    return min(f for f in floors.values() if f is not None), clocks


def batch_gold(spark: SparkSession, settings: Settings) -> tuple[Any, dict[str, dict]]:
    """Every output's rows for the windows the stored watermarks make final, computed in batch from bronze
    with sluice's own batch code (what a backfill computes). With substreams, the rows of each key's windows
    that the stored state makes final for that key (``E_k >= end + lateness_bound``). Also returns that state:
    the closing boundary, or with substreams the floor and every key's ``E_k``."""
    definition = settings.pipeline(PIPELINE)
    out: dict[str, dict] = {o.name: {} for o in definition.outputs}
    bound = definition.lateness_bound
    floor: datetime | None = None
    clocks: dict[str, datetime] = {}
    if definition.substream is None:
        boundary = closing_boundary(settings, definition)
        if boundary is None:
            return boundary, out
        hi = boundary + bound
    else:
        floor, clocks = stored_clocks(settings, definition)
        if floor is None:
            return (None, {}), out
        hi = max([floor, *clocks.values()])
    engine = engine_for(spark, settings)
    inputs = batch_inputs(settings, engine, definition, None, hi)
    for output in definition.outputs:
        metrics = METRICS[OUTPUTS[output.name]]
        rows = gold_rows(output, output.build(inputs, definition.window), definition.window)
        for r in rows.filter(F.col("window_end") <= F.lit(hi - bound)).collect():
            key = (collected_utc(r["window_start"]), collected_utc(r["window_end"]), r["device_id"])
            if floor is None or key[1] <= clocks.get(key[2], floor) - bound:
                out[output.name][key] = tuple(r[m] for m in metrics)
    if definition.substream is None:
        return boundary, out
    return (floor, clocks), out


def fmt_key(key: tuple[datetime, datetime, str]) -> str:
    return f"[{hm(key[0])},{hm(key[1])}) {key[2]}"


def fmt_windows(windows: set[tuple[datetime, datetime]]) -> list[str]:
    return [f"[{hm(s)},{hm(e)})" for s, e in sorted(windows)]


def diff_rows(got: dict, want: dict, explain: Any = None) -> list[str]:
    lines = []
    for key in sorted(set(got) | set(want)):
        if got.get(key) != want.get(key):
            line = f"{fmt_key(key)}: product {got.get(key)} expected {want.get(key)}"
            if explain is not None:
                line += f"  {explain(key)}"
            lines.append(line)
    return lines


# -- the checks ----------------------------------------------------------------------------------------------
def check_ingest(settings: Settings, model: TwoStreamsModel) -> list[str]:
    problems = []
    for stream in STREAMS:
        m = model.streams[stream]
        id_field = {"readings": "reading_id", "txns": "txn_id"}[stream]
        value_field = {"readings": "temp_c", "txns": "amount"}[stream]
        bronze = table(settings, f"bronze/{stream}")
        accepted = {r[id_field]: (r["device_id"], utc(r["event_time"]), r[value_field])
                    for r in bronze if not r["is_heartbeat"]}
        want = {rid: (rec.device, rec.t, rec.value) for rid, rec in m.accepted.items()}
        if accepted != want:
            problems.append(f"ingest {stream}: accepted records differ: missing {sorted(set(want) - set(accepted))}"
                            f", unexpected {sorted(set(accepted) - set(want))}, changed "
                            f"{sorted(k for k in set(want) & set(accepted) if want[k] != accepted[k])}")
        # The watermark each late record missed (with substreams: its key's E_k, and the key itself).
        late = {r[id_field]: (utc(r["watermark"]), r.get("substream")) for r in table(settings, f"dlq/{stream}")}
        want_late = {rid: (wm, m.dead[rid].device if model.skew else None) for rid, wm in m.late.items()}
        if late != want_late:
            problems.append(f"ingest {stream}: DLQ differs: product "
                            f"{sorted((k, hm(v), key) for k, (v, key) in late.items())}, model "
                            f"{sorted((k, hm(v), key) for k, (v, key) in want_late.items())}")
        if model.skew is not None:
            # Each substream's largest accepted event time (its W_k + watermark_delay), as the product keeps it.
            maxima = substream_maxima(settings, settings.stream(stream))
            kept = {r["substream"]: utc(r["max_event_time"]) for r in (maxima.to_pylist() if maxima else [])}
            if kept != m.key_max:
                problems.append(f"ingest {stream}: per-substream maxima differ: product "
                                f"{sorted((k, hm(v)) for k, v in kept.items())}, model "
                                f"{sorted((k, hm(v)) for k, v in m.key_max.items())}")
        quarantined = sorted((json.loads(r["raw"]).get(id_field), r["reason"])
                             for r in table(settings, f"quarantine/{stream}"))
        if quarantined != sorted((rid, "early") for rid in m.early):
            problems.append(f"ingest {stream}: quarantine {quarantined}, the model has early {sorted(m.early)}")
        state = load_state(settings, stream)
        # Heartbeats that moved the watermark (whether one that does not is stored is not the contract's).
        beats = sorted(r.max_event_time for r in state.rows if r.is_heartbeat and r.max_event_time is not None
                       and r.watermark_after != r.watermark_before)
        if beats != sorted(m.heartbeats):
            problems.append(f"ingest {stream}: heartbeats at {[hm(b) for b in beats]}, the model has "
                            f"{[hm(b) for b in m.heartbeats]}")
        dups = state.totals()["duplicates"]
        if dups != m.duplicates:
            problems.append(f"ingest {stream}: {dups} duplicates, the model has {m.duplicates}")
        if state.watermark != m.watermark:
            problems.append(f"ingest {stream}: stored watermark {hm(state.watermark)}, the model's {hm(m.watermark)}")
    return problems


def check_closing(spark: SparkSession, settings: Settings, model: TwoStreamsModel) -> list[str]:
    definition = settings.pipeline(PIPELINE)
    problems = []
    w = pipeline_watermark(settings, definition)
    if w != model.watermark:
        problems.append(f"pipeline watermark {'F (the floor)' if model.skew else 'W'}: product {hm(w)}, model "
                        f"{hm(model.watermark)}")
    boundary = model.boundary
    clocks = model.clocks()
    rule = (f"E_k >= end + bound (bound {model.bound}; E_k: "
            f"{', '.join(f'{k} {hm(c)}' for k, c in sorted(clocks.items()))}; other keys F={hm(model.watermark)})"
            if model.skew else f"W >= end + bound (W={hm(model.watermark)}, bound {model.bound})")
    golds = {}
    for o in definition.outputs:
        golds[o.name], twice = gold_of(settings, o.name)
        if twice:
            problems.append(f"gold/{o.name}: rows written more than once (a window is written once): {twice}")
    # 4. One closing rule for every output: gold holds exactly the final windows that have rows (with
    # substreams: each key's rows of the windows final for that key).
    for output, got in golds.items():
        kind = OUTPUTS[output]
        want = model.gold(kind)
        early = sorted(k for k in got if not model.is_final((k[0], k[1]), k[2]))
        if early:
            problems.append(f"closing rule, gold/{output}: rows written before {rule}: {[fmt_key(k) for k in early]}")
        missing = sorted(set(want) - set(got))
        if missing:
            problems.append(f"closing rule, gold/{output}: final rows missing ({rule}): "
                            f"{[fmt_key(k) for k in missing]}")
        # 2 and 3. Gold = the model's aggregate of the accepted records: every accepted record counted in
        # exactly the final windows that hold it.
        contributions = model.contributions(kind)
        at_wm = {rid for st in model.streams.values() for rid in st.at_watermark}

        def explain(key: Any, contributions: Any = contributions, at_wm: set[str] = at_wm) -> str:
            items = ["+".join(p + ("*" if p in at_wm else "") for p in rid.split("+"))
                     for rid, _v in contributions.get(key, [])]
            return f"records {items} (* = accepted exactly at its file's watermark)" if items else "no record in it"

        bad = diff_rows({k: v for k, v in got.items() if k not in early}, want, explain)
        if bad:
            problems.append(f"gold/{output} differs from the model (accepted records per final window):\n      "
                            + "\n      ".join(bad))
    # The ledger: the windows closed as a whole (with substreams, by the floor) that have rows.
    stored_boundary = None if w is None else w - definition.lateness_bound
    union = {(s, e) for got in golds.values() for s, e, _d in got
             if model.skew is None or (stored_boundary is not None and e <= stored_boundary)}
    ledger = {r.window for r in read_ledger(settings, PIPELINE)}
    if ledger != union:
        problems.append(f"ledger windows differ from gold's: only in the ledger {fmt_windows(ledger - union)}, only "
                        f"in gold {fmt_windows(union - ledger)}")
    want_ledger = model.ledger()
    if ledger != want_ledger:
        problems.append(f"ledger windows differ from the model's (closed as a whole up to {hm(boundary)}): only in "
                        f"the ledger {fmt_windows(ledger - want_ledger)}, only in the model "
                        f"{fmt_windows(want_ledger - ledger)}")
    # 1. Gold = the batch computation over bronze of the windows the stored watermarks make final.
    stored, batch = batch_gold(spark, settings)
    expected_state = (model.watermark, clocks) if model.skew else boundary
    shown = (f"floor {hm(stored[0])}, E_k {', '.join(f'{k} {hm(c)}' for k, c in sorted(stored[1].items()))}"
             if model.skew else f"boundary {hm(stored)}")
    if model.skew and stored != expected_state:
        problems.append(f"the product's stored state gives {shown}; the model floor {hm(model.watermark)}, E_k "
                        f"{', '.join(f'{k} {hm(c)}' for k, c in sorted(clocks.items()))}")
    for output, got in golds.items():
        bad = diff_rows(got, batch[output])
        if bad:
            problems.append(f"gold/{output} differs from the batch recomputation from bronze ({shown}):\n      "
                            + "\n      ".join(bad))
        # The model and sluice's batch path agree (else one of them is wrong, whatever streaming did).
        if stored == expected_state:
            bad = diff_rows(batch[output], model.gold(OUTPUTS[output]))
            if bad:
                problems.append(f"the batch recomputation of gold/{output} differs from the model:\n      "
                                + "\n      ".join(bad))
    return problems


def raised(exc: BaseException) -> str:
    """An exception in a few lines: its first line and the causes in its text (Spark's JVM stack trace)."""
    text = f"{exc}\n{getattr(exc, '_stackTrace', '') or ''}"
    causes = [line.strip()[:300] for line in text.splitlines() if line.strip().startswith("Caused by")]
    return "\n      ".join([f"{type(exc).__name__}: {text.splitlines()[0][:300]}", *causes[:3]])


@pytest.mark.parametrize("seed", seeds(), ids=lambda s: f"seed{s}")
def test_streaming_gold_matches_the_model_and_a_batch_recomputation(
    spark: SparkSession, tmp_path: Path, seed: int
) -> None:
    scenario = Scenario(seed)
    settings = two_stream_home(tmp_path, f"seed{seed}", **scenario.options())
    model = scenario.model()
    for index, cyc in enumerate(scenario.cycles):
        if scenario.change is not None and index == scenario.change[0]:
            # The definition changes between cycles: gold must then hold the model's windows of the new spec.
            window = scenario.change[1]
            settings = two_stream_home(tmp_path, f"seed{seed}", **scenario.options(window, max_temp=window is None))
            if window is not None:
                size, hop = window if isinstance(window, tuple) else (window, window)
                model.size, model.hop = parse_duration(size, "size"), parse_duration(hop, "hop")
        for f in cyc.files:
            land(settings, f.stream, f.name, [r.line() for r in f.records], f.arrival)
        try:
            limit = 0 if index in scenario.streamed else max(settings.batch_close_rows, 1_000_000)
            after = cycle(spark, replace(settings, batch_close_rows=limit), PIPELINE, cyc.now)
        except Exception as exc:  # the cycle itself failed: the same report, with what it raised
            after, problems = settings, [f"the cycle raised {raised(exc)}"]
        else:
            problems = []
        model.run_cycle(cyc)
        if not problems:
            problems = check_ingest(after, model) + check_closing(spark, after, model)
        if problems:
            pytest.fail(f"seed {seed}, first bad cycle {index} (now={hm(cyc.now)}; reproduce with "
                        f"SLUICE_RANDOM_SEEDS={seed},):\n  - " + "\n  - ".join(problems) + "\n"
                        + scenario.render(model, upto=index), pytrace=False)


def test_the_model_reproduces_the_readme_examples() -> None:
    """The model against the README's own tables (no Spark): the time-semantics table (watermark delay 10
    min), the worked example of "How this differs from plain Spark" (5 min), and the closing rule's ``>=``."""

    def at(hhmm: str) -> datetime:
        return T0.replace(hour=int(hhmm[:2]), minute=int(hhmm[3:]))

    def landed(stream: str, name: str, arrival: str, *records: tuple[str, str]) -> LandedFile:
        return LandedFile(stream, name, at(arrival), [Rec(stream, rid, "d1", at(t), 1.0) for rid, t in records])

    # Time semantics: 10:31 (10:00, 10:20, 10:20 again, 12:00), 10:40 (10:05, 10:35), then idle until 11:30.
    stream = StreamModel("impressions", timedelta(minutes=10))
    stream.ingest([landed("readings", "a.jsonl", "10:31", ("i1", "10:00"), ("i2", "10:20"), ("i2", "10:20"),
                          ("i3", "12:00"))])
    assert (sorted(stream.accepted), stream.duplicates, stream.early, stream.watermark) == (
        ["i1", "i2"], 1, ["i3"], at("10:10"))
    stream.ingest([landed("readings", "b.jsonl", "10:40", ("i4", "10:05"), ("i5", "10:35"))])
    assert (stream.late, "i5" in stream.accepted, stream.watermark) == ({"i4": at("10:10")}, True, at("10:25"))
    assert stream.heartbeat(at("11:30")) == at("11:00") and stream.watermark == at("10:50")
    # A stream that has never received a file gets no heartbeat.
    assert StreamModel("clicks", timedelta(minutes=10)).heartbeat(at("11:30")) is None

    # Plain Spark's worked example: e3 at exactly the watermark (10:05) is accepted, e4 (10:02) is late.
    events = StreamModel("events", timedelta(minutes=5))
    files = [("1", "10:11", [("e1", "10:00"), ("e2", "10:10")]), ("2", "10:12", [("e3", "10:05")]),
             ("3", "10:13", [("e4", "10:02"), ("e1", "10:00")]), ("4", "10:31", [("e5", "10:30")])]
    for name, arrival, records in files:
        events.ingest([landed("readings", name, arrival, *records)])
    assert (sorted(events.accepted), events.late, events.at_watermark, events.duplicates) == (
        ["e1", "e2", "e3", "e5"], {"e4": at("10:05")}, ["e3"], 1)

    # The closing rule: W = min of the streams' watermarks; [s, e) is final when W >= e + lateness_bound.
    model = TwoStreamsModel(size=timedelta(minutes=10), hop=timedelta(minutes=5), bound=timedelta(minutes=10),
                            delays={"readings": timedelta(minutes=2), "txns": timedelta(minutes=2)}, with_join=True)
    model.run_cycle(Cycle(at("10:30"), [landed("readings", "r.jsonl", "10:30", ("r1", "10:05"), ("r2", "10:24")),
                                        landed("txns", "t.jsonl", "10:30", ("t1", "10:15"), ("t2", "10:22"))]))
    assert model.watermark == at("10:20") and model.boundary == at("10:10")
    assert model.is_final((at("10:00"), at("10:10"))) and not model.is_final((at("10:05"), at("10:15")))
    assert model.gold("readings") == {(at("10:00"), at("10:10"), "d1"): (1, 1.0)}
    # r1 + t1 (10 min apart: in the bound) counts in r1's windows; t1 itself lies after [10:00, 10:10).
    assert model.gold("joined") == {(at("10:00"), at("10:10"), "d1"): (1,)}
    assert model.contributions("joined")[(at("10:05"), at("10:15"), "d1")] == [("r1+t1", 1.0)]
    assert list(model.windows_of(at("10:05"))) == [(at("10:05"), at("10:15")), (at("10:00"), at("10:10"))]


def test_the_model_judges_substreams_as_spec_3_says() -> None:
    """The model's substream rule on a hand-worked case (no Spark; the numbers of tests/streaming/test_substreams.py):
    watermark delay 2 min, skew_tolerance 3 h, device d3 two hours behind d1."""

    def at(hhmm: str) -> datetime:
        return T0.replace(hour=int(hhmm[:2]), minute=int(hhmm[3:5]), second=int(hhmm[6:] or 0))

    def landed(stream: str, name: str, arrival: str, *records: tuple[str, str, str]) -> LandedFile:
        return LandedFile(stream, name, at(arrival), [Rec(stream, rid, device, at(t), 1.0)
                                                      for rid, device, t in records])

    delay, skew = timedelta(minutes=2), timedelta(hours=3)
    stream = StreamModel("readings", delay, skew=skew)
    # The stream's first file: nothing is late, whatever the clocks. Then W = 10:07, F = 07:09, W_d3 = 08:07.
    stream.ingest([landed("readings", "1", "10:10", ("a1", "d1", "10:09"), ("a3", "d3", "08:09"))])
    assert (sorted(stream.accepted), stream.floor, stream.mark("d3"), stream.mark("new")) == (
        ["a1", "a3"], at("10:09") - skew, at("08:07"), at("07:09"))
    # d3 exactly at its own W_k is on time, a second below it is late; a new key below F is late, one at F is not.
    fates = stream.ingest([landed("readings", "2", "10:20", ("b1", "d1", "10:19"), ("b3", "d3", "08:07"),
                                  ("c3", "d3", "08:06:59"), ("d4", "d4", "07:08"), ("d5", "d5", "07:09"))])
    assert [f.status for f in fates.values()] == ["accepted", "accepted", "late", "late", "accepted"]
    assert stream.late == {"c3": at("08:07"), "d4": at("07:09")} and stream.at_watermark == ["b3", "d5"]
    assert {k: v.device for k, v in stream.dead.items()} == {"c3": "d3", "d4": "d4"}
    assert stream.key_max == {"d1": at("10:19"), "d3": at("08:09"), "d5": at("07:09")}
    # Each known key is judged by its own W_k while that is above F (07:19): d1 by 10:17, d3 by 08:07.
    assert stream.mark("d1") == at("10:17") and stream.mark("d3") == at("08:07") and stream.floor == at("07:19")
    # An idle heartbeat (12:30) raises F past d3's own W_k: E_d3 = F = 09:30.
    assert stream.heartbeat(at("13:00")) == at("12:30") and stream.mark("d3") == at("09:30")

    # The pipeline: E_k is the minimum over its streams, F for a stream that never accepted k; the ledger
    # follows the pipeline's floor, each key's rows its own E_k: d1's row of [10:00, 10:10) is final (10:18 - 5m
    # >= 10:10) before the floor (10:10 - 5m) closes the window.
    model = TwoStreamsModel(size=timedelta(minutes=10), hop=timedelta(minutes=10), bound=timedelta(minutes=5),
                            delays={"readings": delay, "txns": delay}, with_join=False, skew=timedelta(minutes=30))
    model.run_cycle(Cycle(at("10:30"), [landed("readings", "r1", "10:30", ("r1", "d1", "10:05")),
                                        landed("txns", "t1", "10:30", ("t1", "d1", "10:20"))]))
    model.run_cycle(Cycle(at("10:45"), [landed("readings", "r2", "10:45", ("r2", "d1", "10:40")),
                                        landed("txns", "t2", "10:45", ("t2", "d2", "10:40"))]))
    # readings: W_d1 = 10:38, F = 10:10; txns: W_d1 = 10:18, W_d2 = 10:38, F = 10:10.
    assert model.watermark == at("10:10") and model.clocks() == {"d1": at("10:18"), "d2": at("10:10")}
    assert model.gold("readings") == {(at("10:00"), at("10:10"), "d1"): (1, 1.0)}
    assert model.gold("txns") == {} and model.ledger() == set()


def test_the_default_seeds_cover_every_shape_the_generator_makes() -> None:
    """The seeds CI runs hold hopping and tumbling windows, a stream whose first file arrives after the
    other's, the join and its absence, and records exactly at the watermark; and substream scenarios with every
    edge of ``E_k = max(W_k, F)``, devices within and beyond ``skew_tolerance``, idle gaps, and gold rows written
    on their key's own clock before the floor closes their window (no Spark)."""
    scenarios = [Scenario(seed) for seed in DEFAULT_SEEDS]
    assert {isinstance(s.window, tuple) for s in scenarios} == {True, False}
    assert any(len({f.stream for f in s.cycles[0].files}) < 2 for s in scenarios)
    assert any(s.options().get("with_join") for s in scenarios)
    assert any(not s.options().get("with_join") for s in scenarios)
    assert len(scenarios) >= 12
    changed = [s for s in scenarios if s.change is not None]  # issue 54: a definition change between cycles
    assert any(s.with_join and s.change[1] is not None for s in changed)  # the window: every output rebuilt
    assert any(s.with_join and s.change[1] is None for s in changed)  # one output's metric: that one alone
    assert all(any(k == "at_wm" for c in s.cycles for f in c.files for k in f.kinds) for s in scenarios[:3])
    # Issue 57: cycles that stream and cycles that close in batch, and a query that streams again after a batch one.
    plain = [s for s in scenarios if not s.skew]
    assert any(s.streamed for s in plain) and any(set(range(len(s.cycles))) - s.streamed for s in plain)
    assert any(c in s.streamed and c - 1 not in s.streamed for s in plain for c in range(1, len(s.cycles)))
    # Issue 55: substream scenarios, with and without the join, and every edge of E_k = max(W_k, F) in them, as a
    # fresh model judges the finished scenarios.
    keyed = [s for s in scenarios if s.skew]
    assert len(keyed) >= 3 and len(keyed) < len(scenarios)
    assert any(s.with_join for s in keyed) and any(not s.with_join for s in keyed)
    assert any(s.change is not None and s.change[1] is not None for s in keyed)  # a window change rebuilds them
    fates: set[str] = set()
    own_clock = 0  # gold rows final for their key in a window the floor has not closed yet
    for s in keyed:
        model = s.model()
        for cyc in s.cycles:
            model.run_cycle(cyc)
            for f in cyc.files:
                for i, rec in enumerate(f.records):
                    fates.add(edge(model.fates[(f.stream, f.name, i)], rec))
            own_clock += sum(1 for out in model.outputs for k in model.gold(out) if not model.is_final((k[0], k[1])))
        skew = parse_duration(s.skew or "0m", "skew")
        assert any(o > -skew for d, o in s.devices.items() if d != "d1")  # behind, within skew_tolerance
        assert any(o < -skew for o in s.devices.values())  # behind, beyond it
        assert any(st.heartbeats for st in model.streams.values())  # idle gaps
    assert {"accepted at E_k = W_k > F", "accepted at E_k = F", "late just below E_k", "late by F alone",
            "new key late below F", "new key accepted at or above F"} <= fates, fates
    assert own_clock >= 3, own_clock


def edge(fate: Outcome, rec: Rec) -> str:
    """Which edge of the substream rule a record's fate shows (the coverage test's vocabulary)."""
    if fate.floor is None or fate.watermark is None or fate.status not in ("accepted", "late"):
        return fate.status
    new = fate.watermark == fate.floor and fate.own is None
    if fate.status == "accepted":
        if rec.t == fate.watermark:
            return "accepted at E_k = F" if fate.watermark == fate.floor else "accepted at E_k = W_k > F"
        return "new key accepted at or above F" if new else "accepted"
    if rec.t == fate.watermark - SECOND:
        return "late just below E_k"
    if new:
        return "new key late below F"
    if fate.own is not None and fate.own <= rec.t:
        return "late by F alone"  # on time by its own W_k: what E_k = W_k alone would accept
    return "late"
