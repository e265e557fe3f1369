"""Corrections of closed windows: late records that land after a window closed (README "Operations").

**The amendment scan** runs in every cycle right after ingest, before new windows close. For each window of
the pipeline whose first validation is done (``validated``, ``failed``, ``reprocessed``) it counts the
window's DLQ records (``event_time`` in ``[start, end)``, over the pipeline's streams; a record of a hopping
pipeline counts in every window that holds it) and compares that with the ledger's ``late_rows``, the count
gold was last built or checked with. More records than that means late records are waiting: ``late_waiting``
grows by the difference, ``late_rows`` becomes the new count, and ``detail`` says what happens next, after
what the window's last validation found. The state is left alone: it is the window's data-quality outcome
(SPEC 4), and a failed window with late data waiting still reads ``failed``. (A ``closed`` window awaits its
first validation, whose lateness check counts the DLQ itself.)

* Cheap when nothing is new: a scan remembers how far it looked, as the sum of the pipeline's DLQ table
  versions (+1 each; that sum only grows), and the next one skips the count while the DLQ tables are still
  at or below it. A scan that amends windows commits that mark with them (app transaction
  ``sluice.amend.<pipeline>`` on the ledger); one that finds nothing keeps it in ``amend_scan.json`` in the
  pipeline's checkpoint folder instead: a cycle with nothing new commits nothing, to any table.
* Cheap when something is: no Spark job, and only the DLQ files added since the last scan are read (see
  :mod:`sluice.storage.dlq`), so a cycle's scan does not grow with the history.
* Crash-safe: the DLQ commit (ingest) and the amendment (ledger) are separate commits, but a rerun finds
  the DLQ versions above the recorded one and scans again; the scan compares counts with ``late_rows``,
  so scanning twice never counts a record twice.

**The policy** (``Pipeline(corrections=..., max_age=...)``, YAML ``pipelines.<name>``, env
``SLUICE_<PIPELINE>_CORRECTIONS``): ``manual`` only flags. ``auto`` re-computes the windows with late data
waiting after the cycle's aggregation, oldest first, at most ``max_corrections_per_run`` per cycle (the rest
wait for the next one), through the backfill path with ``include_late``: one atomic replace per gold table for all of
them, re-validation, the ledger ``reprocessed`` with ``late_waiting = 0`` and the gold tables' Delta
versions before and after in ``gold_versions``; then one correction notice (an alert of level info) per
window, with each output's totals before and after. Windows that ended more than ``max_age`` ago are only
flagged; their ``detail`` names the ``sluice backfill ... --include-late`` command.

A correction is planned in ``lake/_checkpoints/pipelines/<pipeline>/corrections.json`` before its first
commit (windows, app-transaction version, the DLQ counts and the gold totals it starts from, each window's
validation round) and advanced ``planned -> recorded -> done``. A crash anywhere resumes that plan: the
replaces already committed are not redone (their app transactions), the re-validation is the planned round
even when the ledger recorded it before the crash (so a failing window's alert and the notice keep their
ids, and ``attempt`` its value), and the notices carry the numbers of the first attempt.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import NumericType, StructType

from sluice.config import Settings
from sluice.core.model import OutputDef, PipelineDef
from sluice.core.spark import collected_utc, local_frame
from sluice.core.timeutil import format_duration
from sluice.quality.checker import QualityReport
from sluice.storage import snapshots
from sluice.storage.dlq import dlq_counts, dlq_paths
from sluice.storage.engine import DeltaEngine
from sluice.storage.ledger import (
    NOT_INCLUDED,
    SETTLED_STATES,
    WINDOW_LEDGER,
    LedgerRow,
    join_detail,
    next_version,
    read_ledger,
    split_detail,
    write_ledger,
)
from sluice.storage.state import lake_state
from sluice.streaming.backfill import WINDOW_COLUMNS, Backfill, Commits, window_key, window_of, windows_request

log = logging.getLogger("sluice.corrections")

Window = tuple[datetime, datetime]
Number = int | float | None
# table -> window -> measure ("rows" or a metric column) -> value
Totals = dict[str, dict[Window, dict[str, Number]]]

AMEND_APP = "sluice.amend"
CORRECT_APP = "sluice.correct"
CORRECT_LEDGER_APP = "sluice.ledger.correct"
ROWS = "rows"  # the measure that counts a window's gold rows


# -- the amendment scan ------------------------------------------------------------------------------------
def dlq_mark(paths: Mapping[str, str]) -> int:
    """Sum over the DLQ tables of (Delta version + 1), 0 for one not created yet: grows with every DLQ commit,
    so it orders scans without keeping one version per stream."""
    return sum(snapshots.version(p) + 1 for p in paths.values())


def scan_amendments(settings: Settings, engine: DeltaEngine, pipeline: PipelineDef) -> list[Window]:
    """Flag closed windows that late records landed for since they were last built or checked (see the
    module docstring); returns the windows amended by this scan."""
    ledger_path = WINDOW_LEDGER.path(settings)
    if not snapshots.exists(ledger_path):
        return []  # no window has closed yet: closing counts the DLQ itself
    paths = dlq_paths(settings, pipeline)
    # The versions first, then the data: the count sees at least what the mark claims.
    mark = dlq_mark(paths)
    app = f"{AMEND_APP}.{pipeline.name}"
    if mark == 0 or scanned_mark(settings, engine, pipeline) >= mark:
        log.debug("%s: no DLQ commit since the last amendment scan", pipeline.name)
        return []
    settled = [r for r in read_ledger(settings, pipeline.name) if r.state in SETTLED_STATES]
    counts = dlq_counts(settings, pipeline, [r.window for r in settled]) if settled else {}
    amended = amend(pipeline, settled, counts, settings.now())
    if amended:
        write_ledger(settings, engine, amended, app_id=app, version=mark)
        log.info("%s: %d closed window(s) amended: %d late record(s) waiting", pipeline.name, len(amended),
                 sum(r.late_waiting for r in amended))
    else:
        save_scan_mark(settings, pipeline, mark)
    return [r.window for r in amended]


def scan_mark_path(pipeline: PipelineDef) -> tuple[str, ...]:
    """The scan's mark among the lake's state objects (:mod:`sluice.storage.state`)."""
    return ("pipelines", pipeline.name, "amend_scan.json")


def scanned_mark(settings: Settings, engine: DeltaEngine, pipeline: PipelineDef) -> int:
    """How far the last scan looked (a :func:`dlq_mark`, -1 if none did): the ledger's app transaction of the
    last scan that amended windows, or the file of one that found nothing, whichever is further."""
    committed = engine.committed_version(WINDOW_LEDGER.path(settings), f"{AMEND_APP}.{pipeline.name}")
    saved = lake_state(settings).read(*scan_mark_path(pipeline))
    # A lost or unreadable mark only costs one scan more: it counts, it never skips.
    try:
        kept = int(json.loads(saved)["dlq_mark"]) if saved is not None else -1
    except (ValueError, KeyError, TypeError):
        kept = -1
    return max(-1 if committed is None else committed, kept)


def save_scan_mark(settings: Settings, pipeline: PipelineDef, mark: int) -> None:
    """Remember that a scan up to ``mark`` found nothing to amend. Not a ledger commit: a cycle with no new
    input would otherwise write a ledger version with the same rows (and this is only a shortcut: the count
    is exact either way, so losing the file to a crash costs one more count, never a record)."""
    lake_state(settings).write(json.dumps({"dlq_mark": mark}), *scan_mark_path(pipeline))


def amend(pipeline: PipelineDef, rows: Sequence[LedgerRow], counts: Mapping[Window, int], now: datetime
          ) -> list[LedgerRow]:
    """The ledger rows whose DLQ count grew past ``late_rows``, updated: more ``late_waiting``, and a
    ``detail`` that says so after the validation's findings. The state (the data-quality outcome) stays."""
    amended = []
    for row in rows:
        current = counts.get(row.window, 0)
        if current <= row.late_rows:
            continue
        row.late_waiting += current - row.late_rows
        row.late_rows = current
        row.updated_at = now
        row.detail = join_detail(split_detail(row.detail)[0], waiting_detail(pipeline, row, now))
        amended.append(row)
    return amended


