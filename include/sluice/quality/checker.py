"""Data quality per closed window (SPEC section 5), shared by cycles, backfills and the Airflow DQ task.

For each window to check, a handful of small inputs: the window's gold rows (read with pyarrow from the
gold table's files), its bronze counts (:mod:`sluice.quality.counts`, run while Great Expectations checks the
gold rows) and its DLQ count (kept per DLQ file). GE validates those small
inputs, never a scan of raw data. Results go to ops/dq_results and Data Docs; the ledger becomes
``validated`` or ``failed``; a failure raises exactly one alert (webhook and/or email) and writes a row to
ops/alerts. The lateness check counts the window's DLQ records that are not in gold (SPEC 5): all of them after
the streaming path, none of those a backfill or correction with ``include_late`` has just rebuilt gold with.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from sluice.config import Settings
from sluice.core.model import OutputDef, PipelineDef
from sluice.core.spark import local_frame
from sluice.core.timeutil import EARLIEST_EVENT_TIME
from sluice.core.windows import Window
from sluice.quality.counts import completeness_checks, window_counts
from sluice.quality.site import docs_site
from sluice.runtime.context import RunContext
from sluice.storage import tables
from sluice.storage.dlq import dlq_counts
from sluice.storage.engine import DeltaEngine
from sluice.storage.snapshots import read_selected_rows
from sluice.windows.ledger import LedgerRow, airflow_task, next_version, replace_windows

log = logging.getLogger("sluice.quality")


def outcome_prefix(pipeline: PipelineDef, output: OutputDef) -> str:
    """Outcome names of the output named like its pipeline stay plain; other outputs' are qualified."""
    return "" if output.name == pipeline.name else f"{output.name}:"


def _gold_measure(rows: Any, output: OutputDef, metric: str) -> int:
    """The window's sum of ``metric`` over its gold rows (a small pandas frame), or its number of distinct
    keys when ``metric`` is the output's key."""
    if rows.empty or metric not in rows.columns:
        return 0
    if metric in output.keys:
        return int(rows[metric].nunique())
    return int(rows[metric].fillna(0).sum())


@dataclass
class QualityReport:
    pipeline: str
    checked: list[Window] = field(default_factory=list)
    failed: dict[Window, list[tuple[str, str]]] = field(default_factory=dict)
    docs_index: str | None = None  # the index page where readers find it: a local path or an s3:// URI
    alerts_sent: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failed

    def failure_lines(self) -> list[str]:
        """One line per failed window, oldest first: ``  FAILED 2024-05-01 10:00: check (observed), ...``."""
        return [f"  FAILED {start:%Y-%m-%d %H:%M}: " + ", ".join(f"{e} ({v})" for e, v in failures)
                for (start, _end), failures in sorted(self.failed.items())]




def _window_rows(rows: Any, window: Window) -> Any:
    return rows[(rows["window_start"] == window[0]) & (rows["window_end"] == window[1])].reset_index(drop=True)


def gold_rows(engine: DeltaEngine, path: str, windows: Sequence[Window]) -> Any:
    """The rows of a gold table whose windows start where ``windows`` do (a pandas frame, window bounds in
    UTC; :func:`_window_rows` picks one window's): windows x keys rows, read with pyarrow rather than a Spark
    job (seconds of job set-up for a few hundred rows), unless the table needs a Delta reader."""
    import pandas as pd  # only where windows are checked: the import costs every CLI start ~0.4 s

    starts = pa.array(sorted({s for s, _ in windows}), pa.timestamp("us", tz="UTC"))
    start = pc.field("window_start")
    # The range lets pyarrow skip row groups by their statistics; isin keeps exactly the windows' starts.
    table = read_selected_rows(path, (start >= starts[0]) & (start <= starts[-1]) & start.isin(starts))
    if table is not None:
        rows = table.to_pandas()
    else:
        gold = engine.read(path)
        bounds = local_frame(gold.sparkSession, windows, "window_start timestamp, window_end timestamp")
        rows = gold.join(F.broadcast(bounds.select("window_start").distinct()), ["window_start"]).toPandas()
    for column in ("window_start", "window_end"):
        rows[column] = pd.to_datetime(rows[column], utc=True)
    return rows


def deliver_pending_alerts(settings: Settings, pipeline: str) -> list[str]:
    """Send the pipeline's alerts recorded in the ops/alerts outbox but not delivered yet, and mark them
    delivered; returns their messages. Pure delta-rs (no Spark): this runs in the Airflow worker."""
    from sluice.alerting.outbox import deliver_pending

    return [alert.message for alert in deliver_pending(settings, pipeline).delivered]


