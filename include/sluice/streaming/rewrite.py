"""Rewriting closed windows from bronze: the computation a backfill (:mod:`sluice.streaming.backfill`), a
correction (:mod:`sluice.streaming.corrections`) and a retry share.

A request is a range (every window starting in ``[start, end)``) or an explicit set of windows: the same
computation, the same one replace per gold table; a set reads bronze only around its windows. It recomputes the
windows with the very same transforms as the streaming path, replaces exactly them in gold in one atomic commit
per table (an app transaction, so a resumed run does not replace twice), records the gold versions before and
after in the ledger, and re-validates them. Only closed windows are rewritten: a window still open would
otherwise be emitted again by streaming. See :mod:`sluice.streaming.backfill` for what happens to the windows'
late records and the ledger's counts.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from sluice.alerting.outbox import AlertTally
from sluice.core.model import PipelineDef
from sluice.core.spark import local_frame
from sluice.core.windows import Window
from sluice.quality.checker import QualityChecker, QualityReport
from sluice.quality.gx_context import warm_up
from sluice.runtime.context import RunContext
from sluice.storage import snapshots
from sluice.storage.dlq import dlq_snapshot
from sluice.streaming.batch import batch_inputs, closing_boundary, ensure_output_table, gold_rows
from sluice.streaming.definitions import fingerprints, pipeline_definitions, record
from sluice.windows.late import waiting_detail
from sluice.windows.ledger import LedgerRow, format_gold_versions, join_detail, next_version, split_detail
from sluice.windows.plans import WINDOW_COLUMNS, Commits

log = logging.getLogger("sluice.backfill")


@dataclass
class BackfillRequest:
    pipeline: PipelineDef
    start: datetime
    end: datetime
    include_late: bool = False
    # An explicit set of windows (automatic corrections) instead of every window starting in [start, end);
    # start and end then span them (see windows_request).
    windows: tuple[Window, ...] | None = None


def windows_request(pipeline: PipelineDef, windows: Sequence[Window], include_late: bool = False) -> BackfillRequest:
    """A request for exactly ``windows`` (aware UTC bounds, at least one)."""
    chosen = tuple(sorted(set(windows)))
    if not chosen:
        raise ValueError("a backfill of an explicit set of windows needs at least one window")
    return BackfillRequest(pipeline, chosen[0][0], max(end for _start, end in chosen), include_late, chosen)


@dataclass(frozen=True)
class _Scope:
    """What a request covers: the input frames to build from (one per span of bronze), the computed rows it
    rewrites, and the gold rows a replace keeps."""

    inputs: list[dict[str, DataFrame]]
    pick: Callable[[DataFrame], DataFrame]
    keep: Callable[[DataFrame], DataFrame]
    closed: Column


@dataclass
class BackfillResult:
    request: BackfillRequest
    windows: list[Window] = field(default_factory=list)
    rows: dict[str, int] = field(default_factory=dict)
    skipped_open: list[Window] = field(default_factory=list)
    quality: QualityReport | None = None
    seconds: float = 0.0
    # gold table -> (Delta version before, after) its replace; also in the ledger's gold_versions.
    gold_versions: dict[str, tuple[int, int]] = field(default_factory=dict)
    # Windows rewritten whose late records are still not in gold (without include_late), and how many.
    late_waiting: dict[Window, int] = field(default_factory=dict)
    alerts: AlertTally = field(default_factory=AlertTally)

    @property
    def exit_code(self) -> int:
        return 2 if self.quality is not None and not self.quality.ok else 0

    def render(self) -> str:
        req = self.request
        lines = [
            f"sluice backfill {req.pipeline.name} [{req.start:%Y-%m-%d %H:%M}, {req.end:%Y-%m-%d %H:%M}) "
            f"include_late={req.include_late}: {len(self.windows)} window(s) rewritten in {self.seconds:.1f}s",
        ]
        for output, n in self.rows.items():
            lines.append(f"  {output}: {n} row(s)")
        if self.skipped_open:
            lines.append(f"  skipped {len(self.skipped_open)} window(s) that are still open (not yet closed by the "
                         "watermark); they will be written by the scheduled run")
        if self.late_waiting:
            lines.append(f"  {len(self.late_waiting)} window(s) still have {sum(self.late_waiting.values())} late "
                         "record(s) not in gold; rerun with --include-late to bring them in")
        if self.quality is not None:
            lines.append(f"  data quality: {len(self.quality.checked) - len(self.quality.failed)} passed, "
                         f"{len(self.quality.failed)} failed")
        lines += [f"  {line}" for line in self.alerts.render()]
        return "\n".join(lines)


class Backfill:
    def __init__(
        self,
        ctx: RunContext,
        request: BackfillRequest,
        deliver_alerts: bool = True,
        *,
        commits: Commits | None = None,
        late_rows: Mapping[Window, int] | None = None,
        rounds: Mapping[Window, int] | None = None,
    ):
        self.deliver_alerts = deliver_alerts
        self.ctx = ctx
        self._ctx = ctx
        self.settings = ctx.settings
        self.engine = ctx.engine
        self.ledger = ctx.ledger(request.pipeline.name)
        self.request = request
        self.commits = commits or Commits()
        # The DLQ counts the ledger keeps for the rewritten windows (default: the ledger's, at the start).
        self.late_rows = late_rows
        # The validation round of each window, as planned before the first commit (a window missing from it
        # was not in the ledger then: round 1). None: the ledger's attempt + 1 when validating.
        self.rounds = rounds

    @property
    def spark(self) -> SparkSession:
        """The run's Spark session, started when first needed (a cycle with nothing to do needs none)."""
        return self._ctx.spark

    def _margin(self) -> timedelta:
        # Everything that can reach a window: the window itself, plus the join bound both ways.
        pipeline = self.request.pipeline
        return pipeline.window.size + pipeline.lateness_bound + timedelta(hours=1)

    def _inputs(self, lo: datetime | None = None, hi: datetime | None = None) -> dict[str, DataFrame]:
        req = self.request
        margin = self._margin()
        lo = req.start if lo is None else lo
        hi = req.end if hi is None else hi
        return batch_inputs(self.settings, self.engine, req.pipeline, lo - margin, hi + margin,
                            include_late=req.include_late)

    def _scope(self, closable_until: datetime | None) -> _Scope:
        req = self.request
        final = F.col("window_end") <= F.lit(closable_until) if closable_until is not None else F.lit(False)
        if req.windows is None:
            in_range = (F.col("window_start") >= F.lit(req.start)) & (F.col("window_start") < F.lit(req.end))
            return _Scope([self._inputs()], lambda df: df.filter(in_range), lambda current: current.filter(~in_range),
                          in_range & final)
        requested = self._bounds(req.windows)
        rewritten = self._bounds([w for w in req.windows if closable_until is not None and w[1] <= closable_until])
        return _Scope(
            [self._inputs(lo, hi) for lo, hi in input_spans(req.windows, self._margin())],
            lambda df: df.join(F.broadcast(requested), WINDOW_COLUMNS, "left_semi"),
            lambda current: current.join(F.broadcast(rewritten), WINDOW_COLUMNS, "left_anti"),
            final,
        )

    def _bounds(self, windows: Sequence[Window]) -> DataFrame:
        return local_frame(self.spark, sorted(windows), "window_start timestamp, window_end timestamp")

    def run(self) -> BackfillResult:
        started = time.monotonic()
        warm_up()  # every backfill validates what it rewrites
        req = self.request
        pipeline = req.pipeline
        result = BackfillResult(req)
        # The DLQ counts to keep (see the module docstring); a window awaiting its first validation
        # (``closed``) takes its count from that validation, as the amendment scan assumes.
        late_rows = dict(self.late_rows) if self.late_rows is not None else {
            r.window: r.late_rows for r in self.ledger.settled()}
        # The DLQ as it is before the inputs read it: how many late records each window's gold is rebuilt with.
        snapshot = dlq_snapshot(self.settings, pipeline) if req.include_late else None
        # The closing rule of every path: a window is final once W >= end + lateness_bound.
        closable_until = closing_boundary(self.settings, pipeline)
        scope = self._scope(closable_until)
        windows: set[Window] = set()
        for output in pipeline.outputs:
            ensure_output_table(self.spark, self.settings, self.engine, pipeline, output)
            # One computation (gold-sized: windows x keys) feeds the open-window check, the counts and the commit.
            parts = [scope.pick(gold_rows(output, output.build(inputs, pipeline.window), pipeline.window))
                     for inputs in scope.inputs]
            computed = parts[0]
            for part in parts[1:]:
                computed = computed.unionByName(part)
            computed = computed.localCheckpoint()
            for r in computed.filter(~scope.closed).select("window_start", "window_end").distinct().collect():
                result.skipped_open.append((r[0].astimezone(UTC), r[1].astimezone(UTC)))
            rows = computed.filter(scope.closed).coalesce(1).sortWithinPartitions(
                "window_start", "window_end", *output.keys
            )
            counts = {
                (r[0].astimezone(UTC), r[1].astimezone(UTC)): int(r[2])
                for r in rows.groupBy("window_start", "window_end").count().collect()
            }
            windows.update(counts)
            result.rows[output.name] = sum(counts.values())
            result.gold_versions[output.table_name] = self._replace(output.path(self.settings), output.name, rows,
                                                                    scope.keep)
            log.info("backfill %s: %s rewritten: %d window(s), %d row(s), Delta version %d -> %d",
                     pipeline.name, output.table_name, len(counts), result.rows[output.name],
                     *result.gold_versions[output.table_name])
        if req.windows is None:
            result.windows = sorted(windows)
        else:
            # Every requested closed window is rewritten, even one whose recomputation has no rows left.
            result.windows = sorted(w for w in req.windows if closable_until is not None and w[1] <= closable_until)
            result.skipped_open.extend(w for w in req.windows if w not in result.windows)
        result.skipped_open = sorted(set(result.skipped_open) - set(result.windows))
        self._mark_ledger(result)
        rounds = None if self.rounds is None else {w: self.rounds.get(w, 1) for w in result.windows}
        in_gold = None
        if snapshot is not None:
            counted = snapshot.counts(result.windows)
            # The ledger's count is the one a resumed run can trust: the snapshot of a rerun after a crash may
            # hold records that landed after the first run read the DLQ.
            in_gold = {w: min(late_rows[w], counted.get(w, 0)) if w in late_rows else counted.get(w, 0)
                       for w in result.windows}
        # Without include_late gold was rebuilt from bronze alone: it holds none of the DLQ records.
        in_gold = in_gold if in_gold is not None else {}
        result.quality = QualityChecker(self.ctx, pipeline).check(
            result.windows, final_state="reprocessed", include_late=req.include_late, deliver=self.deliver_alerts,
            rounds=rounds, late_in_gold=in_gold,
        )
        self._settle_ledger(result, late_rows, in_gold)
        result.seconds = time.monotonic() - started
        return result

    def _replace(self, path: str, output: str, rows: DataFrame, keep: Callable[[DataFrame], DataFrame]
                 ) -> tuple[int, int]:
        """Replace the scope's windows of one gold table in one atomic commit; its Delta versions (before,
        after). The pipeline lock keeps other writers off gold, so the version before is the one under it."""
        req = self.request
        app = f"{self.commits.prefix}.{output}"
        version = self.commits.version
        if version is None:
            version = next_version(self.engine, path, app)
        # The app transaction in the metadata too: a resumed run finds the commit of its replace by it.
        meta: dict[str, object] = {"pipeline": req.pipeline.name, "include_late": req.include_late, "app": app,
                                   "app_version": version}
        if req.windows is None:
            meta.update(start=req.start, end=req.end)
        else:
            meta["windows"] = [[s.isoformat(), e.isoformat()] for s, e in req.windows]
        before = snapshots.version(path)
        if self.engine.replace(rows, path, keep=keep, app_id=app, version=version, metadata=meta):
            return (before, snapshots.version(path))
        # Committed by an earlier attempt of the same write (a backfill or correction resumed after a crash).
        committed = commit_version(path, app, version)
        return (committed - 1, committed) if committed is not None else (before, before)

    def _mark_ledger(self, result: BackfillResult) -> None:
        now = self.settings.now()
        name = self.request.pipeline.name
        existing = self.ledger.by_window()
        definitions = pipeline_definitions(self.spark, self.settings, self.request.pipeline)
        rows = []
        for window in result.windows:
            row = existing.get(window) or LedgerRow(name, window[0], window[1], "reprocessed", None, 0, 0, now, now)
            row.state = "reprocessed"
            row.updated_at = now
            row.definition = fingerprints(definitions)
            row.gold_versions = format_gold_versions(result.gold_versions)
            if self.request.include_late:
                row.late_waiting = 0  # gold now holds every late record the DLQ had
            rows.append(row)
        self.ledger.reprocess(self.engine, rows, app_id=self._ledger_app())
        record(self.ctx.state, name, definitions)

    def _ledger_app(self) -> str:
        return f"{self.commits.ledger_app}.{self.request.pipeline.name}"

    def _settle_ledger(self, result: BackfillResult, late_rows: Mapping[Window, int],
                       in_gold: Mapping[Window, int]) -> None:
        """After the validation: ``late_rows`` back to the count the backfill started from, ``late_in_gold``
        what gold now holds of the DLQ, and windows whose late records are still not in gold say so. One
        commit, only when something differs."""
        now = self.settings.now()
        pipeline = self.request.pipeline
        chosen = set(result.windows)
        changed = []
        for row in self.ledger.rows:
            if row.window not in chosen:
                continue
            before = (row.late_rows, row.detail, row.late_in_gold)
            row.late_rows = late_rows.get(row.window, row.late_rows)
            row.late_in_gold = in_gold.get(row.window, 0)
            if row.late_waiting > 0:
                result.late_waiting[row.window] = row.late_waiting
                findings = split_detail(row.detail)[0]
                row.detail = join_detail(findings, waiting_detail(pipeline, row, now, reprocessed=True))
            if (row.late_rows, row.detail, row.late_in_gold) != before:
                row.updated_at = now
                changed.append(row)
        if changed:
            self.ledger.reprocess(self.engine, changed, app_id=self._ledger_app())


def input_spans(windows: Sequence[Window], margin: timedelta) -> list[tuple[datetime, datetime]]:
    """The event-time ranges to read for ``windows``: each window widened by ``margin`` both ways (what can
    reach it), overlapping ranges merged, so scattered windows do not read the bronze hours between them and
    no hour is read twice."""
    spans: list[tuple[datetime, datetime]] = []
    for start, end in sorted(windows):
        if spans and start - margin <= spans[-1][1] + margin:
            spans[-1] = (spans[-1][0], max(spans[-1][1], end))
        else:
            spans.append((start, end))
    return spans


def commit_version(path: str, app_id: str, version: int, *, depth: int = 100) -> int | None:
    """The table version whose commit carries app transaction ``(app_id, version)``, from the commit metadata
    of the newest ``depth`` commits (written by :meth:`Backfill._replace`); None if not among them."""
    for table_version, meta in snapshots.commit_metadata(path, depth):
        if meta.get("app") == app_id and meta.get("app_version") == version:
            return table_version
    return None


