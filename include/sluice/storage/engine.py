"""The Delta engine seam.

Everything in sluice reads and writes Delta through :class:`DeltaEngine`; each table has exactly one writer:

* :class:`sluice.storage.spark_engine.SparkDeltaEngine`: delta-spark writes every table Spark computes
  (bronze, quarantine, dlq, gold, and the backfill and correction rewrites), and streams bronze with Delta's
  own source.
* :class:`OpsDeltaEngine` (here): delta-rs, from the driver, writes the small ops tables (``ops/*``), whose
  rows the driver builds: one commit of a few rows, with no Spark job and no Spark session (the alert outbox,
  ``sluice alerts`` and Airflow's callbacks have none).

Reading a table's log (versions, app transactions, commit metadata) is engine-neutral and lives in
:mod:`sluice.storage.snapshots`.

Exactly-once: every commit carries a Delta *app transaction* ``(app_id, version)``. A writer that is
re-run for a version already committed (a retried micro-batch after a crash) finds
``transaction_version(app_id) >= version`` and commits nothing. Files written by a crashed attempt sit
unreferenced in the table directory: invisible to every Delta reader, and removed by VACUUM.

Concurrent writers of an ops table: a commit that loses the race to another writer's commit (delta-rs raises
``CommitFailedError``) is retried against the new snapshot, up to ``COMMIT_ATTEMPTS`` times; a retry whose
app transaction the winner already committed stops there (see :meth:`OpsDeltaEngine._write`).
"""

from __future__ import annotations

import json
import logging
import os
import random
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable, Transaction
from deltalake.exceptions import CommitFailedError
from deltalake.transaction import AddAction, RemoveAction
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from sluice.core.lake import child, name_of, storage_options
from sluice.storage import snapshots
from sluice.storage.snapshots import arrow_schema, merged_rows

log = logging.getLogger(__name__)

PartitionValues = Mapping[str, Any]
PartitionPredicate = Callable[[PartitionValues], bool]
Actions = list[AddAction | RemoveAction]

# Commits per write before giving up when other writers keep committing first, and the pause before the
# n-th retry: COMMIT_BACKOFF_S * 2**(n-1) (0.05 s .. 6.4 s, about 13 s in all), times a random factor in
# [0.5, 1.5). The jitter is what breaks ties: writers that lost to the same commit and waited the same time
# collided again, and on a loaded machine one of four writers of a ledger lost 7 times in a row. Timing
# never changes a table's content: every write is an app transaction, replayed or not on its own merits.
COMMIT_ATTEMPTS = 9
COMMIT_BACKOFF_S = 0.05


class CommitConflictError(RuntimeError):
    """Other writers committed first on every attempt; the write was not committed."""


def commit_backoff(failed: int) -> None:
    """Pause after the ``failed``-th lost attempt (1-based), unless it was the last one."""
    if failed < COMMIT_ATTEMPTS:
        time.sleep(COMMIT_BACKOFF_S * 2 ** (failed - 1) * random.uniform(0.5, 1.5))


class RowsEngine(Protocol):
    """The part of the contract that driver-side writers need (the ledger, DQ results, the alert outbox,
    heartbeats): both engines have it, so code that only writes rows built on the driver runs without Spark."""

    def ensure_table(self, path: str, schema: StructType, partition_by: Sequence[str] = ()) -> None:
        """Create the table (empty, version 0) if it does not exist yet."""

    def committed_version(self, path: str, app_id: str) -> int | None:
        """The last app-transaction version committed by ``app_id`` (None if never)."""

    def append_rows(
        self,
        rows: Sequence[Sequence[Any]],
        schema: StructType,
        path: str,
        *,
        app_id: str,
        version: int,
        metadata: Mapping[str, Any] | None = None,
    ) -> bool:
        """Like :meth:`DeltaEngine.append`, for a handful of rows built on the driver (ops rows, heartbeats)."""

    def replace_rows(
        self,
        rows: Sequence[Sequence[Any]],
        schema: StructType,
        path: str,
        *,
        drop: Callable[[Mapping[str, Any]], bool],
        order_by: Sequence[str],
        app_id: str,
        version: int,
        metadata: Mapping[str, Any] | None = None,
    ) -> bool:
        """Rewrite a small, unpartitioned table (ledger, DQ results) on the driver in one atomic commit:
        current rows for which ``drop`` is true are replaced by ``rows``; the result is sorted by
        ``order_by``, so the file content does not depend on the order of earlier writes."""


