"""What a change to a pipeline file changes (SPEC 9): each output's definition now against the one its gold was
last built with, and what the next run will do about it (``sluice plan``; a run applies it with
:mod:`sluice.streaming.rebuild`).

The plan analyses the build functions (Spark's analyzed plan, no Spark job) and reads the ledger and the records
kept beside the checkpoints; it writes nothing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sluice.core.errors import ConfigError
from sluice.core.model import PipelineDef
from sluice.core.windows import Window
from sluice.runtime.context import RunContext
from sluice.storage.state import LakeState
from sluice.streaming.batch import closed_through
from sluice.streaming.definitions import OutputDefinition, pipeline_definitions, recorded


class ChangeRefused(ConfigError):
    """A run met a change its ``on_change`` does not allow (exit 1); the message holds the plan."""


def _columns(definition: OutputDefinition | None) -> dict[str, str]:
    return dict(definition.columns) if definition is not None else {}


@dataclass(frozen=True)
class OutputChange:
    """One output: its definition before (None: never built) and now, and its ``on_change``."""

    output: str
    before: OutputDefinition | None
    after: OutputDefinition
    on_change: str

    @property
    def changed(self) -> bool:
        return self.before is None or self.before.fingerprint != self.after.fingerprint

    @property
    def reshaped(self) -> bool:
        """The window or the keys changed: the old rows are not rows of the new table."""
        return self.before is not None and (self.before.window, self.before.keys) != (self.after.window,
                                                                                        self.after.keys)

    def columns(self) -> dict[str, list[str]]:
        old, new = _columns(self.before), _columns(self.after)
        return {
            "added": [f"{n} {t}" for n, t in new.items() if n not in old],
            "removed": [f"{n} {t}" for n, t in old.items() if n not in new],
            "retyped": [f"{n} {old[n]} -> {t}" for n, t in new.items() if n in old and old[n] != t],
        }

    def aspects(self) -> dict[str, tuple[str, str]]:
        """What changed besides the columns, each ``(before, after)``."""
        if self.before is None:
            return {}
        b, a = self.before, self.after
        pairs = {
            "window": (b.window, a.window),
            "keys": (", ".join(b.keys), ", ".join(a.keys)),
            "lateness bound": (b.lateness_bound, a.lateness_bound),
            "checks": ("; ".join(b.checks) or "-", "; ".join(a.checks) or "-"),
            "streams": (", ".join(f"{n} {d}" for n, d in b.streams), ", ".join(f"{n} {d}" for n, d in a.streams)),
        }
        changed = {k: v for k, v in pairs.items() if v[0] != v[1]}
        if b.plan != a.plan and not any(self.columns().values()) and "window" not in changed:
            changed["build"] = (f"plan {b.plan}", f"plan {a.plan}")
        return changed

    def refusal(self) -> str | None:
        """Why a run cannot apply this change (None: it can)."""
        if not self.changed or self.before is None:
            return None
        if self.on_change == "fail":
            return f"output {self.output}: its definition changed and on_change='fail'"
        if self.on_change == "forward":
            if self.reshaped:
                return (f"output {self.output}: a change of the window or the keys cannot go forward (closed windows "
                        "would not be windows of the new table); set on_change='rebuild', or give the output a new "
                        "name")
            if self.columns()["retyped"]:
                return (f"output {self.output}: a retyped column ({', '.join(self.columns()['retyped'])}) cannot go "
                        "forward (old and new rows would not share a type); set on_change='rebuild', or give the "
                        "column a new name")
        return None


@dataclass
class PipelinePlan:
    pipeline: PipelineDef
    outputs: list[OutputChange]
    closed: list[Window] = field(default_factory=list)  # the windows the ledger holds
    boundary: datetime | None = None  # gold holds every window ending by it

    @property
    def definitions(self) -> dict[str, OutputDefinition]:
        """Every output's definition now."""
        return {c.output: c.after for c in self.outputs}

    @property
    def unrecorded(self) -> bool:
        """No definition is recorded: a pipeline that never ran, or whose gold was built before sluice kept
        definitions (its next run records the current ones; there is nothing to compare with)."""
        return all(o.before is None for o in self.outputs)

    @property
    def new(self) -> bool:
        return self.unrecorded and not self.closed

    @property
    def changed(self) -> list[OutputChange]:
        return [] if self.unrecorded else [o for o in self.outputs if o.changed]

    @property
    def status(self) -> str:
        return "new" if self.new else "changed" if self.changed else "unchanged"

    def refusals(self) -> list[str]:
        return [r for o in self.changed if (r := o.refusal()) is not None]

    def rebuilt(self) -> list[OutputChange]:
        return [o for o in self.changed if o.on_change == "rebuild"]

    def forwarded(self) -> list[OutputChange]:
        return [o for o in self.changed if o.on_change == "forward"]

    def action(self, change: OutputChange) -> str:
        """What the next run does with one output, in a sentence."""
        if change not in self.changed:
            return "nothing to change"
        if (refusal := change.refusal()) is not None:
            return f"refuses, exit 1: {refusal}"
        span = (f"{self.closed[0][0]:%Y-%m-%d %H:%M} .. {self.closed[-1][1]:%Y-%m-%d %H:%M} UTC"
                if self.closed else "none closed yet")
        if change.on_change == "forward":
            return (f"forward: the {len(self.closed)} closed window(s) ({span}) keep their rows and definition "
                    f"{change.before.fingerprint if change.before else '-'}; new windows use "
                    f"{change.after.fingerprint}" + ("; added columns read null in the old rows"
                                                      if change.columns()["added"] else ""))
        if not self.closed:
            return "rebuild: no window is closed yet; the new definition applies from the next window"
        text = f"rebuild: recomputes the {len(self.closed)} closed window(s) ({span})"
        if self.boundary is not None and self.boundary > self.closed[-1][1]:
            # The watermark passed the last window with rows (an idle heartbeat, a catch-up): every window ending
            # by then is final, and the rebuild gives each the rows a fresh home would.
            text += f" and every window ending by {self.boundary:%Y-%m-%d %H:%M} UTC, which the watermark has passed,"
        text += " from bronze"
        if change.reshaped:
            text += f" as windows of {change.after.window}; the old windows leave gold and the ledger"
        return text + f", in one commit of gold/{change.output}, and validates them again"

    def render(self) -> str:
        p = self.pipeline
        if self.new:
            return f"{p.name}: new (never ran); the first run builds " + ", ".join(
                f"gold/{o.output} with definition {o.after.fingerprint}" for o in self.outputs)
        if self.unrecorded:
            return (f"{p.name}: no definition recorded yet (gold was built before sluice kept them); the next run "
                    "records " + ", ".join(f"gold/{o.output}: {o.after.fingerprint}" for o in self.outputs))
        lines = [f"{p.name}: " + ("no change since gold was built" if not self.changed else
                                  f"{len(self.changed)} output(s) changed since gold was built")]
        for change in self.outputs:
            before = change.before.fingerprint if change.before else "never built"
            lines.append(f"  gold/{change.output}: {before} -> {change.after.fingerprint}"
                         f" (on_change={change.on_change})" if change.changed else
                         f"  gold/{change.output}: {change.after.fingerprint}, unchanged")
            if not change.changed:
                continue
            for kind, items in change.columns().items():
                if items:
                    lines.append(f"    columns {kind}: {', '.join(items)}")
            for aspect, (old, new) in change.aspects().items():
                lines.append(f"    {aspect}: {old} -> {new}")
            lines.append(f"    next run: {self.action(change)}")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {
            "pipeline": self.pipeline.name,
            "status": self.status,
            "closed_windows": len(self.closed),
            "closed_range": None if not self.closed else [self.closed[0][0].isoformat(),
                                                          self.closed[-1][1].isoformat()],
            "closed_through": None if self.boundary is None else self.boundary.isoformat(),
            "outputs": [{
                "output": c.output,
                "changed": c in self.changed,
                "on_change": c.on_change,
                "before": None if c.before is None else c.before.fingerprint,
                "after": c.after.fingerprint,
                "columns": c.columns() if c.before is not None else {"added": [], "removed": [], "retyped": []},
                "changes": {k: {"before": v[0], "after": v[1]} for k, v in c.aspects().items()},
                "next_run": self.action(c),
                "definition": c.after.describe(),
            } for c in self.outputs],
        }


