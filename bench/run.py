#!/usr/bin/env python
"""sluice benchmark: what does sluice cost on top of a bare Spark job, and where does the time go?

Stages, each run in a FRESH subprocess (so every one pays the same interpreter + JVM start), alternated and
repeated ``--repeat`` times:

  bare_spark     (a) bench/bare_spark_job.py: hand-written Structured Streaming, availableNow, Parquet sink
  cycle          (b) ``sluice run ad_clicks_hourly --now <after the data>`` on a fresh SLUICE_HOME copy
  backfill       (c) ``sluice backfill ad_clicks_hourly --start .. --end ..`` on the home (b) produced
  noop_cycle         ``sluice run`` again on that home with the same --now: the steady-state fixed cost
  spark_batch    (d) bench/spark_batch.py: the same logic as a plain Spark batch query
  duckdb         (e) bench/duckdb_floor.py: the same logic in DuckDB, the single-machine floor
  empty_cycle        ``sluice run`` on an empty landing zone (fresh home)
  empty_job          bench/empty_job.py: SparkSession + one trivial job, nothing else

Peak memory is the max over 0.2 s samples of the summed RSS of the process tree (Python, JVM, Python
workers). The sluice cycle's stages (start-up, ingest, aggregate, data quality, tear-down) come from its
log lines, time-stamped as they arrive on stderr.

    .venv/bin/python bench/run.py                 # 1M impressions (+~10% clicks), repeat 3
    .venv/bin/python bench/run.py --smoke         # 5k impressions, repeat 1 (CI)
    .venv/bin/python bench/run.py --scaling       # also 0.25M / 1M / 4M for the cycle and bare Spark

The last line is always ``bench: cycle/bare_spark=<r> backfill/spark_batch=<r> empty_cycle_s=<s>
events_per_s=<n>``.
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
FINAL_RE = re.compile(
    r"^bench: cycle/bare_spark=(?P<cycle>[0-9.]+) backfill/spark_batch=(?P<backfill>[0-9.]+) "
    r"empty_cycle_s=(?P<empty>[0-9.]+) events_per_s=(?P<eps>[0-9]+)$"
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


def _cached(events: int, root: Path, smoke: bool) -> tuple[Path, Dataset | None]:
    hours, _per_hour = _shape(events, smoke)
    target = root / f"ad_clicks-v{DATA_VERSION}-n{events}-h{hours}-f{FILE_MINUTES}"
    marker = target / "dataset.json"
    if marker.exists():
        data = Dataset(**json.loads(marker.read_text()))
        if Path(data.landing).is_dir():
            return target, data
    return target, None


def ensure_dataset(events: int, root: Path, smoke: bool = False) -> Dataset:
    """The cached data set of this size, generated first if needed, in a subprocess: the generator holds
    a day of records in memory, and a bench process that had grown that large would pass its peak RSS on
    to every child it forks (Linux carries ru_maxrss across fork + exec)."""
    _target, data = _cached(events, root, smoke)
    if data is None:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--task", "generate", "--events", str(events),
               "--data-dir", str(root), *(["--smoke"] if smoke else [])]
        subprocess.run(cmd, check=True, cwd=REPO, stdout=subprocess.DEVNULL)
        _target, data = _cached(events, root, smoke)
    if data is None:
        raise RuntimeError(f"generating {events} events under {root} left no data set")
    return data


def generate_dataset(events: int, root: Path, smoke: bool = False) -> Dataset:
    """Generate the landing files once per size (cached under ``root``) with the product's generator."""
    from sluice_tools.generate import DEFAULT_START, GenerateOptions, generate

    hours, per_hour = _shape(events, smoke)
    target, cached = _cached(events, root, smoke)
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
    for chunk in range(math.ceil(hours / CHUNK_HOURS)):
        chunk_hours = min(CHUNK_HOURS, hours - chunk * CHUNK_HOURS)
        options = GenerateOptions(
            start=DEFAULT_START + timedelta(hours=chunk * CHUNK_HOURS),
            hours=chunk_hours,
            impressions_per_hour=per_hour,
            click_rate=0.1,
            streams=("impressions", "clicks"),
            file_minutes=FILE_MINUTES,
        )
        manifest = generate(landing, options)
        for name, stream in manifest.streams.items():
            lines[name] = lines.get(name, 0) + stream.lines
            files[name] = files.get(name, 0) + stream.files
            accepted[name] = accepted.get(name, 0) + stream.accepted
    size = sum(p.stat().st_size for p in landing.rglob("*") if p.is_file())
    end = DEFAULT_START + timedelta(hours=hours)
    data = Dataset(
        events=events, hours=hours, impressions_per_hour=per_hour,
        start=_ts(DEFAULT_START), end=_ts(end),
        # Well after the data: idle heartbeats at now - 30 min push every watermark past the last window's
        # end + the 30-min join bound, so every window closes in one cycle.
        now=_ts(end + timedelta(hours=2)),
        landing=str(target / "landing"), lines=lines, files=files, accepted=accepted, bytes=size,
        generate_s=round(time.monotonic() - started, 1),
    )
    (partial / "dataset.json").write_text(json.dumps(asdict(data), indent=2))
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)
    log(f"generated {data.total_lines:,} lines ({size / 1e6:.0f} MB) in {data.generate_s:.0f}s")
    return data


