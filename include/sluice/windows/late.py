"""Late data waiting: records that land in the DLQ after their window closed (README "Operations").

**The amendment scan** runs in every cycle right after ingest, before new windows close. For each window of
the pipeline whose first validation is done (``validated``, ``failed``, ``reprocessed``) it counts the
window's DLQ records (``event_time`` in ``[start, end)``, over the pipeline's streams; a record of a hopping
pipeline counts in every window that holds it) and compares that with the ledger's ``late_rows``, the count
gold was last built or checked with. More records than that means late records are waiting: ``late_waiting``
grows by the difference, ``late_rows`` becomes the new count, and ``detail`` says what happens next, after
what the window's last validation found. The state is left alone: it is the window's data-quality outcome
(SPEC 4), and a failed window with late data waiting still reads ``failed``. (A ``closed`` window awaits its
first validation, whose lateness check counts the DLQ itself.)

* Cheap when nothing is new: a scan remembers how far it looked, as the sum of the pipeline's DLQ table
  versions (+1 each; that sum only grows), and the next one skips the count while the DLQ tables are still
  at or below it. A scan that amends windows commits that mark with them (app transaction
  ``sluice.amend.<pipeline>`` on the ledger); one that finds nothing keeps it in ``amend_scan.json`` in the
  pipeline's checkpoint folder instead: a cycle with nothing new commits nothing, to any table.
* Cheap when something is: no Spark job, and only the DLQ files added since the last scan are read (see
  :mod:`sluice.storage.dlq`), so a cycle's scan does not grow with the history.
* Crash-safe: the DLQ commit (ingest) and the amendment (ledger) are separate commits, but a rerun finds
  the DLQ versions above the recorded one and scans again; the scan compares counts with ``late_rows``,
  so scanning twice never counts a record twice.

What is done about late data waiting (corrections under ``corrections: auto``, or a backfill with
``--include-late``) is :mod:`sluice.streaming.corrections`; the texts the ledger shows for it are here.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from datetime import datetime

from sluice.core.model import PipelineDef
from sluice.core.timeutil import format_duration
from sluice.core.windows import Window
from sluice.storage import snapshots
from sluice.storage.dlq import dlq_counts, dlq_paths
from sluice.storage.engine import RowsEngine
from sluice.storage.state import LakeState
from sluice.windows.ledger import NOT_INCLUDED, SETTLED_STATES, Ledger, LedgerRow, join_detail, split_detail

log = logging.getLogger("sluice.corrections")

AMEND_APP = "sluice.amend"


def dlq_mark(paths: Mapping[str, str]) -> int:
    """Sum over the DLQ tables of (Delta version + 1), 0 for one not created yet: grows with every DLQ commit,
    so it orders scans without keeping one version per stream."""
    return sum(snapshots.version(p) + 1 for p in paths.values())


def scan_amendments(ledger: Ledger, engine: RowsEngine, state: LakeState, pipeline: PipelineDef) -> list[Window]:
    """Flag closed windows that late records landed for since they were last built or checked (see the
    module docstring); returns the windows amended by this scan."""
    settings = ledger.settings
    if not snapshots.exists(ledger.path):
        return []  # no window has closed yet: closing counts the DLQ itself
    paths = dlq_paths(settings, pipeline)
    # The versions first, then the data: the count sees at least what the mark claims.
    mark = dlq_mark(paths)
    app = f"{AMEND_APP}.{pipeline.name}"
    if mark == 0 or scanned_mark(ledger, engine, state, pipeline) >= mark:
        log.debug("%s: no DLQ commit since the last amendment scan", pipeline.name)
        return []
    settled = ledger.settled()
    counts = dlq_counts(settings, pipeline, [r.window for r in settled]) if settled else {}
    amended = amend(pipeline, settled, counts, settings.now())
    if amended:
        ledger.note_late(engine, amended, app_id=app, version=mark)
        log.info("%s: %d closed window(s) amended: %d late record(s) waiting", pipeline.name, len(amended),
                 sum(r.late_waiting for r in amended))
    else:
        save_scan_mark(state, pipeline, mark)
    return [r.window for r in amended]


def scan_mark_path(pipeline: PipelineDef) -> tuple[str, ...]:
    """The scan's mark among the lake's state objects (:mod:`sluice.storage.state`)."""
    return ("pipelines", pipeline.name, "amend_scan.json")


def scanned_mark(ledger: Ledger, engine: RowsEngine, state: LakeState, pipeline: PipelineDef) -> int:
    """How far the last scan looked (a :func:`dlq_mark`, -1 if none did): the ledger's app transaction of the
    last scan that amended windows, or the file of one that found nothing, whichever is further."""
    committed = engine.committed_version(ledger.path, f"{AMEND_APP}.{pipeline.name}")
    saved = state.read(*scan_mark_path(pipeline))
    # A lost or unreadable mark only costs one scan more: it counts, it never skips.
    try:
        kept = int(json.loads(saved)["dlq_mark"]) if saved is not None else -1
    except (ValueError, KeyError, TypeError):
        kept = -1
    return max(-1 if committed is None else committed, kept)


def save_scan_mark(state: LakeState, pipeline: PipelineDef, mark: int) -> None:
    """Remember that a scan up to ``mark`` found nothing to amend. Not a ledger commit: a cycle with no new
    input would otherwise write a ledger version with the same rows (and this is only a shortcut: the count
    is exact either way, so losing the file to a crash costs one more count, never a record)."""
    state.write(json.dumps({"dlq_mark": mark}), *scan_mark_path(pipeline))


def amend(pipeline: PipelineDef, rows: Sequence[LedgerRow], counts: Mapping[Window, int], now: datetime
          ) -> list[LedgerRow]:
    """The ledger rows whose DLQ count grew past ``late_rows``, updated: more ``late_waiting``, and a
    ``detail`` that says so after the validation's findings. The state (the data-quality outcome) stays."""
    amended = []
    for row in rows:
        current = counts.get(row.window, 0)
        if current <= row.late_rows:
            continue
        row.late_waiting += current - row.late_rows
        row.late_rows = current
        row.updated_at = now
        row.detail = join_detail(split_detail(row.detail)[0], waiting_detail(pipeline, row, now))
        amended.append(row)
    return amended


