"""Leases in an object store: mutual exclusion between processes that share nothing but a bucket.

A local home locks with ``flock`` (:mod:`sluice.storage.locks`); two Airflow workers on two hosts cannot. Here a
lock named ``<kind>/<name>`` is a series of *generations*, one object each, under ``<prefix>/<kind>/<name>/``,
and every write is a create (``If-None-Match: *``): the one atomic conditional write that S3, and s3proxy's
filesystem backend, guarantee (a conditional overwrite, ``If-Match``, is not atomic on every server).

* The newest generation says who holds the lock. A holder takes it by creating generation ``n + 1`` when
  generation ``n`` is free: released (its body says so) or expired (its ``LastModified`` plus its TTL is past,
  by the server's clock, never this host's). Of two takers, exactly one creates ``n + 1``.
* A holder renews before its TTL runs out by creating the next generation itself. When that create fails,
  somebody took an expired lease over: the holder has lost it and must stop writing.
* The generation is the fencing token. A writer checks, before it commits (:meth:`Lease.check`), that the
  newest generation is still one of its own; a holder that was paused past its TTL finds out there, before
  its commit, instead of writing beside the new holder.
* A holder killed with SIGKILL writes nothing more: the others wait at most its TTL.

Old generations are deleted by the holder that released them (only the newest one matters).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from email.utils import parsedate_to_datetime
from typing import Any

from sluice.core.errors import LockTimeout

log = logging.getLogger("sluice.locks")

GENERATION_DIGITS = 20
DEFAULT_TTL_S = 60.0


class LeaseLost(RuntimeError):
    """Another process took this lease over (it expired while this one held it): stop writing."""


@dataclass(frozen=True)
class Generation:
    number: int
    key: str
    modified: datetime


class LeaseStore:
    """The leases under ``s3://<bucket>/<prefix>/`` through one boto3 S3 client."""

    def __init__(self, client: Any, bucket: str, prefix: str, *, ttl_s: float = DEFAULT_TTL_S,
                 poll_s: float = 0.5, page_size: int = 1000) -> None:
        self.client = client
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.ttl_s = ttl_s
        self.poll_s = poll_s
        self.page_size = page_size

    # -- reading ---------------------------------------------------------------------------------------
    def _folder(self, name: str) -> str:
        return f"{self.prefix}/{name}/" if self.prefix else f"{name}/"

    def generations(self, name: str) -> tuple[list[Generation], datetime]:
        """Every generation of ``name`` (paged listing), oldest first, and the server's time of the listing."""
        found: list[Generation] = []
        server_now: datetime | None = None
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": self._folder(name), "MaxKeys": self.page_size}
            if token:
                kwargs["ContinuationToken"] = token
            page = self.client.list_objects_v2(**kwargs)
            server_now = server_now or _server_time(page)
            for item in page.get("Contents", []):
                tail = item["Key"].rsplit("/", 1)[-1]
                if tail.isdigit() and len(tail) == GENERATION_DIGITS:
                    found.append(Generation(int(tail), item["Key"], item["LastModified"]))
            if not page.get("IsTruncated"):
                break
            token = page["NextContinuationToken"]
        assert server_now is not None
        return sorted(found, key=lambda g: g.number), server_now

    def _body(self, key: str) -> dict[str, Any] | None:
        """A generation's body; None when it is gone (its holder released the lease and cleaned up)."""
        try:
            return dict(json.loads(self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read()))
        except self.client.exceptions.NoSuchKey:
            return None

    # -- writing ---------------------------------------------------------------------------------------
    def _create(self, name: str, number: int, body: dict[str, Any]) -> bool:
        """Create generation ``number``; False when it exists already (somebody else created it first)."""
        key = f"{self._folder(name)}{number:0{GENERATION_DIGITS}d}"
        try:
            self.client.put_object(Bucket=self.bucket, Key=key, Body=json.dumps(body).encode(), IfNoneMatch="*",
                                   ContentType="application/json")
            return True
        except self.client.exceptions.ClientError as exc:
            # 412: it exists. 409: a concurrent create of the same key is in flight (S3 asks to retry).
            if exc.response.get("Error", {}).get("Code") in ("PreconditionFailed", "ConditionalRequestConflict"):
                return False
            raise

    def try_acquire(self, name: str, holder: str, purpose: str = "") -> Lease | None:
        """Take the lease when it is free (never held, released, or expired); None when somebody holds it."""
        generations, server_now = self.generations(name)
        number = 1
        if generations:
            newest = generations[-1]
            body = self._body(newest.key)
            if body is None:
                return None  # changed while we looked: look again
            expired = (server_now - newest.modified).total_seconds() > float(body.get("ttl_s", self.ttl_s))
            if not body.get("released") and not expired:
                return None
            if expired and not body.get("released"):
                log.warning("%s: the lease of %s (generation %d) expired; taking it over", name,
                            body.get("holder"), newest.number)
            number = newest.number + 1
        body = {"holder": holder, "purpose": purpose, "ttl_s": self.ttl_s}
        if not self._create(name, number, body):
            return None
        return Lease(self, name, holder, number)

    @contextmanager
    def hold(self, name: str, *, timeout: float = 3600.0, purpose: str = "") -> Iterator[Lease]:
        """Hold ``name`` for the block: wait for it (up to ``timeout``), renew it in the background, release
        it at the end. A holder killed with SIGKILL blocks the others for at most the TTL."""
        holder = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        deadline = time.monotonic() + timeout
        waited = False
        while (lease := self.try_acquire(name, holder, purpose)) is None:
            if not waited:
                log.info("%s: waiting for the lease held by another run", name)
                waited = True
            if time.monotonic() > deadline:
                raise LockTimeout(f"{name}: another run held the lease s3://{self.bucket}/{self._folder(name)} "
                                  f"for more than {timeout:.0f}s; check for a stuck backfill or cycle")
            time.sleep(self.poll_s)
        lease.start_renewing()
        try:
            yield lease
        finally:
            lease.release()


