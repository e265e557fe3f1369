"""The other side of the engine seam: the native delta-spark connector.

Used where the Delta jars are on the Spark classpath (the docker-compose Spark image sets
``spark.sql.extensions=io.delta.sql.DeltaSparkSessionExtension``). Same contract as
:class:`sluice.storage.engine.RsDeltaEngine`: idempotent commits keyed by Delta app transactions
(``txnAppId``/``txnVersion``, Delta's idempotent-writes options), commit metadata in ``userMetadata``,
atomic range replacement with ``replaceWhere``.

The driver-built writes of small ops tables (``append_rows``, ``replace_rows``) go through delta-rs here
too: their rows never were a Spark job, and delta-rs lets ``replace_rows`` merge and commit against one
snapshot and retry on a concurrent commit (a delta-spark overwrite would start from a newer snapshot
than the rows it merged, and drop what was committed in between).

Every Spark session carries the connector's jars (``sluice.core.jars``, fetched by ``make setup``); the
engine-contract tests (tests/delta/test_engine.py) run on this engine and on delta-rs's.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from deltalake import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from sluice.storage.engine import PartitionPredicate, RsDeltaEngine


class NativeDeltaEngine:
    def __init__(self, spark: SparkSession, properties: Mapping[str, str] | None = None) -> None:
        self.spark = spark
        # delta-rs still answers the metadata questions (it reads any Delta table's log), so both
        # engines agree on versions, partitions and app transactions; it also creates the tables.
        self._meta = RsDeltaEngine(spark, properties)

    def ensure_table(self, path: Path, schema: StructType, partition_by: Sequence[str] = ()) -> None:
        self._meta.ensure_table(path, schema, partition_by)

    def committed_version(self, path: Path, app_id: str) -> int | None:
        return self._meta.committed_version(path, app_id)

    def _done(self, path: Path, app_id: str, version: int) -> bool:
        done = self.committed_version(path, app_id)
        return done is not None and done >= version

    def _writer(self, df: DataFrame, app_id: str, version: int, metadata: Mapping[str, Any] | None) -> Any:
        return (
            df.write.format("delta")
            .option("txnAppId", app_id)
            .option("txnVersion", str(version))
            .option("userMetadata", json.dumps(dict(metadata or {}), default=str, sort_keys=True))
        )

    def append(
        self,
        df: DataFrame,
        path: Path,
        *,
        app_id: str,
        version: int,
        metadata: Mapping[str, Any] | None = None,
    ) -> bool:
        if self._done(path, app_id, version):
            return False
        self._writer(df, app_id, version, metadata).mode("append").save(str(path))
        return True

    def append_rows(
        self,
        rows: Sequence[Sequence[Any]],
        schema: StructType,
        path: Path,
        *,
        app_id: str,
        version: int,
        metadata: Mapping[str, Any] | None = None,
    ) -> bool:
        return self._meta.append_rows(rows, schema, path, app_id=app_id, version=version, metadata=metadata)

    def replace_rows(
        self,
        rows: Sequence[Sequence[Any]],
        schema: StructType,
        path: Path,
        *,
        drop: Callable[[Mapping[str, Any]], bool],
        order_by: Sequence[str],
        app_id: str,
        version: int,
        metadata: Mapping[str, Any] | None = None,
    ) -> bool:
        return self._meta.replace_rows(
            rows, schema, path, drop=drop, order_by=order_by, app_id=app_id, version=version, metadata=metadata
        )

    def replace(
        self,
        df: DataFrame,
        path: Path,
        *,
        keep: Callable[[DataFrame], DataFrame],
        files: PartitionPredicate | None = None,
        app_id: str,
        version: int,
        metadata: Mapping[str, Any] | None = None,
    ) -> bool:
        if self._done(path, app_id, version):
            return False
        chosen = None if files is None else self._partitions(path, files)
        condition = "true" if chosen is None else _any_of(chosen)
        current = self.spark.read.format("delta").load(str(path)).where(condition)
        rewritten = keep(current).unionByName(df)
        (
            self._writer(rewritten.localCheckpoint(), app_id, version, metadata)
            .mode("overwrite")
            .option("replaceWhere", condition)
            .save(str(path))
        )
        return True

    def read(self, path: Path, *, files: PartitionPredicate | None = None) -> DataFrame:
        df = self.spark.read.format("delta").load(str(path))
        if files is None:
            return df
        chosen = self._partitions(path, files)
        return df if chosen is None else df.where(_any_of(chosen))

    def schema(self, path: Path) -> StructType:
        return self.spark.read.format("delta").load(str(path)).schema

    @staticmethod
    def _partitions(path: Path, files: PartitionPredicate) -> list[dict[str, Any]] | None:
        """The partitions whose typed values (date, int: what the predicates compare) ``files`` chooses;
        None for an unpartitioned table (the predicate cannot choose among its files)."""
        table = DeltaTable(str(path))
        if not table.metadata().partition_columns:
            return None
        distinct = {tuple(sorted(values.items())): values for _rel, values, _size in RsDeltaEngine._files(table, None)}
        return [values for _key, values in sorted(distinct.items(), key=lambda kv: repr(kv[0])) if files(values)]

    def read_stream(
        self, path: Path, *, max_files_per_trigger: int | None = None, min_event_time: datetime | None = None
    ) -> DataFrame:
        reader = self.spark.readStream.format("delta")
        if max_files_per_trigger:
            reader = reader.option("maxFilesPerTrigger", str(max_files_per_trigger))
        frame = reader.load(str(path))
        if min_event_time is not None:
            # A filter on the partition column lets Delta's streaming source skip whole partitions.
            frame = frame.filter(F.col("event_date") >= F.lit(min_event_time.date()))
        return frame

    def history_metadata(self, path: Path, limit: int = 1) -> list[dict[str, Any]]:
        return self._meta.history_metadata(path, limit)


def _literal(value: Any) -> str:
    text = str(value).replace("\\", "\\\\").replace("'", "\\'")
    return f"'{text}'"


def _any_of(partitions: Sequence[Mapping[str, Any]]) -> str:
    """A SQL predicate (for ``replaceWhere`` and reads) matching exactly these partitions; ``false`` for none."""
    if not partitions:
        return "false"
    return " OR ".join(
        "(" + " AND ".join(f"`{k}` IS NULL" if v is None else f"`{k}` = {_literal(v)}" for k, v in p.items()) + ")"
        for p in partitions
    )
