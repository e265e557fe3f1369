"""One full cycle of a pipeline: ingest its streams, flag closed windows that late records landed for,
aggregate (close new windows), correct windows with late data waiting (``corrections: auto``), and check
new windows.

Shared by ``sluice run`` and the DAG's ``run_cycle`` task (one Spark application per DAG run: the cycle
checks the windows it closes) so that both behave identically.

Corrections validate the windows they rewrite themselves, like backfills, so they run with
``check_quality=False`` too (``sluice run --skip-quality``). Their failures are recorded and alerted either
way; they count in the cycle's quality report and exit code only when the cycle checks quality itself.

A cycle whose new records cannot close a window (most 15-minute cycles of hourly windows) runs neither the
stateful queries (see :meth:`PipelineRunner.can_close`) nor the data-quality set-up.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from sluice.alerting.outbox import (
    AlertTally,
    alerts_recorded_since,
    kafka_offsets_lost_alert,
    outbox_snapshot,
    unreadable_files_alert,
)
from sluice.config import Settings
from sluice.core.windows import Window
from sluice.ingest.accounting import accounting_table
from sluice.ingest.run import run_ingest
from sluice.ingest.state import BatchRow
from sluice.ingest.time_rules import all_late, all_late_message, arrived_after, arrived_after_message
from sluice.quality.checker import QualityChecker, QualityReport, merged_reports, raise_alert
from sluice.quality.gx_context import warm_up
from sluice.runtime.context import RunContext
from sluice.streaming.batch import streams_without_files
from sluice.streaming.changes import plan_pipeline
from sluice.streaming.commits import AggregateResult
from sluice.streaming.corrections import CorrectionReport, run_corrections
from sluice.streaming.rebuild import ChangeReport, apply_changes
from sluice.streaming.runner import PipelineRunner, has_records
from sluice.windows.late import scan_amendments

log = logging.getLogger("sluice.cycle")



@dataclass
class CycleResult:
    pipeline: str
    settings: Settings
    batches: dict[str, list[BatchRow]] = field(default_factory=dict)
    aggregate: AggregateResult | None = None
    quality: QualityReport | None = None
    failed_windows: int = 0
    seconds: float = 0.0
    # Closed windows that late records landed for (``late_waiting``), found by this cycle's scan.
    amended: list[Window] = field(default_factory=list)
    corrections: CorrectionReport | None = None
    alerts: AlertTally = field(default_factory=AlertTally)
    changes: ChangeReport | None = None  # what a changed definition made this cycle do first (SPEC 9)

    @property
    def corrected(self) -> list[Window]:
        """Windows this cycle re-computed with their late records (``corrections: auto``)."""
        return list(self.corrections.corrected) if self.corrections is not None else []

    @property
    def exit_code(self) -> int:
        return 2 if self.failed_windows else 0

    def render(self) -> str:
        streams = list(self.batches)
        head = (
            f"sluice run {self.pipeline}: {sum(len(b) for b in self.batches.values())} batch(es) "
            f"in {self.seconds:.1f}s (now={self.settings.now().isoformat()})"
        )
        parts = [head, accounting_table(self.settings, streams)]
        parts += [f"warning: {stream}: {all_late_message(row)}" for stream, rows in self.batches.items()
                  for row in rows if all_late(row)]
        future = arrived_after(self.batches, self.settings.now())
        if future:
            parts.append(f"warning: {arrived_after_message(future, self.settings.now())}")
        waiting = streams_without_files(self.settings, self.settings.pipeline(self.pipeline))
        if waiting:
            parts.append(f"warning: no window of {self.pipeline} can close until {', '.join(waiting)} "
                         f"receive(s) a first file (in {self.settings.landing.join(waiting[0])}/)")
        if self.changes is not None:
            parts.extend(self.changes.render())
        if self.aggregate is not None:
            windows = self.aggregate.windows
            closed = ", ".join(f"{s:%m-%d %H:%M}" for s, _e in windows[:6]) + (" ..." if len(windows) > 6 else "")
            parts.append(f"windows closed this cycle: {len(windows)}" + (f" ({closed})" if windows else ""))
        if self.amended:
            shown = ", ".join(f"{s:%m-%d %H:%M}" for s, _e in self.amended[:6]) + (
                " ..." if len(self.amended) > 6 else "")
            policy = self.corrections.policy if self.corrections is not None else "manual"
            parts.append(f"late records landed for {len(self.amended)} closed window(s), late data waiting ({shown}); "
                         f"corrections: {policy}")
        if self.corrections is not None:
            parts.extend(self.corrections.render())
        if self.quality is not None:
            q = self.quality
            parts.append(f"data quality: {len(q.checked) - len(q.failed)} window(s) passed, {len(q.failed)} failed"
                         + (f"; Data Docs: {q.docs_index}" if q.docs_index else ""))
            parts += q.failure_lines()
        parts += self.alerts.render()
        return "\n".join(parts)


def run_cycle(
    ctx: RunContext,
    pipeline: str,
    *,
    check_quality: bool = True,
    deliver_alerts: bool = True,
) -> CycleResult:
    """Ingest the pipeline's streams, aggregate closed windows, validate them. ``check_quality=False``
    leaves the validation to a separate step (the Airflow DAG runs it as its own task)."""
    settings = ctx.settings
    definition = settings.pipeline(pipeline)  # fails fast on an unknown pipeline, before any JVM starts
    streams = definition.streams
    started = time.monotonic()
    engine = ctx.engine
    log.info("cycle %s: ingesting %s (now=%s)", pipeline, ", ".join(streams), settings.now().isoformat())
    with ctx.pipeline_lock(pipeline, purpose=f"cycle now={settings.now().isoformat()}"):
        outbox = outbox_snapshot(settings, pipeline)
        # New input will start the JVM, whose launch leaves this process waiting: the seconds of Great
        # Expectations' import then cost nothing (a cycle with nothing new imports nothing).
        batches = run_ingest(ctx, streams, on_new_input=warm_up if check_quality else None)
        # From the ingest log, not from this cycle's batches: a crash between a file's quarantine and its
        # alert is caught up here, and a rerun finds the alert's key already recorded.
        for ingest_alert in (unreadable_files_alert(settings, pipeline), kafka_offsets_lost_alert(settings, pipeline)):
            if ingest_alert is not None:
                raise_alert(settings, engine, ingest_alert, deliver=deliver_alerts)
        # Before new windows close: a window closing in this cycle counts its DLQ records when it closes.
        amended = scan_amendments(ctx.ledger(pipeline), engine, ctx.state, definition)
        # A changed definition is applied before any window closes under it (SPEC 9): rebuilt, gone forward,
        # or refused (exit 1, nothing written).
        # Until a stream accepts a record no gold exists to rebuild, and the pipeline's first run with records
        # records its definitions: a cycle with nothing yet analyses none (and starts no JVM).
        plan = plan_pipeline(ctx, definition) if has_records(settings, definition) else None
        changes = apply_changes(ctx, definition, deliver_alerts=deliver_alerts, plan=plan) if plan else None
        # The runner records the same definitions with the windows it closes: analysed once per cycle.
        runner = PipelineRunner(ctx, definition, definitions=plan.definitions if plan else None)
        log.info("cycle %s: aggregating closed windows", pipeline)
        aggregate = runner.run()
        corrections = run_corrections(ctx, definition, deliver_alerts=deliver_alerts)
        if check_quality:
            log.info("cycle %s: checking data quality", pipeline)
        quality = (
            QualityChecker(ctx, definition).check(deliver=deliver_alerts)
            if check_quality
            else None
        )
        alerts = alerts_recorded_since(settings, pipeline, outbox)
    for line in alerts.render():
        log.log(logging.WARNING if alerts.unrouted else logging.INFO, "cycle %s: %s", pipeline, line)
    result = CycleResult(pipeline, settings, batches, aggregate, seconds=time.monotonic() - started,
                         amended=amended, corrections=corrections, alerts=alerts, changes=changes)
    if check_quality:
        # The corrections' and a rebuild's own validations belong to this cycle's verdict (exit code 2, the
        # JSON's quality).
        quality = merged_reports(quality, corrections.quality)
        if changes is not None:
            quality = merged_reports(quality, changes.quality)
    result.quality = quality
    result.failed_windows = len(quality.failed) if quality else 0
    return result


def run_quality(ctx: RunContext, pipeline: str, *, deliver_alerts: bool = True) -> QualityReport:
    """The DQ step on its own (the DAG's check_quality task): every window closed but not yet validated."""
    definition = ctx.settings.pipeline(pipeline)
    with ctx.pipeline_lock(pipeline, purpose="data quality"):
        return QualityChecker(ctx, definition).check(deliver=deliver_alerts)
