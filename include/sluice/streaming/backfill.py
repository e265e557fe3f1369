"""Backfills (SPEC section 6): recompute a range of windows from bronze, in batch, with the very same
transforms as the streaming path, and replace exactly that range of gold in one atomic commit per table.

* Deterministic: the same bronze gives the same rows (sorted, one file per commit), so two runs yield
  identical tables, and without late data the result equals what streaming wrote.
* ``include_late`` adds the DLQ records of the pipeline's streams to the input.
* Only closed windows are rewritten: a window still open would otherwise be emitted again by streaming.
* Holds the pipeline lock, so it never writes at the same time as a scheduled cycle.

A request is a range (``sluice backfill``: every window starting in ``[start, end)``) or an explicit set of
windows (automatic corrections, :mod:`sluice.streaming.corrections`): the same computation, the same one
replace per gold table; a set reads bronze only around its windows.

**Late records and the ledger.** Each rewritten window records the gold tables' Delta versions before and
after the replace (``gold_versions``). With ``include_late`` its late records are in gold afterwards, so
``late_waiting`` drops to 0, and its re-validation's lateness check no longer counts them (SPEC 5: only DLQ
records not in gold count). Those in gold are the ones the DLQ held before the backfill read it: the ledger's
``late_rows``, or a count taken just before, so a record that lands meanwhile still counts as late. Without
``include_late`` they are still not in gold: the window keeps its ``late_waiting`` count (and, under
``corrections: auto``, a later cycle corrects it), its state is what its re-validation says (the lateness
check counts them), and its ``detail`` names the ``--include-late`` command after the validation's findings.
``late_rows`` keeps the count the ledger had when the backfill started (the validation counts the DLQ again,
later), so a late record that lands while the backfill runs is flagged by the next amendment scan instead of
being taken for one already in gold.

**A crash mid-backfill.** ``sluice backfill`` plans its run in
``lake/_checkpoints/pipelines/<pipeline>/backfill.json`` before its first commit: the range, the app-transaction
version of its gold replaces, the ledger's late counts and each window's validation round (``attempt``), then
marks the plan ``done`` after its last commit. Run again after a crash (an Airflow retry, the same command by
hand), it resumes that plan instead of starting a new backfill: a gold replace already committed is not redone
(its app transaction; the ledger's ``gold_versions`` are those of the first replace), and the re-validation is
the same round, so its alerts have the same ids and the ledger the same ``attempt`` as a run never
interrupted. A backfill of another range first finishes the interrupted one. (Automatic corrections keep a
plan of their own, :mod:`sluice.streaming.corrections`.)
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import datetime

from sluice.alerting.outbox import alerts_recorded_since, outbox_snapshot
from sluice.config import ConfigError, Settings, parse_time
from sluice.core.model import PipelineDef
from sluice.core.windows import EPOCH, Window
from sluice.quality.gx_context import warm_up
from sluice.runtime.context import RunContext
from sluice.storage import snapshots
from sluice.streaming.rebuild import apply_changes
from sluice.streaming.rewrite import Backfill, BackfillRequest, BackfillResult
from sluice.windows.late import scan_amendments
from sluice.windows.ledger import next_version
from sluice.windows.plans import Commits, PlanFile, window_key, window_of

log = logging.getLogger("sluice.backfill")


def validate_request(
    settings: Settings, pipeline: str, start: str | datetime, end: str | datetime, include_late: bool = False
) -> BackfillRequest:
    """Check parameters before any Spark work; every message says what to do instead."""
    definition = settings.pipeline(pipeline)
    start_ts = parse_time(start, "start")  # within the range timestamps (and window margins) support
    end_ts = parse_time(end, "end")
    if start_ts >= end_ts:
        raise ConfigError(
            f"backfill range is empty or reversed: start {start_ts.isoformat()} must be before end "
            f"{end_ts.isoformat()}; swap them or widen the range"
        )
    slide = definition.window.slide
    for name, ts in (("start", start_ts), ("end", end_ts)):
        if (ts - EPOCH) % slide:
            aligned = EPOCH + ((ts - EPOCH) // slide) * slide
            raise ConfigError(
                f"backfill {name} {ts.isoformat()} is not aligned to the {pipeline} windows "
                f"(every {slide}); use e.g. {aligned.isoformat()}"
            )
    return BackfillRequest(definition, start_ts, end_ts, include_late)


@dataclass
class BackfillPlan:
    """A ``sluice backfill`` run, written before its first commit and marked ``done`` after its last (see the
    module docstring): what a rerun after a crash needs to finish it exactly as it would have."""

    start: datetime
    end: datetime
    include_late: bool
    version: int  # app-transaction version of its gold replaces
    late_rows: dict[Window, int]  # the ledger's DLQ counts of the settled windows in the range
    rounds: dict[Window, int]  # the validation round of each window in the ledger (others: 1)
    stage: str = "planned"  # planned -> done

    def matches(self, request: BackfillRequest) -> bool:
        return (self.start, self.end, self.include_late) == (request.start, request.end, request.include_late)

    def request(self, pipeline: PipelineDef) -> BackfillRequest:
        return BackfillRequest(pipeline, self.start, self.end, self.include_late)

    def to_json(self) -> str:
        return json.dumps({
            "start": self.start.isoformat(), "end": self.end.isoformat(), "include_late": self.include_late,
            "version": self.version, "stage": self.stage,
            "late_rows": {window_key(w): n for w, n in self.late_rows.items()},
            "rounds": {window_key(w): n for w, n in self.rounds.items()},
        }, indent=1)

    @classmethod
    def from_json(cls, text: str) -> BackfillPlan:
        raw = json.loads(text)
        return cls(
            start=datetime.fromisoformat(raw["start"]), end=datetime.fromisoformat(raw["end"]),
            include_late=bool(raw["include_late"]), version=int(raw["version"]), stage=str(raw["stage"]),
            late_rows={window_of(k): int(n) for k, n in raw["late_rows"].items()},
            rounds={window_of(k): int(n) for k, n in raw["rounds"].items()},
        )


def backfill_plan_file(ctx: RunContext, pipeline: PipelineDef) -> PlanFile:
    """The backfill plan among the lake's state objects (:mod:`sluice.windows.plans`)."""
    return PlanFile(ctx.state, pipeline.name, "backfill.json")


