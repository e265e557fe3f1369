"""Download the Data Docs assets sluice vendors again from npm and check them against their MANIFEST.

``include/sluice/quality/docs_static/`` holds the files Great Expectations' Data Docs pages would load from
CDNs (see ``sluice.quality.docs_assets``); ``MANIFEST.json`` there lists, per npm package and version, the
tarball, its integrity and every file taken from it with its sha256. This script makes that copy
reproducible. It needs registry.npmjs.org and is run by hand (neither ``make setup`` nor CI runs it):

    python tools/fetch_docs_assets.py            # download, verify every sha256, (re)write the files
    python tools/fetch_docs_assets.py --check    # download and compare with the vendored files; write nothing
    python tools/fetch_docs_assets.py --update   # after editing a version or a file list in the MANIFEST:
                                                 # resolve tarballs anew, write the files, record their sha256

A file marked ``"from_tarball": false`` (a licence the tarball lacks) is not downloaded: it is checked (or,
with ``--update``, hashed) as it stands.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import io
import json
import sys
import tarfile
import urllib.request
from pathlib import Path
from typing import Any

STATIC = Path(__file__).resolve().parents[1] / "include" / "sluice" / "quality" / "docs_static"
MANIFEST = STATIC / "MANIFEST.json"
REGISTRY = "https://registry.npmjs.org"


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=120) as response:
        data: bytes = response.read()
    return data


def _resolve(package: dict[str, Any]) -> None:
    """Fill in the tarball address and integrity of ``name@version`` from the registry."""
    meta = json.loads(_get(f"{REGISTRY}/{package['name'].replace('/', '%2F')}/{package['version']}"))
    package["tarball"] = meta["dist"]["tarball"]
    package["integrity"] = meta["dist"]["integrity"]


def _tarball(package: dict[str, Any]) -> tarfile.TarFile:
    data = _get(package["tarball"])
    algorithm, _, expected = package["integrity"].partition("-")
    actual = base64.b64encode(hashlib.new(algorithm, data).digest()).decode()
    if actual != expected:
        raise SystemExit(f"{package['tarball']}: integrity {algorithm}-{actual} is not the MANIFEST's")
    return tarfile.open(fileobj=io.BytesIO(data), mode="r:gz")


def _member(tar: tarfile.TarFile, path: str, label: str) -> bytes:
    # npm tarballs keep everything under one top folder, nearly always "package/".
    for member in tar.getmembers():
        if member.isfile() and member.name.partition("/")[2] == path:
            extracted = tar.extractfile(member)
            assert extracted is not None
            return extracted.read()
    raise SystemExit(f"{path} is not in the tarball of {label}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="compare with the vendored files, write nothing")
    mode.add_argument("--update", action="store_true", help="resolve tarballs and record new sha256s")
    args = parser.parse_args(argv)

    manifest = json.loads(MANIFEST.read_text())
    problems: list[str] = []
    for package in manifest["packages"]:
        label = f"{package['name']}@{package['version']}"
        known = len(problems)
        if args.update:
            _resolve(package)
        tar = _tarball(package)
        for entry in package["files"]:
            target = STATIC / package["dir"] / entry["path"]
            if entry.get("from_tarball", True):
                data = _member(tar, entry["path"], label)
            elif target.is_file():
                data = target.read_bytes()
            else:
                problems.append(f"{target.relative_to(STATIC)}: missing (not from the tarball; see its note)")
                continue
            digest = hashlib.sha256(data).hexdigest()
            if args.update:
                entry["sha256"] = digest
            elif digest != entry["sha256"]:
                problems.append(f"{label} {entry['path']}: sha256 {digest} is not the MANIFEST's {entry['sha256']}")
                continue
            if args.check:
                if not target.is_file() or target.read_bytes() != data:
                    problems.append(f"{target.relative_to(STATIC)}: differs from {label}")
            elif not target.is_file() or target.read_bytes() != data:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data)
                print(f"wrote {target.relative_to(STATIC)}")
        print(f"{label}: {len(package['files'])} files, {'ok' if len(problems) == known else 'NOT ok'}")
    if args.update:
        MANIFEST.write_text(json.dumps(manifest, indent=2) + "\n")
        print(f"recorded the sha256s in {MANIFEST}")
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
