"""The driver's own objects under a root: state documents, landing listings, put-if-absent.

One protocol, :class:`ObjectStore`, over a local folder (:class:`LocalStore`) and an S3 prefix
(:class:`S3Store`). Keys are ``/``-separated and relative to the root. What each operation promises on both:

* ``get`` reads a whole object; ``None`` when there is none.
* ``put`` replaces a whole object: a reader sees the old bytes or the new ones, never a mix (an S3 PUT is
  atomic; locally the bytes go to a temporary file that is renamed over the old one).
* ``create`` writes only when the key does not exist yet (``If-None-Match: *`` on S3; locally a hard link to a
  temporary file that already holds all the bytes), so of several writers exactly one wins, and a reader never
  sees the winner's object half written.
* ``list`` yields the objects directly in a folder, with their ``LastModified`` (S3) or mtime (local), page by
  page: a folder with 100,000 objects never sits in memory as one response.
* ``folders`` yields the names of a folder's subfolders (S3's common prefixes), to find the lake's tables.
* ``walk`` yields the key of every object under a folder, at any depth (Great Expectations' stores list
  theirs so).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from sluice.core.lake import Credentials, Root

PAGE_SIZE = 1000  # S3's own maximum per ListObjectsV2 page


@dataclass(frozen=True)
class ObjectInfo:
    name: str  # the last part of the key: the file name
    key: str  # relative to the store's root
    size: int
    modified: datetime  # UTC: LastModified on S3, the mtime locally
    uri: str  # what Spark and delta-rs read


class ObjectStore(Protocol):
    root: Root

    def get(self, key: str) -> bytes | None: ...

    def put(self, key: str, data: bytes) -> None: ...

    def create(self, key: str, data: bytes) -> bool: ...

    def delete(self, key: str) -> None: ...

    def list(self, folder: str) -> Iterator[ObjectInfo]: ...

    def folders(self, folder: str) -> Iterator[str]: ...

    def walk(self, folder: str) -> Iterator[str]: ...

    def delete_folder(self, folder: str) -> int: ...


class LocalStore:
    def __init__(self, root: Root) -> None:
        self.root = root

    def _path(self, key: str) -> Path:
        return self.root.local(key)

    def get(self, key: str) -> bytes | None:
        try:
            return self._path(key).read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            return None

    def _temporary(self, path: Path, data: bytes) -> Path:
        """``data`` in a new file beside ``path``, on disk: what put and create move or link into place."""
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(handle, "wb") as out:
                out.write(data)
                out.flush()
                os.fsync(out.fileno())
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
        return Path(temporary)

    def put(self, key: str, data: bytes) -> None:
        temporary = self._temporary(self._path(key), data)
        try:
            os.replace(temporary, self._path(key))
        except BaseException:
            temporary.unlink(missing_ok=True)
            raise

    def create(self, key: str, data: bytes) -> bool:
        # Written whole under a temporary name, then hard-linked to the key: link() fails when the key exists,
        # as O_EXCL would, but a reader never sees the winner's object before its bytes are there (with O_EXCL
        # the file exists, empty, until the write lands).
        temporary = self._temporary(self._path(key), data)
        try:
            os.link(temporary, self._path(key))
        except FileExistsError:
            return False
        finally:
            temporary.unlink(missing_ok=True)
        return True

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def list(self, folder: str) -> Iterator[ObjectInfo]:
        base = self._path(folder)
        try:
            entries = os.scandir(base)
        except (FileNotFoundError, NotADirectoryError):
            return
        with entries:
            for entry in entries:
                if not entry.is_file():
                    continue
                stat = entry.stat()
                key = f"{folder.strip('/')}/{entry.name}" if folder.strip("/") else entry.name
                yield ObjectInfo(entry.name, key, stat.st_size, datetime.fromtimestamp(stat.st_mtime, tz=UTC),
                                 os.path.join(base, entry.name))

    def folders(self, folder: str) -> Iterator[str]:
        try:
            entries = os.scandir(self._path(folder))
        except (FileNotFoundError, NotADirectoryError):
            return
        with entries:
            yield from sorted(entry.name for entry in entries if entry.is_dir())

    def walk(self, folder: str) -> Iterator[str]:
        base = self._path(folder)
        for parent, _subfolders, files in os.walk(base):
            for name in files:
                yield Path(parent, name).relative_to(self.root.local()).as_posix()

    def delete_folder(self, folder: str) -> int:
        """Delete the folder and everything under it; the number of files deleted (0: there was none)."""
        files = sum(1 for _ in self.walk(folder))
        shutil.rmtree(self._path(folder), ignore_errors=True)
        return files


class S3Store:
    def __init__(self, root: Root, client: Any, *, page_size: int = PAGE_SIZE) -> None:
        self.root = root
        self.client = client
        self.page_size = page_size

    def get(self, key: str) -> bytes | None:
        try:
            body: bytes = self.client.get_object(Bucket=self.root.bucket, Key=self.root.key(key))["Body"].read()
        except self.client.exceptions.NoSuchKey:
            return None
        return body

    def put(self, key: str, data: bytes) -> None:
        self.client.put_object(Bucket=self.root.bucket, Key=self.root.key(key), Body=data)

    def create(self, key: str, data: bytes) -> bool:
        try:
            self.client.put_object(Bucket=self.root.bucket, Key=self.root.key(key), Body=data, IfNoneMatch="*")
        except self.client.exceptions.ClientError as exc:
            # 412: it exists. 409: a concurrent create of the same key is in flight (S3 asks to retry).
            if exc.response.get("Error", {}).get("Code") in ("PreconditionFailed", "ConditionalRequestConflict"):
                return False
            raise
        return True

    def delete(self, key: str) -> None:
        self.client.delete_object(Bucket=self.root.bucket, Key=self.root.key(key))

    def list(self, folder: str) -> Iterator[ObjectInfo]:
        # Delimiter: the folder's own objects only, as a local listing of one folder has them.
        prefix = self.root.key(folder).rstrip("/") + "/" if self.root.key(folder) else ""
        for page in self._pages(folder):
            for item in page.get("Contents", []):
                name = item["Key"][len(prefix):]
                relative = self._relative(item["Key"])
                yield ObjectInfo(name, relative, int(item["Size"]), item["LastModified"].astimezone(UTC),
                                 f"s3://{self.root.bucket}/{item['Key']}")

    def folders(self, folder: str) -> Iterator[str]:
        for page in self._pages(folder):
            for common in page.get("CommonPrefixes", []):
                yield common["Prefix"].rstrip("/").rsplit("/", 1)[-1]

    def walk(self, folder: str) -> Iterator[str]:
        for page in self._pages(folder, nested=True):
            for item in page.get("Contents", []):
                yield self._relative(item["Key"])

    def delete_folder(self, folder: str) -> int:
        """Delete every object under the folder, a thousand per request (S3's DeleteObjects); how many."""
        keys = [self.root.key(k) for k in self.walk(folder)]
        for at in range(0, len(keys), 1000):
            self.client.delete_objects(Bucket=self.root.bucket,
                                       Delete={"Objects": [{"Key": k} for k in keys[at:at + 1000]], "Quiet": True})
        return len(keys)

    def _relative(self, key: str) -> str:
        """An object's key relative to the store's root prefix."""
        return key[len(self.root.path) + 1:] if self.root.path else key

    def _pages(self, folder: str, *, nested: bool = False) -> Iterator[dict[str, Any]]:
        """The ListObjectsV2 pages of the folder's own objects and subfolders (``Delimiter``), in key order;
        ``nested``: of every object under the folder instead."""
        prefix = self.root.key(folder).rstrip("/") + "/" if self.root.key(folder) else ""
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"Bucket": self.root.bucket, "Prefix": prefix, "MaxKeys": self.page_size}
            if not nested:
                kwargs["Delimiter"] = "/"
            if token:
                kwargs["ContinuationToken"] = token
            page: dict[str, Any] = self.client.list_objects_v2(**kwargs)
            yield page
            if not page.get("IsTruncated"):
                return
            token = page["NextContinuationToken"]


