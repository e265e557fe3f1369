#!/usr/bin/env python
"""sluice benchmark: what does sluice cost on top of a bare Spark job, and where does the time go?

Stages, each run in a FRESH subprocess (so every one pays the same interpreter + JVM start), alternated and
repeated ``--repeat`` times:

  bare_spark     (a) bench/bare_spark_job.py: hand-written Structured Streaming, availableNow, delta-spark sink
  cycle          (b) ``sluice run ad_clicks_hourly --now <after the data>`` on a fresh SLUICE_HOME copy
  backfill       (c) ``sluice backfill ad_clicks_hourly --start .. --end ..`` on the home (b) produced
  noop_cycle         ``sluice run`` again on that home with the same --now: the steady-state fixed cost
  spark_batch    (d) bench/spark_batch.py: the same logic as a plain Spark batch query, delta-spark sink
  duckdb         (e) bench/duckdb_floor.py: the same logic in DuckDB, the single-machine floor
  empty_cycle        ``sluice run`` on an empty landing zone (fresh home)
  empty_job          bench/empty_job.py: SparkSession + one trivial job, nothing else

and, once per invocation after round 1, the steady state (README, "Steady state"): a day of history caught up
(round 1's ``cycle`` and ``bare_spark`` homes; with ``--steady-only``, ``catchup_cycle`` and ``catchup_bare``),
then 8 increments of 15 min, each landed and run through ``sluice run`` (``incr_cycle``) and the bare job from
its warm checkpoint (``incr_bare``), back to back; the next increment
through one ``airflow dags test`` (``dag_run``) vs one ``spark-submit`` of the bare job (``bare_submit``); and
3 increments after 7 days vs after 1 day of history at 1/16 of the rate (``incr_long_hist`` / ``incr_short_hist``).

Peak memory is the max over 0.2 s samples of the summed RSS of the process tree (Python, JVM, Python
workers). The sluice cycle's stages (start-up, ingest, aggregate, data quality, tear-down) come from its
log lines, time-stamped as they arrive on stderr.

    .venv/bin/python bench/run.py                 # 1M impressions (+~10% clicks), repeat 3
    .venv/bin/python bench/run.py --smoke         # 5k impressions, repeat 1 (CI)
    .venv/bin/python bench/run.py --scaling       # also 0.25M / 1M / 4M for the cycle and bare Spark
    .venv/bin/python bench/run.py --steady-only   # only the steady state (--skip-steady: everything else)

The last line is always ``bench: cycle/bare_spark=<r> backfill/spark_batch=<r> empty_cycle_s=<s>
events_per_s=<n> incr_cycle_s=<s> incr/bare_spark=<r> history_ratio=<r> dag_run/bare_submit=<r>
empty_cycle/empty_job=<r> dq_history_ratio=<r>`` (dq_history_ratio: the data-quality seconds per validated
window of the 7-day catch-up over the 1-day one's).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "bench"
PIPELINE = "ad_clicks_hourly"
OUTPUTS = ("ad_clicks_hourly", "unmatched_clicks_hourly")
# Bump when the generated data changes shape, so cached data sets are not reused by mistake.
DATA_VERSION = 1
# Events per hour of the default size: 1M impressions over 24 hours of 10-min files (~7k lines per file).
REFERENCE_EVENTS = 1_000_000
REFERENCE_HOURS = 24
FILE_MINUTES = 10
CHUNK_HOURS = 24  # the generator holds a chunk in memory; larger sizes are generated day by day
SAMPLE_S = 0.2
SCALING_SIZES = (250_000, 1_000_000, 4_000_000)
MAIN_STAGES = ("bare_spark", "cycle", "backfill", "noop_cycle", "spark_batch", "duckdb", "empty_cycle", "empty_job")
# bench/kafka_case.py's stages: the catch-up of a day in a topic, then its increments, each beside the bare job.
KAFKA_STAGES = ("kafka_cycle", "kafka_bare", "kafka_incr", "kafka_incr_bare")
# bench/substream_case.py's stages: the same files with and without a watermark per device.
SUBSTREAM_STAGES = ("substream_cycle", "substream_plain")
# Steady state (README, "Steady state"): 15-minute increments on homes that already hold a caught-up history.
STEADY_STAGES = (
    "catchup_cycle", "catchup_bare",  # untimed for the ratios: the day of history, caught up once
    "incr_cycle", "incr_bare",  # each increment through `sluice run` and through the bare job (warm checkpoint)
    "airflow_migrate", "dag_run", "bare_submit",  # `airflow dags test` of one increment vs one spark-submit
    "catchup_short_hist", "catchup_long_hist", "incr_short_hist", "incr_long_hist",  # history_ratio
)
# The `sluice run`/`backfill` stages whose log lines give a per-stage breakdown (the markdown's second table).
SLUICE_STAGES = ("cycle", "noop_cycle", "empty_cycle", "backfill", "catchup_cycle", "incr_cycle",
                 "catchup_short_hist", "catchup_long_hist", "incr_short_hist", "incr_long_hist")
STEADY_RESULTS = ("incr_cycle_s", "incr/bare_spark", "history_ratio", "dag_run/bare_submit")  # final-line fields
# Appended to the final line after STEADY_RESULTS, with their targets (<=) for the report.
EXTRA_RESULTS = {"empty_cycle/empty_job": 1.0, "dq_history_ratio": 1.1, "kafka_cycle/bare": 1.0, "kafka_incr/bare": 1.0,
                 "substream_cycle/plain": 1.2}
INCREMENT_MINUTES = 15
# The generator lands a file 1-2 min after its slice ends, so "now" = end of the data landed so far + 2 min:
# every landed file has arrived by then, and no stream is idle (idle_timeout 30 min), so no heartbeat moves a
# watermark and windows close on the data alone: one hourly window every 4 increments.
NOW_MARGIN = timedelta(minutes=2)
# Round 1's clock (the cycle, backfill and no-op cycle): the idle heartbeats at now - 30 min must move the
# watermarks (heartbeat - 10 min) past the last window's end + the 30-min join bound, so that every window
# closes in one cycle: now >= end + 1 h 10 min. At end + 1 h 15 min the watermarks stop at end + 35 min, and
# the steady state's increments, which start at that now, close a window in the 2nd and 6th of 8 (the empty
# hour after the data, then every 4th), the production mix of one in four. (At end + 2 h they started an
# hour later and 3 of 8 closed one: the 1st, 3rd and 7th.)
AFTER_DATA = timedelta(hours=1, minutes=15)
INCREMENT_SLOTS = 12  # increments generated per span (cached once): room for --increments 8 plus the DAG runs
HISTORY_HOURS = (24, 168)  # history_ratio: 1 day vs 7 days (smoke: SMOKE_HISTORY_HOURS)
SMOKE_HISTORY_HOURS = (1, 3)
_NUM = r"(?:[0-9.]+|nan)"  # a stage that was skipped (--skip-steady, --steady-only) or failed reports nan
FINAL_RE = re.compile(
    rf"^bench: cycle/bare_spark=(?P<cycle>{_NUM}) backfill/spark_batch=(?P<backfill>{_NUM}) "
    rf"empty_cycle_s=(?P<empty>{_NUM}) events_per_s=(?P<eps>[0-9]+) incr_cycle_s=(?P<incr>{_NUM}) "
    rf"incr/bare_spark=(?P<incr_bare>{_NUM}) history_ratio=(?P<history>{_NUM}) "
    rf"dag_run/bare_submit=(?P<dag>{_NUM}) empty_cycle/empty_job=(?P<empty_ratio>{_NUM}) "
    rf"dq_history_ratio=(?P<dq_history>{_NUM})$"
)


def log(message: str) -> None:
    print(f"[{datetime.now():%H:%M:%S}] {message}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------------ data


@dataclass
class Dataset:
    events: int  # impressions asked for (--events)
    hours: int
    impressions_per_hour: int
    start: str
    end: str
    now: str
    landing: str
    lines: dict[str, int] = field(default_factory=dict)  # stream -> lines in the landing files
    files: dict[str, int] = field(default_factory=dict)
    accepted: dict[str, int] = field(default_factory=dict)
    bytes: int = 0
    generate_s: float = 0.0

    @property
    def total_lines(self) -> int:
        return sum(self.lines.values())


def _shape(events: int, smoke: bool) -> tuple[int, int]:
    """Hours and impressions per hour. Sizes scale by hours at the reference rate (~7k lines per 10-min
    file), so the scaling curve is 'more hours of the same traffic'; tiny sizes keep at least 3 hours."""
    if smoke:
        hours = 3
    else:
        hours = max(3, round(REFERENCE_HOURS * events / REFERENCE_EVENTS))
    return hours, max(1, round(events / hours))


def _early_tag(early_share: float | None) -> str:
    """A cache name's mark for a data set generated with a share of early records other than the generator's."""
    return "" if early_share is None else f"-e{early_share:g}"


def _cached(events: int, root: Path, smoke: bool, early_share: float | None = None) -> tuple[Path, Dataset | None]:
    hours, _per_hour = _shape(events, smoke)
    target = root / f"ad_clicks-v{DATA_VERSION}-n{events}-h{hours}-f{FILE_MINUTES}{_early_tag(early_share)}"
    marker = target / "dataset.json"
    if marker.exists():
        data = Dataset(**json.loads(marker.read_text()))
        data.now = _ts(_parse_ts(data.end) + AFTER_DATA)  # a data set cached before AFTER_DATA changed
        if Path(data.landing).is_dir():
            return target, data
    return target, None


def ensure_dataset(events: int, root: Path, smoke: bool = False, early_share: float | None = None) -> Dataset:
    """The cached data set of this size, generated first if needed, in a subprocess: the generator holds
    a day of records in memory, and a bench process that had grown that large would pass its peak RSS on
    to every child it forks (Linux carries ru_maxrss across fork + exec). ``early_share`` overrides the
    generator's share of early records (None: its default)."""
    _target, data = _cached(events, root, smoke, early_share)
    if data is None:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--task", "generate", "--events", str(events),
               "--data-dir", str(root), *(["--smoke"] if smoke else []),
               *([] if early_share is None else ["--early-share", repr(early_share)])]
        subprocess.run(cmd, check=True, cwd=REPO, stdout=subprocess.DEVNULL)
        _target, data = _cached(events, root, smoke, early_share)
    if data is None:
        raise RuntimeError(f"generating {events} events under {root} left no data set")
    return data


