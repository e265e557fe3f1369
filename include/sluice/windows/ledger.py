"""ops/window_ledger: one row per (pipeline, window), from the moment the window closes.

``state`` is the window's data-quality lifecycle (SPEC 4): ``closed`` (written to gold by the watermark) ->
``validated`` | ``failed`` (data quality) -> ``reprocessed`` (a backfill or an automatic correction rewrote it
and its checks passed; ``failed`` if they did not). Late data is kept apart from it: ``late_waiting`` counts the
DLQ records that landed after the window closed and are not in gold yet, whatever the state, so a failed window
with late data waiting still reads ``failed``. The ledger is tiny (windows, not records), so it is read on the
driver with delta-rs and rewritten through the engine in one atomic commit per change.

Ledgers written before that split have rows in state ``amended`` (late data waiting), which hid the window's
data-quality outcome. :func:`read_ledger` reads such a row with the state its last validation left in
ops/dq_results (``failed`` if an expectation failed, otherwise ``reprocessed`` for a window a backfill rewrote
and ``validated`` for the others); the next write of the row stores it.

``gold_versions`` holds the Delta versions of each gold table before and after the last backfill or
correction of the window, as JSON (``{"gold/<output>": [before, after]}``): what ``sluice status --window``
time-travels to.
"""

from __future__ import annotations

import copy
import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from datetime import datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType

from sluice.config import Settings
from sluice.core.windows import Window
from sluice.storage.engine import (
    COMMIT_ATTEMPTS,
    CommitConflictError,
    RowsEngine,
    commit_backoff,
)
from sluice.storage.snapshots import open_table, read_small_table
from sluice.storage.tables import DQ_RESULTS, TableDef

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
            # Of the window's DLQ records, how many gold holds: those a backfill or correction with the late
            # data rebuilt it with (0 otherwise). The lateness check counts only the others (SPEC 5).
            StructField("late_in_gold", LongType(), True),
            # The Airflow task that closed the window, and the one that last validated it (JSON: dag_id,
            # run_id, task_id, try_number; null outside Airflow), for the ledger page's links.
            StructField("closed_by", StringType(), True),
            StructField("validated_by", StringType(), True),
            # The fingerprints of the output definitions that last wrote the window's gold, one per output
            # (JSON: {"<output>": "<fingerprint>"}; SPEC 9, sluice.streaming.definitions).
            StructField("definition", StringType(), True),
        ]
    ),
)

STATES = ("open", "closed", "validated", "failed", "reprocessed")
#: States of windows whose first validation is done: late records landing for them now are late data waiting.
#: (``closed`` windows await their first validation, whose lateness check counts the DLQ itself.)
SETTLED_STATES = ("validated", "failed", "reprocessed")
#: The state older ledgers gave a window with late data waiting, in place of its data-quality outcome.
LEGACY_AMENDED = "amended"


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
    late_in_gold: int = 0
    closed_by: str | None = None
    validated_by: str | None = None
    definition: str | None = None

    @property
    def key(self) -> tuple[str, datetime, datetime]:
        return (self.pipeline, self.window_start, self.window_end)

    @property
    def window(self) -> Window:
        return (self.window_start, self.window_end)


#: The Airflow task context a task runner exports (and spark-submit passes on to its driver).
_AIRFLOW_TASK = {"dag_id": "AIRFLOW_CTX_DAG_ID", "run_id": "AIRFLOW_CTX_DAG_RUN_ID", "task_id": "AIRFLOW_CTX_TASK_ID",
                 "try_number": "AIRFLOW_CTX_TRY_NUMBER"}


def airflow_task() -> str | None:
    """The Airflow task this process runs for, as the ledger's ``closed_by`` / ``validated_by`` hold it (JSON);
    None outside Airflow (the CLI)."""
    if not os.environ.get(_AIRFLOW_TASK["run_id"]):
        return None
    return json.dumps({key: os.environ.get(var) for key, var in _AIRFLOW_TASK.items()}, sort_keys=True)


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
    """Every row of ``pipeline`` (of every pipeline when None), sorted by window. Product code reads the ledger
    through a :class:`Ledger`; this is its one read of the table."""
    return _rows_of(settings, read_small_table(WINDOW_LEDGER.path(settings)), pipeline)


