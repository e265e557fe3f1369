"""Reading a Delta table from the driver, without Spark: its log (version, live files with their partition
values and record counts, commit history, app transactions) and the rows of small tables.

A Delta log is the Delta protocol whichever engine wrote it, so these reads serve both engines; they are
the one place where sluice opens a table with delta-rs to read it. The status and report commands, the
freshness check, the DLQ's bucket cache, the cycle's bookkeeping and both engines' log lookups come
through here, and nowhere else.
"""

from __future__ import annotations

import functools
import json
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from sluice.core.lake import Credentials, child, credentials_for, storage_options

if TYPE_CHECKING:
    import pyarrow.compute as pc
    import pyarrow.dataset as pads


@dataclass(frozen=True)
class LiveFile:
    """A data file of a table's snapshot."""

    relative: str  # in the table's layout, URI-decoded (the log stores region=c%3Ad as region=c%253Ad)
    path: str  # the file itself
    partition: Mapping[str, Any]  # typed values (date, int): what partition predicates compare
    records: int | None  # numRecords from the log's statistics, when the writer kept them
    size: int
    # minValues from the log's statistics (typed), for the columns the writer kept them for
    minimum: Mapping[str, Any] = field(default_factory=dict)


def arrow_schema(schema: StructType) -> Any:
    return to_arrow_schema(schema, timezone="UTC")


def open_table(path: str, version: int | None = None) -> DeltaTable | None:
    """The table's snapshot (the latest, or ``version``), or None when there is no table at ``path``."""
    if not exists(path):
        return None
    return DeltaTable(str(path), version=version, storage_options=storage_options(path))


def exists(path: str) -> bool:
    return DeltaTable.is_deltatable(str(path), storage_options=storage_options(path))


def filesystem(uri: str) -> tuple[Any, str]:
    """The pyarrow file system that reaches ``uri`` and the path to give it: the local one and the path itself,
    or S3 (native, not Python-backed: safe in Spark's callback threads) and ``bucket/key``."""
    credentials = credentials_for(uri)
    if credentials is None:
        return None, uri
    return _s3_filesystem(credentials), uri.split("://", 1)[1]


@functools.cache
def _s3_filesystem(credentials: Credentials) -> Any:
    from pyarrow.fs import S3FileSystem

    endpoint = credentials.endpoint_url
    return S3FileSystem(
        access_key=credentials.access_key_id, secret_key=credentials.secret_access_key,
        session_token=credentials.session_token, region=credentials.region or "us-east-1",
        endpoint_override=endpoint.split("://", 1)[1] if endpoint else None,
        scheme="http" if credentials.plain_http else "https", force_virtual_addressing=False,
    )


def version(path: str) -> int:
    """The table's current version; -1 when it does not exist yet."""
    table = open_table(path)
    return -1 if table is None else table.version()


def live_files(path: str, table: DeltaTable | None = None) -> list[LiveFile]:
    """The data files of ``table``'s snapshot (the latest when not given), in the log's order; none when the
    table does not exist."""
    table = table if table is not None else open_table(path)
    if table is None:
        return []
    adds = pa.table(table.get_add_actions(flatten=False)).to_pylist()
    files = [LiveFile(unquote(add["path"]), child(path, unquote(add["path"])), dict(add.get("partition") or {}),
                      None if add.get("num_records") is None else int(add["num_records"]), int(add["size_bytes"]),
                      dict(add.get("min") or {}))
             for add in adds]
    return files


def rows_are_files(table: DeltaTable) -> bool:
    """Whether the table's rows are exactly its files' rows: reader protocol 1, no column mapping or deletion
    vectors (which delta-spark may write). Otherwise read it with Spark."""
    return table.protocol().min_reader_version <= 1


def app_version(path: str, app_id: str, at: int | None = None) -> int | None:
    """The last app-transaction version ``app_id`` committed (Delta's ``txn`` action) in the latest snapshot, or
    in table version ``at``; None if never."""
    table = open_table(path, at)
    return None if table is None else table.transaction_version(app_id)


def commit_metadata(path: str, depth: int = 1) -> list[tuple[int, dict[str, Any]]]:
    """(version, sluice's commit metadata) of the newest ``depth`` commits that carry it, newest first. The
    delta-rs engine writes it under ``sluice``, delta-spark as ``userMetadata``."""
    table = open_table(path)
    out = []
    for entry in table.history(depth) if table is not None else []:
        raw = entry.get("sluice") or entry.get("userMetadata")
        if raw:
            out.append((int(entry["version"]), json.loads(raw)))
    return out


def dataset(path: str, version: int | None = None) -> pads.Dataset | None:
    """The snapshot as a pyarrow dataset (filters and column selection pushed down), or None when absent.

    Its live files with their partition values, as delta-rs's ``to_pyarrow_dataset`` gives them, but read through
    pyarrow's own file system (local or S3) instead of delta-rs's Python-backed one: with that one, each file
    pyarrow's I/O threads read goes through Python and needs the GIL, a known way for a scan to hang for ever in
    a process where other threads (Spark's callback server, a test's servers) hold it or wait on it. A table
    whose files alone are not its rows (column mapping, deletion vectors) is left to delta-rs."""
    table = open_table(path, version)
    if table is None:
        return None
    return _files_dataset(path, table) if rows_are_files(table) else table.to_pyarrow_dataset()