def store_for(root: Root, credentials: Credentials | None = None) -> ObjectStore:
    """The store of ``root``: its folder, or its bucket and prefix through the credentials."""
    if root.is_local:
        return LocalStore(root)
    return S3Store(root, (credentials or Credentials.from_env()).boto3_client())


# Reading files on local disk only (a landing zone): Hadoop's checksumming local file system derives a ".<name>.crc"
# path by parsing the file name as a URI, which fails for names with ':' (events-2024-05-01T10:02:00Z.jsonl). The
# raw local file system reads the same bytes; it is set for this source only (uncached), because the checkpoints and
# state stores keep to the checksumming one. Never for a landing zone on object storage: the option travels with the
# batch into its writes, where S3A's upload buffer casts the local file system it gets to the checksumming class,
# and on an executor of a cluster that cast failed every write to an s3:// lake.
LOCAL_READ_OPTIONS = {
    "fs.file.impl": "org.apache.hadoop.fs.RawLocalFileSystem",
    "fs.file.impl.disable.cache": "true",
}


def hadoop_read_options(root: Root) -> dict[str, str]:
    """The options a Spark file source needs to read under ``root``: :data:`LOCAL_READ_OPTIONS` on a local root,
    none on object storage (S3A's settings are the session's)."""
    return dict(LOCAL_READ_OPTIONS) if root.is_local else {}


def folder_listing(root: Root, store: ObjectStore, folder: str) -> list[ObjectInfo] | None:
    """The objects directly in ``folder`` under ``root``, or None when the folder does not exist: a missing
    directory on a local root; on object storage, no object with its prefix yet."""
    listed = list(store.list(folder))
    if root.is_local:
        return listed if root.local(folder).is_dir() else None
    return listed or None
