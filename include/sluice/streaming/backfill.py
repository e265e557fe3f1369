"""Backfills (SPEC section 6): recompute a range of windows from bronze, in batch, with the very same
transforms as the streaming path, and replace exactly that range of gold in one atomic commit per table.

* Deterministic: the same bronze gives the same rows (sorted, one file per commit), so two runs yield
  identical tables, and without late data the result equals what streaming wrote.
* ``include_late`` adds the DLQ records of the pipeline's streams to the input.
* Only closed windows are rewritten: a window still open would otherwise be emitted again by streaming.
* Holds the pipeline lock, so it never writes at the same time as a scheduled cycle.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from sluice.config import ConfigError, Settings, parse_time
from sluice.core.locks import pipeline_lock
from sluice.core.model import PipelineDef
from sluice.core.spark import get_spark
from sluice.quality.checker import QualityChecker, QualityReport
from sluice.quality.validator import warm_up
from sluice.storage.engine import DeltaEngine, engine_for
from sluice.storage.ledger import LedgerRow, next_version, read_ledger, write_ledger
from sluice.streaming.runner import batch_inputs, closing_boundary, ensure_output_table, gold_rows

log = logging.getLogger("sluice.backfill")

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass
class BackfillRequest:
    pipeline: PipelineDef
    start: datetime
    end: datetime
    include_late: bool = False


@dataclass
class BackfillResult:
    request: BackfillRequest
    windows: list[tuple[datetime, datetime]] = field(default_factory=list)
    rows: dict[str, int] = field(default_factory=dict)
    skipped_open: list[tuple[datetime, datetime]] = field(default_factory=list)
    quality: QualityReport | None = None
    seconds: float = 0.0

    @property
    def exit_code(self) -> int:
        return 2 if self.quality is not None and not self.quality.ok else 0

    def render(self) -> str:
        req = self.request
        lines = [
            f"sluice backfill {req.pipeline.name} [{req.start:%Y-%m-%d %H:%M}, {req.end:%Y-%m-%d %H:%M}) "
            f"include_late={req.include_late}: {len(self.windows)} window(s) rewritten in {self.seconds:.1f}s",
        ]
        for output, n in self.rows.items():
            lines.append(f"  {output}: {n} row(s)")
        if self.skipped_open:
            lines.append(f"  skipped {len(self.skipped_open)} window(s) that are still open (not yet closed by the "
                         "watermark); they will be written by the scheduled run")
        if self.quality is not None:
            lines.append(f"  data quality: {len(self.quality.checked) - len(self.quality.failed)} passed, "
                         f"{len(self.quality.failed)} failed")
        return "\n".join(lines)


def validate_request(
    settings: Settings, pipeline: str, start: str | datetime, end: str | datetime, include_late: bool = False
) -> BackfillRequest:
    """Check parameters before any Spark work; every message says what to do instead."""
    definition = settings.pipeline(pipeline)
    start_ts = parse_time(start, "start")  # within the range timestamps (and window margins) support
    end_ts = parse_time(end, "end")
    if start_ts >= end_ts:
        raise ConfigError(
            f"backfill range is empty or reversed: start {start_ts.isoformat()} must be before end "
            f"{end_ts.isoformat()}; swap them or widen the range"
        )
    slide = definition.window.slide
    for name, ts in (("start", start_ts), ("end", end_ts)):
        if (ts - EPOCH) % slide:
            aligned = EPOCH + ((ts - EPOCH) // slide) * slide
            raise ConfigError(
                f"backfill {name} {ts.isoformat()} is not aligned to the {pipeline} windows "
                f"(every {slide}); use e.g. {aligned.isoformat()}"
            )
    return BackfillRequest(definition, start_ts, end_ts, include_late)


class Backfill:
    def __init__(
        self,
        spark: SparkSession,
        settings: Settings,
        engine: DeltaEngine,
        request: BackfillRequest,
        deliver_alerts: bool = True,
    ):
        self.deliver_alerts = deliver_alerts
        self.spark = spark
        self.settings = settings
        self.engine = engine
        self.request = request

    def _inputs(self) -> dict[str, DataFrame]:
        req = self.request
        pipeline = req.pipeline
        # Everything that can reach a window in range: the window itself, plus the join bound both ways.
        margin = pipeline.window.size + pipeline.lateness_bound + timedelta(hours=1)
        return batch_inputs(self.settings, self.engine, pipeline, req.start - margin, req.end + margin,
                            include_late=req.include_late)

    def run(self) -> BackfillResult:
        started = time.monotonic()
        warm_up()  # every backfill validates what it rewrites
        req = self.request
        pipeline = req.pipeline
        result = BackfillResult(req)
        # The closing rule of every path: a window is final once W >= end + lateness_bound.
        closable_until = closing_boundary(self.settings, pipeline)
        inputs = self._inputs()
        in_range = (F.col("window_start") >= F.lit(req.start)) & (F.col("window_start") < F.lit(req.end))
        closed = (
            in_range & (F.col("window_end") <= F.lit(closable_until)) if closable_until is not None else F.lit(False)
        )
        windows: set[tuple[datetime, datetime]] = set()
        for output in pipeline.outputs:
            ensure_output_table(self.spark, self.settings, self.engine, pipeline, output)
            # One computation (gold-sized: windows x keys) feeds the open-window check, the counts and the commit.
            computed = gold_rows(output, output.build(inputs, pipeline.window), pipeline.window)
            computed = computed.filter(in_range).localCheckpoint()
            for r in computed.filter(~closed).select("window_start", "window_end").distinct().collect():
                result.skipped_open.append((r[0].astimezone(UTC), r[1].astimezone(UTC)))
            rows = computed.filter(closed).coalesce(1).sortWithinPartitions("window_start", "window_end", *output.keys)
            counts = {
                (r[0].astimezone(UTC), r[1].astimezone(UTC)): int(r[2])
                for r in rows.groupBy("window_start", "window_end").count().collect()
            }
            windows.update(counts)
            result.rows[output.name] = sum(counts.values())
            path = output.path(self.settings)
            app = f"sluice.backfill.{output.name}"
            meta = {"pipeline": pipeline.name, "start": req.start, "end": req.end, "include_late": req.include_late}
            self.engine.replace(
                rows, path, keep=lambda current: current.filter(~in_range),
                app_id=app, version=next_version(self.engine, path, app), metadata=meta,
            )
        result.windows = sorted(windows)
        result.skipped_open = sorted(set(result.skipped_open) - windows)
        self._mark_ledger(result)
        result.quality = QualityChecker(self.spark, self.settings, self.engine, pipeline).check(
            result.windows, final_state="reprocessed", include_late=req.include_late, deliver=self.deliver_alerts
        )
        result.seconds = time.monotonic() - started
        return result

    def _mark_ledger(self, result: BackfillResult) -> None:
        now = self.settings.now()
        name = self.request.pipeline.name
        existing = {(r.window_start, r.window_end): r for r in read_ledger(self.settings, name)}
        rows = []
        for window in result.windows:
            row = existing.get(window) or LedgerRow(name, window[0], window[1], "reprocessed", None, 0, 0, now, now)
            row.state = "reprocessed"
            row.updated_at = now
            rows.append(row)
        write_ledger(self.settings, self.engine, rows, app_id=f"sluice.ledger.backfill.{name}")


def run_backfill(
    settings: Settings,
    pipeline: str,
    start: str | datetime,
    end: str | datetime,
    include_late: bool = False,
    spark: SparkSession | None = None,
    *,
    deliver_alerts: bool = True,
) -> BackfillResult:
    request = validate_request(settings, pipeline, start, end, include_late)  # before any JVM starts
    with pipeline_lock(settings, pipeline, purpose=f"backfill {request.start:%Y-%m-%dT%H:%M}..{request.end:%H:%M}"):
        spark = spark or get_spark(settings, f"sluice-backfill-{pipeline}")
        return Backfill(spark, settings, engine_for(spark, settings), request, deliver_alerts).run()
