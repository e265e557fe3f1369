"""ops/window_ledger: one row per (pipeline, window), from the moment the window closes.

States: ``closed`` (written to gold by the watermark) -> ``validated`` | ``failed`` (data quality) ->
``amended`` (late records landed after it closed; ``late_waiting`` counts them) -> ``reprocessed`` (a
backfill or an automatic correction rewrote it). The ledger is tiny (windows, not records), so it is read on the
driver with delta-rs and rewritten through the engine in one atomic commit per change.

``gold_versions`` holds the Delta versions of each gold table before and after the last backfill or
correction of the window, as JSON (``{"gold/<output>": [before, after]}``): what ``sluice status --window``
time-travels to.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType

from sluice.config import Settings
from sluice.storage.engine import (
    COMMIT_ATTEMPTS,
    CommitConflictError,
    DeltaEngine,
    commit_backoff,
    read_small_table,
)
from sluice.storage.tables import TableDef

WINDOW_LEDGER = TableDef(
    "ops/window_ledger",
    StructType(
        [
            StructField("pipeline", StringType(), True),
            StructField("window_start", TimestampType(), True),
            StructField("window_end", TimestampType(), True),
            StructField("state", StringType(), True),
            StructField("closed_by_watermark", TimestampType(), True),
            StructField("rows", LongType(), True),
            StructField("late_rows", LongType(), True),
            StructField("closed_at", TimestampType(), True),
            StructField("updated_at", TimestampType(), True),
            StructField("detail", StringType(), True),
            # Late records (DLQ) that landed after the window closed and are not in gold yet.
            StructField("late_waiting", LongType(), True),
            # Validation rounds completed (first check, then one per backfill or correction): the
            # ``attempt`` of the window's alerts in ops/alerts.
            StructField("attempt", LongType(), True),
            # The last correction or backfill: {"gold/<output>": [version before, version after], ...}, for
            # Delta time travel (``sluice status --window``).
            StructField("gold_versions", StringType(), True),
        ]
    ),
)

STATES = ("open", "closed", "validated", "failed", "amended", "reprocessed")
#: States of windows whose first validation is done: late records landing for them now are amendments.
#: (``closed`` windows await their first validation, whose lateness check counts the DLQ itself.)
SETTLED_STATES = ("validated", "failed", "amended", "reprocessed")

Window = tuple[datetime, datetime]


@dataclass
class LedgerRow:
    pipeline: str
    window_start: datetime
    window_end: datetime
    state: str
    closed_by_watermark: datetime | None
    rows: int
    late_rows: int
    closed_at: datetime | None
    updated_at: datetime | None
    detail: str | None = None
    late_waiting: int = 0
    attempt: int = 0
    gold_versions: str | None = None

    @property
    def key(self) -> tuple[str, datetime, datetime]:
        return (self.pipeline, self.window_start, self.window_end)

    @property
    def window(self) -> Window:
        return (self.window_start, self.window_end)


def format_gold_versions(versions: Mapping[str, tuple[int, int]]) -> str | None:
    """The ``gold_versions`` column: ``{"gold/<output>": [before, after], ...}``, keys sorted."""
    if not versions:
        return None
    return json.dumps({table: [int(v[0]), int(v[1])] for table, v in sorted(versions.items())}, sort_keys=True)


def parse_gold_versions(text: str | None) -> dict[str, tuple[int, int]]:
    """The ``gold_versions`` column back as ``{table: (before, after)}`` (empty when null)."""
    if not text:
        return {}
    return {table: (int(pair[0]), int(pair[1])) for table, pair in json.loads(text).items()}


def read_ledger(settings: Settings, pipeline: str | None = None) -> list[LedgerRow]:
    data = read_small_table(WINDOW_LEDGER.path(settings))
    if data is None:
        return []
    table = data.filter(pc.field("pipeline") == pipeline) if pipeline else data
    names = {f.name for f in fields(LedgerRow)}
    # Columns added by later versions read as null in older rows: their defaults.
    counters = ("late_waiting", "attempt")
    rows = []
    for r in pa.Table.to_pylist(table):
        values: dict[str, Any] = {k: (0 if v is None and k in counters else v) for k, v in r.items() if k in names}
        rows.append(LedgerRow(**values))
    return sorted(rows, key=lambda r: r.key)


def pending_windows(settings: Settings, pipeline: str) -> list[tuple[datetime, datetime]]:
    """Windows of ``pipeline`` closed but not validated yet: one read of the ledger (delta-rs, no Spark)."""
    return [(r.window_start, r.window_end) for r in read_ledger(settings, pipeline) if r.state == "closed"]


def replace_windows(
    engine: DeltaEngine,
    path: Path,
    rows: Sequence[Sequence[Any]],
    schema: StructType,
    keys: Iterable[tuple[str, datetime, datetime]],
    *,
    order_by: Sequence[str] = ("pipeline", "window_start", "window_end"),
    app_id: str,
    version: int,
) -> bool:
    """Replace every row of the given (pipeline, window_start, window_end) keys with ``rows``, in one
    atomic commit. Used for the ledger and the DQ results: both are keyed by window and small (one or a
    few rows per window), so they are rewritten on the driver without a Spark job."""
    victims = set(keys)

    def drop(row: Mapping[str, Any]) -> bool:
        return (row["pipeline"], row["window_start"], row["window_end"]) in victims

    return engine.replace_rows(rows, schema, path, drop=drop, order_by=order_by, app_id=app_id, version=version)


def next_version(engine: DeltaEngine, path: Path, app_id: str) -> int:
    """For writers that are not replays of a numbered batch (DQ, backfills): the next app version.

    Racy on its own: two processes sharing ``app_id`` can both get N, and the engine then treats the
    second one's write as a replay of the first and skips it. :func:`write_ledger` (without ``version``)
    takes the next version again in that case."""
    done = engine.committed_version(path, app_id)
    return 0 if done is None else done + 1


def write_ledger(
    settings: Settings,
    engine: DeltaEngine,
    rows: Iterable[LedgerRow],
    *,
    app_id: str,
    version: int | None = None,
) -> bool:
    """Upsert ledger rows (by pipeline and window) in one atomic commit, idempotent per (app_id, version).

    Without ``version`` the write is an upsert under the next free version of ``app_id``: never skipped as
    a replay, so it returns True once committed."""
    rows = list(rows)
    if not rows:
        return False
    path = WINDOW_LEDGER.path(settings)
    engine.ensure_table(path, WINDOW_LEDGER.schema)

    def write(at: int) -> bool:
        return replace_windows(
            engine, path, [tuple(asdict(r).values()) for r in rows], WINDOW_LEDGER.schema, [r.key for r in rows],
            app_id=app_id, version=at,
        )

    if version is not None:
        return write(version)
    for failed in range(1, COMMIT_ATTEMPTS + 1):
        # False means another process sharing app_id committed the version we had just taken: our rows are
        # not in, so take the one after it. Rows are upserted by key, so of two writers of one window the
        # later commit wins, as it would without the race.
        if write(next_version(engine, path, app_id)):
            return True
        commit_backoff(failed)
    raise CommitConflictError(f"{path}: {app_id}: other writers took the next version {COMMIT_ATTEMPTS} times")
