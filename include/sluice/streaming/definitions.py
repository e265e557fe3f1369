"""An output's definition (SPEC 9): what its gold rows mean, so that a run can tell which definition built
each window and what a change to the pipeline file changes.

A definition is what ``build`` computes, taken from Spark's analyzed plan of ``build`` over empty frames of
the declared stream schemas (canonicalized: expression ids and aliases normalised, so that a comment or a
reformatting is no change), the gold columns and their types, the window, the keys, the lateness bound, the
checks, and the declarations of the streams it reads. Analysing starts no Spark job. Its fingerprint (12 hex
digits of a SHA-256 of all of that) goes into ``ops/window_ledger.definition`` (one per output) for every
window a run writes, and the readable definition beside the pipeline's checkpoints
(``_checkpoints/pipelines/<pipeline>/definitions.json``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pyspark.sql import SparkSession

from sluice.config import Settings
from sluice.core.model import OutputDef, PipelineDef
from sluice.core.timeutil import format_duration
from sluice.ingest.declarations import Declaration
from sluice.storage.state import LakeState
from sluice.streaming.batch import empty_inputs, gold_rows

DEFINITIONS = "definitions.json"


@dataclass(frozen=True)
class OutputDefinition:
    """One output's definition; :attr:`fingerprint` names it."""

    output: str
    plan: str  # digest of the canonicalized analyzed plan
    columns: tuple[tuple[str, str], ...]  # the gold columns and their Spark types, in order
    window: str
    keys: tuple[str, ...]
    lateness_bound: str
    checks: tuple[str, ...]
    streams: tuple[tuple[str, str], ...]  # (stream, its declaration as JSON)

    def to_dict(self) -> dict[str, Any]:
        return {"output": self.output, "plan": self.plan, "columns": [list(c) for c in self.columns],
                "window": self.window, "keys": list(self.keys), "lateness_bound": self.lateness_bound,
                "checks": list(self.checks), "streams": [list(s) for s in self.streams]}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> OutputDefinition:
        return cls(raw["output"], raw["plan"], tuple((str(n), str(t)) for n, t in raw["columns"]), raw["window"],
                   tuple(raw["keys"]), raw["lateness_bound"], tuple(raw["checks"]),
                   tuple((str(s), str(d)) for s, d in raw["streams"]))

    @property
    def fingerprint(self) -> str:
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()[:12]

    def describe(self) -> list[str]:
        """The definition as a person reads it, one aspect per line."""
        return [
            f"columns: {', '.join(f'{n} {t}' for n, t in self.columns)}",
            f"window: {self.window}; keys: {', '.join(self.keys)}; lateness bound: {self.lateness_bound}",
            f"checks: {', '.join(self.checks) or '-'}",
            f"streams: {', '.join(name for name, _d in self.streams)}",
            f"build plan: {self.plan}",
        ]


def window_text(pipeline: PipelineDef) -> str:
    size, slide = pipeline.window.size, pipeline.window.slide
    if slide == size:
        return f"{format_duration(size)} tumbling"
    return f"{format_duration(size)} every {format_duration(slide)}"


def _check_text(check: Any) -> str:
    params = {k: v for k, v in dataclasses.asdict(check).items() if k != "name" and v is not None}
    return f"{check.name}({', '.join(f'{k}={v}' for k, v in sorted(params.items()))})"


def output_definition(spark: SparkSession, settings: Settings, pipeline: PipelineDef,
                      output: OutputDef) -> OutputDefinition:
    """``output``'s definition now: its build analysed by Spark over the declared stream schemas."""
    frame = gold_rows(output, output.build(empty_inputs(spark, settings, pipeline), pipeline.window), pipeline.window)
    canonical = frame._jdf.queryExecution().analyzed().canonicalized().toString()
    return OutputDefinition(
        output=output.name,
        plan=hashlib.sha256(canonical.encode()).hexdigest()[:16],
        columns=tuple((f.name, f.dataType.simpleString()) for f in frame.schema.fields),
        window=window_text(pipeline),
        keys=tuple(output.keys),
        lateness_bound=format_duration(pipeline.lateness_bound) if pipeline.lateness_bound else "0",
        checks=tuple(_check_text(c) for c in output.checks),
        streams=tuple((s, Declaration.of(settings.stream(s)).to_json()) for s in sorted(pipeline.streams)),
    )


