#!/usr/bin/env python
"""sluice on the platform's standalone cluster, beside the bare Spark job on the same cluster (``make bench-cluster``).

The platform (``make platform``: a Spark master with 2 workers of 1 core, s3proxy) runs both sides; each job
asks for both cores (``spark.cores.max=2``) and the same shuffle partitions. For each size (1M and 10M
impressions, plus ~10% clicks: the reference rate, so 10M is ten days of the same traffic):

  catchup_cycle  ``sluice run ad_clicks_hourly`` of the whole data set, landing zone and lake in the bucket
  catchup_bare   bench/bare_spark_job.py (hand-written Structured Streaming, delta-spark sink) on the same files,
                 its landing, checkpoint and tables in the bucket too; its micro-batches bounded as sluice's
                 are (max_files_per_trigger) and its state in RocksDB, as a backlog of days needs
  incr_cycle     then 8 increments of 15 minutes, each uploaded to both landing zones and run by both sides,
  incr_bare      alternating which goes first

The data sets have no early records (EARLY_SHARE), and a sluice run with more than 1% of its lines late is
flagged (LATE_LIMIT): either would mean the run measured the DLQ.

The files are uploaded in their arrival order before each catch-up (untimed); an object's arrival time is its
upload (SPEC 1), so both sides read the same files in the same order. The DAGs of the platform are paused while
the benchmark runs (their scheduled runs would take the cluster's cores) and set back after.

The last line: ``cluster: scale_10x=<catchup_cycle(10M)/catchup_cycle(1M)> cycle/bare_spark=<r>
incr/bare_spark=<r> events_per_s=<n>``, the ratios at the largest size, medians of the increments.

    .venv/bin/python bench/cluster.py --platform-dir .platform             # 1M and 10M, 8 increments
    .venv/bin/python bench/cluster.py --sizes 20000,200000 --increments 2  # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from run import (  # the bench's own helpers: data sets, spans, measured processes
    BENCH,
    INCREMENT_MINUTES,
    INCREMENT_SLOTS,
    PIPELINE,
    REPO,
    Dataset,
    Run,
    _bench_json,
    _parse_ts,
    _tail,
    ensure_dataset,
    ensure_span,
    log,
    machine_info,
    measure,
    parse_sluice,
    ratio,
)

SIZES = (1_000_000, 10_000_000)
PREFIX = "bench-cluster"
APP_CORES = 2  # both workers' cores for each job: the cluster runs one job at a time here
# No early records. An object's arrival is its upload (SPEC 1), and the upload is long after the data's event
# times, so the generator's early records (event time hours past their file's) are not early in a bucket: they
# are accepted, move sluice's watermark hours ahead, and every later on-time record goes to the DLQ as late.
# That measures the DLQ, not a pipeline; platform-demo generates its day the same way.
EARLY_SHARE = 0.0
# The generator makes 0.2% of the records late; far more means the runs measured the DLQ, not the pipeline
# (SPEC 5's lateness check fails a window at 1%).
LATE_LIMIT = 0.01
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


class ClusterBench:
    def __init__(self, platform: Any, args: argparse.Namespace) -> None:
        from sluice.core.class_data import java_options

        self.platform = platform
        self.args = args
        self.client = platform.s3_client()
        self.bucket = platform.topology.bucket
        self.runs: list[Run] = []
        self.started = datetime.now(UTC)
        self.work = Path(args.work_dir)
        keep = {k: v for k, v in os.environ.items() if not k.startswith(("SLUICE_", "AIRFLOW", "AWS_", "PYSPARK"))}
        self.env = {**keep, **{k: v for k, v in platform.env().items() if not k.startswith("AIRFLOW")},
                    "PYTHONUNBUFFERED": "1", "SLUICE_SPARK_MASTER": platform.master_url,
                    "SLUICE_SHUFFLE_PARTITIONS": str(APP_CORES)}
        # sluice's driver takes its Spark settings from sluice; the cores an application may take on a
        # standalone cluster are spark-submit's business, as for a DAG task.
        self.env["PYSPARK_SUBMIT_ARGS"] = f"--conf spark.cores.max={APP_CORES} pyspark-shell"
        self.java = " ".join(java_options())

    # -- the bucket ---------------------------------------------------------------------------------
    def prefix(self, events: int) -> str:
        # A prefix of this run's own: s3proxy's filesystem back end keeps a deleted key's folders, and Spark
        # takes a checkpoint folder that lists as non-empty for another query's.
        return f"{PREFIX}/{self.started:%Y%m%dT%H%M%S}/n{events}"

    def root(self, events: int, side: str) -> str:
        return f"s3://{self.bucket}/{self.prefix(events)}/{side}"

    def clear(self, events: int) -> None:
        paginator = self.client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=f"{self.prefix(events)}/"):
            keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
            if keys:
                self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": keys})
        shutil.rmtree(self.work / f"home-n{events}", ignore_errors=True)  # a fresh start on both sides

    def upload(self, files: list[Path], events: int) -> None:
        """Each file into both sides' landing zones, in arrival order (modification time, then name)."""
        for path in sorted(files, key=lambda f: (f.stat().st_mtime, f.name)):
            for side in ("sluice", "bare"):
                key = f"{self.prefix(events)}/{side}/landing/{path.parent.name}/{path.name}"
                self.client.upload_file(str(path), self.bucket, key)

    # -- the two sides ------------------------------------------------------------------------------
    def sluice_env(self, events: int) -> dict[str, str]:
        home = self.work / f"home-n{events}"  # caches only: everything kept lives in the bucket
        home.mkdir(parents=True, exist_ok=True)
        root = self.root(events, "sluice")
        return {**self.env, "SLUICE_HOME": str(home), "SLUICE_LANDING": f"{root}/landing",
                "SLUICE_LAKE": f"{root}/lake"}

    def bare_command(self, events: int) -> list[str]:
        from sluice.config import load_settings
        from sluice.runtime.spark import spark_conf

        env = self.sluice_env(events)
        settings = load_settings(env, home=Path(env["SLUICE_HOME"]))
        conf = spark_conf(settings)  # the same Spark settings, s3a's too
        conf["spark.cores.max"] = str(APP_CORES)
        # What a Spark user sets for a streaming join over days of backlog on 2 GB executors: the state in
        # RocksDB (off the heap) and micro-batches bounded as sluice bounds its own (max_files_per_trigger).
        # Without them the bare job's 10M catch-up (2,880 files in one micro-batch, its join and dedup state
        # on the heap) failed on 2026-11-28, twice: Java heap space on both executors.
        conf["spark.sql.streaming.stateStore.providerClass"] = ROCKSDB
        if self.java:
            conf["spark.driver.extraJavaOptions"] = self.java
        root = self.root(events, "bare")
        return [sys.executable, str(BENCH / "bare_spark_job.py"), "--landing", f"{root}/landing",
                "--out", f"{root}/out", "--master", self.platform.master_url, "--conf-json", json.dumps(conf),
                "--max-files-per-trigger", str(settings.max_files_per_trigger)]

    def record(self, stage: str, events: int, rep: int, side: str, details: dict[str, Any]) -> Run:
        size = details["size"]  # the data set the run belongs to: its landing and lake (events: the run's own)
        if side == "sluice":
            cmd, env = [str(Path(sys.executable).parent / "sluice"), "run", PIPELINE], self.sluice_env(size)
        else:
            cmd, env = self.bare_command(size), self.env
        wall, peak, rc, out, err = measure(cmd, env, self.args.timeout)
        parsed = parse_sluice(out, err, wall) if side == "sluice" else _bench_json(out)
        failed = rc not in (0, 2)
        run = Run(stage, events, rep, round(wall, 3), round(peak, 1), rc, {**parsed, **details},
                  stdout_tail=_tail(out) if failed else "", stderr_tail=_tail(err, 40) if failed else "")
        self.runs.append(run)
        log(f"{stage:<14} n={events:<11,} rep={rep} wall={wall:7.1f}s rc={rc}")
        if failed:
            log(f"{stage} failed (rc={rc}):\n{run.stderr_tail}\n{run.stdout_tail}")
        if (late := late_share(run)) > LATE_LIMIT:
            log(f"WARNING: {stage} n={events:,} rep={rep}: sluice sent {late:.1%} of the lines to the "
                "DLQ as late; this run measures the DLQ, not the pipeline")
        return run

    # -- one size -----------------------------------------------------------------------------------
    def size(self, events: int) -> None:
        data: Dataset = ensure_dataset(events, Path(self.args.data_dir), early_share=EARLY_SHARE)
        self.clear(events)
        log(f"n={events:,}: uploading {sum(data.files.values()):,} files ({data.bytes / 1e6:,.0f} MB) to both sides")
        self.upload([f for f in Path(data.landing).glob("*/*") if f.is_file()], events)
        history = {"lines": data.total_lines, "history_h": data.hours, "size": events}
        self.record("catchup_cycle", events, 0, "sluice", history)
        self.record("catchup_bare", events, 0, "bare", history)

        end = _parse_ts(data.end)
        span = ensure_span(Path(self.args.data_dir), end, INCREMENT_SLOTS * INCREMENT_MINUTES / 60,
                           data.impressions_per_hour, INCREMENT_MINUTES, early_share=EARLY_SHARE)
        per_increment = round(data.impressions_per_hour * INCREMENT_MINUTES / 60)
        for i in range(self.args.increments):
            lo = end + timedelta(minutes=INCREMENT_MINUTES * i)
            chosen = span.select(lo, lo + timedelta(minutes=INCREMENT_MINUTES))
            files = [Path(span.landing) / stream / f["name"] for stream, fs in chosen.items() for f in fs]
            self.upload(files, events)
            details = {"lines": sum(f["lines"] for fs in chosen.values() for f in fs), "increment": i, "size": events}
            for side in ("sluice", "bare") if i % 2 == 0 else ("bare", "sluice"):
                stage = "incr_cycle" if side == "sluice" else "incr_bare"
                self.record(stage, per_increment, i, side, details)
        if not self.args.keep:
            self.clear(events)

    # -- the result ---------------------------------------------------------------------------------
    def wall(self, stage: str, events: int) -> float | None:
        walls = [r.wall_s for r in self.runs if r.stage == stage and r.events == events and r.rc in (0, 2)]
        return statistics.median(walls) if walls else None

    def ratios(self) -> dict[str, float]:
        small, large = min(self.args.sizes), max(self.args.sizes)
        cycle = self.wall("catchup_cycle", large)
        incr = [r for r in self.runs if r.stage in ("incr_cycle", "incr_bare") and r.details.get("size") == large]
        med = {s: statistics.median([r.wall_s for r in incr if r.stage == s and r.rc in (0, 2)] or [float("nan")])
               for s in ("incr_cycle", "incr_bare")}
        return {
            "scale_10x": ratio(cycle, self.wall("catchup_cycle", small)),
            "cycle/bare_spark": ratio(cycle, self.wall("catchup_bare", large)),
            "incr/bare_spark": ratio(med["incr_cycle"], med["incr_bare"]),
            "events_per_s": round(large / cycle) if cycle else 0,
        }