def backfill_command(pipeline: PipelineDef, window: Window) -> str:
    """The ``sluice backfill`` command that rewrites exactly ``window`` with its late records (the range ends
    one slide after its start: exactly one window starts in it, and both bounds are on the grid)."""
    start = window[0]
    end = start + pipeline.window.slide
    return f"sluice backfill {pipeline.name} --start {_rfc3339(start)} --end {_rfc3339(end)} --include-late"


def too_old(pipeline: PipelineDef, window: Window, now: datetime) -> bool:
    """Whether ``window`` ended more than ``correction_max_age`` before ``now`` (then it is only flagged)."""
    return window[1] < now - pipeline.correction_max_age


def waiting_detail(pipeline: PipelineDef, row: LedgerRow, now: datetime, *, reprocessed: bool = False) -> str:
    """The ledger ``detail`` of a window with late records not in gold: how many, and what happens next."""
    n = row.late_waiting
    head = (f"{n} late record(s) still not in gold {NOT_INCLUDED}" if reprocessed
            else f"{n} late record(s) landed after the window closed and are not in gold yet")
    command = backfill_command(pipeline, row.window)
    if pipeline.corrections != "auto":
        return f"{head}; corrections are manual: `{command}` brings them in"
    if too_old(pipeline, row.window, now):
        return (f"{head}; the window ended more than max_age ({format_duration(pipeline.correction_max_age)}) ago, so "
                f"it is not corrected automatically: `{command}` brings them in")
    return (f"{head}; corrections are auto: a cycle re-computes the window with them (oldest first, at most "
            f"{pipeline.max_corrections_per_run} per cycle)")


def refresh_details(ledger: Ledger, engine: RowsEngine, pipeline: PipelineDef, rows: Sequence[LedgerRow],
                    now: datetime) -> None:
    """Windows with late data waiting whose ``detail`` no longer says what happens next (the window aged past
    max_age, or the policy changed) get the current text, after their data-quality findings; one commit, only
    when one differs."""
    stale = []
    for row in rows:
        if row.state in SETTLED_STATES and row.late_waiting > 0:
            findings, waiting_text = split_detail(row.detail)
            reprocessed = waiting_text is not None and NOT_INCLUDED in waiting_text
            text = join_detail(findings, waiting_detail(pipeline, row, now, reprocessed=reprocessed))
            if row.detail != text:
                row.detail = text
                row.updated_at = now
                stale.append(row)
    if stale:
        ledger.note_late(engine, stale, app_id=f"sluice.ledger.amend.{pipeline.name}")


def _rfc3339(value: datetime) -> str:
    return value.isoformat().replace("+00:00", "Z")
