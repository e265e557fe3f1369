"""Building this machine's class-data archive (:mod:`sluice.core.class_data`): ``make setup`` runs
``python -m sluice.cli.class_data build``, which trains a small pipeline in a process whose JVM writes the
archive as it exits. Idempotent: a present archive is kept."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TextIO

from sluice.core.class_data import DUMP_ENV, archive_path

# A small pipeline of SPEC section 8's shape: ingest (with a late record), a hopping-window aggregate, data
# quality and a backfill touch the classes every sluice run loads.
TRAINING_PIPELINE = '''
from pyspark.sql import functions as F
from sluice import Output, Pipeline, Stream, checks

readings = Stream(name="readings", id="reading_id", required=["reading_id", "device_id", "event_time"],
                  fields={"reading_id": "string", "device_id": "string", "temp_c": "double",
                          "event_time": "timestamp"}, watermark_delay="2m")

def temps(inputs, window):
    r = inputs["readings"]
    return (r.groupBy(window.column("event_time"), "device_id")
             .agg(F.count("*").alias("readings"), F.avg("temp_c").alias("avg_temp_c")))

pipeline = Pipeline(name="class_data_training", streams=[readings], window=("15m", "5m"), schedule=None,
                    outputs=[Output("class_data_training", temps, key="device_id",
                                    checks=[checks.completeness("readings", stream="readings")])])
'''
T0 = datetime(2024, 5, 1, 10, 0, tzinfo=UTC)


def _train(root: Path) -> None:
    """Two cycles and a backfill of the training pipeline, in this process (whose JVM writes the archive)."""
    from sluice.config import load_settings
    from sluice.runtime.context import open_run
    from sluice.streaming.backfill import run_backfill
    from sluice.streaming.cycle import run_cycle

    (root / "pipelines").mkdir(parents=True)
    (root / "pipelines" / "training.py").write_text(TRAINING_PIPELINE)
    settings = load_settings(home=root / "home", pipelines=root / "pipelines")
    landing = settings.landing_dir("readings")
    landing.mkdir(parents=True, exist_ok=True)
    run = open_run(settings, app_name="sluice-class-data")
    for n, minutes in enumerate((40, 80)):
        arrival = T0 + timedelta(minutes=minutes)
        lines = [{"reading_id": f"r{n}-{i}", "device_id": f"d{i % 3}", "temp_c": 20.0 + i,
                  "event_time": (arrival - timedelta(minutes=i % 45)).isoformat()} for i in range(60)]
        path = landing / f"batch-{n}.jsonl"
        path.write_text("".join(json.dumps(line) + "\n" for line in lines))
        os.utime(path, (arrival.timestamp(), arrival.timestamp()))
        run_cycle(run.at(load_settings(home=root / "home", pipelines=root / "pipelines", now=arrival)),
                  "class_data_training", deliver_alerts=False)
    run_backfill(run, "class_data_training", T0, T0 + timedelta(hours=1))
    run.spark.stop()


def build(cache: Path | None = None, out: TextIO = sys.stderr) -> Path | None:
    """Write this machine's archive (idempotent: a present one is kept). Returns its path, or None when
    there is no Java runtime or the training run failed: sluice then runs without one, as before."""
    target = archive_path(cache)
    if target is None:
        print("class data: no Java runtime, no archive", file=out)
        return None
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="sluice-class-data-") as tmp:
        dump = Path(tmp) / "archive.jsa"
        print(f"class data: training a Spark run to write {target} (about a minute, once per checkout)", file=out)
        env = {**os.environ, DUMP_ENV: str(dump)}
        done = subprocess.run([sys.executable, "-m", "sluice.cli.class_data", "train", tmp], env=env,
                              capture_output=True, text=True, check=False)
        if done.returncode != 0 or not dump.is_file():
            print(f"WARNING: class data: the training run failed (exit {done.returncode}); sluice runs without an "
                  f"archive. Its output ends:\n{done.stderr[-2000:]}", file=out)
            return None
        os.chmod(dump, 0o644)
        # Into the cache's folder under a name of this build's own, then renamed into place: a concurrent
        # build or a crash never leaves a partial archive under the final name (one crashes the JVM).
        part = target.with_name(f"{target.name}.{os.getpid()}.part")
        shutil.move(dump, part)
        os.replace(part, target)
    return target


def _wait_for_jvm() -> None:
    """The JVM writes the archive as it exits, after this process lets go of it: end it and wait."""
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    if gateway is None:
        return
    proc = getattr(gateway, "proc", None)
    gateway.shutdown()
    if proc is not None:
        if proc.stdin:
            proc.stdin.close()  # Spark's gateway server exits when its stdin closes
        proc.wait(timeout=600)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sluice.cli.class_data", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("build", help="write this machine's archive (idempotent)")
    commands.add_parser("path", help="print where this machine's archive is (or would be)")
    train = commands.add_parser("train", help=argparse.SUPPRESS)
    train.add_argument("root", type=Path)
    args = parser.parse_args(argv)
    if args.command == "train":
        _train(args.root)
        _wait_for_jvm()
        return 0
    if args.command == "path":
        print(archive_path() or "no Java runtime")
        return 0
    path = build()
    print(f"class data: {path}" if path else "class data: none", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
