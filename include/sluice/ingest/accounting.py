"""The accounting of ingest, human-readable: where every record went, per stream (lines = accepted +
quarantined + late + duplicates), and table sizes. Metadata only: the numbers come from ops/ingest_batches and
the Delta logs, never from scanning data. Shown after a cycle (sluice.streaming.cycle) and by the CLI."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sluice.config import Settings
from sluice.ingest.state import load_state
from sluice.storage import snapshots


def fmt_ts(value: datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%SZ") if value else "-"


def table_rows(path: str) -> int | None:
    """Row count of a Delta table from its log (numRecords of the live files), or None if absent."""
    table = snapshots.open_table(path)
    if table is None:
        return None
    return sum(f.records or 0 for f in snapshots.live_files(path, table))


def render_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[str(c) for c in header], *[[str(c) for c in r] for r in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
             for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def accounting_table(settings: Settings, streams: Sequence[str]) -> str:
    """lines = accepted + quarantined + late + duplicates, per stream, over every batch so far."""
    rows = []
    for name in streams:
        state = load_state(settings, name)
        t = state.totals()
        check = "ok" if t["lines"] == t["accepted"] + t["quarantined"] + t["late"] + t["duplicates"] else "MISMATCH"
        rows.append([name, t["lines"], t["accepted"], t["quarantined"], t["late"], t["duplicates"], check,
                     fmt_ts(state.watermark), fmt_ts(state.last_arrival)])
    header = ["stream", "lines", "accepted", "quarantined", "late(dlq)", "duplicates", "balance",
              "watermark", "last arrival"]
    return render_table(header, rows)