def pipeline_definitions(spark: SparkSession, settings: Settings, pipeline: PipelineDef) -> dict[str, OutputDefinition]:
    return {o.name: output_definition(spark, settings, pipeline, o) for o in pipeline.outputs}


def fingerprints(definitions: Mapping[str, OutputDefinition]) -> str:
    """The ledger's ``definition`` value: ``{"<output>": "<fingerprint>", ...}`` as JSON."""
    return json.dumps({name: d.fingerprint for name, d in sorted(definitions.items())}, sort_keys=True)


@dataclass(frozen=True)
class Recorded:
    """What is kept of one output beside the pipeline's checkpoints: the definition its gold was last built
    with, the generation of its streaming checkpoint (0: ``<output>``; n > 0: ``<output>.g<n>``, started by a
    change, or by a query that streams again after cycles closed in batch; an old checkpoint is never reused),
    and the oldest event time that checkpoint's query reads (set when it was started so: the rows that can still
    reach an open window). ``retired``: the old generations of a query that streamed again after cycles closed
    in batch, listed until their folders are deleted (a change's old checkpoint is kept, SPEC 9, never listed)."""

    definition: OutputDefinition
    generation: int = 0
    stream_from: datetime | None = None
    retired: tuple[int, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        out = {"fingerprint": self.definition.fingerprint, "definition": self.definition.to_dict(),
               "generation": self.generation,
               "stream_from": None if self.stream_from is None else self.stream_from.isoformat()}
        return {**out, "retired": list(self.retired)} if self.retired else out

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Recorded:
        since = raw.get("stream_from")
        return cls(OutputDefinition.from_dict(raw["definition"]), int(raw.get("generation", 0)),
                   None if since is None else datetime.fromisoformat(since),
                   tuple(int(g) for g in raw.get("retired", ())))


def checkpoint_name(output: str, generation: int) -> str:
    """The folder of an output's streaming checkpoint (and of its markers) under ``pipelines/<pipeline>/``."""
    return output if generation == 0 else f"{output}.g{generation}"


def recorded_outputs(state: LakeState, pipeline: str) -> dict[str, Recorded]:
    """Every output's record (empty for a pipeline that never wrote a window, or whose windows were written
    before definitions were kept)."""
    raw = state.read_json("pipelines", pipeline, DEFINITIONS) or {}
    return {name: Recorded.from_dict(entry) for name, entry in raw.items()}


def save_recorded(state: LakeState, pipeline: str, records: Mapping[str, Recorded]) -> None:
    """Replace the pipeline's records (one object, one write; only when they changed)."""
    text = json.dumps({name: r.to_dict() for name, r in sorted(records.items())}, sort_keys=True, indent=1)
    if state.read("pipelines", pipeline, DEFINITIONS) != text:
        state.write(text, "pipelines", pipeline, DEFINITIONS)


def record(state: LakeState, pipeline: str, definitions: Mapping[str, OutputDefinition]) -> None:
    """Keep the definitions gold was built with beside the pipeline's checkpoints (only when they changed),
    each output's checkpoint generation as it is."""
    kept = recorded_outputs(state, pipeline)
    save_recorded(state, pipeline, {
        name: dataclasses.replace(kept[name], definition=d) if name in kept else Recorded(d)
        for name, d in definitions.items()})


def recorded(state: LakeState, pipeline: str) -> dict[str, OutputDefinition]:
    """The definitions gold was last built with (see :func:`recorded_outputs`)."""
    return {name: r.definition for name, r in recorded_outputs(state, pipeline).items()}
