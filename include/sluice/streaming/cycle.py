"""One full cycle of a pipeline: ingest its streams (and, as the pipeline grows, aggregate and check).

Shared by ``sluice run`` and the Airflow tasks so that both behave identically.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from pyspark.sql import SparkSession

from sluice.cli.report import accounting_table
from sluice.config import Settings
from sluice.core.locks import pipeline_lock
from sluice.core.spark import get_spark
from sluice.ingest.landing import BatchRow, local_path, run_ingest
from sluice.quality.checker import QualityChecker, QualityReport, raise_alert
from sluice.quality.validator import warm_up
from sluice.storage.engine import engine_for
from sluice.streaming.runner import AggregateResult, run_pipeline

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
        if self.aggregate is not None:
            windows = self.aggregate.windows
            closed = ", ".join(f"{s:%m-%d %H:%M}" for s, _e in windows[:6]) + (" ..." if len(windows) > 6 else "")
            parts.append(f"windows closed this cycle: {len(windows)}" + (f" ({closed})" if windows else ""))
        if self.quality is not None:
            q = self.quality
            parts.append(f"data quality: {len(q.checked) - len(q.failed)} window(s) passed, {len(q.failed)} failed"
                         + (f"; Data Docs: {q.docs_index}" if q.docs_index else ""))
            for (start, _end), failures in sorted(q.failed.items()):
                parts.append(f"  FAILED {start:%Y-%m-%d %H:%M}: " + ", ".join(f"{e} ({v})" for e, v in failures))
        return "\n".join(parts)


def run_cycle(
    settings: Settings,
    pipeline: str,
    spark: SparkSession | None = None,
    *,
    check_quality: bool = True,
    deliver_alerts: bool = True,
) -> CycleResult:
    """Ingest the pipeline's streams, aggregate closed windows, validate them. ``check_quality=False``
    leaves the validation to a separate step (the Airflow DAG runs it as its own task)."""
    definition = settings.pipeline(pipeline)  # fails fast on an unknown pipeline, before any JVM starts
    streams = definition.streams
    started = time.monotonic()
    spark = spark or get_spark(settings, f"sluice-{pipeline}")
    engine = engine_for(spark, settings)
    log.info("cycle %s: ingesting %s (now=%s)", pipeline, ", ".join(streams), settings.now().isoformat())
    with pipeline_lock(settings, pipeline, purpose=f"cycle now={settings.now().isoformat()}"):
        batches = run_ingest(spark, settings, engine, streams)
        unreadable = [(stream, local_path(r.source_file or "")) for stream, rows in batches.items()
                      for r in rows if r.unreadable]
        if unreadable:
            from sluice.alerting.notifiers import Alert  # imports Airflow: only when there is an alert

            raise_alert(settings, engine, Alert.unreadable_files(pipeline, unreadable, settings.now()),
                        deliver=deliver_alerts)
        if check_quality and any(b.accepted for rows in batches.values() for b in rows):
            warm_up()  # new records may close windows to validate: import GE while Spark aggregates
        log.info("cycle %s: aggregating closed windows", pipeline)
        aggregate = run_pipeline(spark, settings, engine, definition)
        if check_quality:
            log.info("cycle %s: checking data quality", pipeline)
        quality = (
            QualityChecker(spark, settings, engine, definition).check(deliver=deliver_alerts)
            if check_quality
            else None
        )
    result = CycleResult(pipeline, settings, batches, aggregate, seconds=time.monotonic() - started)
    result.quality = quality
    result.failed_windows = len(quality.failed) if quality else 0
    return result


def run_quality(
    settings: Settings, pipeline: str, spark: SparkSession | None = None, *, deliver_alerts: bool = True
) -> QualityReport:
    """The DQ step on its own (the DAG's check_quality task): every window closed but not yet validated."""
    definition = settings.pipeline(pipeline)
    spark = spark or get_spark(settings, f"sluice-dq-{pipeline}")
    with pipeline_lock(settings, pipeline, purpose="data quality"):
        engine = engine_for(spark, settings)
        return QualityChecker(spark, settings, engine, definition).check(deliver=deliver_alerts)