def backfill_command(pipeline: PipelineDef, window: Window) -> str:
    """The ``sluice backfill`` command that rewrites exactly ``window`` with its late records (the range ends
    one slide after its start: exactly one window starts in it, and both bounds are on the grid)."""
    start = window[0]
    end = start + pipeline.window.slide
    return f"sluice backfill {pipeline.name} --start {_rfc3339(start)} --end {_rfc3339(end)} --include-late"


def too_old(pipeline: PipelineDef, window: Window, now: datetime) -> bool:
    """Whether ``window`` ended more than ``correction_max_age`` before ``now`` (then it is only flagged)."""
    return window[1] < now - pipeline.correction_max_age


def waiting_detail(pipeline: PipelineDef, row: LedgerRow, now: datetime, *, reprocessed: bool = False) -> str:
    """The ledger ``detail`` of a window with late records not in gold: how many, and what happens next."""
    n = row.late_waiting
    head = (f"{n} late record(s) still not in gold {NOT_INCLUDED}" if reprocessed
            else f"{n} late record(s) landed after the window closed and are not in gold yet")
    command = backfill_command(pipeline, row.window)
    if pipeline.corrections != "auto":
        return f"{head}; corrections are manual: `{command}` brings them in"
    if too_old(pipeline, row.window, now):
        return (f"{head}; the window ended more than max_age ({format_duration(pipeline.correction_max_age)}) ago, so "
                f"it is not corrected automatically: `{command}` brings them in")
    return (f"{head}; corrections are auto: a cycle re-computes the window with them (oldest first, at most "
            f"{pipeline.max_corrections_per_run} per cycle)")


