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

from deltalake import DeltaTable
from pyspark.sql import SparkSession

from sluice.config import Settings


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


def table(settings: Settings, name: str) -> list[dict[str, Any]]:
    """Every row of ``lake/<name>`` (empty when the table does not exist yet)."""
    path = settings.lake.local() / name
    if not DeltaTable.is_deltatable(str(path)):
        return []
    return DeltaTable(str(path)).to_pyarrow_table().to_pylist()


def cycle(spark: SparkSession, settings: Settings, pipeline: str, now: datetime, *, quality: bool = False) -> Settings:
    """One product cycle of ``pipeline`` at ``now`` (ingest, aggregate, and optionally data quality)."""
    from sluice.streaming.cycle import run_cycle

    at_now = replace(settings, now_override=now)
    run_cycle(at_now, pipeline, spark=spark, check_quality=quality, deliver_alerts=False)
    return at_now
