"""A Spark Python Data Source that reads delta-rs owned Delta tables, in batch and as a stream.

Why this exists: without Maven access Spark's own Delta connector (``delta-spark``) is unavailable, so
the tables are written by delta-rs and Spark reads them through this source instead::

    register(spark)
    spark.read.format("sluice_delta").load(path)                        # snapshot (option ``version``)
    spark.readStream.format("sluice_delta").option("maxFilesPerTrigger", 100).load(path)

Streaming semantics (offsets are Delta table versions, ``{"version": <int>}``):

* The initial offset is ``-1`` ("before version 0"), or ``startingVersion - 1`` when the option
  ``startingVersion`` is given (``"latest"`` means: only commits after the current version).
* The micro-batch ``(start, end]`` contains the rows of the files **added with dataChange=true** by the
  commits ``start < version <= end``.  The source is **append-only**, like Delta's ``ignoreDeletes``:
  ``remove`` actions are ignored, so compaction (remove+add with dataChange=false) emits nothing, and a
  delete emits nothing.  Rows rewritten by an update/merge/overwrite (remove+add with dataChange=true)
  are emitted again, unless the option ``skipChangeCommits=true`` skips such commits entirely (as in
  Delta).  Unlike Delta's default (which starts with a snapshot of the latest version), a fresh query
  replays the history from version 0, because offsets are plain versions; if that history has been
  removed by log cleanup, the newest checkpoint at or before the batch end is read as a snapshot.
* ``maxFilesPerTrigger`` (default 1000, as in Delta) bounds the number of new files per micro-batch, but
  a commit is never split: a batch always contains at least one whole commit.
* ``minEventTime`` (ISO 8601, with zone) skips the files of hourly event partitions (``event_date``,
  ``event_hour``, the layout of sluice's bronze tables) that end at or before it. It prunes files only:
  rows are not filtered, so the query applies its own row filter as well.
* ``Trigger.AvailableNow`` is supported: the latest version when the query starts is the target, and
  nothing committed afterwards is read by that run.

Work split: the driver only reads the Delta log (commit JSON files, or delta-rs for snapshots) and
plans small groups of files per Spark task; executors read the Parquet files with pyarrow, add the
partition columns back from the ``partitionValues`` of the add actions, and yield Arrow record batches.

Not supported (the source fails loudly rather than returning wrong rows): column mapping
(``delta.columnMapping.mode`` name/id) and files with deletion vectors.
"""

from __future__ import annotations

import json
import os
import re
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadLimit,
    ReadMaxBytes,
    ReadMaxFiles,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

# pyarrow and deltalake are imported inside functions: this module is imported by every Python worker
# that deserialises the data source, and deltalake is only needed on the driver.
if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.fs as pafs
    from pyspark.sql import SparkSession

__all__ = [
    "DEFAULT_MAX_FILES_PER_TRIGGER",
    "SOURCE_NAME",
    "DataFile",
    "DeltaBatchReader",
    "DeltaDataSource",
    "DeltaFilesPartition",
    "DeltaStreamReader",
    "files_between",
    "latest_version",
    "register",
    "table_schema",
]

SOURCE_NAME = "sluice_delta"
DEFAULT_MAX_FILES_PER_TRIGGER = 1000

# One Spark task reads at most this many files / bytes: small files are grouped so that a micro-batch
# of many tiny commits does not become hundreds of tasks, large ones get a task each.
_TASK_MAX_FILES = 16
_TASK_MAX_BYTES = 128 * 1024 * 1024
# Rows per Arrow batch handed to the JVM; matches spark.sql.execution.arrow.maxRecordsPerBatch.
_ARROW_BATCH_ROWS = 10_000

_COMMIT_FILE = re.compile(r"^(\d{20})\.json$")
_CHECKPOINT_FILE = re.compile(r"^(\d{20})\.checkpoint(?:\.[^/]*)?\.parquet$")

