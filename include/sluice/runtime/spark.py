"""Building the SparkSession: one place for the settings every sluice Spark application shares.

Called at the edge of a run (the CLI command, the Airflow task, a test fixture) through the run context
(:mod:`sluice.runtime.context`); nothing below the edge starts a session of its own."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from pyspark import SparkContext
from pyspark.sql import SparkSession

from sluice.config import Settings
from sluice.core import line_scan
from sluice.core.class_data import java_options
from sluice.core.lake import on_object_storage as _any_on_object_storage


def require_java() -> None:
    """Fail fast, with the fix, when no Java runtime is available (Spark needs Java 17)."""
    if os.environ.get("JAVA_HOME") or shutil.which("java"):
        return
    raise RuntimeError(
        "Spark needs a Java 17 runtime and none was found: install OpenJDK 17 "
        "(e.g. `apt-get install openjdk-17-jre-headless`) or set JAVA_HOME."
    )


LOOPBACK = "127.0.0.1"


def get_spark(settings: Settings, app_name: str = "sluice", master: str | None = None, *,
              work: str = "cycle") -> SparkSession:
    """Get or create the SparkSession for this process.

    Python workers must run the interpreter that has ``deltalake`` installed (the Delta stream source
    imports it on executors), hence PYSPARK_PYTHON is pinned to this interpreter unless already set.
    """
    require_java()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name)
    # spark-submit already decided the master; only set it when we start the JVM ourselves.
    if master or (not os.environ.get("SPARK_ENV_LOADED") and "spark.master" not in _submit_conf()):
        builder = builder.master(master or settings.spark_master)
    # The JVM's logging is decided when it starts: only when this process starts it (not under spark-submit,
    # whose JVM already runs and got its Java options from spark-submit's own --conf).
    starts_jvm = "PYSPARK_GATEWAY_PORT" not in os.environ and SparkContext._gateway is None
    options = {**(log_conf(work) if starts_jvm else {}), **spark_conf(settings)}
    if starts_jvm and (master or settings.spark_master).startswith("local") and not os.environ.get("SPARK_LOCAL_IP"):
        # A local session serves no one else: its driver (RPC, block manager) listens on loopback only, where
        # Spark would take the machine's first address and be reachable from the network.
        options.update({"spark.driver.bindAddress": LOOPBACK, "spark.driver.host": LOOPBACK})
    for key, value in options.items():
        builder = builder.config(key, value)
    if starts_jvm:
        _launch_gateway(builder)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    line_scan.register(spark)
    return spark


# What the driver JVM prints on stderr that no logging setting reaches: Spark's launcher always adds
# --add-modules=jdk.incubator.vector, and the JVM announces it before log4j starts.
JVM_NOISE = ("WARNING: Using incubator modules",)


def _launch_gateway(builder: SparkSession.Builder) -> None:
    """Start the driver JVM as pyspark would (spark-submit with the builder's options), with its stderr
    passed through line by line minus :data:`JVM_NOISE`, and make it the gateway the session uses."""
    from pyspark import SparkConf
    from pyspark.java_gateway import launch_gateway

    conf = SparkConf()
    for key, value in builder._options.items():  # what getOrCreate would hand spark-submit
        conf.set(key, value)
    gateway = launch_gateway(conf, popen_kwargs={"stderr": subprocess.PIPE})
    threading.Thread(target=_pass_stderr, args=(gateway.proc.stderr,), name="sluice-jvm-stderr",
                     daemon=True).start()
    SparkContext._ensure_initialized(gateway=gateway)


def _pass_stderr(stream: Any) -> None:
    """Copy the JVM's stderr to this process's (file descriptor 2, where the JVM would have written)."""
    for line in iter(stream.readline, b""):
        if not line.startswith(tuple(n.encode() for n in JVM_NOISE)):
            os.write(2, line)


LOG4J2_PROPERTIES = Path(__file__).with_name("log4j2.properties")
# What the driver JVM's JIT compiles, per kind of run (``work``). A sluice JVM lives for one cycle or one backfill,
# tens of seconds on the 2 cores of the machines it is measured on (bench/README, "What each change bought"):
# - Every run compiles huge methods. HotSpot compiles no method over 8000 bytes of bytecode by default, and the
#   code Spark generates for ingest's projection (a JSON parse, each field's type, text and value, the
#   quarantine reason) is larger: it ran interpreted, and parsing 1M lines took 8.1 s where it takes 5.4 s
#   compiled (local[2]).
# - A cycle leaves C2 to what is really hot (ten times HotSpot's tier-4 thresholds): the parse and the
#   shuffles still get there within seconds, the lukewarm rest stays in C1 rather than taking a core to compile
#   (the Kafka case's catch-up of 1M records: 54-55 s -> 49 s).
# - A backfill runs C1 only: its Spark SQL aggregations over bronze last seconds each, and C2's compiles did
#   not pay back within the run (a backfill of the 1M day: 27.2-27.5 s -> 23.0-23.2 s).
# - So does an increment: a cycle whose streams hold at most INCREMENT_BYTES of new data when it starts
#   (RunContext.expect). Its every Spark job is a first one, and nothing in it gets hot enough for C2 to pay.
_C1_ONLY = "-XX:-DontCompileHugeMethods -XX:TieredStopAtLevel=1"
JIT_OPTIONS: dict[str, str] = {
    "cycle": "-XX:-DontCompileHugeMethods -XX:Tier4InvocationThreshold=50000 -XX:Tier4MinInvocationThreshold=6000 "
             "-XX:Tier4CompileThreshold=150000 -XX:Tier4BackEdgeThreshold=400000",
    "increment": _C1_ONLY,
    "backfill": _C1_ONLY,
}
# New data up to this size (a listing's bytes, or a topic's new records at KAFKA_RECORD_BYTES each) makes a cycle
# an increment: a scheduled 15-minute increment is a few MB, a day's catch-up hundreds.
INCREMENT_BYTES = 32 << 20


def log_conf(work: str = "cycle") -> dict[str, str]:
    """Spark's JVM logging as sluice ships it (``log4j2.properties`` beside this module: warnings and errors,
    without start-up chatter and known-harmless noise), the JIT settings of the run's ``work``
    (:data:`JIT_OPTIONS`: ``cycle``, ``increment`` or ``backfill``), and the machine's class-data archive
    (:mod:`sluice.core.class_data`) when it has one. Takes effect only when this process starts the driver
    JVM; a spark-submit run needs the same setting as one of spark-submit's ``--conf``. Left out when the user
    configured the driver's Java options (PYSPARK_SUBMIT_ARGS) or Spark's logging (a log4j2.properties in
    SPARK_CONF_DIR)."""
    conf_dir = os.environ.get("SPARK_CONF_DIR")
    if "extraJavaOptions" in _submit_conf() or (conf_dir and (Path(conf_dir) / "log4j2.properties").is_file()):
        return {}
    if work not in JIT_OPTIONS:
        raise ValueError(f"unknown kind of run {work!r}: use one of {', '.join(JIT_OPTIONS)}")
    options = [f"-Dlog4j2.configurationFile={LOG4J2_PROPERTIES.as_uri()}", JIT_OPTIONS[work], *java_options()]
    return {"spark.driver.extraJavaOptions": " ".join(options)}


def _submit_conf() -> str:
    return os.environ.get("PYSPARK_SUBMIT_ARGS", "") + " ".join(sys.argv)


def spark_conf(settings: Settings) -> dict[str, str]:
    """The Spark settings sluice relies on. Each one is here for a reason:"""
    return {
        # Event time is UTC end to end; never let the JVM's zone leak into windows or partitions.
        "spark.sql.session.timeZone": "UTC",
        # Delta readers (delta-rs, DuckDB/delta-kernel) expect INT64 micros, not Spark's legacy INT96.
        "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
        "spark.sql.shuffle.partitions": str(settings.shuffle_partitions),
        # Spark records the provider in a query's checkpoint and keeps it on restart, whatever this says.
        "spark.sql.streaming.stateStore.providerClass": STATE_STORE_PROVIDERS[settings.state_store],
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        # Deterministic output file names/partitioning matter less than never writing _SUCCESS files
        # into table directories.
        "spark.hadoop.mapreduce.fileoutputcommitter.marksuccessfuljobs": "false",
        "spark.sql.sources.partitionOverwriteMode": "static",
        "spark.driver.memory": settings.driver_memory,
        # The executors' heap on a cluster: a shuffle partition of a catch-up's micro-batch is cached there.
        **({"spark.executor.memory": settings.executor_memory} if settings.executor_memory else {}),
        # Ingest parses each line once as a VARIANT. A key given twice takes its last value, as Spark's
        # from_json does, instead of making the line malformed.
        "spark.sql.variant.allowDuplicateKeys": "true",
        # The landing file source lists the files of each micro-batch, and on every restart those of the
        # checkpoint's last batch again (Spark's recovery of a file source). Above 32 paths that listing is
        # a Spark job with one task per file by default: 2.4 s on local[2] for the cycle after a 672-file
        # catch-up batch, for what is I/O on a handful of directories. A few listing tasks are enough.
        "spark.sql.sources.parallelPartitionDiscovery.parallelism": str(LISTING_TASKS),
        # Spark keeps the classes it generates for plans (Janino-compiled, then JIT-compiled by the JVM) in a
        # cache of 100 by default. One cycle generates 200-300 (ingest's micro-batches, the aggregate, Delta's
        # commits), so the cache turned over within a cycle and the same code was compiled again and again.
        "spark.sql.codegen.cache.maxEntries": str(CODEGEN_CACHE_ENTRIES),
        # Ingest caches each micro-batch's parsed lines (read by dedup, the per-file counts and three writes) for
        # the few seconds of the batch. Compressing that cache cost more than it saved: building it took 5.6 s
        # per 1M lines compressed and 3.6 s uncompressed (local[2]; bench/README). Past memory, it spills to disk.
        "spark.sql.inMemoryColumnarStorage.compressed": "false",
        **delta_conf(settings),
        # A root on object storage (SPEC 1): s3:// URIs through Hadoop's S3A, with the standard AWS settings.
        **(settings.lake.credentials.spark_conf() if on_object_storage(settings) else {}),
    }


def on_object_storage(settings: Settings) -> bool:
    """Whether the lake or the landing zone is on object storage (then Spark needs the s3a file system)."""
    return _any_on_object_storage(settings.lake.root, settings.landing)


def delta_conf(settings: Settings | None = None) -> dict[str, str]:
    """Delta Lake's connector (delta-spark) in every session: its pinned jars from the machine's cache
    (``make setup`` fetched them; :class:`sluice.core.jars.MissingJarsError` names that command when they
    are missing), and its SQL extension and catalog, so that ``format("delta")``, ``DeltaTable.forPath``
    and ``delta.`<uri>``` SQL all work in sluice's sessions as in any Spark shop's. The spark-submit tasks
    of the DAGs pass the same jars with ``--jars`` (:func:`delta_jars`).

    On a cluster whose workers hold the jars themselves (``executor_jars``), the driver ships none: the
    executors load them from that folder and the driver from its own cache, each with its ``extraClassPath``
    (the DAGs' spark-submit tasks pass ``--driver-class-path``)."""
    return {
        **jars_conf(settings),
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        # Delta replays a table's log with this many tasks (default 50): sluice's tables have short logs
        # that it checkpoints, and 50 tasks per snapshot cost seconds per operation on a few cores.
        "spark.databricks.delta.snapshotPartitions": "2",
    }


def _jar_sets(settings: Settings | None) -> tuple[str, ...]:
    """Delta's always; s3a's when a root is on object storage; Spark's Kafka source when a stream reads a topic
    or Kafka's servers are configured (a session of a platform with a ``kafka_default`` connection)."""
    if settings is None:
        return ("delta",)
    kafka = bool(settings.kafka.get("bootstrap.servers")) or any(
        spec.source is not None for spec in settings.streams.values())
    return ("delta", *(("s3",) if on_object_storage(settings) else ()), *(("kafka",) if kafka else ()))


def _cached_jars(settings: Settings | None) -> list[str]:
    from sluice.core.jars import jar_paths

    return [str(p) for p in jar_paths(_jar_sets(settings))]


def delta_jars(settings: Settings | None = None) -> str:
    """Delta's jars, and the s3a file system's when ``settings`` put a root on object storage."""
    return ",".join(_cached_jars(settings))


def sluice_jars() -> str:
    """sluice's own jar (:mod:`sluice.core.line_scan`), when ``make setup`` built it: shipped with the pinned jars
    (``spark.jars``/``--jars``). Not to workers that hold the pinned jars themselves (``executor_jars``): nothing is
    shipped to those, and the line reader is not used there."""
    jar = line_scan.built_jar()
    return str(jar) if jar is not None else ""


def driver_class_path(settings: Settings) -> str:
    """The same jars as a class path (``--driver-class-path``, ``spark.driver.extraClassPath``)."""
    return os.pathsep.join(_cached_jars(settings))


def executor_class_path(settings: Settings) -> str | None:
    """Where the executors find the jars on their own disk (``executor_jars``), or None: the driver ships them."""
    if not settings.executor_jars:
        return None
    from sluice.core.jars import locked

    return os.pathsep.join(f"{settings.executor_jars}/{jar.repo_path}" for jar in locked(_jar_sets(settings)))


def jars_conf(settings: Settings | None) -> dict[str, str]:
    """How the jars reach the driver and the executors: shipped (``spark.jars``), or on each side's class path
    when the workers hold them (:func:`executor_class_path`)."""
    on_workers = executor_class_path(settings) if settings is not None else None
    if settings is None or on_workers is None:
        return {"spark.jars": ",".join(filter(None, (delta_jars(settings), sluice_jars())))}
    # Nothing is shipped to workers that hold the jars, sluice's own jar included: it is built per machine, so
    # the driver does not have it on its class path either, and every line takes the VARIANT path.
    return {"spark.driver.extraClassPath": driver_class_path(settings), "spark.executor.extraClassPath": on_workers}


# The state store providers behind Settings.state_store. sluice's state is small and bounded by the watermark
# (open windows, the join's bound of records): in memory, a micro-batch on local[2] costs about 5 s less than
# with RocksDB, which opens, commits and snapshots one native instance per operator and partition.
STATE_STORE_PROVIDERS = {
    "hdfs": "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider",
    "rocksdb": "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
}

# Tasks of a file-listing job (Spark's default is one per path, up to 10,000): enough to list an object
# store's files in parallel on a cluster, few enough that scheduling them costs nothing on two cores.
LISTING_TASKS = 8

# Generated classes Spark keeps for reuse (its default is 100). Measured on the two-stream scenarios of
# tests/streaming/test_randomized.py in one session: 8 cycles compiled 1287 classes with the default and 391
# with this, and the cycles after the first took 25-35% less time. The classes are small (tens of KB each).
CODEGEN_CACHE_ENTRIES = 2000