def _rows_of(settings: Settings, data: pa.Table | None, pipeline: str | None) -> list[LedgerRow]:
    if data is None:
        return []
    table = data.filter(pc.field("pipeline") == pipeline) if pipeline else data
    names = {f.name for f in fields(LedgerRow)}
    # Columns added by later versions read as null in older rows: their defaults.
    counters = ("late_waiting", "attempt", "late_in_gold")
    rows = []
    for r in pa.Table.to_pylist(table):
        values: dict[str, Any] = {k: (0 if v is None and k in counters else v) for k, v in r.items() if k in names}
        rows.append(LedgerRow(**values))
    if any(r.state == LEGACY_AMENDED for r in rows):
        _migrate_amended(settings, rows)
    return sorted(rows, key=lambda r: r.key)


def _migrate_amended(settings: Settings, rows: Sequence[LedgerRow]) -> None:
    """Rows of an older ledger in state ``amended`` get back the data-quality outcome it replaced (see the
    module docstring); their ``late_waiting`` already counts the late data."""
    failed = _failed_windows(settings)
    for row in rows:
        if row.state == LEGACY_AMENDED:
            row.state = "failed" if row.key in failed else "reprocessed" if row.gold_versions else "validated"


def _failed_windows(settings: Settings) -> set[tuple[str, datetime, datetime]]:
    """(pipeline, start, end) of every window whose last validation failed an expectation (ops/dq_results
    keeps each window's last validation only)."""
    data = read_small_table(DQ_RESULTS.path(settings), ["pipeline", "window_start", "window_end", "success"])
    if data is None:
        return set()
    return {(r["pipeline"], r["window_start"], r["window_end"]) for r in data.to_pylist() if r["success"] is False}


# A ledger detail is the window's data-quality findings (failed expectations), then what is to be done about
# its late data waiting (sluice.windows.late.waiting_detail), which always comes last and starts
# with its count.
_WAITING = re.compile(r"(?:^|; )(\d+ late record\(s\) (?:landed after the window closed|still not in gold).*)$", re.S)
NOT_INCLUDED = "(the backfill ran without --include-late)"


def split_detail(detail: str | None) -> tuple[str | None, str | None]:
    """A ledger ``detail`` as (the data-quality findings, the late-data text), each None when absent."""
    if not detail:
        return None, None
    found = _WAITING.search(detail)
    if found is None:
        return detail, None
    return detail[: found.start()] or None, found.group(1)


def join_detail(findings: str | None, waiting: str | None) -> str | None:
    """The ledger ``detail`` of a window: its data-quality findings, then the late-data text."""
    return "; ".join(part for part in (findings, waiting) if part) or None


def gold_changes(before: Sequence[LedgerRow], after: Sequence[LedgerRow]) -> list[LedgerRow]:
    """The rows of ``after`` whose gold a run wrote, from two reads of one pipeline's ledger around it: the
    windows it closed (new rows) and those it rewrote (backfills and corrections record new gold versions).
    A window only validated again is not among them: its gold did not change."""
    earlier = {r.window: r for r in before}
    return [r for r in after if (old := earlier.get(r.window)) is None
            or (old.rows, old.gold_versions, old.closed_at) != (r.rows, r.gold_versions, r.closed_at)]