def late_share(run: Run) -> float:
    """The share of a sluice run's landing lines that went to the DLQ as late (0 for the bare job's runs)."""
    outcomes = run.details.get("outcomes") or {}
    return outcomes["late"] / outcomes["lines"] if outcomes.get("lines") else 0.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--platform-dir", default=str(REPO / ".platform"), help="make platform's folder (PLATFORM_DIR)")
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)),
                        help="impressions per data set, comma-separated (default 1M,10M)")
    parser.add_argument("--increments", type=int, default=8, help="15-min increments after each catch-up")
    parser.add_argument("--data-dir", default=str(Path(tempfile.gettempdir()) / "sluice-bench-data"),
                        help="where the generated data sets are cached (shared with make bench)")
    parser.add_argument("--work-dir", default=str(REPO / ".bench-cluster"), help="the sluice homes' caches")
    parser.add_argument("--results-dir", default=str(BENCH / "results"))
    parser.add_argument("--timeout", type=float, default=7200, help="seconds per run")
    parser.add_argument("--keep", action="store_true", help="keep the bucket's objects afterwards")
    args = parser.parse_args(argv)
    args.sizes = sorted({int(s) for s in str(args.sizes).split(",") if s.strip()})
    if len(args.sizes) < 2 or args.increments < 1:
        parser.error("--sizes needs two sizes or more (scale_10x compares the largest with the smallest), "
                     "--increments at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    from sluice.platform.launcher import Platform
    from sluice_tools.platform_demo import Api

    args = parse_args(argv)
    platform = Platform(Path(args.platform_dir)).load()
    missing = [name for name in platform.topology.services if not platform.daemon(name).alive()]
    if missing:
        print(f"ERROR: the platform in {args.platform_dir} is not running ({', '.join(missing)} down): "
              "run `make platform` first (make bench-cluster does)", file=sys.stderr)
        return 1
    bench = ClusterBench(platform, args)
    api = Api(platform)
    paused = {d["dag_id"]: d["is_paused"] for d in api.get("/dags")["dags"]}
    started = time.monotonic()
    try:
        for dag_id in paused:
            api.set_paused(dag_id, True)
        for dag_id in paused:
            api.wait_idle(dag_id)
        for events in args.sizes:
            bench.size(events)
    finally:
        for dag_id, was in paused.items():
            api.set_paused(dag_id, was)
    ratios = bench.ratios()
    workers = platform.alive_workers()
    results: dict[str, Any] = {
        "machine": machine_info(), "cluster": {"master": platform.master_url, "workers": workers,
                                               "app_cores": APP_CORES},
        "args": {k: v for k, v in vars(args).items()}, "runs": [asdict(r) for r in bench.runs],
        "ratios": ratios, "wall_s": round(time.monotonic() - started, 1),
    }
    out = Path(args.results_dir) / f"{datetime.now(UTC):%Y-%m-%d}-cluster.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1, default=str) + "\n")
    print(f"## sluice on the cluster ({platform.master_url}, {len(workers)} workers, "
          f"{APP_CORES} cores per job); results: {out}")
    print("| stage | size | runs | median s |\n|---|---:|---:|---:|")
    for stage in ("catchup_cycle", "catchup_bare", "incr_cycle", "incr_bare"):
        for events in args.sizes:
            walls = [r.wall_s for r in bench.runs if r.stage == stage and r.details.get("size") == events]
            if walls:
                print(f"| {stage} | {events:,} | {len(walls)} | {statistics.median(walls):.1f} |")
    failed = [(r.stage, r.events, r.rc) for r in bench.runs if r.rc not in (0, 2)]
    if failed:
        print(f"failed runs: {failed}")
    mostly_late = [(r.stage, r.events, r.rep) for r in bench.runs if late_share(r) > LATE_LIMIT]
    if mostly_late:
        print(f"runs with more than {LATE_LIMIT:.0%} of their lines late (their ratios do not measure sluice's "
              f"pipeline): {mostly_late}")
    print(f"cluster: scale_10x={ratios['scale_10x']} cycle/bare_spark={ratios['cycle/bare_spark']} "
          f"incr/bare_spark={ratios['incr/bare_spark']} events_per_s={ratios['events_per_s']}")
    return 1 if failed or mostly_late else 0


if __name__ == "__main__":
    sys.exit(main())