# -- corrections -------------------------------------------------------------------------------------------
@dataclass
class CorrectionPlan:
    """One cycle's correction, written before its first commit (see the module docstring)."""

    version: int  # app-transaction version of its gold replaces
    windows: list[Window]
    late_rows: dict[Window, int]  # the DLQ counts gold is rebuilt with (at least)
    before: Totals
    stage: str = "planned"  # planned -> recorded -> done
    after: Totals = field(default_factory=dict)
    gold_versions: dict[str, tuple[int, int]] = field(default_factory=dict)
    # Each window's validation round, fixed in the plan (the ledger's attempt + 1): the re-validation of a
    # resumed correction keeps it, so its alerts and notice keep their ids. Plans of older versions have none.
    attempts: dict[Window, int] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps({
            "version": self.version,
            "stage": self.stage,
            "windows": [window_key(w) for w in self.windows],
            "late_rows": {window_key(w): n for w, n in self.late_rows.items()},
            "before": _totals_json(self.before),
            "after": _totals_json(self.after),
            "gold_versions": {t: list(v) for t, v in self.gold_versions.items()},
            "attempts": {window_key(w): n for w, n in self.attempts.items()},
        }, indent=1)  # not sort_keys: the measures keep their table order

    @classmethod
    def from_json(cls, text: str) -> CorrectionPlan:
        raw = json.loads(text)
        return cls(
            version=int(raw["version"]),
            windows=[window_of(k) for k in raw["windows"]],
            late_rows={window_of(k): int(n) for k, n in raw["late_rows"].items()},
            before=_totals_of(raw["before"]),
            stage=str(raw["stage"]),
            after=_totals_of(raw["after"]),
            gold_versions={t: (int(v[0]), int(v[1])) for t, v in raw["gold_versions"].items()},
            attempts={window_of(k): int(n) for k, n in raw["attempts"].items()},
        )