def replace_windows(
    engine: RowsEngine,
    path: str,
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


def next_version(engine: RowsEngine, path: str, app_id: str) -> int:
    """For writers that are not replays of a numbered batch (DQ, backfills): the next app version.

    Racy on its own: two processes sharing ``app_id`` can both get N, and the engine then treats the
    second one's write as a replay of the first and skips it. :func:`write_ledger` (without ``version``)
    takes the next version again in that case."""
    done = engine.committed_version(path, app_id)
    return 0 if done is None else done + 1


def write_ledger(
    settings: Settings,
    engine: RowsEngine,
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


class Ledger:
    """The windows of one pipeline (of every pipeline when ``pipeline`` is None) as ``ops/window_ledger`` holds
    them: the one reader and writer of the table.

    Opened once per cycle or command (the run context holds it) and passed down. It reads the table again only
    when the table has a new Delta version (one look at the log), so the steps of a cycle share one read, and a
    write by anyone, this process or another, is seen by the next look. Rows are handed out as copies: a caller
    that changes a row changes the ledger only by writing it back.

    The transitions (SPEC 4: ``closed -> validated | failed -> reprocessed``; late data waiting beside the
    state) are its writes: :meth:`close` (the closing rule), :meth:`record_validation` (data quality),
    :meth:`reprocess` (backfills and corrections), :meth:`note_late` (the amendment scan) and :meth:`rebuild`
    (a change to the pipeline, SPEC 9)."""

    def __init__(self, settings: Settings, pipeline: str | None = None) -> None:
        self.settings = settings
        self.pipeline = pipeline
        self.path = WINDOW_LEDGER.path(settings)
        self._version: int | None = None
        self._rows: list[LedgerRow] = []

    # -- reading ---------------------------------------------------------------------------------------------
    @property
    def rows(self) -> list[LedgerRow]:
        """The rows, sorted by (pipeline, window): fresh copies of the table as it is now."""
        table = open_table(self.path)
        if table is None:
            return []
        if table.version() != self._version:
            self._rows = _rows_of(self.settings, read_small_table(self.path, table=table), self.pipeline)
            self._version = table.version()
        return [copy.copy(r) for r in self._rows]

    def by_window(self) -> dict[Window, LedgerRow]:
        return {r.window: r for r in self.rows}

    def in_state(self, *states: str) -> list[LedgerRow]:
        return [r for r in self.rows if r.state in states]

    def windows(self, *states: str) -> list[Window]:
        """The windows in ``states`` (every window when none is given), oldest first."""
        return sorted(r.window for r in self.rows if not states or r.state in states)

    def pending(self) -> list[Window]:
        """Windows closed but not validated yet."""
        return self.windows("closed")

    def settled(self) -> list[LedgerRow]:
        """Rows whose first validation is done: late records landing for them now are late data waiting."""
        return self.in_state(*SETTLED_STATES)

    def waiting(self) -> list[LedgerRow]:
        """Windows with late records not in gold yet, oldest first."""
        return sorted((r for r in self.settled() if r.late_waiting > 0), key=lambda r: r.window)

    # -- the transitions -----------------------------------------------------------------------------------
    def close(self, engine: RowsEngine, rows: Iterable[LedgerRow], *, app_id: str, version: int) -> bool:
        """Windows the closing rule wrote to gold: new rows in state ``closed``, and rows another output of the
        pipeline created, whatever their state, with this output's rows added (a replayed batch commits nothing)."""
        return self._write(engine, rows, STATES, app_id=app_id, version=version)

    def record_validation(self, engine: RowsEngine, rows: Iterable[LedgerRow], *, app_id: str) -> bool:
        """A data-quality round's outcome: ``validated``, ``failed`` or ``reprocessed``."""
        return self._write(engine, rows, SETTLED_STATES, app_id=app_id)

    def reprocess(self, engine: RowsEngine, rows: Iterable[LedgerRow], *, app_id: str,
                  version: int | None = None) -> bool:
        """Windows a backfill or a correction rewrote (their gold versions and late counts), before and after
        their re-validation."""
        return self._write(engine, rows, STATES, app_id=app_id, version=version)

    def note_late(self, engine: RowsEngine, rows: Iterable[LedgerRow], *, app_id: str,
                  version: int | None = None) -> bool:
        """Late data waiting: settled windows whose ``late_waiting`` and ``detail`` changed; the state stays."""
        return self._write(engine, rows, SETTLED_STATES, app_id=app_id, version=version)

    def rebuild(self, engine: RowsEngine, rows: Iterable[LedgerRow], dropped: Iterable[Window], *, app_id: str,
                version: int) -> bool:
        """A change to the pipeline rebuilt its closed windows (SPEC 9): ``rows`` are the windows gold now holds,
        awaiting their re-validation (``closed``), and the ``dropped`` windows leave the ledger (those of an
        earlier window spec), in one commit. ``ops/dq_results`` and ``ops/alerts`` keep their history."""
        rows = list(rows)
        wrong = [r for r in rows if r.state != "closed"]
        if wrong:
            raise ValueError(f"{app_id}: a rebuilt window awaits its validation, not {wrong[0].state!r}")
        name = self.pipeline or (rows[0].pipeline if rows else "")
        keys = {r.key for r in rows} | {(name, start, end) for start, end in dropped}
        path = WINDOW_LEDGER.path(self.settings)
        engine.ensure_table(path, WINDOW_LEDGER.schema)
        return replace_windows(engine, path, [tuple(asdict(r).values()) for r in rows], WINDOW_LEDGER.schema, keys,
                               app_id=app_id, version=version)

    def _write(self, engine: RowsEngine, rows: Iterable[LedgerRow], states: Sequence[str], *, app_id: str,
               version: int | None = None) -> bool:
        rows = list(rows)
        wrong = [r for r in rows if r.state not in states]
        if wrong:
            raise ValueError(f"{app_id}: ledger rows in state {wrong[0].state!r} for "
                             f"{wrong[0].window_start.isoformat()}: this transition writes {', '.join(states)}")
        return write_ledger(self.settings, engine, rows, app_id=app_id, version=version)