PartitionValues = dict[str, str | None]


# --------------------------------------------------------------------------------------------------
# Delta log (driver side)
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DataFile:
    """One data file to read: ``path`` is absolute (local path or URI), partition values are strings."""

    path: str
    partition_values: PartitionValues
    size: int


@dataclass(frozen=True)
class _Commit:
    version: int
    files: tuple[DataFile, ...]  # adds with dataChange=true only
    changes_data: bool  # has a remove with dataChange=true (delete/update/merge/overwrite)


def _filesystem(table: str) -> tuple[pafs.FileSystem, str]:
    """The pyarrow filesystem and the root path for a table given as a local path or a URI."""
    import pyarrow.fs as pafs

    if "://" in table:
        fs, root = pafs.FileSystem.from_uri(table)
        return fs, root.rstrip("/")
    return pafs.LocalFileSystem(), os.path.abspath(table).rstrip("/") or "/"


def _table_uri(table: str) -> str:
    # Plan-time normalisation: executors may run with another working directory.
    return table if "://" in table else os.path.abspath(table)


def _resolve(table: str, root: str, path: str) -> str:
    """Absolute location of an add action's path. Log paths are URI-encoded (RFC 2396), relative to
    the table root unless they carry a scheme."""
    if "://" in path:
        return path
    rel = unquote(path)
    if "://" in table:
        return table.rstrip("/") + "/" + rel
    return root + "/" + rel


def _log_dir(root: str) -> str:
    return root + "/_delta_log"


def _commit_path(root: str, version: int) -> str:
    return f"{_log_dir(root)}/{version:020d}.json"


def _list_log(fs: pafs.FileSystem, root: str) -> tuple[list[int], list[int]]:
    """Versions with a commit JSON and versions with a checkpoint, both sorted. A missing log is empty:
    the table does not exist yet, which a stream treats as "no data"."""
    import pyarrow.fs as pafs

    selector = pafs.FileSelector(_log_dir(root), allow_not_found=True)
    commits: list[int] = []
    checkpoints: list[int] = []
    for info in fs.get_file_info(selector):
        name = info.base_name
        if m := _COMMIT_FILE.match(name):
            commits.append(int(m.group(1)))
        elif m := _CHECKPOINT_FILE.match(name):
            checkpoints.append(int(m.group(1)))
    return sorted(commits), sorted(set(checkpoints))


def latest_version(path: str) -> int:
    """The table's latest committed version, or -1 when the table does not exist (yet)."""
    fs, root = _filesystem(path)
    commits, _ = _list_log(fs, root)
    return commits[-1] if commits else -1


def _check_metadata(metadata: Mapping[str, Any]) -> None:
    mode = (metadata.get("configuration") or {}).get("delta.columnMapping.mode")
    if mode not in (None, "none"):
        # Physical Parquet column names differ from the logical ones; reading them by logical name
        # would silently return nulls.
        raise NotImplementedError(f"{SOURCE_NAME}: Delta column mapping (mode={mode!r}) is not supported")


def _parse_commit(table: str, root: str, version: int, text: str) -> _Commit:
    files: list[DataFile] = []
    changes_data = False
    for line in text.splitlines():
        if not line.strip():
            continue
        action = json.loads(line)
        if (add := action.get("add")) is not None:
            # dataChange=false adds are rewrites of rows already in the table (OPTIMIZE, ...).
            if not add.get("dataChange", True):
                continue
            if add.get("deletionVector"):
                raise NotImplementedError(
                    f"{SOURCE_NAME}: {add['path']} (version {version}) has a deletion vector; not supported"
                )
            files.append(
                DataFile(
                    path=_resolve(table, root, add["path"]),
                    partition_values=dict(add.get("partitionValues") or {}),
                    size=int(add.get("size") or 0),
                )
            )
        elif (remove := action.get("remove")) is not None:
            changes_data = changes_data or bool(remove.get("dataChange", True))
        elif (metadata := action.get("metaData")) is not None:
            _check_metadata(metadata)
    return _Commit(version, tuple(files), changes_data)


