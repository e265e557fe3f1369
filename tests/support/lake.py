"""Landing files as producers write them, Delta tables as users read them, and cycles as the product runs
them: the helpers the Spark tests share."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from sluice.config import Settings
from sluice.storage import snapshots


def land(settings: Settings, stream: str, name: str, lines: Iterable[str | Mapping[str, Any]],
         arrival: datetime) -> Path:
    """Write a landing file the way producers do (in-flight name, then rename) with its arrival mtime.
    Lines may be raw text or records (written as JSON)."""
    folder = settings.landing_dir(stream)
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{name}.tmp"
    tmp.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    final = folder / name
    tmp.rename(final)
    os.utime(final, (arrival.timestamp(), arrival.timestamp()))
    return final


def read_arrow(path: str | os.PathLike[str], version: int | None = None) -> pa.Table:
    """Every row of the Delta table at ``path`` (a local path or a URI), of its latest snapshot or ``version``.

    Through sluice.storage.snapshots, which reads the live files with pyarrow's own file system: never with
    delta-rs's ``to_pyarrow_table``, whose Python-backed file system needs the GIL on pyarrow's I/O threads (a
    worker of the suite hung for good in one, reading the tables of a cycle it had just run on its Spark
    session). tests/delta/test_readers.py is where delta-rs's own readers are tested."""
    data = snapshots.dataset(os.fspath(path), version)
    assert data is not None, f"no Delta table at {path}"
    return data.to_table()


def read_rows(path: str | os.PathLike[str], version: int | None = None) -> list[dict[str, Any]]:
    """:func:`read_arrow` as a list of rows."""
    return list(read_arrow(path, version).to_pylist())


def table(settings: Settings, name: str) -> list[dict[str, Any]]:
    """Every row of ``lake/<name>`` (empty when the table does not exist yet)."""
    path = settings.lake.local() / name
    if not DeltaTable.is_deltatable(str(path)):
        return []
    return read_rows(path)


def table_snapshot(home: Path) -> dict[str, list[tuple[object, ...]]]:
    """Sorted content of every table of ``home``'s lake (lineage ids and arrival included, ops rows minus the
    lineage of the Spark checkpoint, which legitimately differs between a crashed and a clean run). Paths are
    made relative to the home so two homes compare."""
    lake = home / "lake"
    out = {}
    for log_dir in sorted(lake.glob("**/_delta_log")):
        folder = log_dir.parent
        data = pa.table(read_arrow(folder))
        data = data.drop_columns([c for c in ("spark_batch_id", "query_id") if c in data.column_names])
        out[str(folder.relative_to(lake))] = sorted(
            tuple(str(v).replace(str(home), "<home>") for v in row.values()) for row in data.to_pylist()
        )
    return out


def cycle(spark: SparkSession, settings: Settings, pipeline: str, now: datetime, *, quality: bool = False) -> Settings:
    """One product cycle of ``pipeline`` at ``now`` (ingest, aggregate, and optionally data quality)."""
    from sluice.runtime.context import open_run
    from sluice.streaming.cycle import run_cycle

    at_now = replace(settings, now_override=now)
    run_cycle(open_run(at_now, spark), pipeline, check_quality=quality, deliver_alerts=False)
    return at_now
