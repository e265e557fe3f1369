"""The driver's side of the table contract, the same on a local lake and on a lake in a real S3 bucket (s3proxy,
tests/support/s3.py): the ops tables' writer (delta-rs, sluice.storage.engine.OpsDeltaEngine) and the snapshot
readers (sluice.storage.snapshots) reach a table by its URI alone, with the lake's credentials (SPEC 1).

What Spark writes on S3 (bronze, gold, checkpoints) is covered end to end by tests/test_object_storage.py."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable, write_deltalake
from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType

from sluice.config import Settings, load_settings
from sluice.core.lake import storage_options
from sluice.storage import snapshots
from sluice.storage.engine import OpsDeltaEngine
from support.s3 import S3Server

SMALL = StructType([
    StructField("pipeline", StringType(), True),
    StructField("window_start", TimestampType(), True),
    StructField("n", LongType(), True),
])
H = [dt.datetime(2024, 5, 1, i, tzinfo=dt.UTC) for i in range(4)]


@pytest.fixture(params=["file", "s3"])
def lake(request: pytest.FixtureRequest, tmp_path: Path) -> Settings:
    if request.param == "file":
        return load_settings({}, home=tmp_path / "home")
    s3: S3Server = request.getfixturevalue("s3")
    # Only the settings' environment names the server: the URI alone must find its credentials.
    env = {k: v for k, v in s3.env().items() if k != "AWS_ALLOW_HTTP"}
    return load_settings({**env, "SLUICE_LAKE": f"s3://{s3.bucket('tables')}/lake"}, home=tmp_path / "home")


def _rows(path: str) -> list[tuple[object, ...]]:
    data = snapshots.read_small_table(path)
    assert data is not None
    return [(r["pipeline"], r["window_start"], r["n"]) for r in data.to_pylist()]


def test_ops_rows_are_appended_once_and_read_back(lake: Settings) -> None:
    engine = OpsDeltaEngine({"delta.appendOnly": "false"})
    path = lake.lake.table("ops/batches")
    assert not snapshots.exists(path) and snapshots.version(path) == -1
    engine.ensure_table(path, SMALL)
    engine.ensure_table(path, SMALL)  # a second call commits nothing
    assert snapshots.exists(path) and snapshots.version(path) == 0
    assert engine.append_rows([("a", H[0], 1), ("b", H[1], 2)], SMALL, path, app_id="ingest", version=1,
                              metadata={"batch": 1})
    # A retry of a committed version (a rerun after a crash) is a no-op.
    assert not engine.append_rows([("a", H[0], 1)], SMALL, path, app_id="ingest", version=1)
    assert engine.append_rows([("c", H[2], 3)], SMALL, path, app_id="ingest", version=2, metadata={"batch": 2})
    assert sorted(_rows(path)) == [("a", H[0], 1), ("b", H[1], 2), ("c", H[2], 3)]
    assert snapshots.version(path) == 2 and snapshots.app_version(path, "ingest") == 2
    assert [meta for _v, meta in snapshots.commit_metadata(path, 5)] == [{"batch": 2}, {"batch": 1}]
    assert sorted(f.records for f in snapshots.live_files(path)) == [1, 2]
    # Where the table lives: under the lake's root, as any Delta reader with the same credentials sees it.
    assert path == f"{lake.lake.uri}/ops/batches"
    other = DeltaTable(path, storage_options=storage_options(path)).to_pyarrow_table().to_pylist()
    assert sorted(r["pipeline"] for r in other) == ["a", "b", "c"]
    assert DeltaTable(path, storage_options=storage_options(path)).metadata().configuration == {
        "delta.appendOnly": "false"}


def test_ops_rows_are_replaced_in_one_commit_and_selected_by_statistics(lake: Settings) -> None:
    engine = OpsDeltaEngine()
    path = lake.lake.table("ops/window_ledger")
    engine.ensure_table(path, SMALL)
    key = ("pipeline", "window_start")
    engine.replace_rows([("b", H[1], 1), ("a", H[2], 2), ("a", H[0], 3)], SMALL, path,
                        drop=lambda r: False, order_by=key, app_id="w", version=0)
    before = snapshots.version(path)
    assert engine.replace_rows([("b", H[3], 4), ("a", H[2], 20)], SMALL, path,
                               drop=lambda r: (r["pipeline"], r["window_start"]) == ("a", H[2]),
                               order_by=key, app_id="w", version=1)
    assert snapshots.version(path) == before + 1 and len(snapshots.live_files(path)) == 1
    assert _rows(path) == [("a", H[0], 3), ("a", H[2], 20), ("b", H[1], 1), ("b", H[3], 4)]
    chosen = snapshots.read_selected_rows(path, pc.field("pipeline") == "b")
    assert chosen is not None and sorted(chosen.column("n").to_pylist()) == [1, 4]
    dataset = snapshots.dataset(path, before)
    assert dataset is not None and dataset.count_rows() == 3  # time travel to the version before


def test_a_table_another_delta_writer_made_is_read_and_appended_to(lake: Settings) -> None:
    path = lake.lake.table("ops/imported")
    rows = [{"pipeline": "x", "window_start": H[0], "n": 7}]
    write_deltalake(path, pa.Table.from_pylist(rows, snapshots.arrow_schema(SMALL)),
                    storage_options=storage_options(path))
    OpsDeltaEngine().append_rows([("y", H[1], 8)], SMALL, path, app_id="a", version=1)
    assert sorted(_rows(path)) == [("x", H[0], 7), ("y", H[1], 8)]


def test_a_partitioned_table_reads_as_a_dataset_of_its_live_files(lake: Settings) -> None:
    """snapshots.dataset: each live file with its partition values (typed, and filled into the partition
    columns, which the files do not hold), pruned by them, read by pyarrow's own file system: not delta-rs's
    Python-backed one, whose reads need the GIL on pyarrow's I/O threads."""
    from pyarrow.fs import PyFileSystem

    path = lake.lake.table("gold/partitioned")
    schema = pa.schema([("id", pa.string()), ("event_date", pa.date32()), ("region", pa.string())])
    day = dt.date(2024, 5, 1)
    for region, ids in (("c:d é", ["a", "b"]), ("e", ["c"]), (None, ["d"])):
        write_deltalake(path, pa.Table.from_pylist([{"id": i, "event_date": day, "region": region} for i in ids],
                                                   schema), mode="append", partition_by=["event_date", "region"],
                        storage_options=storage_options(path))
    write_deltalake(path, pa.Table.from_pylist([{"id": "a", "event_date": day, "region": "c:d é"}], schema),
                    mode="overwrite", partition_by=["event_date", "region"], storage_options=storage_options(path),
                    predicate="region = 'c:d é'")
    dataset = snapshots.dataset(path)
    assert dataset is not None and not isinstance(dataset.filesystem, PyFileSystem), dataset.filesystem
    assert dataset.schema == schema
    rows = sorted(dataset.to_table().to_pylist(), key=lambda r: r["id"])
    assert rows == [{"id": "a", "event_date": day, "region": "c:d é"}, {"id": "c", "event_date": day, "region": "e"},
                    {"id": "d", "event_date": day, "region": None}]
    assert dataset.to_table(filter=pc.field("region") == "e").column("id").to_pylist() == ["c"]
    assert dataset.to_table(filter=pc.field("region").is_null()).column("id").to_pylist() == ["d"]
    # Pruned by the partition values alone: one file read for one region.
    assert len(list(dataset.get_fragments(filter=pc.field("region") == "e"))) == 1
    # Time travel: the version before the overwrite still holds b.
    before = snapshots.dataset(path, snapshots.version(path) - 1)
    assert before is not None and sorted(before.to_table().column("id").to_pylist()) == ["a", "b", "c", "d"]