def _read_commit(table: str, version: int) -> _Commit | None:
    """The commit ``version`` parsed from its JSON, or None when that JSON does not exist."""
    fs, root = _filesystem(table)
    try:
        with fs.open_input_stream(_commit_path(root, version)) as stream:
            text = stream.read().decode("utf-8")
    except FileNotFoundError:
        return None
    return _parse_commit(table, root, version, text)


def _delta_string(value: object) -> str | None:
    """Serialise a typed partition value (from delta-rs) the way the Delta log does."""
    import datetime as dt

    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dt.datetime):
        if value.tzinfo is not None:
            value = value.astimezone(dt.UTC)
        return value.isoformat()
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, bytes):
        return value.decode("latin-1")
    return str(value)


def _snapshot_files(table: str, version: int | None) -> tuple[int, list[DataFile]]:
    """The live data files of the table at ``version`` (default: latest), read with delta-rs, which
    handles checkpoints and log replay."""
    import pyarrow as pa
    from deltalake import DeltaTable

    _, root = _filesystem(table)
    dt_ = DeltaTable(table, version=version)
    metadata = dt_.metadata()
    _check_metadata({"configuration": metadata.configuration})
    actions = pa.table(dt_.get_add_actions(flatten=False))
    paths = actions.column("path").to_pylist()
    sizes = actions.column("size_bytes").to_pylist()
    if "partition" in actions.column_names:
        parts = actions.column("partition").to_pylist()
    else:
        parts = [{} for _ in paths]
    files = [
        DataFile(
            path=_resolve(table, root, path),
            partition_values={k: _delta_string(v) for k, v in (part or {}).items()},
            size=int(size or 0),
        )
        for path, size, part in zip(paths, sizes, parts, strict=True)
    ]
    return dt_.version(), files


class _DeltaLog:
    """Commits of one table, read on demand and cached: a commit file never changes once written."""

    def __init__(self, table: str, skip_change_commits: bool = False) -> None:
        self.table = table
        self.skip_change_commits = skip_change_commits
        self._commits: dict[int, _Commit] = {}
        self._latest = -1

    def latest(self) -> int:
        """Latest version. Probes the next commit file first, so an idle poll costs one stat rather
        than a listing of a log directory that grows by one file per commit."""
        import pyarrow.fs as pafs

        fs, root = _filesystem(self.table)
        if self._latest >= 0:
            info = fs.get_file_info(_commit_path(root, self._latest + 1))
            if info.type == pafs.FileType.NotFound:
                return self._latest
        commits, _ = _list_log(fs, root)
        self._latest = max(self._latest, commits[-1] if commits else -1)
        return self._latest

    def commits(self, start: int, end: int) -> Iterator[_Commit]:
        """Commits in (start, end], in version order, read lazily (so that admission control stops
        reading the log once the budget is used)."""
        version = start + 1
        while version <= end:
            commit = self._commits.get(version) or _read_commit(self.table, version)
            if commit is None:
                commit = self._history_gap(start, version, end)
            self._commits[commit.version] = commit
            yield self._visible(commit)
            version = commit.version + 1

    def _visible(self, commit: _Commit) -> _Commit:
        if self.skip_change_commits and commit.changes_data:
            return _Commit(commit.version, (), commit.changes_data)
        return commit

    def _history_gap(self, start: int, version: int, end: int) -> _Commit:
        """Commit JSON ``version`` is gone (log cleanup). From the very beginning, the table state at
        the newest checkpoint <= end is equivalent to replaying the lost history; otherwise the rows
        in between cannot be known, and silently skipping them would lose data."""
        fs, root = _filesystem(self.table)
        commits, checkpoints = _list_log(fs, root)
        # The newest checkpoint <= end: commit files after the newest checkpoint are never cleaned up.
        usable = [v for v in checkpoints if version <= v <= end]
        if start < 0 and usable:
            snapshot_version, files = _snapshot_files(self.table, usable[-1])
            return _Commit(snapshot_version, tuple(files), False)
        earliest = commits[0] if commits else None
        raise RuntimeError(
            f"{SOURCE_NAME}: version {version} of {self.table} is no longer in the Delta log "
            f"(earliest commit file: {earliest}); the data between offsets {start} and {end} cannot "
            "be read. Restart the query with a new checkpoint (optionally with startingVersion)."
        )

    def forget(self, up_to: int) -> None:
        """Drop cached commits that the engine will never ask for again."""
        for version in [v for v in self._commits if v <= up_to]:
            del self._commits[version]