def _ts(value: datetime) -> str:
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


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
    "ingest": re.compile(r"\bingest (impressions|clicks)\s+batch\s+\d+ (heartbeat)?"),
    "closed": re.compile(r"\b(\w+): closed window \d{4}-"),
    "catchup_end": re.compile(r"\b\S+: catch-up done"),
    "dq_start": re.compile(r"\bcycle \S+: checking data quality"),
    "dq": re.compile(r"\b\S+: data quality on (\d+) window\(s\): (\d+) passed, (\d+) failed"),
    "render": re.compile(r"^sluice run \S+: (\d+) batch\(es\) in ([0-9.]+)s"),
    "backfill": re.compile(r"^sluice backfill .*: (\d+) window\(s\) rewritten in ([0-9.]+)s"),
}


def parse_sluice(out: list[tuple[float, str]], err: list[tuple[float, str]], wall: float) -> dict[str, Any]:
    """Per-stage timings of a sluice run/backfill from the arrival times of its log lines.

    * startup: until 'cycle ...: ingesting' (interpreter, imports, JVM, SparkSession);
    * ingest_<stream>: the ingest of a stream logs one line per landing file, all at the end of its Spark
      batch, so the last such line ends that stream's ingest; ingest ends at 'aggregating closed windows';
    * aggregate_<output>: closed-window lines come at the end of each output's sink; with a batch catch-up,
      aggregate_catchup (until 'catch-up done') and aggregate_stream (until 'checking data quality');
    * dq: from 'checking data quality' (or the last closed-window line) to 'data quality on N window(s)'
      (with neither, the two steps cannot be told apart and are reported together as aggregate+dq);
    * report: until the CLI prints its summary (accounting table); teardown: the rest (JVM exit).
    A backfill logs too little for this; it gets in_process (its own timer) and startup+teardown.
    """
    marks: dict[str, float] = {}
    d: dict[str, Any] = {"ingest_batches": {}, "heartbeats": {}, "closed_windows": {}}
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
            for stream in ("impressions", "clicks"):
                if f"ingest_end_{stream}" in marks:
                    stages[f"ingest_{stream}"] = marks[f"ingest_end_{stream}"] - previous
                    previous = marks[f"ingest_end_{stream}"]
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


# ---------------------------------------------------------------------------------------------- bench


