"""Lake housekeeping for the ``sluice_maintenance`` DAG: compaction, vacuum and checkpoint cleanup.

Each table is compacted and vacuumed by the engine that writes it (delta-spark for the tables Spark writes,
delta-rs for the ops tables), holding every pipeline's lock so it never races a cycle or a backfill.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Iterator
from contextlib import ExitStack

from sluice.config import Settings
from sluice.storage.engine import DeltaEngine
from sluice.storage.locks import pipeline_lock
from sluice.storage.state import lake_state

log = logging.getLogger("sluice.maintenance")

def delta_tables(settings: Settings) -> Iterator[tuple[str, str]]:
    """(name under the lake, URI) of every Delta table in the lake, local or on object storage: a folder with a
    ``_delta_log`` (a table's own folders, its partitions, are not searched). sluice's own folders
    (``_checkpoints``, ``_locks``: names starting with ``_``) hold no tables."""
    store = lake_state(settings).store

    def walk(folder: str) -> Iterator[str]:
        subfolders = list(store.folders(folder))
        if "_delta_log" in subfolders:
            yield folder
            return
        for sub in subfolders:
            if not sub.startswith(("_", ".")):
                yield from walk(f"{folder}/{sub}" if folder else sub)

    for name in walk(""):
        yield name, settings.lake.table(name)


def _all_locks(settings: Settings) -> ExitStack:
    stack = ExitStack()
    for pipeline in sorted(settings.registry.pipelines):
        stack.enter_context(pipeline_lock(settings, pipeline, purpose="maintenance"))
    return stack


def compact(settings: Settings, engine: DeltaEngine) -> dict[str, int]:
    """Bin-pack small files; returns files removed per table."""
    out = {}
    with _all_locks(settings):
        for name, uri in delta_tables(settings):
            out[name] = engine.compact(uri)
    log.info("compaction: %s", out)
    return out


def vacuum(settings: Settings, engine: DeltaEngine) -> dict[str, int]:
    """Delete unreferenced files older than the retention; returns files deleted per table."""
    hours = settings.vacuum_retention_hours
    out = {}
    with _all_locks(settings):
        for name, uri in delta_tables(settings):
            out[name] = engine.vacuum(uri, hours)
    log.info("vacuum (retention %dh): %s", hours, out)
    return out


def clean_checkpoints(settings: Settings, older_than_hours: float = 24.0) -> int:
    """Remove the staging directories that crashed writes of sluice 0.2's delta-rs engine left in the tables
    (never referenced by any Delta log; delta-spark's own leftovers are files that vacuum deletes)."""
    if not settings.lake.is_local:
        return 0  # sluice 0.2 wrote only local lakes
    cutoff = time.time() - older_than_hours * 3600
    removed = 0
    with _all_locks(settings):
        for name, _uri in delta_tables(settings):
            staging = settings.lake.local(name, "_staging")
            for leftover in staging.glob("*") if staging.is_dir() else []:
                if leftover.stat().st_mtime < cutoff:
                    shutil.rmtree(leftover, ignore_errors=True)
                    removed += 1
    log.info("removed %d stale staging directories", removed)
    return removed
