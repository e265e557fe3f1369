"""DLQ records per window (sluice.storage.dlq), on real Delta tables: exact for hopping windows, reading
each DLQ file once, following appends and compactions."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from sluice.config import Settings, load_settings
from sluice.storage import tables
from sluice.storage.dlq import dlq_counts
from sluice.storage.snapshots import arrow_schema
from support.tutorial import write_tutorial

PIPELINE = "device_temps"  # 15-minute windows every 5 minutes
T0 = datetime(2024, 5, 1, 10, tzinfo=UTC)


def settings_for(tmp_path: Path) -> Settings:
    folder = write_tutorial(tmp_path / "team-pipelines")
    return load_settings({"SLUICE_PIPELINES": str(folder)}, home=tmp_path / "home")


def land_dlq(settings: Settings, minutes: list[float], mode: Literal["append", "overwrite"] = "append") -> None:
    table = tables.dlq(settings.stream("readings"))
    schema = arrow_schema(table.schema)
    rows: list[dict[str, Any]] = [
        {"reading_id": f"r{i}-{m}", "event_time": T0 + timedelta(minutes=m), "raw": "{}"}
        for i, m in enumerate(minutes)
    ]
    data = pa.Table.from_pylist(rows, schema=schema)
    write_deltalake(str(table.path(settings)), data, mode=mode)


def expected(all_minutes: list[float], windows: list[tuple[datetime, datetime]]) -> dict[Any, int]:
    counts = {w: sum(1 for m in all_minutes if w[0] <= T0 + timedelta(minutes=m) < w[1]) for w in windows}
    return {w: n for w, n in counts.items() if n}


def test_counts_are_exact_per_hopping_window_and_each_file_is_read_once(tmp_path: Path) -> None:
    settings = settings_for(tmp_path)
    pipeline = settings.pipeline(PIPELINE)
    windows = [(T0 + timedelta(minutes=5 * k), T0 + timedelta(minutes=5 * k + 15)) for k in range(-3, 8)]
    first = [0, 4.99, 5, 14.5, 15, 29.999, 31]
    land_dlq(settings, first)
    assert dlq_counts(settings, pipeline, windows) == expected(first, windows)

    # The counted file is now unreadable: a second count must not open it.
    dlq = tables.dlq(settings.stream("readings")).path(settings)
    [counted] = [Path(uri) for uri in DeltaTable(str(dlq)).file_uris()]
    saved = counted.read_bytes()
    counted.write_bytes(b"not parquet")
    try:
        second = [2, 33]
        land_dlq(settings, second)
        assert dlq_counts(settings, pipeline, windows) == expected(first + second, windows)
    finally:
        counted.write_bytes(saved)

    # A compaction (every file replaced) is followed: the counts stay exact.
    compacted = [1, 17]
    land_dlq(settings, compacted, mode="overwrite")
    assert dlq_counts(settings, pipeline, windows) == expected(compacted, windows)
    assert dlq_counts(settings, pipeline, []) == {}