class Bench:
    def __init__(self, args: argparse.Namespace, work: Path):
        from sluice.config import load_settings
        from sluice.core.spark import spark_conf

        self.args = args
        self.work = work
        self.runs: list[Run] = []
        settings = load_settings({}, home=work / "settings-probe")
        self.master = settings.spark_master
        self.spark_conf = spark_conf(settings)
        bindir = Path(sys.executable).parent
        self.sluice = [str(bindir / "sluice")] if (bindir / "sluice").exists() else [sys.executable, "-m", "sluice.cli"]
        self.env = self._base_env(bindir)
        self.checks: dict[str, dict[str, dict[str, int]]] = {}
        self.started = time.monotonic()
        self.rounds_done = 0
        self.notes: list[str] = []

    @staticmethod
    def _base_env(bindir: Path) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
        # Keep the knobs that shape Spark the same for everyone; drop anything that points elsewhere.
        for key in ("SLUICE_DRIVER_MEMORY", "SLUICE_SHUFFLE_PARTITIONS", "SLUICE_SPARK_MASTER",
                    "SLUICE_MAX_FILES_PER_TRIGGER", "SLUICE_DELTA_ENGINE"):
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

    def bare_spark(self, data: Dataset, rep: int) -> Run:
        out = self._out_dir("bare_spark", data, rep)
        run = self.record("bare_spark", data.events, rep, [
            sys.executable, str(BENCH / "bare_spark_job.py"), "--landing", data.landing, "--out", str(out),
            *self.spark_args(),
        ])
        self._check("bare_spark", data, "parquet", out)
        shutil.rmtree(out, ignore_errors=True)
        return run

    def spark_batch(self, data: Dataset, rep: int) -> Run:
        out = self._out_dir("spark_batch", data, rep)
        run = self.record("spark_batch", data.events, rep, [
            sys.executable, str(BENCH / "spark_batch.py"), "--landing", data.landing, "--out", str(out),
            *self.spark_args(),
        ])
        self._check("spark_batch", data, "parquet", out)
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

    def sluice_chain(self, data: Dataset, rep: int, with_backfill: bool = True) -> list[Run]:
        """(b) a full cycle on a fresh home, then (c) a backfill of every window and a no-op cycle on it."""
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
        if not self.args.keep:
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
        key = f"{stage}@{data.events}"
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
    def main_rounds(self, data: Dataset) -> None:
        groups = [
            lambda rep: [self.bare_spark(data, rep)],
            lambda rep: self.sluice_chain(data, rep),
            lambda rep: [self.spark_batch(data, rep)],
            lambda rep: [self.duckdb(data, rep)],
            lambda rep: [self.empty_cycle(rep)],
            lambda rep: [self.empty_job(rep)],
        ]
        budget = self.args.budget_min * 60
        for rep in range(self.args.repeat):
            round_started = time.monotonic()
            # Alternate: each round starts with the next group, so no stage always runs first (or last).
            k = rep % len(groups)
            for i, group in enumerate(groups[k:] + groups[:k]):
                # The first round always completes (the summary line needs every stage); later rounds stop
                # at a group boundary once the budget is spent, e.g. when the machine got busier.
                if rep and budget and time.monotonic() - self.started > budget:
                    self.notes.append(f"round {rep + 1} stopped after {i} of {len(groups)} stage groups: the "
                                      f"{self.args.budget_min:g}-minute budget was spent (--budget-min 0 disables it)")
                    log(self.notes[-1])
                    return
                group(rep)
            self.rounds_done = rep + 1
            elapsed = time.monotonic() - self.started
            if rep + 1 < self.args.repeat and budget and elapsed + (time.monotonic() - round_started) > budget:
                self.notes.append(
                    f"stopped after {rep + 1} of {self.args.repeat} rounds: another round would exceed the "
                    f"{self.args.budget_min:g}-minute budget (--budget-min 0 disables it)"
                )
                log(self.notes[-1])
                break

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
    rows = [
        "| stage | events | runs | wall s (median) | min..max | events/s | peak RSS MB | in-process s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in results["summary"]:
        if s["wall_s_median"] is None:
            rows.append(f"| {s['stage']} | {s['events']:,} | 0 ({s['failed']} failed) | - | - | - | - | - |")
            continue
        eps = f"{s['events_per_s_median']:,}" if s.get("events_per_s_median") else "-"
        rows.append(
            f"| {s['stage']} | {s['events']:,} | {s['runs']} | {s['wall_s_median']:.1f} | "
            f"{s['wall_s_min']:.1f}..{s['wall_s_max']:.1f} | {eps} | {s['peak_rss_mb_median']:.0f} | "
            f"{s.get('in_process_s_median', '-')} |"
        )
    cycles = [s for s in results["summary"] if s["stage"] in ("cycle", "noop_cycle", "empty_cycle", "backfill")
              and s.get("stages_s_median")]
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
    parser.add_argument("--skip-main", action="store_true", help="only the scaling curve")
    parser.add_argument("--data-dir", help="where generated data sets are cached (default: <tmp>/sluice-bench-data)")
    parser.add_argument("--results-dir", default=str(BENCH / "results"))
    parser.add_argument("--timeout", type=float, default=1800, help="per-run timeout in seconds")
    parser.add_argument("--tag", help="appended to the results file name: results/<date>[-smoke][-TAG].json")
    parser.add_argument("--keep", action="store_true", help="keep the sluice homes of the runs")
    parser.add_argument("--task", choices=("generate", "totals"), help=argparse.SUPPRESS)
    parser.add_argument("--kind", choices=("parquet", "delta"), help=argparse.SUPPRESS)
    parser.add_argument("--path", help=argparse.SUPPRESS)
    parser.add_argument("--budget-min", type=float, default=14.0,
                        help="stop starting new rounds when the next one would end past this many minutes "
                             "(make bench must finish in 15; 0 = no budget)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.events = 5_000 if args.events == REFERENCE_EVENTS else args.events
        args.repeat = 1
        args.scaling = False
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.task == "generate":
        root = Path(args.data_dir) if args.data_dir else Path(tempfile.gettempdir()) / "sluice-bench-data"
        print(json.dumps(asdict(generate_dataset(args.events, root, smoke=args.smoke))))
        return 0
    if args.task == "totals":
        print(json.dumps(output_totals(args.kind, Path(args.path))))
        return 0
    started = time.monotonic()
    info = machine_info()
    log(f"machine: {info['nproc']} cpu ({info['cpu']}), {info['mem_total_gb']} GB, load {info['load_avg_at_start']}; "
        f"Python {info['python']}, Spark {info['spark']}, {info['java']}")
    work = Path(tempfile.mkdtemp(prefix="sluice-bench-"))
    bench = Bench(args, work)
    try:
        data = ensure_dataset(args.events, bench.data_root(), smoke=args.smoke)
        log(f"data: {data.total_lines:,} lines in {sum(data.files.values())} files, {data.hours} h, "
            f"windows {data.start}..{data.end}, now={data.now}")
        if not args.skip_main:
            bench.main_rounds(data)
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
    by_stage = {s["stage"]: s for s in summary}

    def med(stage: str) -> float | None:
        return by_stage.get(stage, {}).get("wall_s_median")

    results = {
        "machine": info,
        "args": {k: v for k, v in vars(args).items()},
        "dataset": asdict(data),
        "spark_conf": bench.spark_conf,
        "spark_master": bench.master,
        "summary": summary,
        "scaling": scaling,
        "checks": bench.checks,
        "runs": [asdict(r) for r in bench.runs],
        "ratios": {
            "cycle/bare_spark": ratio(med("cycle"), med("bare_spark")),
            "backfill/spark_batch": ratio(med("backfill"), med("spark_batch")),
            "cycle/duckdb": ratio(med("cycle"), med("duckdb")),
            "empty_cycle/empty_job": ratio(med("empty_cycle"), med("empty_job")),
        },
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
    print("ratios: " + ", ".join(f"{k}={v}" for k, v in results["ratios"].items()))
    print(f"results: {target}  (bench took {results['bench_wall_s']:.0f}s)")

    failed = [r for r in bench.runs if r.rc not in (0, 2)]
    cycle_s = med("cycle")
    eps = round(data.total_lines / cycle_s) if cycle_s else 0
    empty = med("empty_cycle")
    print(f"bench: cycle/bare_spark={results['ratios']['cycle/bare_spark']} "
          f"backfill/spark_batch={results['ratios']['backfill/spark_batch']} "
          f"empty_cycle_s={empty if empty is not None else 'nan'} events_per_s={eps}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