def files_between(path: str, start_version: int, end_version: int) -> list[tuple[str, PartitionValues]]:
    """The files added (dataChange=true) by the commits with version in (start_version, end_version],
    in commit order, as ``(absolute path or URI, partitionValues as Delta-serialised strings)``."""
    log = _DeltaLog(path)
    return [(f.path, f.partition_values) for c in log.commits(start_version, end_version) for f in c.files]


# --------------------------------------------------------------------------------------------------
# Schema
# --------------------------------------------------------------------------------------------------


def table_schema(path: str, version: int | None = None) -> StructType:
    """Spark schema of the Delta table (``timestamp`` -> TimestampType, ``timestamp_ntz`` ->
    TimestampNTZType), in the table's column order, partition columns included."""
    import pyarrow as pa
    from deltalake import DeltaTable
    from pyspark.sql.pandas.types import from_arrow_schema

    table = DeltaTable(path, version=version)
    _check_metadata({"configuration": table.metadata().configuration})
    arrow = pa.schema(table.schema().to_arrow())
    # Field metadata from delta-rs (generation expressions, ...) means nothing to Spark.
    arrow = pa.schema([field.remove_metadata() for field in arrow])
    return from_arrow_schema(arrow, prefer_timestamp_ntz=True)


# --------------------------------------------------------------------------------------------------
# Executor side: Parquet -> Arrow record batches in the declared schema
# --------------------------------------------------------------------------------------------------


class DeltaFilesPartition(InputPartition):
    """One Spark task: a small group of files. Plain strings and ints only, so it pickles cheaply."""

    def __init__(self, files: list[DataFile]) -> None:
        super().__init__(None)
        self.files = files


def _partition_hour_end(values: PartitionValues) -> datetime | None:
    """End of the event hour a file of an (event_date, event_hour) partitioned table holds."""
    day, hour = values.get("event_date"), values.get("event_hour")
    if day is None or hour is None:
        return None
    return datetime.fromisoformat(day).replace(tzinfo=UTC) + timedelta(hours=int(hour) + 1)


def _plan_partitions(files: Iterable[DataFile]) -> list[InputPartition]:
    partitions: list[InputPartition] = []
    group: list[DataFile] = []
    group_bytes = 0
    for f in files:
        if group and (len(group) >= _TASK_MAX_FILES or group_bytes + f.size > _TASK_MAX_BYTES):
            partitions.append(DeltaFilesPartition(group))
            group, group_bytes = [], 0
        group.append(f)
        group_bytes += f.size
    if group:
        partitions.append(DeltaFilesPartition(group))
    return partitions


