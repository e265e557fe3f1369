"""Committing closed windows, what every path that closes one shares (the streaming sinks of
:mod:`sluice.streaming.runner`, the batch close and the batch catch-up of :mod:`sluice.streaming.closing`): an
output's gold rows of the closed windows in one commit, then their ledger rows, each idempotent per app
transaction ``(app_id, version)``."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from sluice.core.model import OutputDef, PipelineDef
from sluice.core.spark import collected_utc
from sluice.core.windows import Window
from sluice.runtime.context import RunContext
from sluice.storage.dlq import dlq_counts
from sluice.streaming.definitions import OutputDefinition, fingerprints, record
from sluice.windows.ledger import LedgerRow, airflow_task

log = logging.getLogger("sluice.aggregate")


@dataclass
class AggregateResult:
    pipeline: str
    closed: dict[str, list[Window]] = field(default_factory=dict)  # output -> windows closed this cycle

    @property
    def windows(self) -> list[Window]:
        return sorted({w for ws in self.closed.values() for w in ws})


class WindowCommits:
    """Commits one pipeline's closed windows to gold and the ledger, and notes them in ``result``."""

    def __init__(self, ctx: RunContext, pipeline: PipelineDef, result: AggregateResult,
                 definitions: Callable[[], dict[str, OutputDefinition]]):
        self.settings = ctx.settings
        self.engine = ctx.engine
        self.state = ctx.state
        self.ledger = ctx.ledger(pipeline.name)
        self.pipeline = pipeline
        self.result = result
        # The outputs' definitions, analysed when a window is first recorded (see PipelineRunner.definitions).
        self._definitions = definitions

    def commit(
        self,
        output: OutputDef,
        rows: DataFrame,
        meta: dict[str, object],
        watermark: datetime | None,
        app_id: str,
        version: int,
        *,
        ledger_app: str,
        before_ledger: Callable[[], None] | None = None,
    ) -> None:
        """Append closed windows to gold in one commit and record them in the ledger (both idempotent per
        (app_id, version)); ``before_ledger`` runs between the two (the streaming sinks' turn, see Turnstile)."""
        counts = self.write_rows(output, rows, meta, watermark, app_id, version)
        if not counts:
            return
        windows = sorted(counts)
        if before_ledger is not None:
            before_ledger()
        self.record_closed(output, counts, watermark, app_id=ledger_app, version=version)
        self.result.closed[output.name].extend(windows)
        for start, end in windows:
            log.info("%s: closed window %s..%s (%d rows, watermark %s)", output.name,
                     start.strftime("%Y-%m-%d %H:%M"), end.strftime("%H:%M"), counts[(start, end)],
                     watermark.isoformat() if watermark else "-")

    def write_rows(self, output: OutputDef, rows: DataFrame, meta: dict[str, object], watermark: datetime | None,
                   app_id: str, version: int, *, windows_key: str = "closed_windows") -> dict[Window, int]:
        """Append ``rows`` to gold in one commit (idempotent per (app_id, version)); their row counts per window,
        which the commit's metadata lists under ``windows_key``."""
        counts = {
            (collected_utc(r["window_start"]), collected_utc(r["window_end"])): int(r["n"])
            for r in rows.groupBy("window_start", "window_end").agg(F.count(F.lit(1)).alias("n")).collect()
        }
        if counts:
            meta = {**meta, "watermark": watermark,
                    windows_key: [[s.isoformat(), e.isoformat()] for s, e in sorted(counts)]}
            self.engine.append(rows, output.path(self.settings), app_id=app_id, version=version, metadata=meta)
        return counts

    def record_closed(
        self, output: OutputDef, counts: dict[Window, int], watermark: datetime | None, *, app_id: str, version: int
    ) -> None:
        """Ledger rows for windows this batch closed. A pipeline with several outputs shares one ledger row
        per window; the first output to close it creates the row, later ones add their rows."""
        existing = self.ledger.by_window()
        late = dlq_counts(self.settings, self.pipeline, list(counts))
        now = self.settings.now()
        definition = fingerprints(self._definitions())
        rows = []
        for window, n in sorted(counts.items()):
            current = existing.get(window)
            if current is not None:
                current.rows += n
                current.late_rows = late.get(window, 0)
                current.updated_at = now
                current.definition = definition
                rows.append(current)
            else:
                rows.append(
                    LedgerRow(
                        pipeline=self.pipeline.name,
                        window_start=window[0],
                        window_end=window[1],
                        state="closed",
                        closed_by_watermark=watermark,
                        rows=n,
                        late_rows=late.get(window, 0),
                        closed_at=now,
                        updated_at=now,
                        closed_by=airflow_task(),
                        definition=definition,
                    )
                )
        self.ledger.close(self.engine, rows, app_id=app_id, version=version)
        record(self.state, self.pipeline.name, self._definitions())

