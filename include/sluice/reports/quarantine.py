"""``sluice quarantine <stream>``: what a stream's quarantine holds, for people and for scripts. Counts per
reason, then a few examples of each (file, line number, reason, detail, the raw line), newest file first and
in line order within a file.

Read on the driver with pyarrow (:mod:`sluice.storage.snapshots`), as ``sluice status`` reads tables: no Spark.
The counts read the narrow columns only; the examples' rows are read for the batches that hold them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from sluice.config import Settings
from sluice.ingest.accounting import fmt_ts, render_table
from sluice.ingest.files import source_key
from sluice.reports.output import rfc3339
from sluice.storage import snapshots, tables
from sluice.storage.tables import QUARANTINE_REASONS

#: Examples shown per reason unless asked otherwise.
EXAMPLES = 3
#: A raw line is cut to this many characters in text (the --json document keeps more, see RAW_JSON).
RAW_TEXT = 80
RAW_JSON = 1000


@dataclass
class Example:
    reason: str
    source_file: str | None  # the local path or object URI, decoded
    line_number: int | None  # null for a file quarantined whole, and in rows older than the column
    detail: str | None
    raw: str | None
    arrival_time: datetime | None
    ingest_batch_id: int | None

    @property
    def file(self) -> str:
        return Path(self.source_file).name if self.source_file else "-"


@dataclass
class ReasonCount:
    reason: str
    records: int
    files: int
    last_arrival: datetime | None


@dataclass
class QuarantineView:
    stream: str
    table: str
    exists: bool
    reasons: list[str]  # the reasons asked for (every reason when not filtered)
    since: datetime | None
    limit: int
    counts: list[ReasonCount] = field(default_factory=list)  # reasons with records, most records first
    examples: list[Example] = field(default_factory=list)  # per reason (in counts' order), newest first

    @property
    def total(self) -> int:
        return sum(c.records for c in self.counts)


def quarantine_view(settings: Settings, stream: str, reasons: list[str] | None = None,
                    since: datetime | None = None, limit: int = EXAMPLES) -> QuarantineView:
    """The stream's quarantine, filtered by reason and by arrival time (``since``, inclusive). An unknown stream
    is a ConfigError naming the known ones; a stream with no quarantine table yet has no records."""
    definition = tables.quarantine(settings.stream(stream))
    chosen = list(reasons) if reasons else list(QUARANTINE_REASONS)
    view = QuarantineView(stream, definition.name, False, chosen, since, limit)
    data = snapshots.dataset(definition.path(settings))
    if data is None:
        return view
    view.exists = True
    selection = pc.field("reason").isin(chosen)
    if since is not None:
        selection &= pc.field("arrival_time") >= pa.scalar(since, pa.timestamp("us", "UTC"))
    has_line = "line_number" in data.schema.names
    keys = ["reason", "source_file", "arrival_time", "ingest_batch_id", *(["line_number"] if has_line else [])]
    narrow = data.to_table(columns=keys, filter=selection).to_pylist()
    by_reason: dict[str, list[dict[str, Any]]] = {}
    for row in narrow:
        by_reason.setdefault(row["reason"], []).append(row)
    view.counts = sorted(
        (ReasonCount(reason, len(rows), len({r["source_file"] for r in rows}),
                     max((r["arrival_time"] for r in rows if r["arrival_time"] is not None), default=None))
         for reason, rows in by_reason.items()),
        key=lambda c: (-c.records, c.reason),
    )

    def newest_first(row: dict[str, Any]) -> tuple[int, int]:
        return (-(row["ingest_batch_id"] if row["ingest_batch_id"] is not None else -1),
                row.get("line_number") or 0)

    picked = {c.reason: sorted(by_reason[c.reason], key=newest_first)[:limit] for c in view.counts}
    wanted = {(r["reason"], r["ingest_batch_id"], r["source_file"], r.get("line_number"))
              for rows in picked.values() for r in rows}
    if wanted:
        # Only the examples' rows (a batch may hold a whole file of bad lines): per batch, by line number, or by
        # reason where there is none (a file quarantined whole; rows older than the column).
        lines: dict[int | None, set[int]] = {}
        unnumbered: set[tuple[int | None, str]] = set()
        for reason, batch, _file, line in wanted:
            if line is None:
                unnumbered.add((batch, reason))
            else:
                lines.setdefault(batch, set()).add(line)

        def in_batch(batch: int | None) -> pc.Expression:
            return pc.field("ingest_batch_id") == batch if batch is not None else pc.field("ingest_batch_id").is_null()

        terms = [in_batch(b) & pc.field("line_number").isin(sorted(n)) for b, n in lines.items()]
        terms += [in_batch(b) & (pc.field("reason") == r) for b, r in unnumbered]
        which = terms[0]
        for term in terms[1:]:
            which |= term
        rows = data.to_table(filter=selection & which).to_pylist()
        # Rows without a line number (a file quarantined whole; rows older than the column) may share a key.
        full: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
        for row in rows:
            full.setdefault((row["reason"], row["ingest_batch_id"], row["source_file"], row.get("line_number")),
                            []).append(row)
        for count in view.counts:
            for r in picked[count.reason]:
                same = full.get((r["reason"], r["ingest_batch_id"], r["source_file"], r.get("line_number"))) or []
                if same:
                    row = same.pop(0)
                    view.examples.append(Example(
                        row["reason"], source_key(row["source_file"]) if row["source_file"] else None,
                        row.get("line_number"), row["detail"], row["raw"], row["arrival_time"],
                        row["ingest_batch_id"]))
    return view


def _cut(text: str | None, width: int) -> str | None:
    if text is None or len(text) <= width:
        return text
    return text[: width - 3] + "..."


def render_quarantine(view: QuarantineView) -> str:
    filters = []
    if view.reasons != list(QUARANTINE_REASONS):
        filters.append("reason " + ", ".join(view.reasons))
    if view.since is not None:
        filters.append(f"arrived since {fmt_ts(view.since)}")
    where = f" ({'; '.join(filters)})" if filters else ""
    if not view.exists:
        return (f"{view.table}: no table yet (nothing of {view.stream} has been ingested with this home)")
    head = f"{view.table}: {view.total} record(s){where}"
    if not view.counts:
        return head
    out = [head, "", render_table(["reason", "records", "files", "last arrival"],
                                  [[c.reason, c.records, c.files, fmt_ts(c.last_arrival)] for c in view.counts])]
    for count in view.counts:
        examples = [e for e in view.examples if e.reason == count.reason]
        shown = f"{len(examples)} of {count.records}" if len(examples) < count.records else "all"
        out += ["", f"{count.reason} ({shown}, newest file first):"]
        for e in examples:
            line = f"{e.file}:{e.line_number}" if e.line_number is not None else e.file
            out.append(f"  {line}  batch {e.ingest_batch_id}  {e.detail or '-'}")
            if e.raw is not None:
                out.append(f"    {_cut(e.raw, RAW_TEXT)!r}")
    return "\n".join(out)


def quarantine_data(view: QuarantineView) -> dict[str, Any]:
    """``sluice quarantine <stream> --json``: every key always present."""
    return {
        "stream": view.stream,
        "table": view.table,
        "table_exists": view.exists,
        "reasons": view.reasons,
        "since": rfc3339(view.since),
        "total": view.total,
        "counts": {reason: next((c.records for c in view.counts if c.reason == reason), 0)
                   for reason in view.reasons},
        "examples": [
            {"reason": e.reason, "source_file": e.source_file, "file": e.file if e.source_file else None,
             "line_number": e.line_number, "detail": e.detail, "raw": _cut(e.raw, RAW_JSON),
             "raw_chars": None if e.raw is None else len(e.raw), "arrival_time": rfc3339(e.arrival_time),
             "ingest_batch_id": e.ingest_batch_id}
            for e in view.examples
        ],
    }