def generate_dataset(events: int, root: Path, smoke: bool = False, early_share: float | None = None) -> Dataset:
    """Generate the landing files once per size (cached under ``root``) with the product's generator."""
    from sluice_tools.generate import DEFAULT_START

    hours, per_hour = _shape(events, smoke)
    target, cached = _cached(events, root, smoke, early_share)
    if cached is not None:
        return cached
    key = target.name
    partial = root / f"{key}.partial-{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    landing = partial / "landing"
    log(f"generating {events:,} impressions over {hours} h ({per_hour:,}/h, {FILE_MINUTES}-min files) -> {target}")
    started = time.monotonic()
    lines: dict[str, int] = {}
    files: dict[str, int] = {}
    accepted: dict[str, int] = {}
    for manifest in _generate_chunks(landing, DEFAULT_START, hours, per_hour, FILE_MINUTES, early_share):
        for name, stream in manifest.streams.items():
            lines[name] = lines.get(name, 0) + stream.lines
            files[name] = files.get(name, 0) + stream.files
            accepted[name] = accepted.get(name, 0) + stream.accepted
    size = sum(p.stat().st_size for p in landing.rglob("*") if p.is_file())
    end = DEFAULT_START + timedelta(hours=hours)
    data = Dataset(
        events=events, hours=hours, impressions_per_hour=per_hour,
        start=_ts(DEFAULT_START), end=_ts(end),
        now=_ts(end + AFTER_DATA),  # every window closes in one cycle (see AFTER_DATA)
        landing=str(target / "landing"), lines=lines, files=files, accepted=accepted, bytes=size,
        generate_s=round(time.monotonic() - started, 1),
    )
    (partial / "dataset.json").write_text(json.dumps(asdict(data), indent=2))
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)
    log(f"generated {data.total_lines:,} lines ({size / 1e6:.0f} MB) in {data.generate_s:.0f}s")
    return data


def _generate_chunks(landing: Path, start: datetime, hours: float, per_hour: int, file_minutes: int,
                     early_share: float | None = None) -> Any:
    """The product's generator over ``hours`` from ``start``, a day (CHUNK_HOURS) per call: yields each
    chunk's manifest. Chunks are independent (late records and cross-file duplicates stay inside a chunk),
    which keeps the generator's memory bounded and never makes an on-time record late at a chunk boundary."""
    from sluice_tools.generate import GenerateOptions, generate

    for chunk in range(math.ceil(hours / CHUNK_HOURS)):
        options = GenerateOptions(
            start=start + timedelta(hours=chunk * CHUNK_HOURS),
            hours=min(CHUNK_HOURS, hours - chunk * CHUNK_HOURS),
            impressions_per_hour=per_hour,
            click_rate=0.1,
            streams=("impressions", "clicks"),
            file_minutes=file_minutes,
            **({} if early_share is None else {"early_share": early_share}),
        )
        yield generate(landing, options)


@dataclass
class Span:
    """Cached traffic of ``hours`` from ``start`` in ``file_minutes`` files, with every file's event-time slice
    and line count, so that the steady-state stages can land it piece by piece (a history, then increments)."""

    start: str
    hours: float
    impressions_per_hour: int
    file_minutes: int
    landing: str
    files: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # stream -> files in arrival order
    generate_s: float = 0.0

    def select(self, lo: datetime, hi: datetime) -> dict[str, list[dict[str, Any]]]:
        """Per stream, the files whose event-time slice lies in ``[lo, hi)``."""
        return {
            stream: [f for f in files if lo <= _parse_ts(f["event_start"]) and _parse_ts(f["event_end"]) <= hi]
            for stream, files in self.files.items()
        }

    def land(self, lo: datetime, hi: datetime, *landings: Path) -> int:
        """Copy the files of ``[lo, hi)`` into each ``landing/<stream>/`` (``copy2`` keeps the modification
        time, i.e. the arrival time); return the lines landed (in each)."""
        lines = 0
        for stream, files in self.select(lo, hi).items():
            for landing in landings:
                (landing / stream).mkdir(parents=True, exist_ok=True)
                for f in files:
                    shutil.copy2(Path(self.landing) / stream / f["name"], landing / stream / f["name"])
            lines += sum(f["lines"] for f in files)
        if not lines:
            raise RuntimeError(f"no generated file in [{_ts(lo)}, {_ts(hi)}) under {self.landing}")
        return lines


def _span_dir(root: Path, start: datetime, hours: float, per_hour: int, file_minutes: int,
              early_share: float | None = None) -> Path:
    return root / (f"ad_clicks-v{DATA_VERSION}-span-{start:%Y%m%dT%H%M}-h{hours:g}-r{per_hour}-f{file_minutes}"
                   f"{_early_tag(early_share)}")


def ensure_span(root: Path, start: datetime, hours: float, per_hour: int, file_minutes: int,
                early_share: float | None = None) -> Span:
    """The cached span, generated first if needed (in a subprocess, as for ``ensure_dataset``)."""
    marker = _span_dir(root, start, hours, per_hour, file_minutes, early_share) / "span.json"
    if not marker.exists():
        cmd = [sys.executable, str(Path(__file__).resolve()), "--task", "span", "--data-dir", str(root),
               "--span", json.dumps({"start": _ts(start), "hours": hours, "per_hour": per_hour,
                                     "file_minutes": file_minutes, "early_share": early_share})]
        subprocess.run(cmd, check=True, cwd=REPO, stdout=subprocess.DEVNULL)
    return Span(**json.loads(marker.read_text()))


def generate_span(root: Path, start: datetime, hours: float, per_hour: int, file_minutes: int,
                  early_share: float | None = None) -> Span:
    target = _span_dir(root, start, hours, per_hour, file_minutes, early_share)
    if (target / "span.json").exists():
        return Span(**json.loads((target / "span.json").read_text()))
    partial = root / f"{target.name}.partial-{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    log(f"generating {hours:g} h from {_ts(start)} at {per_hour:,} impressions/h ({file_minutes}-min files) "
        f"-> {target}")
    started = time.monotonic()
    files: dict[str, list[dict[str, Any]]] = {}
    for manifest in _generate_chunks(partial / "landing", start, hours, per_hour, file_minutes, early_share):
        for name, stream in manifest.streams.items():
            files.setdefault(name, []).extend(
                {"name": f.name, "event_start": _ts(f.event_start), "event_end": _ts(f.event_end),
                 "arrival": _ts(f.arrival), "lines": f.lines}
                for f in stream.file_details
            )
    span = Span(start=_ts(start), hours=hours, impressions_per_hour=per_hour, file_minutes=file_minutes,
                landing=str(target / "landing"), files=files, generate_s=round(time.monotonic() - started, 1))
    (partial / "span.json").write_text(json.dumps(asdict(span), indent=1))
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)
    log(f"generated {sum(f['lines'] for fs in files.values() for f in fs):,} lines in {span.generate_s:.0f}s")
    return span


def _ts(value: datetime) -> str:
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse_ts(value: str) -> datetime:
    return datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)


# ------------------------------------------------------------------------------------- measured runs


@dataclass
class Run:
    stage: str
    events: int
    rep: int
    wall_s: float
    peak_rss_mb: float
    rc: int
    details: dict[str, Any] = field(default_factory=dict)
    stdout_tail: str = ""
    stderr_tail: str = ""


def _tree_rss(proc: psutil.Process) -> int:
    total = 0
    try:
        members = [proc, *proc.children(recursive=True)]
    except psutil.Error:
        return 0
    for p in members:
        with contextlib.suppress(psutil.Error):
            total += p.memory_info().rss
    return total


def measure(cmd: Sequence[str], env: dict[str, str], timeout: float) -> tuple[float, float, int, list, list]:
    """Run ``cmd`` in a fresh process group; return wall seconds, peak tree RSS (MB), exit code, and the
    stdout/stderr lines, each with its arrival time (seconds since start)."""
    started = time.monotonic()
    proc = subprocess.Popen(
        list(cmd), cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        bufsize=1, start_new_session=True,
    )
    out: list[tuple[float, str]] = []
    err: list[tuple[float, str]] = []

    def pump(stream: Any, sink: list[tuple[float, str]]) -> None:
        for line in stream:
            sink.append((time.monotonic() - started, line.rstrip("\n")))

    readers = [threading.Thread(target=pump, args=(proc.stdout, out), daemon=True),
               threading.Thread(target=pump, args=(proc.stderr, err), daemon=True)]
    for t in readers:
        t.start()
    ps = psutil.Process(proc.pid)
    peak = 0
    samples = 0
    killed = False
    while True:
        # The sampler sums the RSS of the whole tree (Python, JVM, Python workers) while it runs.
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            wall = time.monotonic() - started
            proc.returncode = os.waitstatus_to_exitcode(status)
            if samples < 3:
                # Too short-lived to sample: the kernel's max RSS of the child (an upper bound, since it
                # includes what the child inherited from this process when forked).
                peak = max(peak, usage.ru_maxrss * 1024)
            break
        peak = max(peak, _tree_rss(ps))
        samples += 1
        if not killed and time.monotonic() - started > timeout:
            killed = True
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # the run's own process group, nothing else
            err.append((time.monotonic() - started, f"bench: killed after {timeout:.0f}s timeout"))
        # Sample densely at first (short runs), then every SAMPLE_S.
        time.sleep(0.02 if time.monotonic() - started < 1 else SAMPLE_S)
    for t in readers:
        t.join(timeout=10)
    return wall, peak / 2**20, proc.returncode, out, err