class Lease:
    """A held lease: its generation is the fencing token."""

    def __init__(self, store: LeaseStore, name: str, holder: str, generation: int) -> None:
        self.store = store
        self.name = name
        self.holder = holder
        self.generation = generation
        self.first_generation = generation
        self.lost = False
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def renew(self) -> None:
        """Create the next generation as this holder; LeaseLost when somebody else did first."""
        with self._lock:
            if self.lost:
                raise LeaseLost(f"{self.name}: lease lost")
            body = {"holder": self.holder, "ttl_s": self.store.ttl_s, "renews": self.first_generation}
            if not self.store._create(self.name, self.generation + 1, body):
                self.lost = True
                raise LeaseLost(f"{self.name}: another run took the lease over (generation {self.generation + 1})")
            self.generation += 1

    def check(self) -> int:
        """Before a commit: this holder's lease is still the newest generation. Returns the fencing token."""
        generations, _now = self.store.generations(self.name)
        if self.lost or not generations or generations[-1].number != self.generation:
            self.lost = True
            raise LeaseLost(f"{self.name}: this run's lease (generation {self.generation}) was taken over; "
                            "its writes must not commit")
        return self.generation

    def start_renewing(self) -> None:
        def loop() -> None:
            while not self._stop.wait(self.store.ttl_s / 3):
                try:
                    self.renew()
                except LeaseLost:
                    log.error("%s: lease lost to another run; this run's next commit check will fail", self.name)
                    return
                except Exception:  # a network blip: the next attempt may succeed before the TTL runs out
                    log.warning("%s: could not renew the lease", self.name, exc_info=True)

        self._thread = threading.Thread(target=loop, name=f"lease-{self.name}", daemon=True)
        self._thread.start()

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        with self._lock:
            if self.lost:
                return
            # The release is a generation too, so that a waiter never mistakes it for a live lease.
            if self.store._create(self.name, self.generation + 1, {"holder": self.holder, "released": True}):
                self.generation += 1
                self._delete_older()

    def _delete_older(self) -> None:
        generations, _now = self.store.generations(self.name)
        for old in generations:
            if old.number < self.generation:
                self.store.client.delete_object(Bucket=self.store.bucket, Key=old.key)


def _server_time(response: dict[str, Any]) -> datetime:
    """The server's clock, from the Date header of its answer: expiry is judged on one clock, the store's."""
    date = response.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
    if not date:
        raise RuntimeError("the object store's answer has no Date header; leases need the server's clock")
    return parsedate_to_datetime(date)
