"""The gold rows a data-quality step checks: read from the table's files with pyarrow (no Spark job), or with
Spark when the files alone are not the table's rows (deletion vectors, column mapping)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import SparkSession

from sluice.config import Settings
from sluice.quality.checker import gold_rows
from sluice.storage.engines import engine_for
from sluice.storage.snapshots import read_selected_rows

HOUR = timedelta(hours=1)
T0 = datetime(2024, 5, 1, 10, tzinfo=UTC)
SCHEMA = pa.schema([("window_start", pa.timestamp("us", tz="UTC")), ("window_end", pa.timestamp("us", tz="UTC")),
                    ("shop", pa.string()), ("orders", pa.int64())])


def hour(n: int) -> tuple[datetime, datetime]:
    return (T0 + n * HOUR, T0 + (n + 1) * HOUR)


def write_gold(path: Path) -> None:
    """Three commits, so three files: hours 0-1, hour 2 (with a null key), hour 5."""
    for rows in ([(*hour(0), "a", 3), (*hour(0), "b", 1), (*hour(1), "a", 2)],
                 [(*hour(2), "a", 4), (*hour(2), None, 1)],
                 [(*hour(5), "c", 9)]):
        write_deltalake(str(path), pa.Table.from_pylist([dict(zip(SCHEMA.names, r, strict=True)) for r in rows],
                                                        SCHEMA), mode="append")


def as_set(frame) -> set[tuple]:  # type: ignore[no-untyped-def]
    return {(r.window_start.to_pydatetime(), r.window_end.to_pydatetime(), r.shop, int(r.orders))
            for r in frame.itertuples()}


@pytest.mark.spark
def test_gold_rows_of_the_checked_windows_with_pyarrow_and_with_spark(
    spark: SparkSession, settings: Settings
) -> None:
    path = settings.lake.local() / "gold" / "orders"
    write_gold(path)
    engine = engine_for(spark, settings)
    checked = [hour(0), hour(2), hour(3)]  # hour 3 has no rows; hours 1 and 5 are not checked
    expected = {(*hour(0), "a", 3), (*hour(0), "b", 1), (*hour(2), "a", 4), (*hour(2), None, 1)}

    plain = gold_rows(engine, path, checked)
    assert as_set(plain) == expected
    assert str(plain["window_start"].dt.tz) == "UTC" and str(plain["window_end"].dt.tz) == "UTC"

    # Deletion vectors make the files alone not the table's rows: the table is read with Spark instead.
    DeltaTable(str(path)).alter.set_table_properties({"delta.enableDeletionVectors": "true"})
    assert DeltaTable(str(path)).protocol().min_reader_version > 1
    assert read_selected_rows(path, pc.field("orders") > 0) is None
    through_spark = gold_rows(engine, path, checked)
    assert as_set(through_spark) == expected
    assert str(through_spark["window_start"].dt.tz) == "UTC"
