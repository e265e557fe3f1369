"""``sluice retry <pipeline>``: the failed windows again, like ``dbt retry``, without working out ``--start``
and ``--end`` by hand.

The failed windows are the ledger's ``failed`` rows. By default they are recomputed from bronze (and, with
``include_late``, the DLQ) and re-validated: each run of consecutive failed windows is one ordinary
:func:`~sluice.streaming.backfill.run_backfill`, so a retry is exactly the backfills a user would have typed,
with their plans, their crash recovery and their ``reprocessed`` state. Runs are grouped only when their
windows follow each other on the slide grid, so no window that passed is rewritten.

``check_only`` re-validates the failed windows as they stand (after a fix to a threshold, or to the data
upstream of gold), without rewriting gold: a new validation round of each, alerted again if it still fails.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from datetime import datetime

from sluice.alerting.outbox import AlertTally, alerts_recorded_since, outbox_snapshot
from sluice.core.model import PipelineDef
from sluice.core.windows import Window
from sluice.quality.checker import QualityChecker, QualityReport, merged_reports
from sluice.runtime.context import RunContext
from sluice.streaming.backfill import run_backfill

log = logging.getLogger("sluice.retry")



def failed_windows(ctx: RunContext, pipeline: str) -> list[Window]:
    """The pipeline's windows whose last validation failed, oldest first."""
    return ctx.ledger(pipeline).windows("failed")


def backfill_ranges(pipeline: PipelineDef, windows: list[Window]) -> list[tuple[datetime, datetime]]:
    """``[start, end)`` backfill ranges (windows *starting* in them) covering exactly ``windows``: one per
    run of windows that follow each other on the slide grid."""
    slide = pipeline.window.slide
    ranges: list[tuple[datetime, datetime]] = []
    for start, _end in sorted(windows):
        if ranges and ranges[-1][1] == start:
            ranges[-1] = (ranges[-1][0], start + slide)
        else:
            ranges.append((start, start + slide))
    return ranges


@dataclass
class RetryResult:
    pipeline: str
    check_only: bool
    include_late: bool
    windows: list[Window] = field(default_factory=list)
    ranges: list[tuple[datetime, datetime]] = field(default_factory=list)
    quality: QualityReport | None = None
    alerts: AlertTally = field(default_factory=AlertTally)
    seconds: float = 0.0
    # What the windows are and who asked: the failed ones (``sluice retry``) or the closed ones of a range
    # (``sluice backfill --check-only``).
    chosen: str = "failed"
    command: str = "retry"

    @property
    def exit_code(self) -> int:
        return 2 if self.quality is not None and self.quality.failed else 0

    def render(self) -> str:
        head = f"sluice {self.command} {self.pipeline}"
        if not self.windows:
            return f"{head}: no {self.chosen} windows; nothing to {'retry' if self.command == 'retry' else 're-check'}"
        how = ("re-validated as they stand (gold not rewritten)" if self.check_only else
               f"recomputed from bronze{' with their late data' if self.include_late else ''} in "
               f"{len(self.ranges)} backfill(s) and re-validated")
        lines = [f"{head}: {len(self.windows)} {self.chosen} window(s) {how} in {self.seconds:.1f}s"]
        if not self.check_only:
            lines += [f"  backfill [{s:%Y-%m-%d %H:%M}, {e:%Y-%m-%d %H:%M})" for s, e in self.ranges]
        q = self.quality
        if q is not None:
            lines.append(f"  data quality: {len(q.checked) - len(q.failed)} passed, {len(q.failed)} still failing")
            lines += q.failure_lines()
        lines += [f"  {line}" for line in self.alerts.render()]
        return "\n".join(lines)


def run_retry(
    ctx: RunContext,
    pipeline: str,
    *,
    check_only: bool = False,
    include_late: bool = False,
    deliver_alerts: bool = True,
) -> RetryResult:
    settings = ctx.settings
    definition = settings.pipeline(pipeline)  # an unknown name fails before any JVM starts
    started = time.monotonic()
    windows = failed_windows(ctx, pipeline)
    result = RetryResult(pipeline, check_only, include_late, windows)
    if not windows:
        log.info("retry %s: no failed windows", pipeline)
        return result
    outbox = outbox_snapshot(settings, pipeline)
    if check_only:
        log.info("retry %s: re-validating %d failed window(s)", pipeline, len(windows))
        result.quality = _recheck(ctx, definition, windows, deliver_alerts)
    else:
        result.ranges = backfill_ranges(definition, windows)
        log.info("retry %s: recomputing %d failed window(s) in %d backfill(s)", pipeline, len(windows),
                 len(result.ranges))
        for start, end in result.ranges:
            done = run_backfill(ctx, pipeline, start, end, include_late, deliver_alerts=deliver_alerts)
            result.quality = merged_reports(result.quality, done.quality)
    result.alerts = alerts_recorded_since(settings, pipeline, outbox)
    result.seconds = time.monotonic() - started
    return result


def _recheck(ctx: RunContext, pipeline: PipelineDef, windows: list[Window], deliver_alerts: bool) -> QualityReport:
    """A new validation round of ``windows`` as gold holds them (under the pipeline lock). Windows whose gold
    a backfill or correction rebuilt with their late records (the ledger's ``late_in_gold``) are checked as
    that backfill checked them: their completeness counts the DLQ records too."""
    with ctx.pipeline_lock(pipeline.name, purpose="re-validation"):
        with_late = {r.window for r in ctx.ledger(pipeline.name).rows if r.late_in_gold}
        report: QualityReport | None = None
        for include_late in (False, True):
            chosen = [w for w in windows if (w in with_late) == include_late]
            if chosen:
                report = merged_reports(report, QualityChecker(ctx, pipeline).check(
                    chosen, deliver=deliver_alerts, include_late=include_late))
        assert report is not None
        return report


def run_recheck(
    ctx: RunContext,
    pipeline: str,
    start: datetime,
    end: datetime,
    *,
    deliver_alerts: bool = True,
) -> RetryResult:
    """``sluice backfill --check-only`` (the ``sluice_backfill`` DAG's ``check_only``, the ledger page's
    "re-check"): re-validate the closed windows starting in ``[start, end)`` as they stand, without
    rewriting gold. Windows the ledger does not hold (open, or never holding a row) are left alone."""
    settings = ctx.settings
    definition = settings.pipeline(pipeline)
    started = time.monotonic()
    windows = [w for w in ctx.ledger(pipeline).windows() if start <= w[0] < end]
    result = RetryResult(pipeline, True, False, windows, chosen="closed", command="backfill --check-only")
    if windows:
        outbox = outbox_snapshot(settings, pipeline)
        log.info("re-check %s: re-validating %d closed window(s) in [%s, %s)", pipeline, len(windows),
                 start.isoformat(), end.isoformat())
        result.quality = _recheck(ctx, definition, windows, deliver_alerts)
        result.alerts = alerts_recorded_since(settings, pipeline, outbox)
    result.seconds = time.monotonic() - started
    return result
