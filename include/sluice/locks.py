"""Mutual exclusion per pipeline: a scheduled cycle and a backfill of the same pipeline never write at once.

An exclusive ``flock`` on ``$SLUICE_HOME/locks/<pipeline>.lock``, taken by the shared code path that both
the CLI and the Airflow tasks run, so it holds whichever launched the work. The kernel releases it when the
holder dies (even on SIGKILL), so a crashed run never leaves a stale lock behind.
"""

from __future__ import annotations

import fcntl
import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager

from sluice.config import Settings

log = logging.getLogger("sluice.locks")


class LockTimeout(RuntimeError):
    pass


@contextmanager
def pipeline_lock(settings: Settings, pipeline: str, *, timeout: float = 3600.0, purpose: str = "") -> Iterator[None]:
    folder = settings.home / "locks"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{pipeline}.lock"
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
                    log.info("%s: waiting for the pipeline lock held by %s", pipeline, holder)
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