class DeltaEngine(RowsEngine, Protocol):
    """What sluice needs from a Delta implementation. Paths are table roots (local paths or URIs)."""

    @property
    def spark(self) -> SparkSession:
        """The engine's Spark session (started on first use)."""

    def append(
        self,
        df: DataFrame,
        path: str,
        *,
        app_id: str,
        version: int,
        metadata: Mapping[str, Any] | None = None,
    ) -> bool:
        """Append ``df`` in one commit, idempotently. Returns False when that version was already there."""

    def replace(
        self,
        df: DataFrame,
        path: str,
        *,
        keep: Callable[[DataFrame], DataFrame],
        files: PartitionPredicate | None = None,
        app_id: str,
        version: int,
        metadata: Mapping[str, Any] | None = None,
    ) -> bool:
        """Atomically replace part of a table in one commit.

        The files chosen by ``files`` (a predicate on partition values; all files when None) are removed.
        The rows of those files that ``keep`` retains are rewritten together with ``df``. Readers see
        either the old or the new table, never a mix.
        """

    def overwrite(
        self,
        df: DataFrame,
        path: str,
        *,
        app_id: str,
        version: int,
        metadata: Mapping[str, Any] | None = None,
    ) -> bool:
        """Replace the whole table, its schema included, with ``df`` in one commit (a rebuild of a changed
        output, SPEC 9), idempotently. Returns False when that version was already there."""

    def add_columns(self, path: str, columns: Sequence[tuple[str, str]]) -> None:
        """Add nullable columns (name, Spark SQL type) to the table's schema; earlier rows read null."""

    def read(self, path: str, *, files: PartitionPredicate | None = None) -> DataFrame:
        """A batch snapshot of the table, pruned to the partitions ``files`` accepts."""

    def read_stream(
        self, path: str, *, max_files_per_trigger: int | None = None, min_event_time: datetime | None = None
    ) -> DataFrame:
        """A streaming read: offsets are Delta versions; works with ``trigger(availableNow=True)``.
        ``min_event_time`` lets the engine skip files of event hours that end before it (rows are not
        filtered: callers filter rows themselves)."""

    def history_metadata(self, path: str, limit: int = 1) -> list[dict[str, Any]]:
        """Custom commit metadata of the newest ``limit`` commits, newest first."""

    def compact(self, path: str) -> int:
        """Bin-pack small files (``dataChange=false``: streaming readers see nothing new); files removed."""

    def vacuum(self, path: str, retention_hours: int) -> int:
        """Delete files no longer referenced and older than the retention; files deleted."""


def _unpartitioned(table: DeltaTable, path: str, what: str) -> None:
    if table.metadata().partition_columns:
        raise ValueError(f"{what} writes the small unpartitioned ops tables; {path} is partitioned")


def _add_file(path: str, data: pa.Table) -> AddAction:
    """Write ``data`` as one new Parquet file of the (unpartitioned) table and describe it for the commit."""
    rel = f"part-00000-{uuid.uuid4()}-c000.snappy.parquet"
    # Serialized first: the file's size is known without asking the store for it (a request per commit on S3).
    buffer = pa.BufferOutputStream()
    pq.write_table(data, buffer, compression="snappy")
    body = buffer.getvalue()
    fs, where = snapshots.filesystem(child(path, rel))
    if fs is None:
        Path(where).write_bytes(body.to_pybytes())
    else:
        with fs.open_output_stream(where) as out:
            out.write(body)
    # numRecords lets Delta readers (and our own status) count rows without opening files. No per-column
    # bounds: delta-rs turns a column without them into a pyarrow guarantee that drops every row of the
    # file from filtered reads (deltalake 1.6), so bounds are all or nothing, and strings are not worth it.
    return AddAction(path=rel, size=body.size, partition_values={}, modification_time=int(time.time() * 1000),
                     data_change=True, stats=json.dumps({"numRecords": data.num_rows}))


