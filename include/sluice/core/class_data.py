"""Class-data sharing for the driver JVM that sluice starts: an archive of the classes a sluice run loads,
built once per machine by ``make setup`` (``python -m sluice.core.class_data build``).

Why: a ``sluice run`` process spends much of its life loading and verifying the same ~20,000 classes of Spark,
its SQL engine and Delta before it does any work. A scheduled cycle is a short process, started every few
minutes, so that cost is paid on every run. Java 17's dynamic class-data sharing (JEP 350) maps the classes a
previous run loaded from one archive instead: on the 2-core machine of bench/README, a fresh process that
starts Spark, writes and reads a small Delta table took 15 s without the archive and 11 s with it.

The archive is only an accelerator. It is keyed by everything its classes come from (the Java runtime,
PySpark's jars, ``jars.lock``), so a changed install looks for a new archive and runs without one until
``make setup`` builds it; the JVM itself also checks the archive and ignores one that does not match, silently
(``-Xlog:cds=off``: nothing on stdout, where ``--json`` output goes). Delete the ``class-data`` folder of the
jar cache to go without it.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TextIO

from sluice.core.jars import LOCK, cache_dir

# The training run names the archive to write here; the JVM writes it when it exits.
DUMP_ENV = "SLUICE_CLASS_DATA_DUMP"
# The JVM reports a mismatched or unreadable archive on stdout; it then runs without it, which is all we want.
QUIET = "-Xlog:cds=off,cds+dynamic=off"


def _java() -> Path | None:
    """The ``java`` that Spark's launcher runs: ``$JAVA_HOME/bin/java``, else the one on the PATH."""
    home = os.environ.get("JAVA_HOME")
    found = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    return Path(found).resolve() if found and Path(found).exists() else None


def archive_key() -> str | None:
    """What the archived classes come from, hashed: the Java runtime, PySpark's jars and the locked jars.
    None without a Java runtime."""
    import pyspark

    java = _java()
    if java is None:
        return None
    digest = hashlib.sha256()
    stat = java.stat()
    digest.update(f"{java}|{stat.st_size}|{stat.st_mtime_ns}|{pyspark.__version__}\n".encode())
    spark_jars = Path(pyspark.__file__).parent / "jars"
    for jar in sorted(spark_jars.glob("*.jar")) if spark_jars.is_dir() else []:
        digest.update(f"{jar.name}|{jar.stat().st_size}\n".encode())
    digest.update(LOCK.read_bytes())
    return digest.hexdigest()[:16]


def archive_path(cache: Path | None = None) -> Path | None:
    key = archive_key()
    return None if key is None else (cache or cache_dir()) / "class-data" / f"sluice-{key}.jsa"


def java_options() -> list[str]:
    """The driver JVM's options for class-data sharing: write the archive (in the training run), use it
    when this machine has one, else nothing."""
    dump = os.environ.get(DUMP_ENV)
    if dump:
        return [f"-XX:ArchiveClassesAtExit={dump}", QUIET]
    path = archive_path()
    return [f"-XX:SharedArchiveFile={path}", QUIET] if path is not None and path.is_file() else []


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
    import json

    from sluice.config import load_settings
    from sluice.core.spark import get_spark
    from sluice.streaming.backfill import run_backfill
    from sluice.streaming.cycle import run_cycle

    (root / "pipelines").mkdir(parents=True)
    (root / "pipelines" / "training.py").write_text(TRAINING_PIPELINE)
    settings = load_settings(home=root / "home", pipelines=root / "pipelines")
    landing = settings.landing_dir("readings")
    landing.mkdir(parents=True, exist_ok=True)
    spark = get_spark(settings, "sluice-class-data")
    for n, minutes in enumerate((40, 80)):
        arrival = T0 + timedelta(minutes=minutes)
        lines = [{"reading_id": f"r{n}-{i}", "device_id": f"d{i % 3}", "temp_c": 20.0 + i,
                  "event_time": (arrival - timedelta(minutes=i % 45)).isoformat()} for i in range(60)]
        path = landing / f"batch-{n}.jsonl"
        path.write_text("".join(json.dumps(line) + "\n" for line in lines))
        os.utime(path, (arrival.timestamp(), arrival.timestamp()))
        run_cycle(load_settings(home=root / "home", pipelines=root / "pipelines", now=arrival),
                  "class_data_training", spark=spark, deliver_alerts=False)
    run_backfill(settings, "class_data_training", T0, T0 + timedelta(hours=1), spark=spark)
    spark.stop()


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
        print(f"class data: training a Spark run to write {target} (about a minute, once per machine)", file=out)
        env = {**os.environ, DUMP_ENV: str(dump)}
        done = subprocess.run([sys.executable, "-m", "sluice.core.class_data", "train", tmp], env=env,
                              capture_output=True, text=True, check=False)
        if done.returncode != 0 or not dump.is_file():
            print(f"WARNING: class data: the training run failed (exit {done.returncode}); sluice runs without an "
                  f"archive. Its output ends:\n{done.stderr[-2000:]}", file=out)
            return None
        os.chmod(dump, 0o644)
        shutil.move(dump, target.with_suffix(".part"))
        os.replace(target.with_suffix(".part"), target)
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
    parser = argparse.ArgumentParser(prog="python -m sluice.core.class_data", description=__doc__.split("\n\n")[0])
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
