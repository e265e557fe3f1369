"""sluice's one piece of JVM code: ``LineScan``, the reader of the common landing line (``jvm/LineScan.java``).

Ingest types every declared field of every line (SPEC 2). Through a VARIANT that costs 5.5 s per million lines
on two cores; most lines are flat objects of strings, whole numbers, booleans and nulls, and ``LineScan`` reads
those in one pass of Jackson's streaming parser, in about 1 s (bench/README). It answers only where its answer
is the VARIANT path's, and leaves every other line to that path (:func:`sluice.ingest.parsing.parse_lines`), so
the results are the same with or without it: it is an accelerator, like the class-data archive.

``make setup`` compiles it (``python -m sluice.core.line_scan build``) against PySpark's jars with the JDK's
``javac`` into the jar cache, keyed by the source and PySpark's version. Without a ``javac`` there is no jar,
and sessions simply do not register the function. A session registers it as :data:`FUNCTION` when the jar
is on its driver's class path, and says so in :data:`REGISTERED` (a session setting that ingest reads).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from sluice.core.jars import cache_dir

SOURCE = Path(__file__).with_name("jvm") / "LineScan.java"
CLASS = "sluice.jvm.LineScan"
#: The SQL function a session registers: ``sluice_line_scan(raw, array(<json names>))`` -> array<string>.
FUNCTION = "sluice_line_scan"
#: The session setting that says the function is registered in this session.
REGISTERED = "spark.sluice.lineScan.registered"


def _pyspark_jars() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent / "jars"


def jar_path(cache: Path | None = None) -> Path:
    """Where the built jar lies: named by the source and the PySpark it was compiled against."""
    digest = hashlib.sha256(SOURCE.read_bytes())
    digest.update(importlib.metadata.version("pyspark").encode())
    return (cache or cache_dir()) / "sluice" / f"line-scan-{digest.hexdigest()[:16]}.jar"


def built_jar() -> Path | None:
    """The jar when ``make setup`` built it for this source and PySpark, else None."""
    path = jar_path()
    return path if path.is_file() else None


def _javac() -> str | None:
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "javac").is_file():
        return str(Path(home) / "bin" / "javac")
    return shutil.which("javac")


def build(out: TextIO = sys.stderr) -> Path | None:
    """Compile :data:`SOURCE` into :func:`jar_path` (kept when present); None, with a note, without ``javac``."""
    target = jar_path()
    if target.is_file():
        return target
    javac = _javac()
    if javac is None:
        print("no javac (a JDK's compiler) on this machine: ingest types lines through Spark's VARIANT only, "
              "about 4 s slower per million lines. Install openjdk-17-jdk-headless and run `make setup` again "
              "for the faster reader.", file=out)
        return None
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as work:
        classes = Path(work) / "classes"
        command = [javac, "--release", "17", "-nowarn", "-cp", str(_pyspark_jars() / "*"), "-d", str(classes),
                   str(SOURCE)]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"javac failed on {SOURCE}:\n{done.stdout}{done.stderr}")
        part = Path(work) / "line-scan.jar"
        with zipfile.ZipFile(part, "w", zipfile.ZIP_DEFLATED) as jar:
            jar.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\nCreated-By: sluice\n\n")
            for compiled in sorted(classes.rglob("*.class")):
                jar.write(compiled, compiled.relative_to(classes).as_posix())
        os.chmod(part, 0o644)
        os.replace(part, target)
    print(f"built {target.name} in {target.parent}", file=out)
    return target


def register(spark: Any) -> bool:
    """Register :data:`FUNCTION` in ``spark`` when its driver can load the class; records the answer in
    :data:`REGISTERED`. A driver started without the jar (a spark-submit whose ``--jars`` lacked it) gets
    False, and ingest takes the VARIANT path for every line."""
    from pyspark.sql.types import ArrayType, StringType

    try:
        spark.udf.registerJavaFunction(FUNCTION, CLASS, ArrayType(StringType()))
        registered = True
    except Exception:  # the class is not on the driver's class path: no accelerator, same results
        registered = False
    spark.conf.set(REGISTERED, str(registered).lower())
    return registered


def registered(spark: Any) -> bool:
    """Whether :func:`register` registered the function in this session."""
    return bool(spark.conf.get(REGISTERED, "false") == "true")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sluice.core.line_scan", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("build", help="compile the reader into the jar cache (idempotent; a note without javac)")
    commands.add_parser("path", help="print the built jar's path, or nothing when it is not built")
    args = parser.parse_args(argv)
    if args.command == "build":
        try:
            build()
        except (RuntimeError, OSError) as exc:
            print(f"ERROR: {exc}", file=sys.stderr)
            return 1
    else:
        print(built_jar() or "")
    return 0


if __name__ == "__main__":
    sys.exit(main())