@dataclass
class CorrectionReport:
    """What the corrections step of a cycle did."""

    pipeline: str
    policy: str
    max_per_run: int
    corrected: list[Window] = field(default_factory=list)
    deferred: list[Window] = field(default_factory=list)  # due, beyond max_corrections_per_run: next cycle
    too_old: list[Window] = field(default_factory=list)  # older than max_age: flagged only
    gold_versions: dict[str, tuple[int, int]] = field(default_factory=dict)
    quality: QualityReport | None = None
    notices: int = 0
    seconds: float = 0.0

    def render(self) -> list[str]:
        lines = []
        if self.corrected:
            versions = ", ".join(f"{t} v{b}->v{a}" for t, (b, a) in sorted(self.gold_versions.items()))
            lines.append(f"corrected {len(self.corrected)} window(s) with their late records "
                         f"({_windows(self.corrected)}); {versions}; {self.notices} notice(s)")
            if self.quality is not None and self.quality.failed:
                lines.append(f"  {len(self.quality.failed)} corrected window(s) failed their checks")
        if self.deferred:
            lines.append(f"{len(self.deferred)} window(s) with late data waiting left for the next cycle (at most "
                         f"{self.max_per_run} per cycle): {_windows(self.deferred)}")
        if self.too_old:
            lines.append(f"{len(self.too_old)} window(s) with late data waiting older than max_age, flagged only "
                         f"(see `sluice status` and the ledger's detail): {_windows(self.too_old)}")
        return lines


def plan_path(pipeline: PipelineDef) -> tuple[str, ...]:
    """The corrections plan among the lake's state objects (:mod:`sluice.storage.state`)."""
    return ("pipelines", pipeline.name, "corrections.json")


def load_plan(settings: Settings, pipeline: PipelineDef) -> CorrectionPlan | None:
    saved = lake_state(settings).read(*plan_path(pipeline))
    return CorrectionPlan.from_json(saved) if saved is not None else None


def save_plan(settings: Settings, pipeline: PipelineDef, plan: CorrectionPlan) -> None:
    lake_state(settings).write(plan.to_json(), *plan_path(pipeline))


def waiting(rows: Sequence[LedgerRow]) -> list[LedgerRow]:
    """Windows with late records not in gold yet, oldest first."""
    return sorted((r for r in rows if r.late_waiting > 0 and r.state in SETTLED_STATES), key=lambda r: r.window)


def run_corrections(
    spark: SparkSession, settings: Settings, engine: DeltaEngine, pipeline: PipelineDef, *, deliver_alerts: bool
) -> CorrectionReport:
    """The corrections step of a cycle (under the pipeline lock, after the aggregation): finish a plan a
    crash interrupted, or, under ``corrections: auto``, correct the oldest windows with late data waiting that are
    due."""
    started = time.monotonic()
    report = CorrectionReport(pipeline.name, pipeline.corrections, pipeline.max_corrections_per_run)
    plan = load_plan(settings, pipeline)
    if plan is not None and plan.stage != "done":
        log.info("%s: resuming the correction of %d window(s) (stage %s)", pipeline.name, len(plan.windows),
                 plan.stage)
    elif pipeline.corrections == "auto":
        plan = new_plan(spark, settings, engine, pipeline)
    else:
        plan = None
    if plan is not None:
        _carry_out(spark, settings, engine, pipeline, plan, report, deliver_alerts)
    now = settings.now()
    rows = read_ledger(settings, pipeline.name)
    refresh_details(settings, engine, pipeline, rows, now)
    if pipeline.corrections == "auto":
        for row in waiting(rows):
            (report.too_old if too_old(pipeline, row.window, now) else report.deferred).append(row.window)
    report.seconds = time.monotonic() - started
    return report


