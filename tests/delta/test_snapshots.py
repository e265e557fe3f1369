"""Driver-side reads of a table's snapshot (sluice.storage.snapshots), on a table a plain delta-rs job wrote:
what the status and report commands, freshness and the DLQ cache read instead of opening tables themselves."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, write_deltalake

from sluice.storage import snapshots


def _write(path: Path, rows: list[dict], meta: dict | None = None) -> None:
    data = pa.Table.from_pylist(rows, pa.schema([("id", pa.string()), ("event_date", pa.date32()),
                                                 ("event_hour", pa.int32()),
                                                 ("event_time", pa.timestamp("us", "UTC"))]))
    write_deltalake(str(path), data, mode="append", partition_by=["event_date", "event_hour"],
                    commit_properties=CommitProperties(custom_metadata={"sluice": json.dumps(meta)}) if meta else None)


def test_a_missing_table_reads_as_absent(tmp_path: Path) -> None:
    path = tmp_path / "nothing"
    assert (snapshots.exists(path), snapshots.version(path), snapshots.live_files(path)) == (False, -1, [])
    assert snapshots.dataset(path) is None and snapshots.app_version(path, "a") is None
    assert snapshots.commit_metadata(path, 5) == []


def test_files_partitions_records_history_and_time_travel(tmp_path: Path) -> None:
    path = tmp_path / "t"
    t = datetime(2024, 5, 1, 10, 30, tzinfo=UTC)
    _write(path, [{"id": "a", "event_date": date(2024, 5, 1), "event_hour": 10, "event_time": t}] * 2,
           {"app": "x", "app_version": 1})
    _write(path, [{"id": "b:c", "event_date": date(2024, 5, 1), "event_hour": 11, "event_time": t}])
    assert snapshots.version(path) == 1
    files = snapshots.live_files(path)
    assert sorted((dict(f.partition)["event_hour"], f.records) for f in files) == [(10, 2), (11, 1)]
    assert all(Path(f.path).is_file() and f.path == str(path / f.relative) and f.size > 0 for f in files)
    assert {type(dict(f.partition)["event_date"]) for f in files} == {date}  # typed, as predicates compare
    table = snapshots.open_table(path)
    assert table is not None and snapshots.rows_are_files(table)
    assert snapshots.commit_metadata(path, 5) == [(0, {"app": "x", "app_version": 1})]
    first = snapshots.dataset(path, 0)
    assert first is not None and first.to_table(filter=pc.field("id") == "a").num_rows == 2
    assert first.count_rows() == 2
    assert snapshots.read_small_table(path, ["id"]).column("id").to_pylist().count("b:c") == 1
