"""The scheduled (streaming) path: bronze -> gold, one availableNow query per pipeline output.

Each query reads the pipeline's bronze streams through the engine's Delta stream source, applies the
pipeline's transforms (watermarks, dedup, stream-stream join, chained windows: several stateful operators
in one query, RocksDB state), and writes closed windows in append mode. The sink (``foreachBatch``):

* drops heartbeat groups (they only exist to move watermarks),
* appends the windows to gold in one Delta commit keyed by (query, batch id), so a replayed batch is a
  no-op and every window is written exactly once,
* records the windows in ops/window_ledger with the watermark that closed them.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from deltalake import DeltaTable
from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from sluice import tables
from sluice.config import Settings
from sluice.delta.engine import DeltaEngine
from sluice.ledger import LedgerRow, late_counts, read_ledger, write_ledger
from sluice.pipelines import PipelineDef
from sluice.pipelines.base import Output, WindowSpec
from sluice.pipelines.transforms import without_heartbeats
from sluice.spark import collected_utc

log = logging.getLogger("sluice.aggregate")

Window = tuple[datetime, datetime]


@dataclass
class AggregateResult:
    pipeline: str
    closed: dict[str, list[Window]] = field(default_factory=dict)  # output -> windows closed this cycle

    @property
    def windows(self) -> list[Window]:
        return sorted({w for ws in self.closed.values() for w in ws})


def batch_watermark(checkpoint: Path, batch_id: int) -> datetime | None:
    """The global watermark Spark used for ``batch_id``, from the query's offset log."""
    offsets = checkpoint / "offsets" / str(batch_id)
    try:
        lines = offsets.read_text().splitlines()
        millis = json.loads(lines[1]).get("batchWatermarkMs", 0)
    except (OSError, IndexError, ValueError):
        return None
    return datetime.fromtimestamp(millis / 1000, UTC) if millis else None


def gold_rows(output: Output, df: DataFrame, window: WindowSpec) -> DataFrame:
    """Sink-side shaping shared by the streaming and backfill paths: contract columns, no heartbeats,
    deterministic order."""
    columns = output.table.schema.names
    return (
        df.transform(window.bounds)
        .transform(without_heartbeats(output.key))
        .select(*columns)
        .coalesce(1)
        .sortWithinPartitions("window_start", "window_end", output.key)
    )


class PipelineRunner:
    def __init__(self, spark: SparkSession, settings: Settings, engine: DeltaEngine, pipeline: PipelineDef):
        self.spark = spark
        self.settings = settings
        self.engine = engine
        self.pipeline = pipeline
        self.result = AggregateResult(pipeline.name)

    def checkpoint(self, output: Output) -> Path:
        return self.settings.checkpoints / "pipelines" / self.pipeline.name / output.name

    def ensure_tables(self) -> None:
        from sluice.ledger import WINDOW_LEDGER

        for output in self.pipeline.outputs:
            self.engine.ensure_table(output.table.path(self.settings), output.table.schema)
        self.engine.ensure_table(WINDOW_LEDGER.path(self.settings), WINDOW_LEDGER.schema)

    def inputs(self, streaming: bool = True) -> dict[str, DataFrame]:
        frames = {}
        for stream, prepare in self.pipeline.inputs.items():
            spec = self.settings.stream(stream)
            path = tables.bronze(spec).path(self.settings)
            raw = (
                self.engine.read_stream(path, max_files_per_trigger=self.settings.max_files_per_trigger)
                if streaming
                else self.engine.read(path)
            )
            frames[stream] = raw.transform(prepare(spec))
        return frames

    def run(self) -> AggregateResult:
        self.ensure_tables()
        for output in self.pipeline.outputs:
            self._run_output(output)
        return self.result

    def input_versions(self) -> dict[str, int]:
        """The current Delta version of every bronze input (metadata only)."""
        versions = {}
        for stream in self.pipeline.inputs:
            path = tables.bronze(self.settings.stream(stream)).path(self.settings)
            versions[stream] = DeltaTable(str(path)).version() if DeltaTable.is_deltatable(str(path)) else -1
        return versions

    def _run_output(self, output: Output) -> None:
        checkpoint = self.checkpoint(output)
        self.result.closed.setdefault(output.name, [])
        # Nothing new in bronze since this query last finished: its watermark cannot have moved, so no
        # window can close. Skipping saves starting a streaming query (seconds) on idle cycles.
        marker = checkpoint / "sluice_input_versions.json"
        versions = self.input_versions()
        if marker.exists() and json.loads(marker.read_text()) == versions:
            log.info("%s: no new bronze commits since the last run; nothing to aggregate", output.name)
            return
        windowed = output.build(self.inputs(), self.pipeline.window)
        query = (
            windowed.writeStream.queryName(f"sluice_{self.pipeline.name}_{output.name}")
            .outputMode("append")
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .foreachBatch(lambda df, batch_id: self._sink(output, checkpoint, df, batch_id))
            .start()
        )
        query.awaitTermination()
        marker.write_text(json.dumps(versions, sort_keys=True))

    def _sink(self, output: Output, checkpoint: Path, df: DataFrame, batch_id: int) -> None:
        rows = gold_rows(output, df, self.pipeline.window).persist(StorageLevel.MEMORY_AND_DISK)
        try:
            counts = {
                (collected_utc(r["window_start"]), collected_utc(r["window_end"])): int(r["n"])
                for r in rows.groupBy("window_start", "window_end").agg(F.count(F.lit(1)).alias("n")).collect()
            }
            watermark = batch_watermark(checkpoint, batch_id)
            if not counts:
                return
            windows = sorted(counts)
            meta = {
                "pipeline": self.pipeline.name,
                "output": output.name,
                "batch_id": batch_id,
                "watermark": watermark,
                "closed_windows": [[s.isoformat(), e.isoformat()] for s, e in windows],
            }
            app_id = f"sluice.gold.{output.name}"
            self.engine.append(rows, output.table.path(self.settings), app_id=app_id, version=batch_id, metadata=meta)
            self._record_closed(output, counts, watermark, batch_id)
            self.result.closed[output.name].extend(windows)
            for start, end in windows:
                log.info("%s: closed window %s..%s (%d rows, watermark %s)", output.name,
                         start.strftime("%Y-%m-%d %H:%M"), end.strftime("%H:%M"), counts[(start, end)],
                         watermark.isoformat() if watermark else "-")
        finally:
            rows.unpersist()

    def _record_closed(
        self, output: Output, counts: dict[Window, int], watermark: datetime | None, batch_id: int
    ) -> None:
        """Ledger rows for windows this batch closed. A pipeline with several outputs shares one ledger row
        per window; the first output to close it creates the row, later ones add their rows."""
        existing = {(r.window_start, r.window_end): r for r in read_ledger(self.settings, self.pipeline.name)}
        dlq = [
            self.engine.read(tables.dlq(self.settings.stream(s)).path(self.settings)) for s in self.pipeline.streams
        ]
        late = late_counts(self.spark, dlq, list(counts))
        now = self.settings.now()
        rows = []
        for window, n in sorted(counts.items()):
            current = existing.get(window)
            if current is not None:
                current.rows += n
                current.late_rows = late.get(window, 0)
                current.updated_at = now
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
                    )
                )
        write_ledger(
            self.spark, self.settings, self.engine, rows,
            app_id=f"sluice.ledger.{output.name}", version=batch_id,
        )


def run_pipeline(
    spark: SparkSession, settings: Settings, engine: DeltaEngine, pipeline: PipelineDef
) -> AggregateResult:
    return PipelineRunner(spark, settings, engine, pipeline).run()