def new_plan(spark: SparkSession, settings: Settings, engine: DeltaEngine, pipeline: PipelineDef
             ) -> CorrectionPlan | None:
    """The windows to correct now: late data waiting, not older than max_age, oldest first, at most N; None if
    none."""
    now = settings.now()
    due = [r for r in waiting(read_ledger(settings, pipeline.name)) if not too_old(pipeline, r.window, now)]
    chosen = due[: pipeline.max_corrections_per_run]
    if not chosen:
        return None
    windows = [r.window for r in chosen]
    # One version for every gold table, above whatever any of them has seen (as the batch catch-up does).
    version = max(next_version(engine, o.path(settings), f"{CORRECT_APP}.{o.name}") for o in pipeline.outputs)
    plan = CorrectionPlan(version, windows, {r.window: r.late_rows for r in chosen},
                          window_totals(spark, settings, engine, pipeline, windows),
                          attempts={r.window: r.attempt + 1 for r in chosen})
    save_plan(settings, pipeline, plan)
    log.info("%s: correcting %d window(s) with their late records (%d more due)", pipeline.name,
             len(windows), len(due) - len(windows))
    return plan


def _carry_out(spark: SparkSession, settings: Settings, engine: DeltaEngine, pipeline: PipelineDef,
               plan: CorrectionPlan, report: CorrectionReport, deliver_alerts: bool) -> None:
    if plan.stage == "planned":
        request = windows_request(pipeline, plan.windows, include_late=True)
        commits = Commits(CORRECT_APP, CORRECT_LEDGER_APP, plan.version)
        result = Backfill(spark, settings, engine, request, deliver_alerts, commits=commits,
                          late_rows=plan.late_rows, rounds=plan.attempts or None).run()
        report.quality = result.quality
        plan.gold_versions = result.gold_versions
        plan.after = window_totals(spark, settings, engine, pipeline, plan.windows)
        if not plan.attempts:  # a plan of an older version: the rounds its validation took
            ledger = {r.window: r for r in read_ledger(settings, pipeline.name)}
            plan.attempts = {w: ledger[w].attempt for w in plan.windows if w in ledger}
        plan.stage = "recorded"
        save_plan(settings, pipeline, plan)
    if plan.stage == "recorded":
        report.notices = raise_notices(settings, pipeline, plan, deliver=deliver_alerts)
        plan.stage = "done"
        save_plan(settings, pipeline, plan)
    report.corrected = list(plan.windows)
    report.gold_versions = dict(plan.gold_versions)


def refresh_details(settings: Settings, engine: DeltaEngine, pipeline: PipelineDef, rows: Sequence[LedgerRow],
                    now: datetime) -> None:
    """Windows with late data waiting whose ``detail`` no longer says what happens next (the window aged past
    max_age, or the policy changed) get the current text, after their data-quality findings; one commit, only
    when one differs."""
    stale = []
    for row in rows:
        if row.state in SETTLED_STATES and row.late_waiting > 0:
            findings, waiting_text = split_detail(row.detail)
            reprocessed = waiting_text is not None and NOT_INCLUDED in waiting_text
            text = join_detail(findings, waiting_detail(pipeline, row, now, reprocessed=reprocessed))
            if row.detail != text:
                row.detail = text
                row.updated_at = now
                stale.append(row)
    if stale:
        write_ledger(settings, engine, stale, app_id=f"sluice.ledger.amend.{pipeline.name}")


# -- totals and notices ------------------------------------------------------------------------------------
def metric_columns(output: OutputDef, schema: StructType) -> list[str]:
    """The numeric metric columns of a gold table (keys and window bounds excluded), in table order."""
    return [f.name for f in schema.fields
            if f.name not in (*WINDOW_COLUMNS, *output.keys) and isinstance(f.dataType, NumericType)]


def count_measure(metrics: Sequence[str]) -> str:
    """The name of a window's row count among its measures: ``rows``, unless a metric is called that."""
    return ROWS if ROWS not in metrics else "gold_rows"


