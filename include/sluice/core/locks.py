"""Mutual exclusion, per pipeline and per stream.

* ``pipeline_lock``: a scheduled cycle and a backfill of the same pipeline never write at once
  (``$SLUICE_HOME/locks/<pipeline>.lock``).
* ``stream_lock``: a stream read by several pipelines is never ingested by two processes at once
  (``$SLUICE_HOME/locks/streams/<stream>.lock``), whichever pipelines' cycles (or ``sluice ingest``) run.

Exclusive ``flock`` locks taken by the shared code path that both the CLI and the Airflow tasks run, so they
hold whichever launched the work. The kernel releases them when the holder dies (even on SIGKILL), so a
crashed run never leaves a stale lock behind. Order: a pipeline lock, then one stream lock at a time, so
two holders can never wait for each other.
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

log = logging.getLogger("sluice.locks")


class LockTimeout(RuntimeError):
    pass


def pipeline_lock(
    settings: Settings, pipeline: str, *, timeout: float = 3600.0, purpose: str = ""
) -> AbstractContextManager[None]:
    return _flock(settings.home / "locks" / f"{pipeline}.lock", pipeline, "pipeline", timeout, purpose)


def stream_lock(
    settings: Settings, stream: str, *, timeout: float = 3600.0, purpose: str = ""
) -> AbstractContextManager[None]:
    return _flock(settings.home / "locks" / "streams" / f"{stream}.lock", stream, "stream", timeout, purpose)


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