def _partition_scalar(raw: str | None, arrow_type: pa.DataType) -> pa.Scalar:
    """Parse a Delta-serialised partition value into a scalar of the target type."""
    import datetime as dt
    import decimal

    import pyarrow as pa
    import pyarrow.types as pat

    # An empty partition value is null for every type, strings included: Spark writes "" as the null
    # partition, and delta-rs' own snapshot reports it as null, so both read paths must agree.
    if raw is None or raw == "":
        return pa.scalar(None, type=arrow_type)
    value: object
    if pat.is_string(arrow_type) or pat.is_large_string(arrow_type):
        value = raw
    elif pat.is_boolean(arrow_type):
        value = raw.strip().lower() == "true"
    elif pat.is_integer(arrow_type):
        value = int(raw)
    elif pat.is_floating(arrow_type):
        value = float(raw)
    elif pat.is_decimal(arrow_type):
        value = decimal.Decimal(raw)
    elif pat.is_date(arrow_type):
        value = dt.date.fromisoformat(raw[:10])
    elif pat.is_timestamp(arrow_type):
        # "2024-01-01 00:00:00[.ffffff]" or ISO 8601 with Z/offset. Naive values are UTC: delta-rs
        # writes them so, and sluice runs Spark in UTC.
        ts = dt.datetime.fromisoformat(raw)
        if ts.tzinfo is not None:
            ts = ts.astimezone(dt.UTC)
            if arrow_type.tz is None:
                ts = ts.replace(tzinfo=None)
        elif arrow_type.tz is not None:
            ts = ts.replace(tzinfo=dt.UTC)
        value = ts
    elif pat.is_binary(arrow_type) or pat.is_large_binary(arrow_type):
        value = raw.encode("latin-1")
    else:
        return pa.scalar(raw).cast(arrow_type)
    return pa.scalar(value, type=arrow_type)


def _conform(column: pa.Array, arrow_type: pa.DataType) -> pa.Array:
    """Cast a file column to the declared type (e.g. ns timestamps from other writers, large strings)."""
    import pyarrow.compute as pc

    if column.type.equals(arrow_type):
        return column
    options = pc.CastOptions.safe(arrow_type)
    options.allow_time_truncate = True  # ns -> us: Spark has microsecond precision anyway
    return pc.cast(column, options=options)


def _read_file(f: DataFile, target: pa.Schema) -> Iterator[pa.RecordBatch]:
    import pyarrow as pa
    import pyarrow.fs as pafs
    import pyarrow.parquet as pq

    # Partition columns come from the add action, never from the file (data files normally do not
    # contain them, and when they do the log is the source of truth).
    constants = {
        field.name: _partition_scalar(f.partition_values[field.name], field.type)
        for field in target
        if field.name in f.partition_values
    }
    fs, file_path = pafs.FileSystem.from_uri(f.path) if "://" in f.path else (pafs.LocalFileSystem(), f.path)
    with fs.open_input_file(file_path) as handle:
        parquet = pq.ParquetFile(handle)
        in_file = set(parquet.schema_arrow.names)
        columns = [n for n in target.names if n in in_file and n not in constants]

        def assemble(batch: pa.RecordBatch | None, rows: int) -> pa.RecordBatch:
            arrays = []
            for field in target:
                if field.name in constants:
                    arrays.append(pa.repeat(constants[field.name], rows))
                elif batch is not None and field.name in columns:
                    arrays.append(_conform(batch.column(field.name), field.type))
                else:  # column added to the table after this file was written
                    arrays.append(pa.nulls(rows, type=field.type))
            return pa.RecordBatch.from_arrays(arrays, schema=target)

        if not columns:
            # Only partition/missing columns requested: Parquet still knows the row count.
            remaining = parquet.metadata.num_rows
            while remaining > 0:
                rows = min(remaining, _ARROW_BATCH_ROWS)
                yield assemble(None, rows)
                remaining -= rows
            return
        for batch in parquet.iter_batches(batch_size=_ARROW_BATCH_ROWS, columns=columns):
            if batch.num_rows:
                yield assemble(batch, batch.num_rows)


def _read_partition(partition: InputPartition, schema: StructType) -> Iterator[pa.RecordBatch]:
    from pyspark.sql.pandas.types import to_arrow_schema

    # Spark checks each batch's schema for exact equality with this (types and nullability), so build
    # the batches in precisely this schema.
    target = to_arrow_schema(schema, timezone="UTC")
    # Spark substitutes InputPartition(None) when a batch scan plans no partitions (empty table).
    for f in getattr(partition, "files", None) or []:
        yield from _read_file(f, target)