def output_totals(gold: DataFrame, output: OutputDef, windows: Sequence[Window], bounds: DataFrame
                  ) -> dict[Window, dict[str, Number]]:
    """Per window: its gold rows, then the sum of each numeric metric in table order (a small Spark aggregate:
    gold holds one row per window and key). A window with no rows has a count of 0 and null sums."""
    metrics = metric_columns(output, gold.schema)
    count = count_measure(metrics)
    aggs = [F.count(F.lit(1)).alias("_rows"), *[F.sum(c).alias(f"_m{i}") for i, c in enumerate(metrics)]]
    found = gold.join(F.broadcast(bounds), WINDOW_COLUMNS, "left_semi").groupBy(*WINDOW_COLUMNS).agg(*aggs)
    out: dict[Window, dict[str, Number]] = {}
    for r in found.collect():
        measures: dict[str, Number] = {count: int(r["_rows"])}
        measures.update({c: _plain(r[f"_m{i}"]) for i, c in enumerate(metrics)})
        out[(collected_utc(r["window_start"]), collected_utc(r["window_end"]))] = measures
    return {w: out.get(w) or {count: 0, **dict.fromkeys(metrics)} for w in windows}


def window_totals(spark: SparkSession, settings: Settings, engine: DeltaEngine, pipeline: PipelineDef,
                  windows: Sequence[Window]) -> Totals:
    """Per gold table of the pipeline: :func:`output_totals` of ``windows`` as gold holds them now."""
    chosen = sorted(windows)
    bounds = local_frame(spark, chosen, "window_start timestamp, window_end timestamp")
    out: Totals = {}
    for output in pipeline.outputs:
        path = output.path(settings)
        if snapshots.exists(path):
            out[output.table_name] = output_totals(engine.read(path), output, chosen, bounds)
    return out


def notice_lines(plan: CorrectionPlan, window: Window) -> list[dict[str, str]]:
    """The notice's "failed" entries: every measure of every gold table (in pipeline and table order),
    ``<before> -> <after>``."""
    lines = []
    for table in [*plan.before, *(t for t in plan.after if t not in plan.before)]:
        before = plan.before.get(table, {}).get(window, {})
        after = plan.after.get(table, {}).get(window, {})
        for measure in [*before, *(m for m in after if m not in before)]:
            lines.append({"expectation": f"{table}.{measure}",
                          "observed_value": f"{_fmt(before.get(measure))} -> {_fmt(after.get(measure))}"})
    return lines


def raise_notices(settings: Settings, pipeline: PipelineDef, plan: CorrectionPlan, *, deliver: bool) -> int:
    """One correction notice (level info) per corrected window; idempotent per (window, attempt)."""
    if not plan.windows:
        return 0
    from sluice.alerting.alert import CORRECTION, Alert
    from sluice.alerting.outbox import raise_alert

    now = settings.now()
    for window in plan.windows:
        # No Data Docs page to point at (the fifth field): the notice carries its numbers itself.
        alert = Alert(pipeline.name, window[0], window[1], notice_lines(plan, window), None, now,
                      kind=CORRECTION, attempt=plan.attempts.get(window, 0))
        raise_alert(settings, alert, deliver=deliver)
    return len(plan.windows)


# -- small helpers -----------------------------------------------------------------------------------------
def _plain(value: Any) -> Number:
    """A Spark sum as a JSON number: integral sums stay whole, anything else (double, decimal) a float."""
    if value is None or isinstance(value, int):
        return value
    return float(value)


def _fmt(value: Number) -> str:
    if value is None:
        return "null"
    if isinstance(value, float):
        return format(value, ".10g")
    return str(value)


def _rfc3339(value: datetime) -> str:
    return value.isoformat().replace("+00:00", "Z")


def _windows(windows: Sequence[Window]) -> str:
    shown = ", ".join(f"{s:%m-%d %H:%M}" for s, _e in windows[:6])
    return shown + (" ..." if len(windows) > 6 else "")



def _totals_json(totals: Totals) -> dict[str, dict[str, dict[str, Number]]]:
    return {t: {window_key(w): dict(m) for w, m in per.items()} for t, per in totals.items()}


def _totals_of(raw: Mapping[str, Mapping[str, Mapping[str, Number]]]) -> Totals:
    return {t: {window_of(k): dict(m) for k, m in per.items()} for t, per in raw.items()}
