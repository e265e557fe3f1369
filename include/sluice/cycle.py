"""One full cycle of a pipeline: ingest its streams (and, as the pipeline grows, aggregate and check).

Shared by ``sluice run`` and the Airflow tasks so that both behave identically.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from pyspark.sql import SparkSession

from sluice.aggregate import AggregateResult, run_pipeline
from sluice.config import Settings, pipeline_streams
from sluice.delta.engine import get_engine
from sluice.ingest import BatchRow, run_ingest
from sluice.pipelines import get_pipeline
from sluice.report import accounting_table
from sluice.spark import get_spark

log = logging.getLogger("sluice.cycle")


@dataclass
class CycleResult:
    pipeline: str
    settings: Settings
    batches: dict[str, list[BatchRow]] = field(default_factory=dict)
    aggregate: AggregateResult | None = None
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
        return "\n".join(parts)


def run_cycle(settings: Settings, pipeline: str, spark: SparkSession | None = None) -> CycleResult:
    streams = pipeline_streams(pipeline)  # fails fast on an unknown pipeline, before any JVM starts
    started = time.monotonic()
    spark = spark or get_spark(settings, f"sluice-{pipeline}")
    engine = get_engine(spark)
    log.info("cycle %s: ingesting %s (now=%s)", pipeline, ", ".join(streams), settings.now().isoformat())
    batches = run_ingest(spark, settings, engine, streams)
    log.info("cycle %s: aggregating closed windows", pipeline)
    aggregate = run_pipeline(spark, settings, engine, get_pipeline(pipeline, settings.window_for(pipeline)))
    return CycleResult(pipeline, settings, batches, aggregate, seconds=time.monotonic() - started)