def _files_dataset(path: str, table: DeltaTable) -> pads.Dataset:
    """``table``'s live files as a pyarrow dataset on pyarrow's own file system, each with its partition values."""
    import pyarrow.dataset as pads  # only here: it is not needed by most commands

    schema = pa.schema(table.schema().to_arrow())
    files = live_files(path, table)
    fs, _ = _native_filesystem(str(path))
    return pads.FileSystemDataset.from_paths(
        [_native_filesystem(f.path)[1] for f in files], schema=schema, format=pads.ParquetFileFormat(),
        filesystem=fs, partitions=[_partition_expression(f.partition, schema) for f in files])


def _native_filesystem(uri: str) -> tuple[Any, str]:
    """:func:`filesystem`, with the local one named (a dataset built from paths needs it)."""
    fs, where = filesystem(uri)
    if fs is not None:
        return fs, where
    from pyarrow.fs import LocalFileSystem

    return LocalFileSystem(), unquote(where.removeprefix("file://")) if where.startswith("file://") else where


def _partition_expression(values: Mapping[str, Any], schema: pa.Schema) -> pc.Expression:
    """The file's partition values as the expression pyarrow fills its partition columns from."""
    import pyarrow.compute as pc

    expression = pc.scalar(True)
    for name, value in values.items():
        field = pc.field(name)
        expression &= field.is_null() if value is None else field == pa.scalar(value, schema.field(name).type)
    return expression


def _data_files(path: str, table: DeltaTable) -> list[str]:
    return [str(f.path) for f in live_files(path, table)]


def read_small_table(
    path: str, columns: Sequence[str] | None = None, *, table: DeltaTable | None = None
) -> pa.Table | None:
    """Read a small, unpartitioned sluice ops table (ledger, batch log) on the driver, without Spark.

    Plain ``pyarrow.parquet`` over the live files from the log: no Python-backed filesystem, so it is safe
    to call from Spark's foreachBatch callback threads. Reads ``table``'s snapshot when given (the latest
    otherwise). Returns None when the table does not exist."""
    table = table if table is not None else open_table(path)
    if table is None:
        return None
    schema = pa.schema(table.schema().to_arrow())
    files = _data_files(path, table)
    if not files:
        return schema.empty_table() if columns is None else schema.empty_table().select(list(columns))
    data = pa.concat_tables(_file_tables(str(path), files, schema))
    return data.select(list(columns)) if columns else data


def read_selected_rows(path: str, selection: pc.Expression) -> pa.Table | None:
    """The rows of a table that ``selection`` picks, read on the driver without Spark: for a small part of a
    table that may be large, such as the gold rows of the windows a data-quality step checks. pyarrow skips
    the row groups whose Parquet statistics rule the selection out, so only the footers of the other files
    are read. Returns None when the table does not exist, or when its files alone are not its rows (a reader
    protocol above 1: column mapping or deletion vectors, e.g. written by delta-spark): read it with Spark."""
    table = open_table(path)
    if table is None or not rows_are_files(table):
        return None
    return _files_dataset(path, table).to_table(filter=selection)


# Ops tables are read many times per cycle and grow by one small file per commit, so a cycle that re-read
# every file would cost O(history). A Delta data file never changes once written, so each is read once per
# process and kept (per table, only the files of its latest snapshot; keyed by the schema it was read with).
_FILES: dict[str, dict[tuple[str, pa.Schema], pa.Table]] = {}
_FILES_LOCK = threading.Lock()


def _file_tables(table_path: str, files: Sequence[str], schema: pa.Schema) -> list[pa.Table]:
    with _FILES_LOCK:
        cached = _FILES.get(table_path, {})
    missing = [f for f in files if (f, schema) not in cached]
    read = {(f, schema): _read_file(f, schema) for f in missing}
    with _FILES_LOCK:
        live = {(f, schema) for f in files}
        current = {k: v for k, v in {**_FILES.get(table_path, {}), **read}.items() if k in live}
        _FILES[table_path] = current
    return [current[(f, schema)] for f in files]


def read_files(uris: Sequence[str], schema: pa.Schema) -> pa.Table:
    """The rows of data files, only the columns of ``schema`` (null where a file lacks one), in file order."""
    parts = [_read_file(uri, schema) for uri in uris]
    return pa.concat_tables(parts) if parts else schema.empty_table()


def _read_file(uri: str, schema: pa.Schema) -> pa.Table:
    fs, where = filesystem(uri)
    return pq.read_table(where, schema=schema, filesystem=fs)


def merged_rows(
    path: str,
    rows: Sequence[Sequence[Any]],
    schema: StructType,
    *,
    drop: Callable[[Mapping[str, Any]], bool],
    order_by: Sequence[str],
    table: DeltaTable | None = None,
) -> pa.Table:
    """The current rows of a small table (of ``table``'s snapshot when given) minus those ``drop`` selects,
    plus ``rows``, sorted by ``order_by`` (nulls first)."""
    current = read_small_table(path, table=table)
    kept = [r for r in (current.to_pylist() if current is not None else []) if not drop(r)]
    added = [dict(zip(schema.names, r, strict=True)) for r in rows]

    def key(row: Mapping[str, Any]) -> tuple[Any, ...]:
        return tuple((row[c] is not None, row[c]) for c in order_by)

    merged = sorted([*kept, *added], key=key)
    return pa.Table.from_pylist(merged, arrow_schema(schema))
