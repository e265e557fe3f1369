"""Corrections of closed windows: late records that land after a window closed (README "Operations").

Late records are flagged on the ledger by the amendment scan (:mod:`sluice.windows.late`); this module
decides what is done about them.

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
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import NumericType, StructType

from sluice.core.model import OutputDef, PipelineDef
from sluice.core.spark import collected_utc, local_frame
from sluice.core.windows import Window
from sluice.quality.checker import QualityReport
from sluice.runtime.context import RunContext
from sluice.storage import snapshots
from sluice.streaming.rewrite import Backfill, windows_request
from sluice.windows.late import refresh_details, too_old
from sluice.windows.ledger import next_version
from sluice.windows.plans import WINDOW_COLUMNS, Commits, PlanFile, window_key, window_of

log = logging.getLogger("sluice.corrections")

Number = int | float | None
# table -> window -> measure ("rows" or a metric column) -> value
Totals = dict[str, dict[Window, dict[str, Number]]]

AMEND_APP = "sluice.amend"
CORRECT_APP = "sluice.correct"
CORRECT_LEDGER_APP = "sluice.ledger.correct"
ROWS = "rows"  # the measure that counts a window's gold rows


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


def plan_file(ctx: RunContext, pipeline: PipelineDef) -> PlanFile:
    """The corrections plan among the lake's state objects (:mod:`sluice.windows.plans`)."""
    return PlanFile(ctx.state, pipeline.name, "corrections.json")


def load_plan(ctx: RunContext, pipeline: PipelineDef) -> CorrectionPlan | None:
    saved = plan_file(ctx, pipeline).load()
    return CorrectionPlan.from_json(saved) if saved is not None else None


def save_plan(ctx: RunContext, pipeline: PipelineDef, plan: CorrectionPlan) -> None:
    plan_file(ctx, pipeline).save(plan.to_json())


def run_corrections(ctx: RunContext, pipeline: PipelineDef, *, deliver_alerts: bool) -> CorrectionReport:
    """The corrections step of a cycle (under the pipeline lock, after the aggregation): finish a plan a
    crash interrupted, or, under ``corrections: auto``, correct the oldest windows with late data waiting that are
    due."""
    started = time.monotonic()
    report = CorrectionReport(pipeline.name, pipeline.corrections, pipeline.max_corrections_per_run)
    plan = load_plan(ctx, pipeline)
    if plan is not None and plan.stage != "done":
        log.info("%s: resuming the correction of %d window(s) (stage %s)", pipeline.name, len(plan.windows),
                 plan.stage)
    elif pipeline.corrections == "auto":
        plan = new_plan(ctx, pipeline)
    else:
        plan = None
    if plan is not None:
        _carry_out(ctx, pipeline, plan, report, deliver_alerts)
    now = ctx.now
    ledger = ctx.ledger(pipeline.name)
    rows = ledger.rows
    refresh_details(ledger, ctx.engine, pipeline, rows, now)
    if pipeline.corrections == "auto":
        for row in ledger.waiting():
            (report.too_old if too_old(pipeline, row.window, now) else report.deferred).append(row.window)
    report.seconds = time.monotonic() - started
    return report


def new_plan(ctx: RunContext, pipeline: PipelineDef) -> CorrectionPlan | None:
    """The windows to correct now: late data waiting, not older than max_age, oldest first, at most N; None if
    none."""
    now = ctx.now
    due = [r for r in ctx.ledger(pipeline.name).waiting() if not too_old(pipeline, r.window, now)]
    chosen = due[: pipeline.max_corrections_per_run]
    if not chosen:
        return None
    windows = [r.window for r in chosen]
    # One version for every gold table, above whatever any of them has seen (as the batch catch-up does).
    version = max(next_version(ctx.engine, o.path(ctx.settings), f"{CORRECT_APP}.{o.name}")
                  for o in pipeline.outputs)
    plan = CorrectionPlan(version, windows, {r.window: r.late_rows for r in chosen},
                          window_totals(ctx, pipeline, windows),
                          attempts={r.window: r.attempt + 1 for r in chosen})
    save_plan(ctx, pipeline, plan)
    log.info("%s: correcting %d window(s) with their late records (%d more due)", pipeline.name,
             len(windows), len(due) - len(windows))
    return plan


def _carry_out(ctx: RunContext, pipeline: PipelineDef, plan: CorrectionPlan, report: CorrectionReport,
               deliver_alerts: bool) -> None:
    if plan.stage == "planned":
        request = windows_request(pipeline, plan.windows, include_late=True)
        commits = Commits(CORRECT_APP, CORRECT_LEDGER_APP, plan.version)
        result = Backfill(ctx, request, deliver_alerts, commits=commits,
                          late_rows=plan.late_rows, rounds=plan.attempts or None).run()
        report.quality = result.quality
        plan.gold_versions = result.gold_versions
        plan.after = window_totals(ctx, pipeline, plan.windows)
        if not plan.attempts:  # a plan of an older version: the rounds its validation took
            ledger = ctx.ledger(pipeline.name).by_window()
            plan.attempts = {w: ledger[w].attempt for w in plan.windows if w in ledger}
        plan.stage = "recorded"
        save_plan(ctx, pipeline, plan)
    if plan.stage == "recorded":
        report.notices = raise_notices(ctx, pipeline, plan, deliver=deliver_alerts)
        plan.stage = "done"
        save_plan(ctx, pipeline, plan)
    report.corrected = list(plan.windows)
    report.gold_versions = dict(plan.gold_versions)


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


def window_totals(ctx: RunContext, pipeline: PipelineDef, windows: Sequence[Window]) -> Totals:
    """Per gold table of the pipeline: :func:`output_totals` of ``windows`` as gold holds them now."""
    chosen = sorted(windows)
    bounds = local_frame(ctx.spark, chosen, "window_start timestamp, window_end timestamp")
    out: Totals = {}
    for output in pipeline.outputs:
        path = output.path(ctx.settings)
        if snapshots.exists(path):
            out[output.table_name] = output_totals(ctx.engine.read(path), output, chosen, bounds)
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


def raise_notices(ctx: RunContext, pipeline: PipelineDef, plan: CorrectionPlan, *, deliver: bool) -> int:
    """One correction notice (level info) per corrected window; idempotent per (window, attempt)."""
    if not plan.windows:
        return 0
    from sluice.alerting.alert import CORRECTION, Alert
    from sluice.alerting.outbox import raise_alert

    now = ctx.now
    for window in plan.windows:
        # No Data Docs page to point at (the fifth field): the notice carries its numbers itself.
        alert = Alert(pipeline.name, window[0], window[1], notice_lines(plan, window), None, now,
                      kind=CORRECTION, attempt=plan.attempts.get(window, 0))
        raise_alert(ctx.settings, alert, deliver=deliver)
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


def _windows(windows: Sequence[Window]) -> str:
    shown = ", ".join(f"{s:%m-%d %H:%M}" for s, _e in windows[:6])
    return shown + (" ..." if len(windows) > 6 else "")



def _totals_json(totals: Totals) -> dict[str, dict[str, dict[str, Number]]]:
    return {t: {window_key(w): dict(m) for w, m in per.items()} for t, per in totals.items()}


def _totals_of(raw: Mapping[str, Mapping[str, Mapping[str, Number]]]) -> Totals:
    return {t: {window_of(k): dict(m) for k, m in per.items()} for t, per in raw.items()}
