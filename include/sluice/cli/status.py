"""``sluice status``: watermarks, the window ledger and row counts, read from Delta metadata only (no
Spark, so it answers in about a second)."""

from __future__ import annotations

from collections import Counter
from datetime import datetime

from sluice.cli.report import accounting_table, fmt_ts, render_table, table_rows
from sluice.config import Settings
from sluice.ingest.landing import load_state, local_path
from sluice.storage import tables
from sluice.storage.ledger import WINDOW_LEDGER, read_ledger


def _bronze_hours(settings: Settings, stream: str) -> set[datetime]:
    """Event hours present in bronze, from partition values in the Delta log."""
    return set(tables.bronze_hours(tables.bronze(settings.stream(stream)).path(settings)))


def ledger_summary(settings: Settings) -> str:
    rows = []
    for pipeline, definition in sorted(settings.registry.pipelines.items()):
        streams = definition.streams
        ledger = read_ledger(settings, pipeline)
        states = Counter(r.state for r in ledger)
        closed_starts = {r.window_start for r in ledger}
        hours = set().union(*(_bronze_hours(settings, s) for s in streams))
        last_closed = max((r.window_end for r in ledger), default=None)
        open_hours = sorted(h for h in hours if h not in closed_starts and (last_closed is None or h >= last_closed))
        rows.append([
            pipeline,
            len(open_hours),
            states.get("closed", 0),
            states.get("validated", 0),
            states.get("failed", 0),
            states.get("reprocessed", 0),
            fmt_ts(last_closed),
            fmt_ts(open_hours[0]) if open_hours else "-",
        ])
    return render_table(
        ["pipeline", "open", "closed", "validated", "failed", "reprocessed", "closed up to", "oldest open"], rows
    )


def unreadable_files(settings: Settings, streams: list[str]) -> list[tuple[str, str]]:
    """(stream, local path) of every landing file that could not be read, in batch order."""
    return [
        (name, local_path(r.source_file))
        for name in streams
        for r in load_state(settings, name).rows
        if r.unreadable and r.source_file
    ]


def render_status(settings: Settings) -> str:
    streams = list(settings.streams)
    out = [
        f"SLUICE_HOME={settings.home}",
        f"lake={settings.lake}",
        "",
        "streams (where every line went):",
        accounting_table(settings, streams),
        "",
        "windows (ops/window_ledger):",
        ledger_summary(settings),
    ]
    unreadable = unreadable_files(settings, streams)
    if unreadable:
        out += ["", "unreadable landing files (quarantined whole, reason unreadable_file; land a good copy under a "
                    "new name):"]
        out += [f"  {stream}: {path}" for stream, path in unreadable]
    if settings.registry.errors:
        out += ["", "pipeline files that failed to load:"]
        out += [f"  {e}" for e in settings.registry.errors]
    failed = [r for r in read_ledger(settings) if r.state == "failed"]
    if failed:
        out += ["", "failed windows:"]
        out += [f"  {r.pipeline} {r.window_start:%Y-%m-%d %H:%M}: {r.detail}" for r in failed[-10:]]
    out += ["", "tables (rows):"]
    rows = []
    gold = [(o.table_name, o.path(settings)) for p in settings.registry.pipelines.values() for o in p.outputs]
    named = [(t.name, t.path(settings)) for t in tables.all_ingest_tables(settings)]
    named += [*gold, *[(t.name, t.path(settings)) for t in (WINDOW_LEDGER, tables.DQ_RESULTS, tables.ALERTS)]]
    for name, path in named:
        count = table_rows(path)
        rows.append([name, "-" if count is None else count])
    out.append(render_table(["table", "rows"], rows))
    return "\n".join(out)
