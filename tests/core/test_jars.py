"""The pinned jars: one lock, fetched once into a cache from a (real, local) Maven repository, verified, and a
clear error naming the fix when Spark would start without them."""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sluice.core import jars
from support.servers import serve_directory

REPO = Path(__file__).resolve().parents[2]


def _repository(tmp_path: Path, content: bytes = b"PK fake jar") -> tuple[Path, Path]:
    """A Maven repository with one jar, and a lock that pins it."""
    maven = tmp_path / "maven"
    jar = maven / "org/example/thing_2.13/1.2.3/thing_2.13-1.2.3.jar"
    jar.parent.mkdir(parents=True)
    jar.write_bytes(content)
    lock = tmp_path / "jars.lock"
    lock.write_text(
        "# a comment\n\n"
        f"delta  org.example:thing_2.13:1.2.3  {hashlib.sha256(content).hexdigest()}  # trailing note\n"
    )
    return maven, lock


def test_fetch_downloads_verifies_and_then_never_fetches_again(tmp_path: Path) -> None:
    maven, lock = _repository(tmp_path)
    cache = tmp_path / "cache"
    with serve_directory(maven) as server:
        (first,) = jars.fetch(cache=cache, repo=server.url, lock=lock)
        assert first == cache / "org/example/thing_2.13/1.2.3/thing_2.13-1.2.3.jar"
        assert first.read_bytes() == b"PK fake jar"
        assert server.paths == ["/org/example/thing_2.13/1.2.3/thing_2.13-1.2.3.jar"]
        # Spark starts offline from here: a second fetch asks the repository nothing.
        assert jars.fetch(cache=cache, repo=server.url, lock=lock) == [first]
        assert len(server.paths) == 1
        assert jars.jar_paths(cache=cache, lock=lock) == [first]
        # --into: a flat copy, as a Spark image's jars/ wants them.
        jars.fetch(cache=cache, repo=server.url, lock=lock, into=tmp_path / "flat")
        assert (tmp_path / "flat/thing_2.13-1.2.3.jar").read_bytes() == b"PK fake jar"


def test_fetch_refuses_content_that_is_not_the_pinned_one(tmp_path: Path) -> None:
    maven, lock = _repository(tmp_path)
    (maven / "org/example/thing_2.13/1.2.3/thing_2.13-1.2.3.jar").write_bytes(b"tampered")
    cache = tmp_path / "cache"
    with serve_directory(maven) as server, pytest.raises(jars.MissingJarsError, match="refusing it"):
        jars.fetch(cache=cache, repo=server.url, lock=lock)
    assert not list(cache.rglob("*.jar")) and not list(cache.rglob("*.part"))


def test_a_missing_jar_is_one_error_naming_the_command_that_fetches_it(tmp_path: Path) -> None:
    _maven, lock = _repository(tmp_path)
    with pytest.raises(jars.MissingJarsError) as excinfo:
        jars.jar_paths(cache=tmp_path / "empty", lock=lock)
    message = str(excinfo.value)
    assert "org.example:thing_2.13:1.2.3" in message and "make setup" in message
    assert str(tmp_path / "empty") in message
    # The CLI says the same in one line, exit 1, no traceback.
    done = subprocess.run([sys.executable, "-m", "sluice.core.jars", "paths"], capture_output=True, text=True,
                          env={"SLUICE_JARS_DIR": str(tmp_path / "empty"), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 1
    assert done.stderr.startswith("ERROR: Spark needs jars that are not fetched yet") and "make setup" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_lock_pins_the_delta_build_for_the_spark_that_requirements_pin() -> None:
    """The versions live in one place: the lock's delta-spark is built for the pinned pyspark's minor, its
    release is the PyPI delta-spark that requirements.txt pins, and hadoop-aws matches the wheel's Hadoop."""
    pins = dict(re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)$", (REPO / "requirements.txt").read_text(), re.M))
    delta = {j.artifact: j for j in jars.locked(["delta"])}
    spark_minor = ".".join(pins["pyspark"].split(".")[:2])
    connector = delta[f"delta-spark_{spark_minor}_2.13"]
    assert connector.version == pins["delta-spark"] == delta["delta-storage"].version
    import pyspark

    wheel_hadoop = {p.name for p in (Path(pyspark.__file__).parent / "jars").glob("hadoop-client-api-*.jar")}
    (aws,) = [j for j in jars.locked(["s3"]) if j.artifact == "hadoop-aws"]
    assert wheel_hadoop == {f"hadoop-client-api-{aws.version}.jar"}


def test_every_spark_session_carries_the_delta_connector(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from delta.tables import DeltaTable

    # A worker's session may have been started first by an object-storage test, with the s3 jars beside Delta's.
    carried = [Path(p) for p in spark.conf.get("spark.jars").split(",")]
    assert set(jars.jar_paths(("delta",))) <= set(carried), carried
    spark.range(3).write.format("delta").save(str(tmp_path / "t"))
    (commit,) = DeltaTable.forPath(spark, str(tmp_path / "t")).history().collect()
    (connector,) = [j for j in jars.locked(["delta"]) if j.artifact.startswith("delta-spark")]
    assert f"Delta-Lake/{connector.version}" in commit["engineInfo"], commit["engineInfo"]