def _tail(lines: list[tuple[float, str]], n: int = 15) -> str:
    return "\n".join(line for _t, line in lines[-n:])


def _bench_json(out: list[tuple[float, str]]) -> dict[str, Any]:
    for _t, line in reversed(out):
        if line.startswith("BENCH "):
            return dict(json.loads(line[6:]))
    return {}


# Matched on the message only: once Great Expectations is imported it may re-format the log lines.
CYCLE_RE = {
    "ingest_start": re.compile(r"\bcycle \S+: ingesting "),
    "aggregate_start": re.compile(r"\bcycle \S+: aggregating closed windows"),
    "ingest": re.compile(r"\bingest (\w+)\s+batch\s+\d+ (heartbeat)?"),
    "closed": re.compile(r"\b(\w+): closed window \d{4}-"),
    "catchup_end": re.compile(r"\b\S+: catch-up done"),
    "dq_start": re.compile(r"\bcycle \S+: checking data quality"),
    "dq": re.compile(r"\b\S+: data quality on (\d+) window\(s\): (\d+) passed, (\d+) failed"),
    "render": re.compile(r"^sluice run \S+: (\d+) batch\(es\) in ([0-9.]+)s"),
    "backfill": re.compile(r"^sluice backfill .*: (\d+) window\(s\) rewritten in ([0-9.]+)s"),
}
# What happened to a landing file's lines, from its ingest line (heartbeats have none).
OUTCOMES_RE = re.compile(r"\blines=(\d+) accepted=(\d+) quarantined=(\d+) late=(\d+) duplicates=(\d+)")
OUTCOMES = ("lines", "accepted", "quarantined", "late", "duplicates")


def parse_sluice(out: list[tuple[float, str]], err: list[tuple[float, str]], wall: float) -> dict[str, Any]:
    """Per-stage timings of a sluice run/backfill from the arrival times of its log lines.

    * startup: until 'cycle ...: ingesting' (interpreter, imports, JVM, SparkSession);
    * ingest_<stream>: the ingest of a stream logs one line per landing file, all at the end of its Spark
      batch, so the last such line ends that stream's ingest (the streams write one after the other, in the
      order of their last lines); ingest ends at 'aggregating closed windows';
    * aggregate_<output>: closed-window lines come at the end of each output's sink; with a batch catch-up,
      aggregate_catchup (until 'catch-up done') and aggregate_stream (until 'checking data quality');
    * dq: from 'checking data quality' (or the last closed-window line) to 'data quality on N window(s)'
      (with neither, the two steps cannot be told apart and are reported together as aggregate+dq);
    * report: until the CLI prints its summary (accounting table); teardown: the rest (JVM exit).
    A backfill logs too little for this; it gets in_process (its own timer) and startup+teardown.
    ``outcomes`` sums what the ingest lines say happened to the landing lines (accepted, quarantined, late,
    duplicates), so that a run whose records went to the DLQ is not read as a measure of the pipeline.
    """
    marks: dict[str, float] = {}
    d: dict[str, Any] = {"ingest_batches": {}, "heartbeats": {}, "closed_windows": {},
                         "outcomes": dict.fromkeys(OUTCOMES, 0)}
    # Both streams: once Great Expectations is imported, some log lines go to stdout in another format.
    for ts, line in sorted([*err, *out], key=lambda item: item[0]):
        if CYCLE_RE["ingest_start"].search(line):
            marks.setdefault("ingest_start", ts)
        elif CYCLE_RE["aggregate_start"].search(line):
            marks["aggregate_start"] = ts
        elif m := CYCLE_RE["ingest"].search(line):
            stream = m.group(1)
            marks[f"ingest_end_{stream}"] = ts
            key = "heartbeats" if m.group(2) else "ingest_batches"
            d[key][stream] = d[key].get(stream, 0) + 1
            if counts := OUTCOMES_RE.search(line):
                for name, value in zip(OUTCOMES, counts.groups(), strict=True):
                    d["outcomes"][name] += int(value)
        elif CYCLE_RE["catchup_end"].search(line):
            marks["catchup_end"] = ts
        elif CYCLE_RE["dq_start"].search(line):
            marks["dq_start"] = ts
        elif m := CYCLE_RE["closed"].search(line):
            marks[f"closed_end_{m.group(1)}"] = ts
            marks["closed_end"] = ts
            d["closed_windows"][m.group(1)] = d["closed_windows"].get(m.group(1), 0) + 1
        elif m := CYCLE_RE["dq"].search(line):
            marks["dq_end"] = ts
            d["dq_windows"], d["dq_passed"], d["dq_failed"] = (int(g) for g in m.groups())
        elif m := CYCLE_RE["render"].search(line):
            marks["done"] = ts
            d["in_process_s"] = float(m.group(2))
        elif m := CYCLE_RE["backfill"].search(line):
            marks["done"] = ts
            d["windows"] = int(m.group(1))
            d["in_process_s"] = float(m.group(2))
    stages: dict[str, float] = {}
    done = marks.get("done", wall)
    if "ingest_start" in marks:
        stages["startup"] = marks["ingest_start"]
        if "aggregate_start" in marks:
            stages["ingest"] = marks["aggregate_start"] - marks["ingest_start"]
            previous = marks["ingest_start"]
            # In the order the streams wrote (fewest new bytes first: sluice.ingest.run.run_ingest).
            ends = sorted((marks[f"ingest_end_{s}"], s) for s in ("impressions", "clicks")
                          if f"ingest_end_{s}" in marks)
            for end, stream in ends:
                stages[f"ingest_{stream}"] = end - previous
                previous = end
            agg_end = marks.get("dq_start", marks.get("closed_end"))
            if "catchup_end" in marks and "dq_start" in marks:
                # Batch catch-up, then the streaming queries (which close nothing more in a one-shot run).
                stages["aggregate"] = marks["dq_start"] - marks["aggregate_start"]
                stages["aggregate_catchup"] = marks["catchup_end"] - marks["aggregate_start"]
                stages["aggregate_stream"] = marks["dq_start"] - marks["catchup_end"]
                if "dq_end" in marks:
                    stages["dq"] = marks["dq_end"] - marks["dq_start"]
                    stages["report"] = done - marks["dq_end"]
            elif agg_end is not None:
                stages["aggregate"] = agg_end - marks["aggregate_start"]
                previous = marks["aggregate_start"]
                for output in OUTPUTS:
                    if f"closed_end_{output}" in marks:
                        stages[f"aggregate_{output}"] = marks[f"closed_end_{output}"] - previous
                        previous = marks[f"closed_end_{output}"]
                if "dq_end" in marks:
                    stages["dq"] = marks["dq_end"] - agg_end
                    stages["report"] = done - marks["dq_end"]
            else:
                stages["aggregate+dq"] = done - marks["aggregate_start"]
    elif "in_process_s" in d:
        stages["in_process"] = d["in_process_s"]
        stages["startup+teardown"] = max(0.0, wall - d["in_process_s"])
    if "ingest_start" in marks and "done" in marks:
        stages["teardown"] = wall - marks["done"]
    d["stages"] = {k: round(v, 2) for k, v in stages.items()}
    # sluice's own log lines (not Spark's or GE's), with their arrival times, for whoever tunes it next.
    own = [f"{ts:7.2f} {line[:240]}" for ts, line in sorted([*err, *out], key=lambda item: item[0])
           if "sluice." in line and "great_expectations" not in line]
    d["log"] = own if len(own) <= 400 else [*own[:200], f"... {len(own) - 400} lines ...", *own[-200:]]
    if d.get("dq_windows") and "dq" in stages:
        d["dq_per_window_s"] = round(stages["dq"] / d["dq_windows"], 3)
    return d


# What `airflow dags test` logs per task (Airflow 3's dag.test()); matched anywhere in the line.
DAG_TASKS = ("choose_path", "run_cycle", "check_quality", "send_alerts")
DAG_RE = {
    "start": re.compile(r"\[DAG TEST\] starting task_id=(\w+)"),
    "end": re.compile(r"\[DAG TEST\] end task task_id=(\w+)"),
    "success": re.compile(r"\bnew_state=success\b"),
    "run_ok": re.compile(r"Marking run <DagRun .*> successful"),
    "cycle": re.compile(r"sluice run \S+: (\d+) batch\(es\) in ([0-9.]+)s"),
}


def parse_dag(out: list[tuple[float, str]], err: list[tuple[float, str]], wall: float) -> dict[str, Any]:
    """Per-task wall times of an `airflow dags test` run from the arrival times of its log lines, which
    tasks reported success, and the sluice cycle's own timer (printed by the run_cycle task's spark-submit).
    ``startup``: until the first task starts (Airflow imports, DAG parsing, serialisation, the run row)."""
    d: dict[str, Any] = {"tasks_s": {}, "tasks_succeeded": [], "run_succeeded": False}
    started: dict[str, float] = {}
    current = None
    first = last = None
    for ts, line in sorted([*err, *out], key=lambda item: item[0]):
        if m := DAG_RE["start"].search(line):
            current = m.group(1)
            started[current] = ts
            first = ts if first is None else first
        elif m := DAG_RE["end"].search(line):
            if m.group(1) in started:
                d["tasks_s"][m.group(1)] = round(ts - started[m.group(1)], 2)
            last = ts
        elif DAG_RE["success"].search(line) and current and current not in d["tasks_succeeded"]:
            d["tasks_succeeded"].append(current)
        elif DAG_RE["run_ok"].search(line):
            d["run_succeeded"] = True
        elif m := DAG_RE["cycle"].search(line):
            d["in_process_s"] = float(m.group(2))
    if first is not None and last is not None:
        d["stages"] = {"startup": round(first, 2), **d["tasks_s"], "teardown": round(wall - last, 2)}
    return d


