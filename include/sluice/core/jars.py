"""The JVM jars Spark runs with: pinned in ``jars.lock`` beside this module, fetched once per machine.

``make setup`` runs ``python -m sluice.core.jars fetch``: every jar of the lock is downloaded from Maven
Central (``SLUICE_MAVEN_REPO`` overrides the address, for a company mirror), checked against its pinned
sha256 and kept in a cache shared by every checkout on the machine (``SLUICE_JARS_DIR``, default
``~/.cache/sluice/jars``, laid out as a Maven repository). Spark sessions then put the cached files on the
classpath with ``spark.jars``: no resolution at start-up, no network.

Standard library only, so that the docker images can run this file before sluice is installed::

    python3 /opt/jars/jars.py fetch --set delta
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import sys
import tempfile
import urllib.request
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

LOCK = Path(__file__).with_name("jars.lock")
MAVEN_CENTRAL = "https://repo1.maven.org/maven2"
FETCH_COMMAND = "make setup"
# The same, for a user who installed sluice without the Makefile.
FETCH_MODULE = "python -m sluice.core.jars fetch"


@dataclass(frozen=True)
class Jar:
    set: str
    group: str
    artifact: str
    version: str
    sha256: str
    classifier: str = ""  # e.g. jar-with-dependencies

    @property
    def coordinate(self) -> str:
        return ":".join(filter(None, (self.group, self.artifact, self.version, self.classifier)))

    @property
    def file_name(self) -> str:
        return f"{self.artifact}-{self.version}{'-' + self.classifier if self.classifier else ''}.jar"

    @property
    def repo_path(self) -> str:
        """Where Maven keeps it: ``io/delta/delta-storage/4.4.0/delta-storage-4.4.0.jar``."""
        return f"{self.group.replace('.', '/')}/{self.artifact}/{self.version}/{self.file_name}"


class MissingJarsError(RuntimeError):
    """A pinned jar is not in the cache (or its content is not the pinned one)."""


def locked(sets: Iterable[str] | None = None, lock: Path = LOCK) -> list[Jar]:
    """The lock's jars, in its order; only those of ``sets`` when given."""
    jars = []
    for number, line in enumerate(lock.read_text().splitlines(), 1):
        fields = line.split("#", 1)[0].split()
        if not fields:
            continue
        if len(fields) != 3 or fields[1].count(":") not in (2, 3) or len(fields[2]) != 64:
            raise ValueError(f"{lock}:{number}: expected '<set> <group:artifact:version[:classifier]> <sha256>', "
                             f"got {line!r}")
        group, artifact, version, *classifier = fields[1].split(":")
        jars.append(Jar(fields[0], group, artifact, version, fields[2].lower(), *classifier))
    wanted = None if sets is None else set(sets)
    if wanted is not None and (unknown := wanted - {j.set for j in jars}):
        raise ValueError(f"no jar set {sorted(unknown)} in {lock}; sets: {sorted({j.set for j in jars})}")
    return [j for j in jars if wanted is None or j.set in wanted]


def cache_dir() -> Path:
    explicit = os.environ.get("SLUICE_JARS_DIR")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "sluice" / "jars"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def jar_paths(sets: Sequence[str] = ("delta",), cache: Path | None = None, lock: Path = LOCK) -> list[Path]:
    """The cached files of ``sets``, for ``spark.jars``. Checks presence only (hashing 690 MB at every Spark
    start would cost seconds): ``fetch`` verified the content when it wrote each file."""
    root = cache or cache_dir()
    jars = locked(sets, lock)
    missing = [j for j in jars if not (root / j.repo_path).is_file()]
    if missing:
        names = ", ".join(j.coordinate for j in missing)
        raise MissingJarsError(
            f"Spark needs jars that are not fetched yet ({names}; looked in {root}, SLUICE_JARS_DIR). "
            f"Run `{FETCH_COMMAND}` in the sluice checkout (or `{FETCH_MODULE}`) once on this machine."
        )
    return [root / j.repo_path for j in jars]


def fetch(sets: Sequence[str] | None = None, cache: Path | None = None, into: Path | None = None,
          repo: str | None = None, lock: Path = LOCK, out: TextIO = sys.stderr) -> list[Path]:
    """Download the jars of ``sets`` (default: all) that the cache lacks, verify each against the lock and
    move it into place atomically; with ``into``, also copy them flat into that folder (a Spark image's
    ``jars/``). Idempotent: a verified jar is never fetched twice."""
    root = cache or cache_dir()
    base = (repo or os.environ.get("SLUICE_MAVEN_REPO") or MAVEN_CENTRAL).rstrip("/")
    done = []
    for jar in locked(sets, lock):
        target = root / jar.repo_path
        if not target.is_file() or _sha256(target) != jar.sha256:
            target.parent.mkdir(parents=True, exist_ok=True)
            url = f"{base}/{jar.repo_path}"
            print(f"fetching {jar.coordinate} from {base}", file=out)
            fd, tmp = tempfile.mkstemp(dir=target.parent, suffix=".part")
            try:
                with os.fdopen(fd, "wb") as f, urllib.request.urlopen(url, timeout=120) as response:
                    while block := response.read(1 << 20):
                        f.write(block)
                got = _sha256(Path(tmp))
                if got != jar.sha256:
                    raise MissingJarsError(f"{url} has sha256 {got}, but jars.lock pins {jar.sha256}: refusing it")
                # mkstemp makes the file 0600; a cache shared by several users (an image's) must be readable.
                os.chmod(tmp, 0o644)
                os.replace(tmp, target)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        if into is not None:
            into.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(target, into / jar.file_name)
        done.append(target)
    return done


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sluice.core.jars", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    get = commands.add_parser("fetch", help="download the pinned jars into the cache (idempotent)")
    get.add_argument("--set", action="append", dest="sets", help="only this set of jars.lock (repeatable)")
    get.add_argument("--into", type=Path, help="also copy them into this folder (a Spark image's jars/)")
    show = commands.add_parser("paths", help="print the cached jars' paths, comma-separated (for --jars)")
    show.add_argument("--set", action="append", dest="sets", help="only this set (default: delta)")
    args = parser.parse_args(argv)
    try:
        if args.command == "fetch":
            paths = fetch(args.sets, into=args.into)
            print(f"{len(paths)} jar(s) in {cache_dir()}", file=sys.stderr)
        else:
            print(",".join(str(p) for p in jar_paths(args.sets or ("delta",))))
    except (MissingJarsError, OSError, ValueError) as exc:
        print(f"ERROR: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