# --------------------------------------------------------------------------------------------------
# Options, readers, data source
# --------------------------------------------------------------------------------------------------


def _option(options: Mapping[str, Any], key: str) -> str | None:
    value = options.get(key)
    return None if value is None or str(value).strip() == "" else str(value).strip()


def _int_option(options: Mapping[str, Any], key: str, minimum: int) -> int | None:
    raw = _option(options, key)
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{SOURCE_NAME}: option {key}={raw!r} is not an integer") from None
    if value < minimum:
        raise ValueError(f"{SOURCE_NAME}: option {key}={value} must be >= {minimum}")
    return value


def _bool_option(options: Mapping[str, Any], key: str) -> bool:
    raw = (_option(options, key) or "false").lower()
    if raw not in ("true", "false"):
        raise ValueError(f"{SOURCE_NAME}: option {key}={raw!r} must be true or false")
    return raw == "true"


def _time_option(options: Mapping[str, Any], key: str) -> datetime | None:
    raw = _option(options, key)
    if raw is None:
        return None
    try:
        value = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"{SOURCE_NAME}: option {key}={raw!r} is not an ISO 8601 timestamp") from None
    if value.tzinfo is None:
        raise ValueError(f"{SOURCE_NAME}: option {key}={raw!r} needs a zone (e.g. Z)")
    return value.astimezone(UTC)


def _table_option(options: Mapping[str, Any]) -> str:
    path = _option(options, "path")
    if path is None:
        raise ValueError(f"{SOURCE_NAME}: the table path is required: .load(path) or .option('path', ...)")
    return _table_uri(path)


def _offset_version(offset: Mapping[str, Any]) -> int:
    return int(offset["version"])


class DeltaBatchReader(DataSourceReader):
    """Snapshot of the table at option ``version`` (default: latest at planning time)."""

    def __init__(self, table: str, schema: StructType, version: int | None) -> None:
        self.table = table
        self.schema = schema
        self.version = version

    def partitions(self) -> list[InputPartition]:
        _, files = _snapshot_files(self.table, self.version)
        return _plan_partitions(files)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read_partition(partition, self.schema)


class DeltaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches over Delta versions; see the module docstring for the semantics.

    Spark keeps one instance alive on the driver for the whole query (offsets, planning, commit), and
    pickles another, fresh one to the executors for :meth:`read`; the log cache therefore lives only
    on the driver and :meth:`read` uses nothing but ``schema``.
    """

    def __init__(
        self,
        table: str,
        schema: StructType,
        *,
        max_files_per_trigger: int = DEFAULT_MAX_FILES_PER_TRIGGER,
        starting_version: int | str | None = None,
        skip_change_commits: bool = False,
        min_event_time: datetime | None = None,
    ) -> None:
        self.table = table
        self.min_event_time = min_event_time
        self.schema = schema
        self.max_files_per_trigger = max_files_per_trigger
        self.starting_version = starting_version
        self.skip_change_commits = skip_change_commits
        self._log: _DeltaLog | None = None
        self._target: int | None = None  # Trigger.AvailableNow: never read past this version

    @property
    def log(self) -> _DeltaLog:
        if self._log is None:
            self._log = _DeltaLog(self.table, self.skip_change_commits)
        return self._log

    def __getstate__(self) -> dict[str, Any]:
        # Never ship the driver's log cache to executors.
        state = dict(self.__dict__)
        state["_log"] = None
        return state

    def initialOffset(self) -> dict:
        if self.starting_version == "latest":
            return {"version": self.log.latest()}
        if isinstance(self.starting_version, int):
            return {"version": self.starting_version - 1}
        return {"version": -1}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxFiles(self.max_files_per_trigger)

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self.log.latest()

    def _available(self) -> int:
        latest = self.log.latest()
        return latest if self._target is None else min(latest, self._target)

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begin = _offset_version(start)
        available = self._available()
        if available <= begin:
            return {"version": begin}
        if isinstance(limit, ReadMaxFiles):
            return {"version": self._admit(begin, available, lambda f: 1, limit.max_files)}
        if isinstance(limit, ReadMaxBytes):
            return {"version": self._admit(begin, available, lambda f: max(f.size, 1), limit.max_bytes)}
        # ReadAllAvailable (the engine passes it whatever the default limit is, e.g. for Trigger.Once),
        # or a limit this source cannot measure (rows): take everything available.
        return {"version": available}

    def _admit(self, begin: int, available: int, cost: Callable[[DataFile], int], budget: int) -> int:
        """The last version such that the commits in (begin, version] fit the budget, at whole-commit
        granularity and with at least one commit carrying files (so the query always progresses)."""
        end, used = begin, 0
        for commit in self.log.commits(begin, available):
            commit_cost = sum(cost(f) for f in commit.files)
            # Commits without files (compaction, metadata) ride along for free, so that they never
            # cost an empty micro-batch of their own.
            if commit_cost > 0 and used > 0 and used + commit_cost > budget:
                break
            end, used = commit.version, used + commit_cost
        return end

    def reportLatestOffset(self) -> dict | None:
        latest = self.log.latest()
        return {"version": latest} if latest >= 0 else None

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        begin, finish = _offset_version(start), _offset_version(end)
        if finish <= begin:
            return []
        files = (f for commit in self.log.commits(begin, finish) for f in commit.files)
        if self.min_event_time is not None:
            cutoff = self.min_event_time
            files = (f for f in files if (ends := _partition_hour_end(f.partition_values)) is None or ends > cutoff)
        return _plan_partitions(files)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read_partition(partition, self.schema)

    def commit(self, end: dict) -> None:
        self.log.forget(_offset_version(end))


class DeltaDataSource(DataSource):
    """``spark.read[Stream].format("sluice_delta")``: options ``path``, ``version`` (batch),
    ``startingVersion`` (int or ``latest``), ``maxFilesPerTrigger``, ``skipChangeCommits``, ``minEventTime``."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> StructType:
        return table_schema(_table_option(self.options), _int_option(self.options, "version", 0))

    def reader(self, schema: StructType) -> DeltaBatchReader:
        return DeltaBatchReader(_table_option(self.options), schema, _int_option(self.options, "version", 0))

    def streamReader(self, schema: StructType) -> DeltaStreamReader:
        starting: int | str | None
        if (_option(self.options, "startingVersion") or "").lower() == "latest":
            starting = "latest"
        else:
            starting = _int_option(self.options, "startingVersion", 0)
        max_files = _int_option(self.options, "maxFilesPerTrigger", 1)
        return DeltaStreamReader(
            _table_option(self.options),
            schema,
            max_files_per_trigger=DEFAULT_MAX_FILES_PER_TRIGGER if max_files is None else max_files,
            starting_version=starting,
            skip_change_commits=_bool_option(self.options, "skipChangeCommits"),
            min_event_time=_time_option(self.options, "minEventTime"),
        )


_registered: weakref.WeakSet[SparkSession] = weakref.WeakSet()


def register(spark: SparkSession) -> None:
    """Register :class:`DeltaDataSource` as ``sluice_delta`` on this session; safe to call repeatedly."""
    if spark in _registered:
        return
    try:
        spark.dataSource.register(DeltaDataSource)
    except Exception as exc:
        # Re-registering a name is allowed (Spark just replaces it), but a name that Spark discovered
        # statically (a ``pyspark_*`` module's DefaultSource) raises DATA_SOURCE_ALREADY_EXISTS; the
        # name is then served already and a pipeline should not die on a repeated register() call.
        if "DATA_SOURCE_ALREADY_EXISTS" not in str(exc):
            raise
    _registered.add(spark)