def home_state(home: Path) -> dict[str, Any]:
    """Untimed, in a subprocess: ingest batches per stream and ledger windows per state of a SLUICE_HOME."""
    done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--task", "state", "--path", str(home)],
                          cwd=REPO, capture_output=True, text=True)
    try:
        return dict(json.loads(done.stdout.strip().splitlines()[-1]))
    except (IndexError, ValueError):
        return {"error": done.stderr.strip()[-300:]}


def read_home_state(home: Path) -> dict[str, Any]:
    from deltalake import DeltaTable

    lake = home / "lake"
    batches = DeltaTable(str(lake / "ops" / "ingest_batches")).to_pyarrow_table(columns=["stream"])
    ledger = DeltaTable(str(lake / "ops" / "window_ledger")).to_pyarrow_table(columns=["state"])
    return {"ingest_batches": _counts(batches.column("stream").to_pylist()),
            "ledger": _counts(ledger.column("state").to_pylist())}


def _counts(values: list[Any]) -> dict[str, int]:
    return {str(v): values.count(v) for v in sorted(set(values), key=str)}


# ---------------------------------------------------------------------------------------------- bench


class Bench:
    def __init__(self, args: argparse.Namespace, work: Path):
        from sluice.config import load_settings
        from sluice.core.class_data import java_options
        from sluice.runtime.spark import spark_conf

        self.args = args
        self.work = work
        self.runs: list[Run] = []
        settings = load_settings({}, home=work / "settings-probe")
        self.master = settings.spark_master
        self.spark_conf = spark_conf(settings)
        # The machine's class-data archive, which sluice's own driver JVM maps (sluice.core.class_data), for
        # every contender: the ratios compare the work, not one side's JVM start-up.
        if jvm := java_options():
            self.spark_conf["spark.driver.extraJavaOptions"] = " ".join(jvm)
        bindir = Path(sys.executable).parent
        self.sluice = [str(bindir / "sluice")] if (bindir / "sluice").exists() else [sys.executable, "-m", "sluice.cli"]
        self.env = self._base_env(bindir)
        self.checks: dict[str, dict[str, dict[str, int]]] = {}
        self.started = time.monotonic()
        self.rounds_done = 0
        self.round_s = 0.0  # the last main round's wall time, to decide whether another fits the budget
        self.steady_s: float | None = None
        self.steady_info: dict[str, Any] = {}  # the steady state's parameters, for the report
        # Round 1's caught-up homes (the cycle's SLUICE_HOME, the bare job's landing + checkpoint), kept for the
        # steady state's increments when it runs on the same data set: catching the day up again would repeat
        # those two runs (~4-5 min here).
        self.caught_up: dict[str, Path] = {}
        self.notes: list[str] = []

    @staticmethod
    def _base_env(bindir: Path) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
        # Keep the knobs that shape Spark the same for everyone; drop anything that points elsewhere.
        for key in ("SLUICE_DRIVER_MEMORY", "SLUICE_EXECUTOR_MEMORY", "SLUICE_SHUFFLE_PARTITIONS",
                    "SLUICE_SPARK_MASTER", "SLUICE_MAX_FILES_PER_TRIGGER"):
            if key in os.environ:
                env[key] = os.environ[key]
        env.update(
            PYTHONUNBUFFERED="1",
            TZ="UTC",
            PYSPARK_PYTHON=sys.executable,
            PYSPARK_DRIVER_PYTHON=sys.executable,
            PATH=f"{bindir}{os.pathsep}{env.get('PATH', '')}",
        )
        return env

    def spark_args(self) -> list[str]:
        return ["--master", self.master, "--conf-json", json.dumps(self.spark_conf)]

    def record(self, stage: str, events: int, rep: int, cmd: Sequence[str], env: dict[str, str] | None = None,
               parser: Any = None) -> Run:
        wall, peak, rc, out, err = measure(cmd, env or self.env, self.args.timeout)
        details = parser(out, err, wall) if parser else _bench_json(out)
        run = Run(stage, events, rep, round(wall, 3), round(peak, 1), rc, details,
                  stdout_tail=_tail(out) if rc else "", stderr_tail=_tail(err, 40) if rc else "")
        self.runs.append(run)
        extra = ""
        if stages := details.get("stages"):
            extra = "  " + " ".join(f"{k}={v:.1f}" for k, v in stages.items())
        log(f"{stage:<12} n={events:<9,} rep={rep} wall={wall:7.1f}s rss={peak:6.0f}MB rc={rc}{extra}")
        if rc not in (0, 2):
            log(f"{stage} failed (rc={rc}); stderr tail:\n{_tail(err, 40)}\nstdout tail:\n{_tail(out)}")
        return run

    # -- the stages ----------------------------------------------------------------------------------
    def fresh_home(self, data: Dataset | None, tag: str) -> Path:
        home = self.work / "homes" / tag
        shutil.rmtree(home, ignore_errors=True)
        home.mkdir(parents=True)
        if data is None:
            for stream in ("impressions", "clicks"):
                (home / "landing" / stream).mkdir(parents=True)
        else:
            # copy2 keeps the modification times, i.e. the arrival times.
            shutil.copytree(data.landing, home / "landing", copy_function=shutil.copy2)
        return home

    def sluice_env(self, home: Path, now: str) -> dict[str, str]:
        return {**self.env, "SLUICE_HOME": str(home), "SLUICE_NOW": now}

    def bare_spark(self, data: Dataset, rep: int, keep: bool = False) -> Run:
        """With ``keep``, on a copy of the landing zone (the steady state then lands increments into it; the
        file source's checkpoint knows its files by path), and the home is kept as ``caught_up["bare"]``."""
        if keep:
            home = self.work / "homes" / "steady-bare"
            shutil.rmtree(home, ignore_errors=True)
            landing, out = home / "landing", home / "out"
            shutil.copytree(data.landing, landing, copy_function=shutil.copy2)
        else:
            landing, out = Path(data.landing), self._out_dir("bare_spark", data, rep)
        run = self.record("bare_spark", data.events, rep, [
            sys.executable, str(BENCH / "bare_spark_job.py"), "--landing", str(landing), "--out", str(out),
            *self.spark_args(),
        ])
        self._check("bare_spark", data, "delta", out)
        if keep and run.rc == 0:
            self.caught_up["bare"] = out.parent
        elif not keep:
            shutil.rmtree(out, ignore_errors=True)
        return run

    def spark_batch(self, data: Dataset, rep: int) -> Run:
        out = self._out_dir("spark_batch", data, rep)
        run = self.record("spark_batch", data.events, rep, [
            sys.executable, str(BENCH / "spark_batch.py"), "--landing", data.landing, "--out", str(out),
            *self.spark_args(),
        ])
        self._check("spark_batch", data, "delta", out)
        shutil.rmtree(out, ignore_errors=True)
        return run

    def duckdb(self, data: Dataset, rep: int) -> Run:
        out = self._out_dir("duckdb", data, rep)
        run = self.record("duckdb", data.events, rep, [
            sys.executable, str(BENCH / "duckdb_floor.py"), "--landing", data.landing, "--out", str(out),
            "--threads", str(_local_cores(self.master)),
        ])
        self._check("duckdb", data, "parquet", out)
        shutil.rmtree(out, ignore_errors=True)
        return run

    def sluice_chain(self, data: Dataset, rep: int, with_backfill: bool = True, keep: bool = False) -> list[Run]:
        """(b) a full cycle on a fresh home, then (c) a backfill of every window and a no-op cycle on it; with
        ``keep``, the home is kept as ``caught_up["sluice"]``."""
        home = self.fresh_home(data, f"cycle-{data.events}-{rep}")
        env = self.sluice_env(home, data.now)
        runs = [self.record("cycle", data.events, rep, [*self.sluice, "run", PIPELINE, "--now", data.now],
                            env=env, parser=parse_sluice)]
        self._check("cycle", data, "delta", home / "lake" / "gold")
        if with_backfill and runs[0].rc in (0, 2):
            runs.append(self.record("backfill", data.events, rep, [
                *self.sluice, "backfill", PIPELINE, "--start", data.start, "--end", data.end,
            ], env=env, parser=parse_sluice))
            self._check("backfill", data, "delta", home / "lake" / "gold")
            runs.append(self.record("noop_cycle", data.events, rep, [*self.sluice, "run", PIPELINE, "--now", data.now],
                                    env=env, parser=parse_sluice))
        if keep:
            if all(r.rc in (0, 2) for r in runs):
                self.caught_up["sluice"] = home
        elif not self.args.keep:
            shutil.rmtree(home, ignore_errors=True)
        return runs

    def empty_cycle(self, rep: int) -> Run:
        home = self.fresh_home(None, f"empty-{rep}")
        run = self.record("empty_cycle", 0, rep, [*self.sluice, "run", PIPELINE, "--now", "2024-05-02T02:00:00Z"],
                          env=self.sluice_env(home, "2024-05-02T02:00:00Z"), parser=parse_sluice)
        shutil.rmtree(home, ignore_errors=True)
        return run

    def empty_job(self, rep: int) -> Run:
        return self.record("empty_job", 0, rep, [sys.executable, str(BENCH / "empty_job.py"), *self.spark_args()])

    def _out_dir(self, stage: str, data: Dataset, rep: int) -> Path:
        out = self.work / "out" / f"{stage}-{data.events}-{rep}"
        shutil.rmtree(out, ignore_errors=True)
        return out

    def _check(self, stage: str, data: Dataset, kind: str, base: Path) -> None:
        """Output totals (untimed, in a subprocess), once per stage and size, so readers see every engine
        did the same work."""
        self._check_key(f"{stage}@{data.events}", kind, base)

    def _check_key(self, key: str, kind: str, base: Path) -> None:
        if key in self.checks:
            return
        done = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), "--task", "totals", "--kind", kind, "--path", str(base)],
            cwd=REPO, capture_output=True, text=True,
        )
        try:
            self.checks[key] = json.loads(done.stdout.strip().splitlines()[-1])
        except (IndexError, ValueError):  # a failed run leaves no output; the run itself is already reported
            self.checks[key] = {"error": {"message": done.stderr.strip()[-300:]}}  # type: ignore[dict-item]

    # -- plans ---------------------------------------------------------------------------------------
    def main_rounds(self, data: Dataset, reps: range, keep_first: bool = False) -> None:
        """Rounds ``reps`` of the main stages; with ``keep_first``, round 1 keeps its caught-up homes for the
        steady state (``caught_up``)."""
        groups = [
            lambda rep: [self.bare_spark(data, rep, keep=keep_first and rep == 0)],
            lambda rep: self.sluice_chain(data, rep, keep=keep_first and rep == 0),
            lambda rep: [self.spark_batch(data, rep)],
            lambda rep: [self.duckdb(data, rep)],
            lambda rep: [self.empty_cycle(rep)],
            lambda rep: [self.empty_job(rep)],
        ]
        budget = self.args.budget_min * 60
        for rep in reps:
            elapsed = time.monotonic() - self.started
            # The first round always runs (the summary line needs every stage); a later one only if it should
            # end within the budget, going by the last round's length (the steady state, when it ran between
            # them, counts as time spent).
            if rep and budget and self.round_s and elapsed + self.round_s > budget:
                self.notes.append(
                    f"stopped after {self.rounds_done} of {self.args.repeat} rounds: another (~{self.round_s / 60:.0f} "
                    f"min) would end past the {self.args.budget_min:g}-minute budget (--budget-min 0 disables it)"
                )
                log(self.notes[-1])
                return
            round_started = time.monotonic()
            # Alternate: each round starts with the next group, so no stage always runs first (or last).
            k = rep % len(groups)
            for i, group in enumerate(groups[k:] + groups[:k]):
                # A later round also stops at a group boundary once the budget is spent, e.g. when the machine
                # got busier.
                if rep and budget and time.monotonic() - self.started > budget:
                    self.notes.append(f"round {rep + 1} stopped after {i} of {len(groups)} stage groups: the "
                                      f"{self.args.budget_min:g}-minute budget was spent (--budget-min 0 disables it)")
                    log(self.notes[-1])
                    return
                group(rep)
            self.rounds_done = rep + 1
            self.round_s = time.monotonic() - round_started

    def scaling_rounds(self, sizes: Sequence[int]) -> None:
        for size in sizes:
            if size == self.args.events and self.rounds_done:
                continue  # the main rounds already measured the cycle and bare Spark at this size
            data = ensure_dataset(size, self.data_root())
            for rep in range(self.args.scaling_repeat):
                # Alternate which of the two runs first.
                if rep % 2 == 0:
                    self.bare_spark(data, rep)
                    self.sluice_chain(data, rep, with_backfill=False)
                else:
                    self.sluice_chain(data, rep, with_backfill=False)
                    self.bare_spark(data, rep)

    # -- steady state (once per invocation; see the README, "Steady state") -----------------------------
    def steady_state(self, ref: Dataset) -> None:
        """15-min increments after a caught-up day (sluice vs the bare job, interleaved), one scheduled DAG
        run vs one spark-submit on the same homes, then increments after a short vs a long history."""
        started = time.monotonic()
        self.steady_info.update(increments=self.args.increments, history_h=ref.hours,
                                rate=ref.impressions_per_hour, dag_runs=self.args.dag_runs,
                                history_increments=self.args.history_increments,
                                now_margin_min=NOW_MARGIN.total_seconds() / 60)
        self.incremental(ref)
        self.history_ratio(ref)
        self.steady_s = round(time.monotonic() - started, 1)
        where = "after main round 1, on its caught-up homes" if self.reuses_round_1 else "with its own catch-ups"
        self.notes.append(f"steady state: {self.steady_s:.0f}s, run once, {where} (--skip-steady skips it, "
                          f"--steady-only runs only it)")
        log(self.notes[-1])

    @property
    def reuses_round_1(self) -> bool:
        return {"sluice", "bare"} <= self.caught_up.keys()

    def incremental(self, ref: Dataset) -> None:
        """incr_cycle vs incr_bare: the reference data set (a day at the reference rate) caught up once by
        each side, then the same 15-min increments landed into both and run increment by increment."""
        args = self.args
        rate = ref.impressions_per_hour
        if self.reuses_round_1:
            # Round 1 caught the day up (cycle, backfill and no-op cycle; bare_spark) at the data set's now
            # (AFTER_DATA): the idle heartbeat moved sluice's watermarks to now - 40 min, so the increments
            # start at now. The bare job's first increment also emits the day's last windows, which its
            # watermark held until then.
            home, bare = self.caught_up["sluice"], self.caught_up["bare"]
            end = _parse_ts(ref.now)
            self.steady_info.update(history_from="main round 1 (cycle, bare_spark)", increments_from=ref.now)
        else:
            end = _parse_ts(ref.end)
            home = self.fresh_home(ref, "steady")
            bare = self.work / "homes" / "steady-bare"
            shutil.rmtree(bare, ignore_errors=True)
            shutil.copytree(ref.landing, bare / "landing", copy_function=shutil.copy2)
            # The catch-up's now is the history's end + the margin, not AFTER_DATA as for `cycle`: a heartbeat
            # would push the watermark past the increments to come and send them all to the DLQ.
            history = {"lines": ref.total_lines, "history_h": ref.hours}
            self._sluice_run("catchup_cycle", ref.events, 0, home, end + NOW_MARGIN, history)
            self._bare_run("catchup_bare", ref.events, 0, bare, history)
            self.steady_info.update(history_from="catchup_cycle, catchup_bare", increments_from=ref.end)
        increments = ensure_span(self.data_root(), end, INCREMENT_SLOTS * INCREMENT_MINUTES / 60, rate,
                                 INCREMENT_MINUTES)
        per_increment = round(rate * INCREMENT_MINUTES / 60)
        for i in range(args.increments):
            lo = end + timedelta(minutes=INCREMENT_MINUTES * i)
            hi = lo + timedelta(minutes=INCREMENT_MINUTES)
            details = {"lines": increments.land(lo, hi, home / "landing", bare / "landing"),
                       "history_h": ref.hours, "increment": i, "now": _ts(hi + NOW_MARGIN)}
            # Interleaved, and alternating which side goes first, so that machine noise hits both.
            for side in ("sluice", "bare") if i % 2 == 0 else ("bare", "sluice"):
                if side == "sluice":
                    self._sluice_run("incr_cycle", per_increment, i, home, hi + NOW_MARGIN, details)
                else:
                    self._bare_run("incr_bare", per_increment, i, bare, details)
        self._check_key("incr_cycle@steady", "delta", home / "lake" / "gold")
        self._check_key("incr_bare@steady", "delta", bare / "out")
        first = end + timedelta(minutes=INCREMENT_MINUTES * args.increments)
        self.dag_runs(home, bare, increments, first, per_increment, ref.hours + args.increments / 4)
        if not args.keep:
            shutil.rmtree(home, ignore_errors=True)
            shutil.rmtree(bare, ignore_errors=True)

    def dag_runs(self, home: Path, bare: Path, increments: Span, start: datetime, per_increment: int,
                 history_h: float) -> None:
        """dag_run vs bare_submit: the next increment(s) through one scheduled run of the pipeline's DAG
        (`airflow dags test`, a fresh AIRFLOW_HOME) and through one `spark-submit` of the bare job, on the
        homes the increments left (warm checkpoints)."""
        if not self.args.dag_runs:
            return
        bindir = Path(sys.executable).parent
        env = self.airflow_env()
        migrate = self.record("airflow_migrate", 0, 0, [str(bindir / "airflow"), "db", "migrate"], env=env)
        if migrate.rc:
            return
        for j in range(self.args.dag_runs):
            lo = start + timedelta(minutes=INCREMENT_MINUTES * j)
            hi = lo + timedelta(minutes=INCREMENT_MINUTES)
            now = _ts(hi + NOW_MARGIN)
            details: dict[str, Any] = {"lines": increments.land(lo, hi, home / "landing", bare / "landing"),
                                       "history_h": history_h, "increment": j, "now": now}
            for side in ("dag", "bare") if j % 2 == 0 else ("bare", "dag"):
                if side == "bare":
                    self._bare_run("bare_submit", per_increment, j, bare, details, submit=True)
                    continue
                before = home_state(home)
                # The logical date is `now` itself: the run's data interval ends at the last 15-min tick
                # before it (the increment's end). SLUICE_NOW wins over the interval (operators.with_clock), so
                # the DAG's clock is exactly the CLI cycles' clock.
                run = self.record("dag_run", per_increment, j,
                                  [str(bindir / "airflow"), "dags", "test", PIPELINE, now],
                                  env={**env, "SLUICE_HOME": str(home), "SLUICE_NOW": now}, parser=parse_dag)
                after = home_state(home)
                run.details.update(details, state_before=before, state_after=after)
                self._verify_dag_run(run, before, after)

    def _verify_dag_run(self, run: Run, before: dict[str, Any], after: dict[str, Any]) -> None:
        """Exit code 0 is not enough: the run must have ingested the increment (one more ingest batch per
        stream) and its tasks must say they succeeded."""
        grew = {s: after.get("ingest_batches", {}).get(s, 0) - before.get("ingest_batches", {}).get(s, 0)
                for s in ("impressions", "clicks")}
        run.details["ingested_batches"] = grew
        problems = [f"no new ingest batch for {s}" for s, n in grew.items() if n < 1]
        missing = [t for t in DAG_TASKS if t not in run.details.get("tasks_succeeded", [])]
        if missing:
            problems.append(f"task(s) not reported successful: {', '.join(missing)}")
        if run.rc == 0 and problems:
            run.rc = 1
            run.stderr_tail = "bench: " + "; ".join(problems)
            log(f"dag_run exited 0 but: {run.stderr_tail}")

    def history_ratio(self, ref: Dataset) -> None:
        """incr_long_hist vs incr_short_hist: the same increments after 7 days vs 1 day of history (smoke: 3 h
        vs 1 h), at 1/--history-rate-divisor of the reference rate so that the catch-ups stay affordable."""
        args = self.args
        rate = max(1, ref.impressions_per_hour // args.history_rate_divisor)
        per_increment = round(rate * INCREMENT_MINUTES / 60)
        hours = SMOKE_HISTORY_HOURS if args.smoke else HISTORY_HOURS
        self.steady_info.update(history_rate=rate, history_hours=list(hours))
        start = _parse_ts(ref.start)
        # One span serves both homes: its first day is generated on its own (generation goes a day at a
        # time), so the short home holds exactly that, and its increments are the next day's first files.
        span = ensure_span(self.data_root(), start, hours[-1] + INCREMENT_SLOTS * INCREMENT_MINUTES / 60, rate,
                           INCREMENT_MINUTES)
        homes: dict[str, tuple[Path, datetime, int]] = {}
        for label, h in zip(("short", "long"), hours, strict=True):
            home = self.fresh_home(None, f"history-{label}")
            end = start + timedelta(hours=h)
            lines = span.land(start, end, home / "landing")
            self._sluice_run(f"catchup_{label}_hist", rate * h, 0, home, end + NOW_MARGIN,
                             {"lines": lines, "history_h": h})
            homes[label] = (home, end, h)
        for i in range(args.history_increments):
            for label in ("short", "long") if i % 2 == 0 else ("long", "short"):
                home, end, h = homes[label]
                lo = end + timedelta(minutes=INCREMENT_MINUTES * i)
                hi = lo + timedelta(minutes=INCREMENT_MINUTES)
                details = {"lines": span.land(lo, hi, home / "landing"), "history_h": h, "increment": i,
                           "now": _ts(hi + NOW_MARGIN)}
                self._sluice_run(f"incr_{label}_hist", per_increment, i, home, hi + NOW_MARGIN, details)
        if not args.keep:
            for home, _end, _h in homes.values():
                shutil.rmtree(home, ignore_errors=True)

    def _sluice_run(self, stage: str, events: int, rep: int, home: Path, now: datetime,
                    details: dict[str, Any]) -> Run:
        run = self.record(stage, events, rep, [*self.sluice, "run", PIPELINE, "--now", _ts(now)],
                          env=self.sluice_env(home, _ts(now)), parser=parse_sluice)
        run.details.update(details)
        return run

    def _bare_run(self, stage: str, events: int, rep: int, bare: Path, details: dict[str, Any],
                  submit: bool = False) -> Run:
        """The bare job on ``bare/landing``, resuming from its checkpoint in ``bare/out``; with ``submit``
        through pyspark's own spark-submit (as a DAG task would start it) instead of the interpreter."""
        job = [str(BENCH / "bare_spark_job.py"), "--landing", str(bare / "landing"), "--out", str(bare / "out"),
               *self.spark_args()]
        if submit:
            # As the DAG's spark-submit tasks do: Delta's jars on the driver's classpath from the start (the
            # job's spark.jars would reach only the executors).
            from sluice.runtime.spark import delta_jars

            # Its driver JVM is started by spark-submit, before the job's builder: Java options go here.
            jvm = self.spark_conf.get("spark.driver.extraJavaOptions")
            cmd = [str(Path(sys.executable).parent / "spark-submit"), "--master", self.master, "--jars",
                   delta_jars(), *(["--conf", f"spark.driver.extraJavaOptions={jvm}"] if jvm else []), *job]
        else:
            cmd = [sys.executable, *job]
        run = self.record(stage, events, rep, cmd)
        run.details.update(details)
        return run

    def airflow_env(self) -> dict[str, str]:
        """The bench's environment for Airflow: a fresh AIRFLOW_HOME under the work dir (SQLite), this repo's
        DAGs and plugin as the Makefile sets them (sluice.airflow.defaults), and nothing of the caller's
        Airflow set-up (database, connections: with no spark_default the DAG runs Spark locally)."""
        from sluice.airflow.defaults import airflow_env

        env = {k: v for k, v in self.env.items() if not k.startswith("AIRFLOW")}
        env.update(airflow_env({}, REPO), AIRFLOW_HOME=str(self.work / "airflow"))
        return env

    def data_root(self) -> Path:
        return Path(self.args.data_dir) if self.args.data_dir else Path(tempfile.gettempdir()) / "sluice-bench-data"


def _local_cores(master: str) -> int:
    m = re.match(r"local\[(\d+)\]", master)
    return int(m.group(1)) if m else (os.cpu_count() or 2)


def output_totals(kind: str, base: Path) -> dict[str, dict[str, int]]:
    import duckdb

    out = {}
    for name in OUTPUTS:
        con = duckdb.connect()
        if kind == "delta":
            from deltalake import DeltaTable

            con.register("gold", DeltaTable(str(base / name)).to_pyarrow_table())
            source = "gold"
        elif (base / name).is_dir():
            source = f"'{base / name}/*.parquet'"
        else:
            source = f"'{base / name}.parquet'"
        out[name] = _sql_totals(con, source, name)
    return out


def _sql_totals(con: Any, source: str, output: str) -> dict[str, int]:
    metrics = "sum(impressions), sum(clicks)" if output == "ad_clicks_hourly" else "sum(unmatched_clicks), 0"
    row = con.sql(f"SELECT count(DISTINCT window_start), count(*), {metrics} FROM {source}").fetchone()
    names = ("windows", "rows", "impressions", "clicks") if output == "ad_clicks_hourly" else (
        "windows", "rows", "unmatched_clicks", "_")
    return {k: int(v or 0) for k, v in zip(names, row, strict=True) if k != "_"}


# -------------------------------------------------------------------------------------------- report


def _median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


def summarize(runs: Sequence[Run], stage: str, events: int, lines: int) -> dict[str, Any] | None:
    ok = [r for r in runs if r.stage == stage and r.events == events and r.rc in (0, 2)]
    failed = [r for r in runs if r.stage == stage and r.events == events and r.rc not in (0, 2)]
    if not ok and not failed:
        return None
    walls = [r.wall_s for r in ok]
    med = _median(walls)
    summary: dict[str, Any] = {
        "stage": stage, "events": events, "runs": len(ok), "failed": len(failed),
        "wall_s_median": round(med, 2) if ok else None,
        "wall_s_min": round(min(walls), 2) if ok else None,
        "wall_s_max": round(max(walls), 2) if ok else None,
        "events_per_s_median": round(lines / med) if ok and lines and med > 0 else None,
        "peak_rss_mb_median": round(_median([r.peak_rss_mb for r in ok]), 0) if ok else None,
        "peak_rss_mb_max": round(max(r.peak_rss_mb for r in ok), 0) if ok else None,
    }
    in_proc = [r.details["in_process_s"] for r in ok if "in_process_s" in r.details]
    if in_proc:
        summary["in_process_s_median"] = round(_median(in_proc), 2)
    stage_keys = sorted({k for r in ok for k in r.details.get("stages", {})})
    if stage_keys:
        summary["stages_s_median"] = {
            k: round(_median([r.details["stages"][k] for r in ok if k in r.details.get("stages", {})]), 2)
            for k in stage_keys
        }
    per_window = [r.details["dq_per_window_s"] for r in ok if "dq_per_window_s" in r.details]
    if per_window:
        summary["dq_per_window_s_median"] = round(_median(per_window), 3)
        summary["dq_windows"] = ok[0].details.get("dq_windows")
    for key in ("ad_clicks_hourly_s", "unmatched_clicks_hourly_s", "session_s", "load_s"):
        values = [r.details[key] for r in ok if key in r.details]
        if values:
            summary.setdefault("job_s_median", {})[key] = round(_median(values), 2)
    return summary


def machine_info() -> dict[str, Any]:
    def run(cmd: list[str]) -> str:
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
            return (done.stdout + done.stderr).strip()
        except (OSError, subprocess.SubprocessError):
            return "?"

    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import duckdb
    import pyspark

    java = run(["java", "-version"]).splitlines()
    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "host": platform.node(),
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "mem_total_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "load_avg_at_start": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
        "java": java[0] if java else "?",
        "spark": pyspark.__version__,
        "duckdb": duckdb.__version__,
        "platform": platform.platform(),
    }


