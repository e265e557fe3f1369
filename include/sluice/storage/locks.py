"""Mutual exclusion, per pipeline and per stream.

* ``pipeline_lock``: a scheduled cycle and a backfill of the same pipeline never write at once.
* ``stream_lock``: a stream read by several pipelines is never ingested by two processes at once, whichever
  pipelines' cycles (or ``sluice ingest``) run.

Taken by the shared code path that both the CLI and the Airflow tasks run, so they hold whichever launched the
work. Order: a pipeline lock, then one stream lock at a time, so two holders can never wait for each other.
Where they live depends on the lake (the one :func:`lock` provider):

* a local lake: exclusive ``flock`` locks on ``$SLUICE_HOME/locks/<pipeline>.lock`` and
  ``$SLUICE_HOME/locks/streams/<stream>.lock``. The kernel releases them when the holder dies (even on
  SIGKILL), so a crashed run never leaves a stale lock behind;
* a lake on object storage: leases in the lake's bucket, under ``<lake>/_locks/`` (:mod:`sluice.core.leases`),
  which hold between processes that share nothing but the bucket (two Airflow workers on two hosts). A holder
  killed with SIGKILL blocks the others for at most the lease's time to live.
"""

from __future__ import annotations

import fcntl
import logging
import os
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

from sluice.config import Settings
from sluice.core.errors import LockTimeout
from sluice.core.leases import LeaseStore

log = logging.getLogger("sluice.locks")


__all__ = ["LockTimeout", "pipeline_lock", "stream_lock"]


def pipeline_lock(
    settings: Settings, pipeline: str, *, timeout: float = 3600.0, purpose: str = ""
) -> AbstractContextManager[None]:
    return lock(settings, "pipeline", pipeline, timeout=timeout, purpose=purpose)


def stream_lock(
    settings: Settings, stream: str, *, timeout: float = 3600.0, purpose: str = ""
) -> AbstractContextManager[None]:
    return lock(settings, "stream", stream, timeout=timeout, purpose=purpose)


# Where each kind of lock lives: under the home's locks/ folder, or under the lake's _locks/ prefix.
_FOLDERS = {"pipeline": "", "stream": "streams"}


def lock(settings: Settings, kind: str, name: str, *, timeout: float, purpose: str) -> AbstractContextManager[None]:
    """The lock provider: ``flock`` for a local lake, a lease in the bucket for a lake on object storage."""
    folder = _FOLDERS[kind]
    if settings.lake.is_local:
        path = settings.home / "locks" / folder / f"{name}.lock"
        return _flock(path, name, kind, timeout, purpose)
    return _lease(settings, "/".join(p for p in (folder, name) if p), timeout, purpose)


@contextmanager
def _lease(settings: Settings, name: str, timeout: float, purpose: str) -> Iterator[None]:
    root = settings.lake.root
    store = LeaseStore(settings.lake.credentials.boto3_client(), root.bucket, root.key("_locks"),
                       ttl_s=settings.lease_ttl.total_seconds())
    with store.hold(name, timeout=timeout, purpose=purpose):
        yield


@contextmanager
def _flock(path: Path, name: str, kind: str, timeout: float, purpose: str) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    pipeline = name
    with open(path, "a+") as handle:
        deadline = time.monotonic() + timeout
        waited = False
        while True:
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not waited:
                    handle.seek(0)
                    holder = handle.read().strip() or "another run"
                    log.info("%s: waiting for the %s lock held by %s", pipeline, kind, holder)
                    waited = True
                if time.monotonic() > deadline:
                    raise LockTimeout(
                        f"{pipeline}: another run held the lock {path} for more than {timeout:.0f}s; "
                        "check for a stuck backfill or cycle"
                    ) from None
                time.sleep(0.2)
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()} {purpose}".strip())
        handle.flush()
        try:
            yield
        finally:
            handle.seek(0)
            handle.truncate()
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
