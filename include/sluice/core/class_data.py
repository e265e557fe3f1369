"""Class-data sharing for the driver JVM that sluice starts: an archive of the classes a sluice run loads,
built once per checkout by ``make setup`` (``python -m sluice.cli.class_data build``, which trains it).

Why: a ``sluice run`` process spends much of its life loading and verifying the same ~20,000 classes of Spark,
its SQL engine and Delta before it does any work. A scheduled cycle is a short process, started every few
minutes, so that cost is paid on every run. Java 17's dynamic class-data sharing (JEP 350) maps the classes a
previous run loaded from one archive instead: on the 2-core machine of bench/README, a fresh process that
starts Spark, writes and reads a small Delta table took 15 s without the archive and 11 s with it.

The archive is only an accelerator. It is keyed by everything its classes come from (the Java runtime,
PySpark's jars and where they lie, the delta jars of ``jars.lock``), so a changed install or another
checkout looks for an archive of its own and runs without one until its ``make setup`` builds it. The JVM
itself checks the class path an archive was written with and ignores one that does not match, silently
(``-Xlog:cds=off``: nothing on stdout, where ``--json`` output goes). Delete the ``class-data`` folder of
the jar cache to go without it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from sluice.core.jars import cache_dir, locked

# The training run names the archive to write here; the JVM writes it when it exits.
DUMP_ENV = "SLUICE_CLASS_DATA_DUMP"
# The JVM reports a mismatched or unreadable archive on stdout; it then runs without it, which is all we want.
QUIET = "-Xlog:cds=off,cds+dynamic=off"


def _java() -> Path | None:
    """The ``java`` that Spark's launcher runs: ``$JAVA_HOME/bin/java``, else the one on the PATH."""
    home = os.environ.get("JAVA_HOME")
    found = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    return Path(found).resolve() if found and Path(found).exists() else None


# What the training run does; bumped when it loads other classes, so that every machine trains again.
# 2: delta-spark writes every table Spark writes (the retired delta-rs engine loaded none of its writer).
TRAINING = 2


def archive_key() -> str | None:
    """What the archived classes come from, hashed: the Java runtime, PySpark's jars (where they lie, their sizes
    and modification times), the locked jars that sessions put on Spark's classpath (``jars.lock``'s delta set)
    and the training (:data:`TRAINING`). None without a Java runtime."""
    import pyspark

    java = _java()
    if java is None:
        return None
    digest = hashlib.sha256()
    stat = java.stat()
    digest.update(f"{java}|{stat.st_size}|{stat.st_mtime_ns}|{pyspark.__version__}|{TRAINING}\n".encode())
    # The JVM checks the class path an archive was written with, so where PySpark lies is part of the key: a
    # second checkout on the machine, with a venv of its own, gets an archive of its own.
    spark_jars = Path(pyspark.__file__).resolve().parent / "jars"
    digest.update(f"{spark_jars}\n".encode())
    # The JVM maps an archive only into a class path whose jars have the sizes and modification times it was
    # written with, so those are part of the key too: a venv made again in the same place (same jars, new
    # times) gets a new archive instead of one that the JVM would silently ignore.
    for jar in sorted(spark_jars.glob("*.jar")) if spark_jars.is_dir() else []:
        jar_stat = jar.stat()
        digest.update(f"{jar.name}|{jar_stat.st_size}|{jar_stat.st_mtime_ns}\n".encode())
    for pinned in locked(("delta",)):  # the locked jars on Spark's classpath
        digest.update(f"{pinned.coordinate}|{pinned.sha256}\n".encode())
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
