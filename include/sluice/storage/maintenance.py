"""Lake housekeeping for the ``sluice_maintenance`` DAG: compaction, vacuum and checkpoint cleanup.

Runs on the driver with delta-rs only (no Spark needed), holding every pipeline's lock so it never races a
cycle or a backfill.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

from deltalake import DeltaTable

from sluice.config import Settings
from sluice.core.locks import pipeline_lock

log = logging.getLogger("sluice.maintenance")

def delta_tables(settings: Settings) -> Iterator[Path]:
    for log_dir in sorted(settings.lake.glob("**/_delta_log")):
        table = log_dir.parent
        if "_checkpoints" not in table.parts:
            yield table


def _all_locks(settings: Settings) -> ExitStack:
    stack = ExitStack()
    for pipeline in sorted(settings.registry.pipelines):
        stack.enter_context(pipeline_lock(settings, pipeline, purpose="maintenance"))
    return stack


def compact(settings: Settings) -> dict[str, int]:
    """Bin-pack small files; returns files removed per table."""
    out = {}
    with _all_locks(settings):
        for path in delta_tables(settings):
            metrics = DeltaTable(str(path)).optimize.compact()
            out[str(path.relative_to(settings.lake))] = int(metrics.get("numFilesRemoved", 0))
    log.info("compaction: %s", out)
    return out


def vacuum(settings: Settings) -> dict[str, int]:
    """Delete unreferenced files older than the retention; returns files deleted per table."""
    hours = settings.vacuum_retention_hours
    out = {}
    with _all_locks(settings):
        for path in delta_tables(settings):
            table = DeltaTable(str(path))
            deleted = table.vacuum(retention_hours=hours, dry_run=False, enforce_retention_duration=False)
            table.cleanup_metadata()
            out[str(path.relative_to(settings.lake))] = len(deleted)
    log.info("vacuum (retention %dh): %s", hours, out)
    return out


def clean_checkpoints(settings: Settings, older_than_hours: float = 24.0) -> int:
    """Remove staging directories left by crashed writes (never referenced by any Delta log)."""
    cutoff = time.time() - older_than_hours * 3600
    removed = 0
    with _all_locks(settings):
        for path in delta_tables(settings):
            staging = path / "_staging"
            for leftover in staging.glob("*") if staging.is_dir() else []:
                if leftover.stat().st_mtime < cutoff:
                    shutil.rmtree(leftover, ignore_errors=True)
                    removed += 1
    log.info("removed %d stale staging directories", removed)
    return removed
