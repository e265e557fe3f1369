"""Progress of long steps (files of an ingest, windows of a data-quality run or a backfill).

On an interactive terminal a tqdm bar runs on stderr while the step runs, with log lines printed above it.
Otherwise (Airflow task logs, pipes, CI) there is no bar: for a long step (``LOG_FROM`` items or more) a
log line at every tenth of the way says how far it is, so it still shows it is moving without flooding the
log; a short one stays quiet.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

log = logging.getLogger("sluice.progress")

# Without a terminal, steps of at least this many items log their progress (every tenth).
LOG_FROM = 20


def nothing(n: int = 1) -> None:
    """No progress to show."""
    return None


@contextmanager
def progress(total: int, what: str, unit: str) -> Iterator[Callable[[int], None]]:
    """Yields ``advance(n)`` for ``total`` items of ``what`` (e.g. "ingest impressions", unit "file")."""
    if total <= 1:
        yield nothing
        return
    if sys.stderr.isatty():
        from tqdm import tqdm
        from tqdm.contrib.logging import logging_redirect_tqdm

        with tqdm(total=total, desc=what, unit=unit, file=sys.stderr, leave=False) as bar, logging_redirect_tqdm():
            yield bar.update
        return
    if total < LOG_FROM:
        # Short steps already log each item (the ingest logs every file); a count would only double it.
        yield nothing
        return
    done = 0
    step = max(1, total // 10)

    def advance(n: int = 1) -> None:
        nonlocal done
        before, done = done, min(total, done + n)
        if done == total or done // step > before // step:
            log.info("%s: %d of %d %ss done", what, done, total, unit)

    yield advance
