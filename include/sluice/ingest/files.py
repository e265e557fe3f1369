"""Landing files: which files of a stream's landing folder are landing files, how Spark reads them, their
identity however a path or URI spells them, whether they can be read at all, and the landing zone's object
store (SPEC 1-2)."""

from __future__ import annotations

import contextlib
import functools
import gzip
import os
import zlib
from typing import Any
from urllib.parse import quote, unquote, urlparse

from sluice.config import Settings
from sluice.core.lake import Credentials, Root
from sluice.storage.objects import ObjectStore, store_for

LANDING_GLOB = "*.{json,jsonl,json.gz,jsonl.gz}"
LANDING_SUFFIXES = (".json", ".jsonl", ".json.gz", ".jsonl.gz")
LANDING_READ_OPTIONS = {
    # An unreadable file never fails the query: it is quarantined whole before the query runs, and Spark
    # skips it (and the partial lines of a truncated .gz).
    "ignoreCorruptFiles": "true",
    # SPARK-58518 (Spark 4.2.0): when a micro-batch holds a file whose name has one of [ ] { } * ? \, Spark
    # builds the batch with every other path of the batch once more per such name, so their lines are read
    # twice or more. With a recursive lookup the file index takes each file once from its listing. It also
    # lists the files of subfolders, which are not landing files: MicroBatchIngest._process drops them.
    "recursiveFileLookup": "true",
}
def source_key(uri: str) -> str:
    """A landing file's identity however it is spelled: the local path of a local file (``file:/a/b%20c.jsonl``
    and ``/a/b c.jsonl`` -> ``/a/b c.jsonl``), ``s3://bucket/key`` with the key decoded for an object."""
    if "://" not in uri and not uri.startswith("file:"):
        return os.path.normpath(uri)  # a plain path: nothing is encoded in it ('#', '%' are name characters)
    parsed = urlparse(uri)
    if parsed.scheme in ("s3", "s3a"):
        return f"s3://{parsed.netloc}{unquote(parsed.path)}"
    return unquote(parsed.path)


def spark_path(location: str) -> str:
    """A landing file's local path or object URI as Spark's ``_metadata.file_path`` spells it: Hadoop keeps ':'
    and non-ASCII as they are and percent-encodes the rest of what a URI cannot hold (space, '%', '#')."""
    safe = "/:@!$&'()*+,;=-._~"

    def encode(text: str) -> str:
        return "".join(c if ord(c) > 127 else quote(c, safe=safe) for c in text)

    if location.startswith(("s3://", "s3a://")):
        bucket, _, key = location.split("://", 1)[1].partition("/")
        return f"s3://{bucket}/{encode(key)}"
    return "file:" + encode(os.path.abspath(location))


def probe_file(location: str, credentials: Credentials | None = None) -> str | None:
    """Why a landing file (a local path or an ``s3://`` URI) cannot be read, or None when it can. A gzip file
    is decompressed to its end, because a truncated or corrupt member only shows there. Runs on executors
    (see ``StreamIngest._probe``), which reach an object with ``credentials``."""
    try:
        with _open_landing(location, credentials) as raw:
            if location.endswith(".gz"):
                with gzip.GzipFile(fileobj=raw) as fh:
                    while fh.read(1 << 20):
                        pass
            else:
                raw.read(1)
    except (OSError, EOFError, zlib.error) as exc:
        return f"{type(exc).__name__}: {exc}"
    except Exception as exc:  # an object store's refusal (botocore's ClientError: no such key, access denied)
        if type(exc).__module__.startswith("botocore"):
            return f"{type(exc).__name__}: {exc}"
        raise
    return None


def _open_landing(location: str, credentials: Credentials | None) -> Any:
    if not location.startswith(("s3://", "s3a://")):
        return open(location, "rb")
    bucket, _, key = location.split("://", 1)[1].partition("/")
    client = (credentials or Credentials.from_env()).boto3_client()
    return contextlib.closing(client.get_object(Bucket=bucket, Key=key)["Body"])


@functools.cache
def _landing_store(root: Root, credentials: Credentials) -> ObjectStore:
    return store_for(root, credentials)


def landing_store(settings: Settings) -> ObjectStore:
    """The landing zone's objects: its folder, or its bucket and prefix (SPEC 1)."""
    return _landing_store(settings.landing, settings.lake.credentials)
