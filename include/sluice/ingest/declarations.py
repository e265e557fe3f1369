"""A stream's declaration as its records were ingested, and the changes that would change what they mean
(SPEC 9, "Streams").

Bronze keeps every accepted record as it was typed when it arrived. A new field is a new column, null for
the records before it. A field's type, the id, the event-time field, or a field removed would make the
records already there mean something else (or vanish from every rebuild), so such a change is refused
before anything is written, naming the stream, the field and both declarations. The declaration the lake
holds is kept beside the stream's ingest checkpoint (``_checkpoints/ingest/<stream>/declaration.json``);
a lake from before it was kept is judged against bronze's own schema.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sluice.core.errors import DefinitionError
from sluice.core.model import EVENT_TIME, StreamSpec
from sluice.storage.snapshots import open_table
from sluice.storage.state import LakeState

DECLARATION = "declaration.json"
# Bronze's column types (Delta's primitive names) as the declared types name them.
DELTA_TYPES = {"string": "string", "long": "long", "double": "double", "boolean": "boolean",
               "timestamp": "timestamp", "timestamp_ntz": "timestamp"}


class DeclarationChanged(DefinitionError):
    """A stream's declaration changed in a way that would change what its ingested records mean."""


@dataclass(frozen=True)
class Declaration:
    """What a stream's records are: its fields (by their JSON names) and types, its id and event-time field.
    ``id`` and ``event_time`` are None when only bronze's schema is known (a lake from before declarations
    were kept)."""

    fields: Mapping[str, str]
    id: str | None
    event_time: str | None

    @classmethod
    def of(cls, spec: StreamSpec) -> Declaration:
        return cls({spec.json_name(f): spec.type_of(f) for f in spec.fields}, spec.json_name(spec.id_field),
                   spec.time_field)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Declaration:
        return cls(dict(raw["fields"]), raw.get("id"), raw.get("event_time"))

    def to_json(self) -> str:
        return json.dumps({"fields": dict(self.fields), "id": self.id, "event_time": self.event_time},
                          sort_keys=True)

    def describe(self, name: str) -> str:
        return f"{name}: {self.fields[name]}" if name in self.fields else f"{name}: (not declared)"


def bronze_declaration(spec: StreamSpec, bronze_path: str) -> Declaration | None:
    """The fields and types bronze holds (its payload columns), or None when the stream has no bronze yet.
    Bronze names the event-time column ``event_time`` whatever its JSON name."""
    from sluice.storage import tables

    table = open_table(bronze_path)
    if table is None:
        return None
    lineage = {f.name for f in tables.bronze(spec).schema.fields if f.name not in spec.fields}
    fields = {}
    for field in table.schema().fields:
        if field.name in lineage:
            continue
        kind = DELTA_TYPES.get(str(getattr(field.type, "type", field.type)), str(field.type))
        fields[spec.time_field if field.name == EVENT_TIME else field.name] = kind
    return Declaration(fields, None, None)


def changes(before: Declaration, now: Declaration) -> list[str]:
    """What in ``now`` would change the meaning of records ingested under ``before``, one line each."""
    out = []
    for name, kind in before.fields.items():
        if name not in now.fields:
            out.append(f"field {name!r} was removed (ingested as {kind})")
        elif now.fields[name] != kind:
            out.append(f"field {name!r} changed type: ingested as {kind}, now declared {now.fields[name]}")
    if before.id is not None and before.id != now.id:
        out.append(f"the id changed: ingested with id {before.id!r}, now {now.id!r}")
    if before.event_time is not None and before.event_time != now.event_time:
        out.append(f"the event-time field changed: ingested from {before.event_time!r}, now {now.event_time!r}")
    return out


def check_declaration(spec: StreamSpec, state: LakeState, bronze_path: str) -> None:
    """Refuse (:class:`DeclarationChanged`) a declaration that changes what the stream's ingested records
    mean; otherwise record it (an added field is accepted: a new column, null before it)."""
    stored = state.read_json("ingest", spec.name, DECLARATION)
    before = Declaration.from_json(stored) if stored is not None else bronze_declaration(spec, bronze_path)
    now = Declaration.of(spec)
    if before is not None:
        problems = changes(before, now)
        if problems:
            raise DeclarationChanged(
                f"stream {spec.name!r}: its declaration changed in a way that would change what the records "
                f"already ingested mean, so nothing was ingested: {'; '.join(problems)}. Records are kept as "
                "they were typed when they arrived. Restore the declaration, or declare the new shape as a new "
                "stream (a new name: its own landing folder, bronze, quarantine and DLQ); adding a field is "
                "fine (a new column, null for earlier records)."
            )
    if stored is None or before != now:
        state.write(now.to_json(), "ingest", spec.name, DECLARATION)
