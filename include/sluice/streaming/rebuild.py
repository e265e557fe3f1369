"""Applying a change to a pipeline before its run (SPEC 9): the plan of :mod:`sluice.streaming.changes`, carried
out under the pipeline's lock, as each output's ``on_change`` says.

**rebuild** (the default): every closed window of the changed outputs is recomputed from bronze with the new
definition, through the transforms every path uses (windows that a correction or an ``--include-late`` backfill
had filled with their late records are recomputed with them), and each gold table is replaced whole, its schema
included, in one atomic commit. The ledger then holds exactly the windows gold holds (after a window change, the
old windows leave it; ``ops/dq_results`` and ``ops/alerts`` keep their history), the new definitions are
recorded with a new streaming checkpoint per rebuilt output, and the rebuilt windows are validated again.

**forward**: closed windows keep their rows and the definition that built them; gold gains the added columns
(null in old rows), and the output's new streaming checkpoint starts at the open windows.

Either way the old checkpoint is kept under the lake and never reused: the new one is ``<output>.g<n>``, and its
query reads only the bronze rows that can still reach a window after the boundary gold was built to.

**Crashes.** A rebuild writes its plan (``pipelines/<pipeline>/rebuild.json``: the fingerprints, the boundary, the
app-transaction version, the validation rounds and the checkpoint generations) before its first commit, and
marks it done after its last step; every commit is an app transaction of that version. A run killed anywhere in
between leaves each gold table wholly old or wholly new, and the next run finishes the same rebuild.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from pyspark.sql import functions as F

from sluice.core.model import OutputDef, PipelineDef
from sluice.core.spark import collected_utc, local_frame
from sluice.core.windows import Window
from sluice.quality.checker import QualityChecker, QualityReport, merged_reports
from sluice.runtime.context import RunContext
from sluice.storage import snapshots
from sluice.storage.dlq import dlq_counts
from sluice.streaming.batch import (
    batch_inputs,
    ensure_output_table,
    gold_rows,
    gold_schema,
    gold_windows,
    mark_closed_through,
)
from sluice.streaming.changes import ChangeRefused, OutputChange, PipelinePlan, plan_pipeline, save_plan
from sluice.streaming.definitions import Recorded, fingerprints, record, recorded_outputs, save_recorded
from sluice.streaming.rewrite import commit_version
from sluice.windows.ledger import WINDOW_LEDGER, LedgerRow, format_gold_versions, next_version
from sluice.windows.plans import WINDOW_COLUMNS, PlanFile, window_key, window_of

log = logging.getLogger("sluice.rebuild")

GOLD_APP = "sluice.rebuild"
LEDGER_APP = "sluice.ledger.rebuild"


@dataclass
class ChangeReport:
    """What a run did about a changed pipeline before its cycle."""

    pipeline: str
    rebuilt: dict[str, int] = field(default_factory=dict)  # output -> rows written
    forwarded: list[str] = field(default_factory=list)
    windows: list[Window] = field(default_factory=list)  # the windows gold now holds for the rebuilt outputs
    dropped: list[Window] = field(default_factory=list)  # windows of an earlier window spec that left gold
    quality: QualityReport | None = None
    seconds: float = 0.0

    def render(self) -> list[str]:
        lines = []
        if self.rebuilt:
            q = self.quality
            lines.append(
                f"definition changed: rebuilt {', '.join(f'gold/{o} ({n} rows)' for o, n in self.rebuilt.items())}: "
                f"{len(self.windows)} closed window(s) from bronze in {self.seconds:.1f}s"
                + (f", {len(self.dropped)} window(s) of the old window spec removed" if self.dropped else "")
                + (f"; data quality: {len(q.checked) - len(q.failed)} passed, {len(q.failed)} failed" if q else ""))
        if self.forwarded:
            lines.append(f"definition changed: {', '.join(f'gold/{o}' for o in self.forwarded)} go forward: closed "
                         "windows keep their rows; new windows use the new definition")
        return lines


@dataclass(frozen=True)
class RebuildPlan:
    """A rebuild as planned before its first commit (see the module docstring)."""

    fingerprints: dict[str, str]  # rebuilt output -> its new fingerprint
    generations: dict[str, int]  # rebuilt output -> its new checkpoint generation
    boundary: datetime
    version: int
    rounds: dict[Window, int]
    done: bool = False

    def to_json(self) -> str:
        return json.dumps({"fingerprints": self.fingerprints, "generations": self.generations,
                           "boundary": self.boundary.isoformat(), "version": self.version,
                           "rounds": {window_key(w): n for w, n in sorted(self.rounds.items())},
                           "done": self.done}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> RebuildPlan:
        raw = json.loads(text)
        return cls(dict(raw["fingerprints"]), {k: int(v) for k, v in raw["generations"].items()},
                   datetime.fromisoformat(raw["boundary"]), int(raw["version"]),
                   {window_of(k): int(n) for k, n in raw["rounds"].items()}, bool(raw["done"]))


def apply_changes(ctx: RunContext, pipeline: PipelineDef, *, deliver_alerts: bool = True,
                  plan: PipelinePlan | None = None) -> ChangeReport | None:
    """Carry out the pipeline's plan (``plan``: as :func:`plan_pipeline` made it, when the caller has it) before
    its run (the caller holds the pipeline's lock). Raises :class:`ChangeRefused` (exit 1, nothing written) for a
    change its ``on_change`` does not allow."""
    plan = plan if plan is not None else plan_pipeline(ctx, pipeline)
    plan_file = PlanFile(ctx.state, pipeline.name, "rebuild.json")
    saved = plan_file.load()
    pending = RebuildPlan.from_json(saved) if saved is not None else None
    if pending is not None and pending.done:
        pending = None
    if not plan.changed and pending is None:
        if plan.unrecorded:
            # A new pipeline (or gold built before definitions were kept): what this run builds, it builds with
            # these; a later change is compared with them, even if no window closes before it.
            record(ctx.state, pipeline.name, plan.definitions)
        save_plan(ctx, plan)
        return None
    refusals = plan.refusals()
    if refusals:
        save_plan(ctx, plan, refused=True)
        raise ChangeRefused(f"{pipeline.name}: the pipeline changed in a way its on_change does not allow:\n  "
                            + "\n  ".join(refusals) + "\nnothing was written; `sluice plan " + pipeline.name
                            + "` shows the change:\n" + plan.render())
    started = time.monotonic()
    report = ChangeReport(pipeline.name)
    current = {c.output: c.after.fingerprint for c in plan.outputs}
    rebuilt = {c.output for c in plan.rebuilt()}
    if pending is not None:
        if all(current.get(o) == fp for o, fp in pending.fingerprints.items()) and rebuilt <= set(pending.fingerprints):
            # The same change: finish it (its definitions may be recorded already, its validation not).
            log.info("%s: finishing the rebuild a crash interrupted", pipeline.name)
            rebuilt = set(pending.fingerprints)
        else:
            # The file changed again before the interrupted rebuild finished: its outputs may hold either
            # definition's rows, so they are rebuilt again, with whatever else changed.
            rebuilt |= set(pending.fingerprints) & set(current)
            pending = None
    forwarded = [c for c in plan.forwarded() if c.output not in rebuilt]
    if forwarded:
        _go_forward(ctx, plan, forwarded)
        report.forwarded = [c.output for c in forwarded]
    if rebuilt:
        Rebuild(ctx, plan, sorted(rebuilt), plan_file, pending, report).run(deliver_alerts)
    report.seconds = time.monotonic() - started
    # What the page shows now: no change left (the definitions just recorded are the ones analysed above).
    save_plan(ctx, replace(plan, outputs=[replace(c, before=c.after) for c in plan.outputs]))
    return report


def _stream_from(pipeline: PipelineDef, boundary: datetime | None) -> datetime | None:
    """The oldest event time that can still reach a window ending after ``boundary``."""
    return None if boundary is None else boundary - pipeline.window.size - pipeline.lateness_bound


def _next_generations(ctx: RunContext, pipeline: PipelineDef, outputs: list[str]) -> dict[str, int]:
    kept = recorded_outputs(ctx.state, pipeline.name)
    return {o: kept[o].generation + 1 if o in kept else 0 for o in outputs}


def _retired(kept: dict[str, Recorded], output: str) -> tuple[int, ...]:
    """The generations still to delete that a change's new record carries over (PipelineRunner._restart_behind)."""
    return kept[output].retired if output in kept else ()


def _go_forward(ctx: RunContext, plan: PipelinePlan, changes: list[OutputChange]) -> None:
    pipeline = plan.pipeline
    kept = recorded_outputs(ctx.state, pipeline.name)
    generations = _next_generations(ctx, pipeline, [c.output for c in changes])
    for change in changes:
        output = pipeline.output(change.output)
        ensure_output_table(ctx.spark, ctx.settings, ctx.engine, pipeline, output)
        added = [(n, t) for n, t in change.after.columns if n not in dict(change.before.columns if change.before
                                                                          else ())]
        ctx.engine.add_columns(output.path(ctx.settings), added)
        kept[change.output] = Recorded(change.after, generations[change.output], _stream_from(pipeline, plan.boundary),
                                       _retired(kept, change.output))
        log.info("%s: gold/%s goes forward with definition %s (%s); its closed windows keep their rows; a new "
                 "streaming checkpoint starts at the open windows", pipeline.name, change.output,
                 change.after.fingerprint, ", ".join(f"+{n}" for n, _t in added) or "same columns")
    save_recorded(ctx.state, pipeline.name, kept)


class Rebuild:
    def __init__(self, ctx: RunContext, plan: PipelinePlan, outputs: list[str], plan_file: PlanFile,
                 pending: RebuildPlan | None, report: ChangeReport) -> None:
        self.ctx = ctx
        self.plan = plan
        self.pipeline = plan.pipeline
        self.outputs = [self.pipeline.output(o) for o in outputs]
        self.plan_file = plan_file
        self.pending = pending
        self.report = report
        self.ledger = ctx.ledger(self.pipeline.name)

    def _new_plan(self, boundary: datetime) -> RebuildPlan:
        engine, settings = self.ctx.engine, self.ctx.settings
        versions = [next_version(engine, o.path(settings), f"{GOLD_APP}.{o.name}") for o in self.outputs
                    if snapshots.exists(o.path(settings))]
        versions.append(next_version(engine, WINDOW_LEDGER.path(settings), f"{LEDGER_APP}.{self.pipeline.name}"))
        return RebuildPlan(
            {c.output: c.after.fingerprint for c in self.plan.outputs if c.output in {o.name for o in self.outputs}},
            _next_generations(self.ctx, self.pipeline, [o.name for o in self.outputs]),
            boundary, max(versions), {r.window: r.attempt + 1 for r in self.ledger.rows})

    def run(self, deliver_alerts: bool) -> None:
        pipeline, ctx = self.pipeline, self.ctx
        boundary = self.pending.boundary if self.pending is not None else self.plan.boundary
        if boundary is None:
            # Nothing closed yet, so gold holds no row: the new definition simply applies, from a new checkpoint,
            # to a table that takes the new schema.
            for output in self.outputs:
                path = output.path(ctx.settings)
                if snapshots.exists(path):
                    empty = local_frame(ctx.spark, [], gold_schema(ctx.spark, ctx.settings, pipeline, output))
                    app = f"{GOLD_APP}.{output.name}"
                    ctx.engine.overwrite(empty, path, app_id=app, version=next_version(ctx.engine, path, app),
                                         metadata={"pipeline": pipeline.name, "output": output.name, "rebuild": True})
            self._record(_next_generations(ctx, pipeline, [o.name for o in self.outputs]), None)
            return
        plan = self.pending or self._new_plan(boundary)
        if self.pending is None:
            self.plan_file.save(plan.to_json())
        started = time.monotonic()
        old = self.ledger.by_window()
        # Windows whose gold held their late records (a correction or an --include-late backfill) keep them.
        reshaped = any(pipeline.output(c.output) in self.outputs and c.reshaped for c in self.plan.outputs)
        with_late = set() if reshaped else {w for w, r in old.items() if r.late_in_gold > 0}
        log.info("%s: definition changed: rebuilding %s, every window closed by %s, from bronze", pipeline.name,
                 ", ".join(f"gold/{o.name}" for o in self.outputs), boundary.isoformat())
        counts: dict[str, dict[Window, int]] = {}
        versions: dict[str, tuple[int, int]] = {}
        for step, output in enumerate(self.outputs, 1):
            counts[output.name], versions[output.table_name] = self._rebuild_output(output, plan, with_late)
            log.info("%s: rebuild %d/%d: gold/%s replaced: %d window(s), %d row(s), Delta version %d -> %d",
                     pipeline.name, step, len(self.outputs), output.name, len(counts[output.name]),
                     sum(counts[output.name].values()), *versions[output.table_name])
            self.report.rebuilt[output.name] = sum(counts[output.name].values())
        windows = self._write_ledger(plan, counts, versions, old, reshaped, with_late)
        self._record(plan.generations, boundary)
        log.info("%s: rebuild: validating %d window(s) again", pipeline.name, len(windows))
        checker = QualityChecker(ctx, pipeline)
        rounds = {w: plan.rounds.get(w, 1) for w in windows}
        plain = [w for w in windows if w not in with_late]
        late = [w for w in windows if w in with_late]
        quality = checker.check(plain, final_state="reprocessed", deliver=deliver_alerts, rounds=rounds) if plain \
            else None
        if late:
            quality = merged_reports(quality, checker.check(late, final_state="reprocessed", deliver=deliver_alerts,
                                                            include_late=True, rounds=rounds))
        self.plan_file.save(replace(plan, done=True).to_json())
        self.report.windows = windows
        self.report.quality = quality
        log.info("%s: rebuild done in %.1fs: %d window(s)", pipeline.name, time.monotonic() - started, len(windows))

    def _rebuild_output(self, output: OutputDef, plan: RebuildPlan, with_late: set[Window]
                        ) -> tuple[dict[Window, int], tuple[int, int]]:
        ctx, pipeline = self.ctx, self.pipeline
        settings, engine = ctx.settings, ctx.engine
        hi = plan.boundary + pipeline.lateness_bound
        final = F.col("window_end") <= F.lit(plan.boundary)
        rows = gold_rows(output, output.build(batch_inputs(settings, engine, pipeline, None, hi), pipeline.window),
                         pipeline.window).filter(final)
        if with_late:
            chosen = F.broadcast(local_frame(ctx.spark, sorted(with_late),
                                             "window_start timestamp, window_end timestamp"))
            late_inputs = batch_inputs(settings, engine, pipeline, None, hi, include_late=True)
            late_rows = gold_rows(output, output.build(late_inputs, pipeline.window), pipeline.window)
            rows = rows.join(chosen, WINDOW_COLUMNS, "left_anti").unionByName(
                late_rows.join(chosen, WINDOW_COLUMNS, "left_semi"))
        rows = rows.coalesce(1).sortWithinPartitions("window_start", "window_end", *output.keys).localCheckpoint()
        counts = {(collected_utc(r[0]), collected_utc(r[1])): int(r[2])
                  for r in rows.groupBy("window_start", "window_end").count().collect()}
        path = output.path(settings)
        before = snapshots.version(path) if snapshots.exists(path) else -1
        app = f"{GOLD_APP}.{output.name}"
        meta: dict[str, Any] = {"pipeline": pipeline.name, "output": output.name, "rebuild": True,
                                "definition": plan.fingerprints[output.name], "boundary": plan.boundary,
                                "app": app, "app_version": plan.version}
        if engine.overwrite(rows, path, app_id=app, version=plan.version, metadata=meta):
            return counts, (before, snapshots.version(path))
        # Committed by the interrupted run: find that commit by its app transaction.
        committed = commit_version(path, app, plan.version)
        return counts, ((committed - 1, committed) if committed is not None else (before, before))

    def _write_ledger(self, plan: RebuildPlan, counts: dict[str, dict[Window, int]],
                      versions: dict[str, tuple[int, int]], old: dict[Window, LedgerRow], reshaped: bool,
                      with_late: set[Window]) -> list[Window]:
        ctx, pipeline = self.ctx, self.pipeline
        now = ctx.settings.now()
        for output in pipeline.outputs:
            if output.name not in counts:
                counts[output.name] = gold_windows(ctx.settings, output, until=plan.boundary)
        held = {w for per in counts.values() for w in per}
        windows = sorted(held if reshaped else held | {w for w in old if w[1] <= plan.boundary})
        late = dlq_counts(ctx.settings, pipeline, windows)
        definition = fingerprints({c.output: c.after for c in self.plan.outputs})
        rows = []
        for window in windows:
            row = old.get(window) or LedgerRow(pipeline.name, window[0], window[1], "closed",
                                               plan.boundary + pipeline.lateness_bound, 0, 0, now, now)
            row.state = "closed"
            row.rows = sum(per.get(window, 0) for per in counts.values())
            row.late_rows = late.get(window, 0)
            row.updated_at = now
            row.definition = definition
            row.gold_versions = format_gold_versions(versions)
            if window in with_late:
                row.late_in_gold = late.get(window, 0)
                row.late_waiting = 0
            rows.append(row)
        dropped = sorted(set(old) - set(windows))
        self.ledger.rebuild(ctx.engine, rows, dropped, app_id=f"{LEDGER_APP}.{pipeline.name}", version=plan.version)
        self.report.dropped = dropped
        return windows

    def _record(self, generations: dict[str, int], boundary: datetime | None) -> None:
        """The new definitions, each rebuilt output with its new checkpoint, and the boundary gold is built to."""
        ctx, pipeline = self.ctx, self.pipeline
        kept = recorded_outputs(ctx.state, pipeline.name)
        since = _stream_from(pipeline, boundary)
        for change in self.plan.outputs:
            if change.output in generations:
                kept[change.output] = Recorded(change.after, generations[change.output], since,
                                               _retired(kept, change.output))
            elif change.output in kept:
                kept[change.output] = replace(kept[change.output], definition=change.after)
        save_recorded(ctx.state, pipeline.name, kept)
        if boundary is not None:
            mark_closed_through(ctx.state, pipeline.name, boundary)
