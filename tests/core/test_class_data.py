"""The driver JVM's class-data archive (sluice.core.class_data): used when this machine's matches, never a
stale one, and the one ``make setup`` built really maps into a JVM that Spark's launcher starts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sluice.core import class_data
from sluice.core.jars import cache_dir
from sluice.runtime import spark as sluice_spark


@pytest.fixture
def empty_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setenv("SLUICE_JARS_DIR", str(tmp_path / "jars"))
    monkeypatch.delenv(class_data.DUMP_ENV, raising=False)
    monkeypatch.delenv("SPARK_CONF_DIR", raising=False)
    monkeypatch.delenv("PYSPARK_SUBMIT_ARGS", raising=False)
    return tmp_path / "jars"


def test_without_an_archive_the_driver_gets_only_sluices_logging(empty_cache: Path) -> None:
    assert class_data.java_options() == []
    option = sluice_spark.log_conf()["spark.driver.extraJavaOptions"]
    jit = sluice_spark.JIT_OPTIONS["cycle"]
    assert option == f"-Dlog4j2.configurationFile={sluice_spark.LOG4J2_PROPERTIES.as_uri()} {jit}"


def test_the_archive_of_this_install_is_mapped_quietly_and_one_of_another_java_is_not(
    empty_cache: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    path = class_data.archive_path()
    assert path is not None and path.parent == empty_cache / "class-data"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"archive")
    options = sluice_spark.log_conf()["spark.driver.extraJavaOptions"].split()
    # -Xlog:cds=off: a JVM that cannot use the archive says so on stdout, where `sluice ... --json` writes.
    assert options[-2:] == [f"-XX:SharedArchiveFile={path}", class_data.QUIET]

    # Another Java runtime (an upgrade of the JDK) has another key: the old archive is not offered to it.
    other = tmp_path / "jdk" / "bin" / "java"
    other.parent.mkdir(parents=True)
    other.write_text("#!/bin/sh\n")
    other.chmod(0o755)
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jdk"))
    assert class_data.archive_path() != path
    assert class_data.java_options() == []


def test_a_venv_made_again_in_the_same_place_gets_an_archive_of_its_own(
    empty_cache: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The JVM ignores an archive whose class path jars changed their modification time, silently: a venv
    removed and made again where it was (same jars, new times) must not be offered the old one."""
    import pyspark

    package = tmp_path / "venv" / "pyspark"
    (package / "jars").mkdir(parents=True)
    jar = package / "jars" / "spark-core.jar"
    jar.write_bytes(b"jar")
    os.utime(jar, ns=(1_700_000_000_000_000_000, 1_700_000_000_000_000_000))
    monkeypatch.setattr(pyspark, "__file__", str(package / "__init__.py"))
    first = class_data.archive_path()
    os.utime(jar, ns=(1_800_000_000_000_000_000, 1_800_000_000_000_000_000))
    assert class_data.archive_path() != first


def test_the_training_run_writes_the_archive_it_is_told_to(empty_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(class_data.DUMP_ENV, "/tmp/x.jsa")
    assert class_data.java_options() == ["-XX:ArchiveClassesAtExit=/tmp/x.jsa", class_data.QUIET]


@pytest.mark.spark
@pytest.mark.slow
def test_the_archive_make_setup_built_maps_into_a_jvm_that_sparks_launcher_starts(tmp_path: Path) -> None:
    """-Xshare:on makes the JVM refuse to start when it cannot map the archive (another class path, another
    Java): so a Spark session that starts and runs a job with it proves the archive fits Spark's launcher."""
    path = class_data.archive_path(cache_dir())
    assert path is not None and path.is_file(), f"no class-data archive at {path}: run `make setup`"
    script = (
        "from pyspark.sql import SparkSession\n"
        "s = SparkSession.builder.master('local[1]').config('spark.ui.enabled', 'false').getOrCreate()\n"
        "print('rows', s.range(3).count())\n"
    )
    env = {**os.environ,
           "PYSPARK_SUBMIT_ARGS": f"--conf 'spark.driver.extraJavaOptions=-XX:SharedArchiveFile={path} -Xshare:on' "
                                  "pyspark-shell"}
    done = subprocess.run([sys.executable, "-c", script], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0 and "rows 3" in done.stdout, done.stdout[-2000:] + done.stderr[-3000:]