PLAN = "plan.json"


def save_plan(ctx: RunContext, plan: PipelinePlan, *, refused: bool = False) -> None:
    """Keep the pipeline's last plan beside its checkpoints (``sluice plan`` and every run that meets a change
    write it; only when it changed), for the ledger page, which has no Spark to analyse the builds itself."""
    doc = {"status": "refused" if refused else plan.status, "text": plan.render()}
    current = ctx.state.read_json("pipelines", plan.pipeline.name, PLAN)
    if current is None or {k: v for k, v in current.items() if k != "at"} != doc:
        ctx.state.write(json.dumps({**doc, "at": ctx.settings.now().isoformat()}, sort_keys=True),
                        "pipelines", plan.pipeline.name, PLAN)


def saved_plan(state: LakeState, pipeline: str) -> dict[str, Any] | None:
    """The last plan :func:`save_plan` kept: ``status`` (new, unchanged, changed or refused), ``text`` and
    ``at``."""
    found = state.read_json("pipelines", pipeline, PLAN)
    return found if isinstance(found, dict) else None


def plan_pipeline(ctx: RunContext, pipeline: PipelineDef) -> PipelinePlan:
    """The pipeline's plan: its definitions analysed now (no Spark job) against what gold was built with."""
    now = pipeline_definitions(ctx.spark, ctx.settings, pipeline)
    before = recorded(ctx.state, pipeline.name)
    closed = sorted(ctx.ledger(pipeline.name).windows())
    ends = [end for _start, end in closed]
    marks = [m for m in (closed_through(ctx.state, pipeline.name), max(ends, default=None)) if m is not None]
    return PipelinePlan(
        pipeline,
        [OutputChange(o.name, before.get(o.name), now[o.name], o.on_change) for o in pipeline.outputs],
        closed=[(s.astimezone(UTC), e.astimezone(UTC)) for s, e in closed],
        boundary=max(marks) if marks else None,
    )
