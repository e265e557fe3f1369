"""delta-spark writes every table that Spark computes (SPEC section 7, "Delta on Spark").

The contract of :class:`sluice.storage.engine.DeltaEngine`: idempotent commits keyed by Delta app
transactions (the commits that Delta's idempotent-writes options ``txnAppId``/``txnVersion`` make, run by
:func:`_write_in_transaction`), commit metadata in ``userMetadata``, atomic range replacement with
``replaceWhere``, streaming reads with Delta's own source; tables are created with
``DeltaTable.createIfNotExists`` and sluice's table properties.

The small ops tables (``ops/*``) stay on delta-rs from the driver: their rows never were a Spark job, and
delta-rs lets ``replace_rows`` merge and commit against one snapshot and retry on a concurrent commit (a
delta-spark overwrite would start from a newer snapshot than the rows it merged, and drop what was
committed in between). Each table thus has exactly one writing engine.

Every Spark session carries the connector's jars (``sluice.core.jars``, fetched by ``make setup``). The
engine contract is tested in tests/delta/test_engine.py."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from sluice.core.spark import local_frame
from sluice.storage import snapshots
from sluice.storage.engine import OpsDeltaEngine, PartitionPredicate, maybe_kill
from sluice.storage.tables import is_ops_table

UNLIMITED_FILES = 2**31 - 1


class SparkDeltaEngine:
    """delta-spark writes every table Spark computes; the small ops tables (``ops/*``), whose rows the driver
    builds, stay on delta-rs (see the module docstring). Never two writing engines on one table."""

    def __init__(self, spark: SparkSession | Callable[[], SparkSession],
                 properties: Mapping[str, str] | None = None) -> None:
        # The session, or what starts it on first use: reading a table's log or writing an ops table needs no
        # JVM, so a cycle with nothing to write never starts one.
        self._spark = spark
        self.properties = dict(properties or {})
        # The ops tables' engine. App transactions and commit metadata are read from the log by
        # sluice.storage.snapshots (reading a Delta log is engine-neutral; writing is not).
        self._ops = OpsDeltaEngine(properties)

    @property
    def spark(self) -> SparkSession:
        if not isinstance(self._spark, SparkSession):
            self._spark = self._spark()
        return self._spark

    # -- tables -------------------------------------------------------------------------------------
    def ensure_table(self, path: str, schema: StructType, partition_by: Sequence[str] = ()) -> None:
        if is_ops_table(path):
            self._ops.ensure_table(path, schema, partition_by)
            return
        from delta.tables import DeltaTable as SparkDeltaTable

        # The log says whether the table exists and which columns it has, whichever engine reads it: delta-rs
        # reads it in milliseconds, where delta-spark builds the whole snapshot in the JVM (0.3 s each in a warm
        # session, 0.6 s in a fresh process) for tables a cycle may not write at all.
        existing = snapshots.open_table(path)
        if existing is not None:
            present = {f.name for f in existing.schema().fields}
            missing = [f for f in schema.fields if f.name not in present]
            if missing:
                # Tables created by an older sluice gain the columns added since: a metadata-only commit.
                columns = ", ".join(f"`{f.name}` {f.dataType.simpleString()}" for f in missing)
                self.spark.sql(f"ALTER TABLE delta.`{path}` ADD COLUMNS ({columns})")
            return
        builder = SparkDeltaTable.createIfNotExists(self.spark).location(str(path)).addColumns(schema)
        if partition_by:
            builder = builder.partitionedBy(*partition_by)
        for key, value in sorted(self.properties.items()):
            builder = builder.property(key, value)
        builder.execute()

    def committed_version(self, path: str, app_id: str) -> int | None:
        return snapshots.app_version(path, app_id)

    def _done(self, path: str, app_id: str, version: int) -> bool:
        return _committed(path, app_id, version)

    def append(
        self,
        df: DataFrame,
        path: str,
        *,
        app_id: str,
        version: int,
        metadata: Mapping[str, Any] | None = None,
    ) -> bool:
        if is_ops_table(path):
            raise ValueError(f"{path}: the ops tables are written from the driver; use append_rows()")
        return _write_in_transaction(
            self.spark, df, str(path), app_id=app_id, version=version, user_metadata=_user_metadata(metadata))

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
        if is_ops_table(path):
            return self._ops.append_rows(rows, schema, path, app_id=app_id, version=version, metadata=metadata)
        # append() skips a version already committed.
        frame = local_frame(self.spark, rows, schema)
        return self.append(frame, path, app_id=app_id, version=version, metadata=metadata)

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
        if not is_ops_table(path):
            raise ValueError(f"{path}: replace_rows rewrites the small ops tables only; use replace()")
        return self._ops.replace_rows(
            rows, schema, path, drop=drop, order_by=order_by, app_id=app_id, version=version, metadata=metadata
        )

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
        if is_ops_table(path):
            raise ValueError(f"{path}: the ops tables are rewritten from the driver; use replace_rows()")
        if self._done(path, app_id, version):
            return False
        chosen = None if files is None else self._partitions(path, files)
        condition = "true" if chosen is None else _any_of(chosen)
        # The rows it replaces, read as read() reads (the files the log lists, no delta-spark snapshot jobs).
        current = self.read(str(path), files=files).where(condition)
        # A column the table has and ``df`` lacks (an output that went forward without it, SPEC 9) reads null.
        rewritten = keep(current).unionByName(df, allowMissingColumns=True)
        return _write_in_transaction(
            self.spark, rewritten.localCheckpoint(), str(path), app_id=app_id, version=version,
            user_metadata=_user_metadata(metadata), replace_where=condition)

    def overwrite(
        self,
        df: DataFrame,
        path: str,
        *,
        app_id: str,
        version: int,
        metadata: Mapping[str, Any] | None = None,
    ) -> bool:
        if is_ops_table(path):
            raise ValueError(f"{path}: the ops tables are rewritten from the driver; use replace_rows()")
        if self._done(path, app_id, version):
            return False
        return _write_in_transaction(self.spark, df, str(path), app_id=app_id, version=version,
                                     user_metadata=_user_metadata(metadata), overwrite_schema=True)

    def add_columns(self, path: str, columns: Sequence[tuple[str, str]]) -> None:
        present = set(self.schema(path).fieldNames())
        wanted = [(name, kind) for name, kind in columns if name not in present]
        if wanted:
            listed = ", ".join(f"`{name}` {kind}" for name, kind in wanted)
            self.spark.sql(f"ALTER TABLE delta.`{path}` ADD COLUMNS ({listed})")

    def read(self, path: str, *, files: PartitionPredicate | None = None) -> DataFrame:
        # delta-spark plans a read of a table from its whole state with stats ("Filtering files for query"):
        # two Spark jobs per table and version, the first of a process's jobs on cold executors, where the
        # log that delta-rs reads on the driver already lists the files. When those files alone are the rows,
        # they are read as Parquet (the format Delta's own reader reads them with).
        table = snapshots.open_table(path)
        if table is not None and (chosen := _plain_files(path, table, files)) is not None:
            schema = StructType.fromJson(json.loads(table.schema().to_json()))
            if not chosen:
                return local_frame(self.spark, [], schema)
            frame = self.spark.read.schema(schema).option("basePath", str(path)).parquet(*chosen)
            return frame.select(*[F.col(f"`{name}`") for name in schema.fieldNames()])
        df = self.spark.read.format("delta").load(str(path))
        if files is None:
            return df
        partitions = self._partitions(path, files, table)
        return df if partitions is None else df.where(_any_of(partitions))

    def schema(self, path: str) -> StructType:
        return self.spark.read.format("delta").load(str(path)).schema

    @staticmethod
    def _partitions(path: str, files: PartitionPredicate, table: Any = None) -> list[dict[str, Any]] | None:
        """The partitions whose typed values (date, int: what the predicates compare) ``files`` chooses;
        None for an unpartitioned table (the predicate cannot choose among its files). ``table``: its snapshot,
        when the caller has opened it already."""
        table = table if table is not None else snapshots.open_table(path)
        if table is None or not table.metadata().partition_columns:
            return None
        distinct = {tuple(sorted(f.partition.items())): dict(f.partition) for f in snapshots.live_files(path, table)}
        return [values for _key, values in sorted(distinct.items(), key=lambda kv: repr(kv[0])) if files(values)]

    def read_stream(
        self, path: str, *, max_files_per_trigger: int | None = None, min_event_time: datetime | None = None
    ) -> DataFrame:
        # Delta's source admits 1,000 files per micro-batch by default, which can split one bronze commit
        # across two batches; the cycle's watermark arguments hold only when a batch ends on a commit, so
        # without an explicit limit every batch takes all that is there.
        reader = self.spark.readStream.format("delta").option(
            "maxFilesPerTrigger", str(max_files_per_trigger or UNLIMITED_FILES))
        frame = reader.load(str(path))
        if min_event_time is not None:
            # A filter on the partition column lets Delta's streaming source skip whole partitions.
            frame = frame.filter(F.col("event_date") >= F.lit(min_event_time.date()))
        return frame

    def history_metadata(self, path: str, limit: int = 1) -> list[dict[str, Any]]:
        return [meta for _version, meta in snapshots.commit_metadata(path, limit)]


    # -- housekeeping (sluice_maintenance) ----------------------------------------------------------
    def compact(self, path: str) -> int:
        if is_ops_table(path):
            return self._ops.compact(path)
        from delta.tables import DeltaTable as SparkDeltaTable

        (result,) = SparkDeltaTable.forPath(self.spark, str(path)).optimize().executeCompaction().collect()
        return int(result["metrics"]["numFilesRemoved"])

    def vacuum(self, path: str, retention_hours: int) -> int:
        if is_ops_table(path):
            return self._ops.vacuum(path, retention_hours)
        # delta-spark refuses a retention under the table's deletedFileRetentionDuration unless told; sluice's
        # own floor is a day (config: MIN_RETENTION_HOURS). And since Delta 4.1 it ignores any RETAIN but 0 in
        # favour of that table property, which holds the retention of the table's creation: the retention
        # asked for now (SLUICE_VACUUM_RETENTION_HOURS) is the one to apply, as delta-rs does.
        scoped = {"spark.databricks.delta.retentionDurationCheck.enabled": "false",
                  "spark.databricks.delta.vacuum.retentionWindowIgnore.enabled": "false"}
        for key, value in scoped.items():
            self.spark.conf.set(key, value)
        try:
            table = f"delta.`{path}`"
            doomed = self.spark.sql(f"VACUUM {table} RETAIN {retention_hours} HOURS DRY RUN").count()
            self.spark.sql(f"VACUUM {table} RETAIN {retention_hours} HOURS")
        finally:
            for key in scoped:
                self.spark.conf.unset(key)
        return doomed


def _committed(path: str, app_id: str, version: int, at: int | None = None) -> bool:
    """Whether ``app_id`` committed ``version`` (or a later one) in the latest snapshot, or in table version ``at``."""
    done = snapshots.app_version(path, app_id, at)
    return done is not None and done >= version


def _user_metadata(metadata: Mapping[str, Any] | None) -> str:
    """sluice's commit metadata, as the JSON that Delta keeps in the commit's ``userMetadata``."""
    return json.dumps(dict(metadata or {}), default=str, sort_keys=True)


def _write_in_transaction(
    spark: SparkSession,
    df: DataFrame,
    path: str,
    *,
    app_id: str,
    version: int,
    user_metadata: str,
    replace_where: str | None = None,
    overwrite_schema: bool = False,
) -> bool:
    """Append ``df`` to the Delta table at ``path``, or replace the rows ``replace_where`` matches with it, in one
    commit with the app transaction ``(app_id, version)``, unless that version is committed already; whether it
    committed (then the crash-test hook ``maybe_kill`` runs).

    This is the command that ``df.write.format("delta").option("txnAppId", app_id).option("txnVersion", version)
    .option("userMetadata", ...)`` with ``mode("append")`` (or ``mode("overwrite").option("replaceWhere", ...)``)
    runs, delta-spark's ``WriteIntoDelta``: the same files, schema checks and commit, app transaction included.
    It is run one step at a time for one reason. Before writing, that command asks its transaction's snapshot for
    the app id's last version (``txnVersion``), and delta-spark 4.4 answers from ``Snapshot.setTransactions``,
    which reconstructs the table's whole state (Spark jobs over its checkpoint and the log since), although the
    version's checksum file lists the app transactions (``SnapshotState.scala``; Delta's master still does).
    Every idempotent commit of a cycle paid that: a 2-row append took 0.9-1.2 s with the writer options and
    0.3-0.35 s this way (local[2], median of 15), and a 15-minute cycle of a two-stream join pipeline makes 8 such
    commits, where the bare Spark job of ``make bench-cluster`` makes one per query. Here delta-rs answers the
    same question on the driver, from the log, at the very version the transaction read.

    Exactly-once stays Delta's own: the app id is recorded as read by the transaction (what ``txnVersion``
    records), so a commit of the same app id that lands after that version fails this one in Delta's conflict
    check, and this commit carries its ``SetTransaction``. (sluice's locks keep a second writer of a stream or a
    pipeline away in the first place.) The classes are delta-spark's internals at the version jars.lock pins;
    tests/delta/test_engine.py checks that the commits are those the writer options make."""
    jvm: Any = spark._jvm
    session: Any = spark._jsparkSession
    delta, scala, utils = jvm.org.apache.spark.sql.delta, jvm.scala, jvm.org.apache.spark.api.python.PythonUtils
    none = scala.Option.empty()
    options = {"txnAppId": app_id, "txnVersion": str(version), "userMetadata": user_metadata}
    if replace_where is not None:
        options["replaceWhere"] = replace_where
    if overwrite_schema:  # the whole table, its schema included (no replaceWhere)
        options["overwriteSchema"] = "true"
    overwrite = replace_where is not None or overwrite_schema
    mode = getattr(jvm.org.apache.spark.sql.SaveMode, "Overwrite" if overwrite else "Append")
    no_columns = utils.toSeq([])
    table_log = delta.DeltaLog.forTable(session, path)
    txn = table_log.startTransaction(none, none)
    if _committed(path, app_id, version, at=txn.readVersion()):
        return False
    txn.readTxn().addOne(app_id)
    command = delta.commands.WriteIntoDelta(
        table_log, mode, delta.DeltaOptions(utils.toScalaMap(options), session.sessionState().conf()), no_columns,
        utils.toScalaMap({}), df._jdf, none, none, False)
    operation = getattr(delta, "DeltaOperations$Write")(
        mode, scala.Some(no_columns), scala.Option.apply(replace_where), scala.Some(user_metadata),
        none, none, none, none, none)
    # WriteIntoDelta runs inside deltaLog.withNewTransaction, which makes the transaction the thread's active one.
    active = getattr(getattr(delta, "OptimisticTransaction$"), "MODULE$")
    active.setActive(txn)
    try:
        data = command.writeAndReturnCommitData(txn, session, none, False)
        txn.commitIfNeeded(data.actions(), operation, data.stringTags())
    finally:
        active.clearActive()
    maybe_kill(path, app_id)
    return True


def _literal(value: Any) -> str:
    text = str(value).replace("\\", "\\\\").replace("'", "\\'")
    return f"'{text}'"


# A partition value that a Hive-style folder name spells as itself (no escaping, no null).
_PLAIN_VALUE = re.compile(r"[A-Za-z0-9_.-]+")


def _plain_files(path: str, table: Any, files: PartitionPredicate | None) -> list[str] | None:
    """The live files of ``table`` that ``files`` chooses (all without it), when those files alone are the rows
    and Spark's Parquet reader gives each its partition values from its folders: reader protocol 1 (no column
    mapping, no deletion vectors) and every chosen file in the Hive-style folders of its values, as delta-spark
    and delta-rs lay them out. None otherwise: delta-spark reads the table."""
    if not snapshots.rows_are_files(table):
        return None
    columns = list(table.metadata().partition_columns)
    chosen = []
    for live in snapshots.live_files(path, table):
        if files is not None and not files(live.partition):
            continue
        values: list[Any] = [live.partition.get(c) for c in columns]
        if any(v is None for v in values):
            return None
        texts = [v.isoformat() if hasattr(v, "isoformat") else str(v) for v in values]
        if not all(_PLAIN_VALUE.fullmatch(t) for t in texts):
            return None
        folder, _, name = live.relative.rpartition("/")
        if folder != "/".join(f"{c}={t}" for c, t in zip(columns, texts, strict=True)) or not name:
            return None
        chosen.append(live.path)
    return chosen


def _any_of(partitions: Sequence[Mapping[str, Any]]) -> str:
    """A SQL predicate (for ``replaceWhere`` and reads) matching exactly these partitions; ``false`` for none."""
    if not partitions:
        return "false"
    return " OR ".join(
        "(" + " AND ".join(f"`{k}` IS NULL" if v is None else f"`{k}` = {_literal(v)}" for k, v in p.items()) + ")"
        for p in partitions
    )