def load_backfill_plan(ctx: RunContext, pipeline: PipelineDef) -> BackfillPlan | None:
    saved = backfill_plan_file(ctx, pipeline).load()
    return BackfillPlan.from_json(saved) if saved is not None else None


def save_backfill_plan(ctx: RunContext, pipeline: PipelineDef, plan: BackfillPlan) -> None:
    backfill_plan_file(ctx, pipeline).save(plan.to_json())


def new_backfill_plan(ctx: RunContext, request: BackfillRequest) -> BackfillPlan:
    """Plan ``request`` (a range): one version above every gold table's backfills so far, and the ledger's
    late counts and validation rounds of its windows as they are now, before anything is rewritten."""
    pipeline = request.pipeline
    paths = {o.name: o.path(ctx.settings) for o in pipeline.outputs}
    version = max(next_version(ctx.engine, path, f"{Commits().prefix}.{name}") if snapshots.exists(path)
                  else 0 for name, path in paths.items())
    ledger = ctx.ledger(pipeline.name)
    settled = {r.window for r in ledger.settled()}
    rows = [r for r in ledger.rows if request.start <= r.window_start < request.end]
    plan = BackfillPlan(request.start, request.end, request.include_late, version,
                        {r.window: r.late_rows for r in rows if r.window in settled},
                        {r.window: r.attempt + 1 for r in rows})
    save_backfill_plan(ctx, pipeline, plan)
    return plan


def run_planned(ctx: RunContext, request: BackfillRequest, plan: BackfillPlan, deliver_alerts: bool
                ) -> BackfillResult:
    """Carry out (or finish) the backfill ``plan`` describes, then mark it done."""
    result = Backfill(ctx, request, deliver_alerts, commits=Commits(version=plan.version),
                      late_rows=plan.late_rows, rounds=plan.rounds).run()
    plan.stage = "done"
    save_backfill_plan(ctx, request.pipeline, plan)
    return result


def run_backfill(
    ctx: RunContext,
    pipeline: str,
    start: str | datetime,
    end: str | datetime,
    include_late: bool = False,
    *,
    deliver_alerts: bool = True,
) -> BackfillResult:
    settings = ctx.settings
    request = validate_request(settings, pipeline, start, end, include_late)  # before any JVM starts
    with ctx.pipeline_lock(pipeline, purpose=f"backfill {request.start:%Y-%m-%dT%H:%M}..{request.end:%H:%M}"):
        warm_up()  # while the JVM starts: the Python process only waits for it
        engine = ctx.engine
        outbox = outbox_snapshot(settings, pipeline)
        # The ledger's late counts up to date first (late records since the last cycle are flagged), so
        # the backfill knows which of its windows have late records waiting and clears exactly those.
        scan_amendments(ctx.ledger(pipeline), engine, ctx.state, request.pipeline)
        # A changed definition first (SPEC 9): the backfill then rewrites gold of the current definition.
        apply_changes(ctx, request.pipeline, deliver_alerts=deliver_alerts)
        plan = load_backfill_plan(ctx, request.pipeline)
        if plan is not None and plan.stage != "done":
            if plan.matches(request):
                log.info("backfill %s: resuming the run a crash interrupted", pipeline)
                result = run_planned(ctx, request, plan, deliver_alerts)
                result.alerts = alerts_recorded_since(settings, pipeline, outbox)
                return result
            # Its gold may be rewritten already, the ledger not: finished first, it is never left half done.
            log.warning("backfill %s: first finishing the backfill of [%s, %s) a crash interrupted", pipeline,
                        plan.start.isoformat(), plan.end.isoformat())
            run_planned(ctx, plan.request(request.pipeline), plan, deliver_alerts)
        plan = new_backfill_plan(ctx, request)
        result = run_planned(ctx, request, plan, deliver_alerts)
        result.alerts = alerts_recorded_since(settings, pipeline, outbox)
        return result