def raise_alert(settings: Settings, engine: DeltaEngine, alert: Any, *, deliver: bool) -> list[str]:
    """Record ``alert`` in the ops/alerts outbox and deliver it now or leave it to the DAG's alert task
    (:func:`sluice.alerting.outbox.raise_alert`). Returns the channels that delivered it."""
    from sluice.alerting.outbox import raise_alert as record_and_deliver

    return record_and_deliver(settings, alert, deliver=deliver, engine=engine)


def docs_url(settings: Settings, page: Path | str | None) -> str | None:
    """The URL of a Data Docs page (where GE rendered it, where readers find it, or its path inside the site),
    for alerts; None for a page outside the site."""
    relative = docs_site(settings).relative(page)
    return None if relative is None else settings.docs_url(relative)


def merged_reports(first: QualityReport | None, second: QualityReport | None) -> QualityReport | None:
    """One report of two validations of one pipeline (a cycle's new windows and its corrections)."""
    if first is None or second is None:
        return first or second
    return QualityReport(first.pipeline, [*first.checked, *second.checked], {**first.failed, **second.failed},
                         second.docs_index or first.docs_index, [*first.alerts_sent, *second.alerts_sent])


class QualityChecker:
    def __init__(self, ctx: RunContext, pipeline: PipelineDef):
        self._ctx = ctx
        self.settings = ctx.settings
        self.engine = ctx.engine
        self.ledger = ctx.ledger(pipeline.name)
        self.pipeline = pipeline

    @property
    def spark(self) -> SparkSession:
        """The run's Spark session, started when first needed (a cycle with nothing to do needs none)."""
        return self._ctx.spark

    def pending(self) -> list[Window]:
        """Windows closed but not yet validated (including any left over by an interrupted cycle)."""
        return self.ledger.pending()

    def check(
        self,
        windows: Sequence[Window] | None = None,
        *,
        final_state: str | None = None,
        deliver: bool = True,
        include_late: bool = False,
        rounds: Mapping[Window, int] | None = None,
        late_in_gold: Mapping[Window, int] | None = None,
    ) -> QualityReport:
        """Validate ``windows`` (default: all pending). ``final_state`` overrides the ledger state written
        on success (backfills mark windows ``reprocessed``). With ``deliver=False`` failing windows get their
        ops/alerts row but delivery is left to :func:`deliver_pending_alerts` (the DAG's alert task).
        ``include_late``: gold was rebuilt with the DLQ records (a backfill), so completeness counts them.
        ``rounds``: the validation round (``attempt``) of each window, as a backfill or correction planned it
        before its first commit; other windows take the ledger's attempt + 1.
        ``late_in_gold``: per window, how many of its DLQ records gold was just rebuilt with (a backfill with
        ``include_late``): the lateness check counts only the DLQ records not in gold (SPEC 5). None: what the
        ledger says gold holds (``late_in_gold``, set by the last backfill or correction), as for a re-check."""
        report = QualityReport(self.pipeline.name)
        if windows is None:  # the scheduled check (not a backfill's): also judge freshness
            self._freshness()
        windows = sorted(set(windows if windows is not None else self.pending()))
        stray = self._stray_records()
        if not windows and not stray:
            if deliver:  # alerts a crashed run recorded but did not deliver
                deliver_pending_alerts(self.settings, self.pipeline.name)
            return report
        # Imported only when there is something to validate: GE takes seconds to import.
        from sluice.quality.validator import WindowValidator

        for table in (tables.DQ_RESULTS, tables.ALERTS):
            self.engine.ensure_table(table.path(self.settings), table.schema)
        gold_by_output = {output.name: gold_rows(self.engine, output.path(self.settings), windows)
                          for output in self.pipeline.outputs} if windows else {}
        site = docs_site(self.settings)
        validator = WindowValidator(
            site,
            lateness_threshold=self.settings.lateness_threshold,
            run_time=self.settings.now(),
            window_seconds=int(self.pipeline.window.size.total_seconds()),
        )
        results = []
        for window, validation in stray:
            results.append((window, validation, 0))
            report.checked.append(window)
            report.failed[window] = [(o.expectation, o.observed_value) for o in validation.failed]
        if windows:
            # The pipeline's DLQ records per window (only DLQ files not counted before are read).
            late_by_window = dlq_counts(self.settings, self.pipeline, windows)
            if late_in_gold is None:
                late_in_gold = {r.window: r.late_in_gold for r in self.ledger.rows
                                if r.late_in_gold}
            count = window_counts(self.settings, self.engine, self.pipeline, windows, include_late)
            with ThreadPoolExecutor(1, thread_name_prefix="sluice-dq-counts") as pool:
                # The windows' bronze counts (pyarrow on a few files, or Spark jobs on the executors) run while GE
                # checks the gold rows here, on the driver.
                counting = pool.submit(count)
                log.info("data quality %s: the gold rows of %d window(s)", self.pipeline.name, len(windows))
                # Every window's gold rows in one validation per output while they pass (the validator's
                # "Many windows"): GE's cost is per validation, and a catch-up closes hundreds of windows.
                gold_runs = validator.validate_outputs_together(
                    self.pipeline.name, {window: self._frames(gold_by_output, window) for window in windows})
                bronze_measure, totals = counting.result()
            completeness = self._completeness(windows, gold_by_output, bronze_measure)
            late_by_window = {window: late_by_window.get(window, 0) for window in windows}
            # The window's records are bronze's and the DLQ's; of the DLQ's, those gold holds are no longer late
            # data (a backfill or correction with the late records put them in).
            totals_runs = validator.validate_totals_together(self.pipeline.name, {
                window: (completeness.get(window, {}), max(0, late - late_in_gold.get(window, 0)),
                         totals.get(window, 0) + late)
                for window, late in late_by_window.items()
            })
            for window in windows:
                validation = validator.combine(self.pipeline.name, *window, [totals_runs[window], *gold_runs[window]])
                report.checked.append(window)
                if not validation.success:
                    report.failed[window] = [(o.expectation, o.observed_value) for o in validation.failed]
                results.append((window, validation, late_by_window[window]))
        report.docs_index = site.location(validator.build_docs())
        self._record(results, report, final_state, deliver, rounds or {})
        return report

    def _frames(self, gold_by_output: Mapping[str, Any], window: Window) -> list[Any]:
        """Every output's gold rows of ``window``, with the checks its gold suite runs."""
        from sluice.core.checks import Between, NotNull
        from sluice.quality.frames import OutputFrame

        return [
            OutputFrame(
                output.name, _window_rows(gold_by_output[output.name], window), output.keys,
                tuple(c for c in output.checks if isinstance(c, Between | NotNull)),
                outcome_prefix(self.pipeline, output),
            )
            for output in self.pipeline.outputs
        ]

    def _freshness(self) -> None:
        """Record a ``stale`` alert when the oldest open window is past end + bound + freshness_grace
        (:mod:`sluice.quality.freshness`); delivered with the step's other alerts."""
        from sluice.quality.freshness import silent_substream_alert, stale_alerts

        alerts = stale_alerts(self.settings, self.pipeline)
        silent = silent_substream_alert(self.settings, self.pipeline)
        if silent is not None:
            alerts.append(silent)
        if alerts:
            from sluice.alerting.outbox import record_alerts

            record_alerts(self.settings, alerts, self.engine)

    def _stray_records(self) -> list[tuple[Window, Any]]:
        """Accepted records that no window can hold: bronze hours before EARLIEST_EVENT_TIME. Ingest
        quarantines such event times, but bronze written before that rule (or by another tool) may hold
        some, and no window, ledger row or completeness check would ever see them. Found from the Delta
        log alone (no data is read), they fail one pseudo-window [earliest such hour, EARLIEST_EVENT_TIME)
        with a ``coverage:<stream>`` outcome per stream, once: a window already failed is not re-raised."""
        from sluice.quality.outcomes import ExpectationOutcome, WindowValidation

        outcomes: list[ExpectationOutcome] = []
        first: datetime | None = None
        for stream in self.pipeline.streams:
            hours = tables.bronze_hours(tables.bronze(self.settings.stream(stream)).path(self.settings))
            old = {hour: n for hour, n in hours.items() if hour < EARLIEST_EVENT_TIME}
            if old:
                first = min(old) if first is None else min(first, min(old))
                outcomes.append(ExpectationOutcome(
                    f"coverage:{stream}",
                    f"{sum(old.values())} accepted record(s) in bronze/{stream} before "
                    f"{EARLIEST_EVENT_TIME:%Y-%m-%dT%H:%M:%SZ} reach no window; move them out of bronze (a "
                    "backfill cannot place them)",
                    False,
                ))
        if first is None:
            return []
        window = (first, EARLIEST_EVENT_TIME)
        failed = {(r.window_start, r.window_end) for r in self.ledger.rows
                  if r.state == "failed"}
        if window in failed:
            return []
        return [(window, WindowValidation(self.pipeline.name, window[0], window[1], outcomes))]

    # -- inputs ---------------------------------------------------------------------------------------
    def _completeness(
        self, windows: Sequence[Window], gold_by_output: Mapping[str, Any], bronze_measure: Mapping[Any, int]
    ) -> dict[Window, dict[str, tuple[int, int]]]:
        """Per window, each declared completeness check's (gold total, bronze count)."""
        checks = completeness_checks(self.pipeline)
        completeness: dict[Window, dict[str, tuple[int, int]]] = {}
        for window in windows:
            for output, check in checks:
                rows = _window_rows(gold_by_output[output.name], window)
                completeness.setdefault(window, {})[outcome_prefix(self.pipeline, output) + check.name] = (
                    _gold_measure(rows, output, check.metric),
                    bronze_measure.get((check.name + output.name, window), 0),
                )
        return completeness

    # -- outputs --------------------------------------------------------------------------------------
    def _record(self, results, report: QualityReport, final_state: str | None, deliver: bool,
                rounds: Mapping[Window, int]) -> None:
        """Results, then the outbox, then the ledger, then delivery: each step is one atomic commit, and a
        crash between any two leaves a state the rerun completes with exactly one alert per failing window
        (a window whose ledger state was not written yet is validated again; its alert key is the same)."""
        from sluice.alerting.alert import Alert
        from sluice.alerting.outbox import deliver_pending, record_alerts

        now = self.settings.now()
        name = self.pipeline.name
        site = docs_site(self.settings)
        docs = report.docs_index
        dq_rows = [
            (name, w[0], w[1], o.expectation, o.observed_value, o.success, now,
             site.location(v.docs_path) or docs)
            for w, v, _late in results
            for o in v.outcomes
        ]
        path = tables.DQ_RESULTS.path(self.settings)
        app = f"sluice.dq.{name}"
        keys = [(name, w[0], w[1]) for w, _v, _l in results]
        replace_windows(self.engine, path, dq_rows, tables.DQ_RESULTS.schema, keys,
                        order_by=("pipeline", "window_start", "window_end", "expectation"),
                        app_id=app, version=next_version(self.engine, path, app))

        ledger = self.ledger.by_window()
        updated = []
        alerts = []
        for window, validation, n_late in results:
            row = ledger.get(window) or LedgerRow(
                name, window[0], window[1], "closed", None, len(validation.outcomes), n_late, now, now
            )
            # This validation round: the key of the window's alert, stable until the ledger records it. A
            # backfill or correction fixes it in its plan, as the ledger may already hold it when a rerun
            # resumes one killed after this step (+1 again would be a new round: a second alert).
            row.attempt = rounds.get(window) or (row.attempt or 0) + 1
            row.validated_by = airflow_task()
            # The ledger keeps the late count its row was closed (or rebuilt) with: late records that landed
            # since are amendments (sluice.streaming.corrections), not silently part of the window. The
            # lateness expectation above counts them all.
            if window not in ledger:
                row.late_rows = n_late
            row.updated_at = now
            if validation.success:
                # A re-check of a rewritten window keeps it reprocessed (its gold is a backfill's).
                row.state = final_state or ("reprocessed" if row.gold_versions else "validated")
                row.detail = None
            else:
                row.state = "failed"
                row.detail = "; ".join(f"{o.expectation} ({o.observed_value})" for o in validation.failed)
                alerts.append(Alert(
                    pipeline=name, window_start=window[0], window_end=window[1],
                    failed=[{"expectation": o.expectation, "observed_value": o.observed_value}
                            for o in validation.failed],
                    docs_url=docs_url(self.settings, validation.docs_path or report.docs_index), raised_at=now,
                    attempt=row.attempt,
                ))
            updated.append(row)
        record_alerts(self.settings, alerts, self.engine)
        self.ledger.record_validation(self.engine, updated, app_id=f"sluice.ledger.dq.{name}")
        if deliver:
            delivered = deliver_pending(self.settings, name, self.engine)
            for channels in delivered.channels.values():
                report.alerts_sent.extend(channels)
        passed = len(results) - len(report.failed)
        log.info("%s: data quality on %d window(s): %d passed, %d failed; Data Docs: %s",
                 name, len(results), passed, len(report.failed), docs or "-")