def markdown(results: dict[str, Any]) -> str:
    main = [s for s in results["summary"] if s["stage"] in (*MAIN_STAGES, *KAFKA_STAGES, *SUBSTREAM_STAGES)]
    rows = [
        "| stage | events | runs | wall s (median) | min..max | events/s | peak RSS MB | in-process s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ] if main else ["(no main rounds: --steady-only)"]
    for s in main:
        if s["wall_s_median"] is None:
            rows.append(f"| {s['stage']} | {s['events']:,} | 0 ({s['failed']} failed) | - | - | - | - | - |")
            continue
        eps = f"{s['events_per_s_median']:,}" if s.get("events_per_s_median") else "-"
        rows.append(
            f"| {s['stage']} | {s['events']:,} | {s['runs']} | {s['wall_s_median']:.1f} | "
            f"{s['wall_s_min']:.1f}..{s['wall_s_max']:.1f} | {eps} | {s['peak_rss_mb_median']:.0f} | "
            f"{s.get('in_process_s_median', '-')} |"
        )
    if main:
        rows += ["", "| result | value |", "|---|---:|", _target_row("empty_cycle/empty_job", results["ratios"])]
    cycles = [s for s in results["summary"] if s["stage"] in SLUICE_STAGES and s.get("stages_s_median")]
    if cycles:
        keys = ["startup", "ingest", "ingest_impressions", "ingest_clicks", "aggregate",
                "aggregate_ad_clicks_hourly", "aggregate_unmatched_clicks_hourly", "dq", "aggregate+dq", "report",
                "teardown", "in_process", "startup+teardown"]
        keys = [k for k in keys if any(k in s["stages_s_median"] for s in cycles)]
        rows += ["", "Where a sluice run spends its time (medians, seconds, from its log lines):", "",
                 "| run | events | " + " | ".join(keys) + " | DQ s/window |",
                 "|---|---:|" + "---:|" * (len(keys) + 1)]
        for s in cycles:
            cells = [f"{s['stages_s_median'][k]:.1f}" if k in s["stages_s_median"] else "-" for k in keys]
            per_window = s.get("dq_per_window_s_median")
            rows.append(f"| {s['stage']} | {s['events']:,} | " + " | ".join(cells)
                        + f" | {per_window if per_window is not None else '-'} |")
    if results.get("steady", {}).get("summary"):
        rows += ["", steady_markdown(results["steady"], results["ratios"])]
    dags = [s for s in results.get("steady", {}).get("summary", []) if s["stage"] == "dag_run"]
    if dags and dags[0].get("stages_s_median"):
        parts = ", ".join(f"{k} {v:.1f}" for k, v in dags[0]["stages_s_median"].items())
        rows += ["", f"Where the DAG run spends its time (median s, from its log lines): {parts}."]
    if results.get("checks"):
        rows += ["", "Output totals (untimed sanity check; sluice excludes late/early/duplicate records by "
                 "contract, the bare jobs only drop unparsable lines and duplicates):", "",
                 "| stage@events | ad windows | impressions | clicks | unmatched windows | unmatched clicks |",
                 "|---|---:|---:|---:|---:|---:|"]
        for key, totals in results["checks"].items():
            a = totals.get("ad_clicks_hourly", {})
            u = totals.get("unmatched_clicks_hourly", {})
            rows.append(f"| {key} | {a.get('windows', '-')} | {a.get('impressions', '-')} | {a.get('clicks', '-')} | "
                        f"{u.get('windows', '-')} | {u.get('unmatched_clicks', '-')} |")
    if results.get("scaling"):
        rows += ["", "Scaling (median wall s; per-event cost relative to the smallest size):", "",
                 "| stage | events | lines | wall s | events/s | s per 1M lines |", "|---|---:|---:|---:|---:|---:|"]
        for s in results["scaling"]:
            rows.append(f"| {s['stage']} | {s['events']:,} | {s['lines']:,} | {s['wall_s_median']} | "
                        f"{s['events_per_s_median']:,} | {s['s_per_million_lines']} |")
    return "\n".join(rows)


def steady_summary(runs: Sequence[Run]) -> list[dict[str, Any]]:
    """The summaries of the steady-state stages; ``lines`` is the median of what each run had to take in."""
    out = []
    for stage in STEADY_STAGES:
        mine = [r for r in runs if r.stage == stage]
        if not mine:
            continue
        lines = round(_median([r.details.get("lines", 0) for r in mine]))
        s = summarize(runs, stage, mine[0].events, lines)
        if s:
            s.update(lines=lines, history_h=mine[0].details.get("history_h"))
            out.append(s)
    return out


def per_increment(runs: Sequence[Run]) -> list[dict[str, Any]]:
    """Wall seconds of the sluice and the bare run of each increment, side by side (they ran back to back)."""
    rows: dict[int, dict[str, Any]] = {}
    for r in runs:
        if r.stage in ("incr_cycle", "incr_bare"):
            rows.setdefault(r.rep, {"increment": r.rep})[r.stage] = round(r.wall_s, 1) if r.rc in (0, 2) else "failed"
    return [rows[k] for k in sorted(rows)]


def steady_markdown(steady: dict[str, Any], ratios: dict[str, float]) -> str:
    hist = steady.get("history_hours") or ["-", "-"]
    rows = [
        f"Steady state ({steady['increments']} increments of {INCREMENT_MINUTES} min after {steady['history_h']} h of "
        f"history at {steady['rate']:,} impressions/h; each run's now = the data's end + {steady['now_margin_min']:g} "
        f"min; history_ratio: {hist[0]} h vs {hist[1]} h at {steady.get('history_rate', 0):,} impressions/h):",
        "",
        "| stage | history h | lines per run | runs | wall s (median) | min..max | peak RSS MB |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for s in steady["summary"]:
        head = f"| {s['stage']} | {s['history_h'] or '-'} | {s['lines']:,} |"
        if s["wall_s_median"] is None:
            rows.append(f"{head} 0 ({s['failed']} failed) | - | - | - |")
            continue
        rows.append(f"{head} {s['runs']} | {s['wall_s_median']:.1f} | {s['wall_s_min']:.1f}..{s['wall_s_max']:.1f} | "
                    f"{s['peak_rss_mb_median']:.0f} |")
    rows += ["", "| steady-state result | value |", "|---|---:|"]
    rows += [f"| {k} | {ratios[k]} |" for k in STEADY_RESULTS]
    rows.append(_target_row("dq_history_ratio", ratios))
    if steady.get("per_increment"):
        pairs = [f"#{p['increment']} {p.get('incr_cycle', '-')} / {p.get('incr_bare', '-')}"
                 for p in steady["per_increment"]]
        rows += ["", "Per increment, sluice / bare s (run back to back): " + "; ".join(pairs)]
    return "\n".join(rows)


def _target_row(key: str, ratios: dict[str, float]) -> str:
    """A result-table row for one of EXTRA_RESULTS: its value, its target in the label."""
    return f"| {key} (≤ {EXTRA_RESULTS[key]}) | {ratios.get(key, float('nan'))} |"


def ratio(a: float | None, b: float | None) -> float:
    return round(a / b, 2) if a and b else float("nan")


# ---------------------------------------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=REFERENCE_EVENTS, help="impressions (clicks add ~10%%)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per stage (medians are reported)")
    parser.add_argument("--smoke", action="store_true", help="5k impressions, repeat 1, no scaling (CI)")
    parser.add_argument("--scaling", action="store_true", help="also run the scaling curve (cycle and bare Spark)")
    parser.add_argument("--scaling-sizes", default=",".join(str(s) for s in SCALING_SIZES))
    parser.add_argument("--scaling-repeat", type=int, default=1)
    parser.add_argument("--skip-main", action="store_true", help="only the scaling curve (no steady state either)")
    parser.add_argument("--data-dir", help="where generated data sets are cached (default: <tmp>/sluice-bench-data)")
    parser.add_argument("--results-dir", default=str(BENCH / "results"))
    parser.add_argument("--timeout", type=float, default=1800, help="per-run timeout in seconds")
    parser.add_argument("--tag", help="appended to the results file name: results/<date>[-smoke][-TAG].json")
    parser.add_argument("--keep", action="store_true", help="keep the sluice homes of the runs")
    parser.add_argument("--task", choices=("generate", "totals", "span", "state"), help=argparse.SUPPRESS)
    parser.add_argument("--span", help=argparse.SUPPRESS)
    parser.add_argument("--early-share", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--kind", choices=("parquet", "delta"), help=argparse.SUPPRESS)
    parser.add_argument("--path", help=argparse.SUPPRESS)
    parser.add_argument("--budget-min", type=float, default=14.0,
                        help="start another main round only if it should end within this many minutes of the "
                             "start (0 = no budget). Round 1 always runs, then the steady state once; their time "
                             "counts against the budget")
    steady = parser.add_mutually_exclusive_group()
    steady.add_argument("--skip-steady", action="store_true", help="skip the steady-state stages")
    steady.add_argument("--steady-only", action="store_true",
                        help="only the steady-state stages (no main rounds, no scaling): for profiling")
    parser.add_argument("--increments", type=int, help="15-min increments after the day of history (default 8; "
                        "smoke 1)")
    parser.add_argument("--history-increments", type=int,
                        help="increments after each history length for history_ratio (default 3; smoke 1)")
    parser.add_argument("--history-rate-divisor", type=int,
                        help="history_ratio runs at the reference rate divided by this (default 16; smoke 1)")
    parser.add_argument("--kafka-events", type=int, help="readings in the Kafka case's topic (default 1,000,000; "
                        "smoke 5,000)")
    parser.add_argument("--kafka-increments", type=int, help="15-min increments of the Kafka case (default 3; smoke 1)")
    parser.add_argument("--skip-kafka", action="store_true", help="skip the Kafka case (bench/kafka_case.py)")
    parser.add_argument("--substream-events", type=int, help="readings of the substream case (default 1,000,000; "
                        "smoke 5,000)")
    parser.add_argument("--substreams", type=int, help="devices of the substream case (default 100,000; smoke 200)")
    parser.add_argument("--skip-substreams", action="store_true",
                        help="skip the substream case (bench/substream_case.py)")
    parser.add_argument("--dag-runs", type=int, default=1,
                        help="scheduled DAG runs (each with one bare spark-submit) in the steady state; 0 = none")
    args = parser.parse_args(argv)
    if args.smoke:
        args.events = 5_000 if args.events == REFERENCE_EVENTS else args.events
        args.repeat = 1
        args.scaling = False
    if args.steady_only:
        args.scaling = False
    elif args.skip_main:
        args.skip_steady = True
    # Smoke: enough to run every steady-state code path once on tiny data, within a few minutes (CI runs it:
    # a second increment cost a minute of CI and ran no path the first does not).
    # History: 3 increments per side (the 3rd closes a window on both, so each median is a non-closing one)
    # at 1/16 of the rate keep `make bench` within its 15 minutes on this 2-core VM (README, "How to run").
    for name, default, smoke in (("increments", 8, 1), ("history_increments", 3, 1), ("history_rate_divisor", 16, 1),
                                 ("kafka_events", 1_000_000, 5_000), ("kafka_increments", 3, 1),
                                 ("substream_events", 1_000_000, 5_000), ("substreams", 100_000, 200)):
        if getattr(args, name) is None:
            setattr(args, name, smoke if args.smoke else default)
    if args.increments < 1 or args.history_increments < 1 or args.history_rate_divisor < 1 or args.dag_runs < 0:
        parser.error("--increments, --history-increments and --history-rate-divisor must be >= 1, --dag-runs >= 0")
    if args.increments + args.dag_runs > INCREMENT_SLOTS or args.history_increments > INCREMENT_SLOTS:
        parser.error(f"at most {INCREMENT_SLOTS} increments are generated: --increments + --dag-runs and "
                     f"--history-increments must stay within that")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.task == "generate":
        root = Path(args.data_dir) if args.data_dir else Path(tempfile.gettempdir()) / "sluice-bench-data"
        print(json.dumps(asdict(generate_dataset(args.events, root, smoke=args.smoke, early_share=args.early_share))))
        return 0
    if args.task == "totals":
        print(json.dumps(output_totals(args.kind, Path(args.path))))
        return 0
    if args.task == "span":
        spec = json.loads(args.span)
        root = Path(args.data_dir) if args.data_dir else Path(tempfile.gettempdir()) / "sluice-bench-data"
        span = generate_span(root, _parse_ts(spec["start"]), spec["hours"], spec["per_hour"], spec["file_minutes"],
                             spec.get("early_share"))
        print(span.landing)
        return 0
    if args.task == "state":
        print(json.dumps(read_home_state(Path(args.path))))
        return 0
    started = time.monotonic()
    info = machine_info()
    log(f"machine: {info['nproc']} cpu ({info['cpu']}), {info['mem_total_gb']} GB, load {info['load_avg_at_start']}; "
        f"Python {info['python']}, Spark {info['spark']}, {info['java']}")
    work = Path(tempfile.mkdtemp(prefix="sluice-bench-"))
    bench = Bench(args, work)
    try:
        # The steady state's history is always the reference day (smoke: the smoke data set), whatever --events.
        ref = None if args.skip_steady else ensure_dataset(
            args.events if args.smoke else REFERENCE_EVENTS, bench.data_root(), smoke=args.smoke)
        data = ref if ref is not None and args.steady_only else ensure_dataset(args.events, bench.data_root(),
                                                                                  smoke=args.smoke)
        log(f"data: {data.total_lines:,} lines in {sum(data.files.values())} files, {data.hours} h, "
            f"windows {data.start}..{data.end}, now={data.now}")
        main = not args.skip_main and not args.steady_only
        # Round 1 first, keeping its caught-up homes when the steady state runs on the same day; then the
        # steady state, once; then the other rounds, as the budget allows.
        reuse = main and ref is not None and ref.landing == data.landing
        if main:
            bench.main_rounds(data, range(1), keep_first=reuse)
        if ref is not None:
            bench.steady_state(ref)
        if main:
            bench.main_rounds(data, range(1, args.repeat))
        if main and not args.skip_kafka:
            from kafka_case import KafkaCase

            KafkaCase(bench, args.kafka_events, args.kafka_increments, parse_sluice).run()
        if main and not args.skip_substreams:
            from substream_case import SubstreamCase

            SubstreamCase(bench, args.substream_events, args.substreams, parse_sluice).run()
        sizes: list[int] = []
        if args.scaling:
            sizes = [int(s) for s in args.scaling_sizes.split(",") if s.strip()]
            bench.scaling_rounds(sizes)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)

    datasets = {data.events: data}
    for size in sizes:
        datasets.setdefault(size, ensure_dataset(size, bench.data_root()))
    summary = []
    for stage in MAIN_STAGES:
        lines = data.total_lines if stage not in ("empty_cycle", "empty_job") else 0
        events = data.events if stage not in ("empty_cycle", "empty_job") else 0
        s = summarize(bench.runs, stage, events, lines)
        if s:
            summary.append(s)
    for stage in (*KAFKA_STAGES, *SUBSTREAM_STAGES):
        kafka_runs = [r for r in bench.runs if r.stage == stage]
        s = summarize(bench.runs, stage, kafka_runs[0].events, kafka_runs[0].events) if kafka_runs else None
        if s:
            summary.append(s)
    scaling = []
    for stage in ("bare_spark", "cycle"):
        base = None
        for size in sorted(datasets):
            if size not in sizes:
                continue
            s = summarize(bench.runs, stage, size, datasets[size].total_lines)
            if not s or s["wall_s_median"] is None:
                continue
            per_m = s["wall_s_median"] / (datasets[size].total_lines / 1e6)
            base = base or per_m
            scaling.append({"stage": stage, "events": size, "lines": datasets[size].total_lines,
                            "wall_s_median": s["wall_s_median"], "events_per_s_median": s["events_per_s_median"],
                            "s_per_million_lines": round(per_m, 1), "relative_cost_per_event": round(per_m / base, 2),
                            "stages_s_median": s.get("stages_s_median")})
    steady = steady_summary(bench.runs)
    by_stage = {s["stage"]: s for s in [*summary, *steady]}

    def med(stage: str) -> float | None:
        return by_stage.get(stage, {}).get("wall_s_median")

    def dq_per_window(stage: str) -> float | None:
        """The median over the stage's runs of their DQ seconds per validated window (None: none validated)."""
        return by_stage.get(stage, {}).get("dq_per_window_s_median")

    def dq_validating(stage: str) -> float | None:
        """The median DQ seconds of the stage's runs that validated at least one window (None: none did)."""
        dq = [r.details["stages"]["dq"] for r in bench.runs if r.stage == stage and r.rc in (0, 2)
              and r.details.get("dq_windows") and "dq" in r.details.get("stages", {})]
        return _median(dq) if dq else None

    incr_s = med("incr_cycle")
    ratios: dict[str, float] = {
        "cycle/bare_spark": ratio(med("cycle"), med("bare_spark")),
        "backfill/spark_batch": ratio(med("backfill"), med("spark_batch")),
        "cycle/duckdb": ratio(med("cycle"), med("duckdb")),
        "empty_cycle/empty_job": ratio(med("empty_cycle"), med("empty_job")),
        "incr_cycle_s": round(incr_s, 2) if incr_s else float("nan"),
        "incr/bare_spark": ratio(incr_s, med("incr_bare")),
        "history_ratio": ratio(med("incr_long_hist"), med("incr_short_hist")),
        # Per validated window: the 7-day catch-up validates 7x the windows of the 1-day one.
        "dq_history_ratio": ratio(dq_per_window("catchup_long_hist"), dq_per_window("catchup_short_hist")),
        "dq_incr_history_ratio": ratio(dq_validating("incr_long_hist"), dq_validating("incr_short_hist")),
        "dag_run/bare_submit": ratio(med("dag_run"), med("bare_submit")),
        "kafka_cycle/bare": ratio(med("kafka_cycle"), med("kafka_bare")),
        "kafka_incr/bare": ratio(med("kafka_incr"), med("kafka_incr_bare")),
        "substream_cycle/plain": ratio(med("substream_cycle"), med("substream_plain")),
    }
    results = {
        "machine": info,
        "args": {k: v for k, v in vars(args).items()},
        "dataset": asdict(data),
        "spark_conf": bench.spark_conf,
        "spark_master": bench.master,
        "summary": [*summary, *steady],
        "steady": {**bench.steady_info, "summary": steady, "per_increment": per_increment(bench.runs),
                   "steady_s": bench.steady_s} if steady else {},
        "scaling": scaling,
        "checks": bench.checks,
        "runs": [asdict(r) for r in bench.runs],
        "ratios": ratios,
        "rounds_done": bench.rounds_done,
        "notes": bench.notes,
        "bench_wall_s": round(time.monotonic() - started, 1),
    }
    results_dir = Path(args.results_dir)
    results_dir.mkdir(parents=True, exist_ok=True)
    suffix = ("-smoke" if args.smoke else "") + (f"-{args.tag}" if args.tag else "")
    target = results_dir / f"{datetime.now(UTC):%Y-%m-%d}{suffix}.json"
    target.write_text(json.dumps(results, indent=2, default=str) + "\n")

    print(f"## sluice bench ({'smoke, ' if args.smoke else ''}{data.events:,} impressions = {data.total_lines:,} "
          f"lines, {data.hours} h, {sum(data.files.values())} files; {info['date']}, {info['nproc']} cpu, "
          f"load {info['load_avg_at_start']})")
    print()
    print(markdown(results))
    print()
    for note in bench.notes:
        print(f"note: {note}")
    if not args.skip_main and not args.steady_only:
        print(f"main rounds: {bench.rounds_done} of {args.repeat} ran")
    print("ratios: " + ", ".join(f"{k}={v}" for k, v in ratios.items()))
    print(f"results: {target}  (bench took {results['bench_wall_s']:.0f}s)")

    failed = [r for r in bench.runs if r.rc not in (0, 2)]
    cycle_s = med("cycle")
    eps = round(data.total_lines / cycle_s) if cycle_s else 0
    empty = med("empty_cycle")
    # The old fields first, unchanged; then the steady state's, then EXTRA_RESULTS (nan when skipped or failed).
    print(f"bench: cycle/bare_spark={ratios['cycle/bare_spark']} backfill/spark_batch={ratios['backfill/spark_batch']} "
          f"empty_cycle_s={empty if empty is not None else 'nan'} events_per_s={eps} "
          + " ".join(f"{k}={ratios[k]}" for k in (*STEADY_RESULTS, *EXTRA_RESULTS)))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