class OpsDeltaEngine:
    """delta-rs from the driver, for the small ops tables (``ops/*``): their rows are built on the driver, so
    no Spark job (and no Spark session) is needed to write them. See the module docstring."""

    def __init__(self, properties: Mapping[str, str] | None = None) -> None:
        # Delta table properties new tables are created with (see sluice.storage.tables.table_properties).
        self.properties = dict(properties or {})

    # -- tables -------------------------------------------------------------------------------------
    def ensure_table(self, path: str, schema: StructType, partition_by: Sequence[str] = ()) -> None:
        if snapshots.exists(path):
            self._add_missing_columns(path, schema)
            return
        if storage_options(path) is None:
            Path(path).mkdir(parents=True, exist_ok=True)
        DeltaTable.create(
            str(path),
            arrow_schema(schema),
            mode="ignore",
            partition_by=list(partition_by) or None,
            name=name_of(path),
            configuration=dict(self.properties) or None,
            storage_options=storage_options(path),
        )

    def _add_missing_columns(self, path: str, schema: StructType) -> None:
        """Tables created by an older sluice gain the columns added since (nullable, so old rows read as
        null): a metadata-only commit, no data is rewritten."""
        table = self._table(path)
        present = {f.name for f in table.schema().fields}
        missing = [f for f in arrow_schema(schema) if f.name not in present]
        if missing:
            from deltalake import Field

            log.info("%s: adding column(s) %s", path, ", ".join(f.name for f in missing))
            table.alter.add_columns([Field.from_arrow(f) for f in missing])

    def _table(self, path: str) -> DeltaTable:
        return DeltaTable(str(path), storage_options=storage_options(path))

    def committed_version(self, path: str, app_id: str) -> int | None:
        return snapshots.app_version(path, app_id)

    # -- writes -------------------------------------------------------------------------------------
    def _commit(
        self,
        table: DeltaTable,
        actions: Actions,
        *,
        app_id: str,
        version: int,
        metadata: Mapping[str, Any] | None,
        rebase: bool,
    ) -> None:
        custom = {"sluice": json.dumps(dict(metadata or {}), default=str, sort_keys=True)}
        table.create_write_transaction(
            actions,
            mode="append",
            schema=table.schema(),
            partition_by=table.metadata().partition_columns or None,
            commit_properties=CommitProperties(
                custom_metadata=custom,
                app_transactions=[Transaction(app_id, version)],
                # None: delta-rs's default, which moves a commit past newer versions its conflict checker
                # accepts. 0: fail as soon as the table moved, whatever the other commit did.
                max_commit_retries=None if rebase else 0,
            ),
        )

    def _write(
        self,
        path: str,
        build: Callable[[DeltaTable], Actions],
        *,
        app_id: str,
        version: int,
        metadata: Mapping[str, Any] | None,
        rebase: bool = True,
    ) -> bool:
        """Commit ``build(snapshot)`` as app transaction ``(app_id, version)``, optimistically.

        When another writer commits first and delta-rs refuses to move our commit past it (a file we read
        or remove changed, the same app id committed, or ``rebase`` is off), the table is reloaded: if the
        winner committed our app transaction, the write is done (False, as for any replay); otherwise
        ``build`` runs again on the new snapshot and the commit is retried. Other errors propagate. Files a
        lost attempt wrote stay unreferenced, like those of a crashed one."""
        failed = 0
        conflict: CommitFailedError | None = None
        while True:
            table = self._table(path)
            if self._already(table, app_id, version, path):
                return False
            if failed == COMMIT_ATTEMPTS:
                raise CommitConflictError(
                    f"{path}: {app_id} version {version} not committed: another writer committed first "
                    f"on all {COMMIT_ATTEMPTS} attempts"
                ) from conflict
            try:
                self._commit(table, build(table), app_id=app_id, version=version, metadata=metadata,
                             rebase=rebase)
            except CommitFailedError as error:
                # delta-rs reports conflicts and some I/O failures with the same class; only a newer table
                # version proves that another writer got in first.
                if self._table(path).version() == table.version():
                    raise
                conflict, failed = error, failed + 1
                log.warning("%s: commit of %s version %s lost to a concurrent writer (%d/%d): %s",
                            name_of(path), app_id, version, failed, COMMIT_ATTEMPTS, error)
                commit_backoff(failed)
                continue
            maybe_kill(path, app_id)
            return True

    def _already(self, table: DeltaTable, app_id: str, version: int, path: str) -> bool:
        done = table.transaction_version(app_id)
        if done is not None and done >= version:
            log.info("skip %s: %s version %s already committed (last %s)", name_of(path), app_id, version, done)
            return True
        return False

    def append_rows(
        self,
        rows: Sequence[Sequence[Any]],
        schema: StructType,
        path: str,
        *,
        app_id: str,
        version: int,
        metadata: Mapping[str, Any] | None = None,
    ) -> bool:
        table = self._table(path)
        _unpartitioned(table, path, "append_rows")
        if self._already(table, app_id, version, path):
            return False
        data = pa.Table.from_pylist([dict(zip(schema.names, r, strict=True)) for r in rows], arrow_schema(schema))
        # The file is written once; only the commit is retried.
        actions: Actions = [_add_file(path, data)]
        return self._write(path, lambda _table: actions, app_id=app_id, version=version, metadata=metadata)

    def replace_rows(
        self,
        rows: Sequence[Sequence[Any]],
        schema: StructType,
        path: str,
        *,
        drop: Callable[[Mapping[str, Any]], bool],
        order_by: Sequence[str],
        app_id: str,
        version: int,
        metadata: Mapping[str, Any] | None = None,
    ) -> bool:
        _unpartitioned(self._table(path), path, "replace_rows")

        def build(table: DeltaTable) -> Actions:
            # Merged from, and removing the files of, exactly the snapshot the commit is based on.
            add = _add_file(path, merged_rows(path, rows, schema, drop=drop, order_by=order_by, table=table))
            removes: Actions = [
                RemoveAction(path=f.relative, data_change=True, deletion_timestamp=add.modification_time,
                             size=f.size, partition_values={})
                for f in sorted(snapshots.live_files(path, table), key=lambda f: f.relative)
            ]
            return [*removes, add]

        # No rebase: delta-rs would move this rewrite past a concurrent commit that only added files (another
        # replace_rows on an empty table, an append), leaving rows this merge never saw next to it (two rows
        # for one key). Any newer version fails the commit instead, and the retry merges it in.
        return self._write(path, build, app_id=app_id, version=version, metadata=metadata, rebase=False)

    # -- housekeeping (sluice_maintenance) ----------------------------------------------------------
    def compact(self, path: str) -> int:
        return int(self._table(path).optimize.compact().get("numFilesRemoved", 0))

    def vacuum(self, path: str, retention_hours: int) -> int:
        table = self._table(path)
        # full: also the files no commit ever referenced (a crashed write's), not only those of remove actions.
        deleted = table.vacuum(retention_hours=retention_hours, dry_run=False, enforce_retention_duration=False,
                               full=True)
        table.cleanup_metadata()
        return len(deleted)


_commits_seen: dict[str, int] = {}


def maybe_kill(path: str, app_id: str = "") -> None:
    """Crash-test hook: ``SLUICE_KILL_AFTER_COMMIT=<table suffix>[@<app id prefix>]:<n>`` SIGKILLs this
    process right after its n-th commit to a table whose path ends with the suffix (by an app id starting
    with the prefix, when given) - the worst moment for a crash, between the commits of one step. Unset (the
    default) it does nothing."""
    spec = os.environ.get("SLUICE_KILL_AFTER_COMMIT")
    if not spec:
        return
    target, _, count = spec.rpartition(":")
    suffix, _, app_prefix = target.partition("@")
    if not str(path).rstrip("/").endswith(suffix) or not app_id.startswith(app_prefix):
        return
    _commits_seen[target] = _commits_seen.get(target, 0) + 1
    if _commits_seen[target] >= int(count):
        import signal

        log.warning("SLUICE_KILL_AFTER_COMMIT=%s reached: SIGKILL", spec)
        os.kill(os.getpid(), signal.SIGKILL)
