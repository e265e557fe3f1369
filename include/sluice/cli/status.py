"""``sluice status``: watermarks, the window ledger and row counts, read from Delta metadata only (no
Spark, so it answers in about a second)."""

from __future__ import annotations

from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any

from sluice.cli.output import rfc3339, stream_totals, window
from sluice.cli.report import accounting_table, fmt_ts, render_table, table_rows
from sluice.config import Settings
from sluice.ingest.landing import load_state, local_path
from sluice.storage import tables
from sluice.storage.ledger import WINDOW_LEDGER, read_ledger

#: The ledger states counted per pipeline, after ``open`` (hours in bronze that no window covers yet).
LEDGER_STATES = ("closed", "validated", "failed", "reprocessed")


def _bronze_hours(settings: Settings, stream: str) -> set[datetime]:
    """Event hours present in bronze, from partition values in the Delta log."""
    return set(tables.bronze_hours(tables.bronze(settings.stream(stream)).path(settings)))


def pipeline_windows(settings: Settings) -> list[dict[str, Any]]:
    """Per registered pipeline: its ledger windows by state, how far windows are closed, and the event hours
    in bronze that no window covers yet (open)."""
    out = []
    for pipeline, definition in sorted(settings.registry.pipelines.items()):
        ledger = read_ledger(settings, pipeline)
        states = Counter(r.state for r in ledger)
        closed_starts = {r.window_start for r in ledger}
        hours = set().union(*(_bronze_hours(settings, s) for s in definition.streams))
        last_closed = max((r.window_end for r in ledger), default=None)
        open_hours = sorted(h for h in hours if h not in closed_starts and (last_closed is None or h >= last_closed))
        out.append({
            "pipeline": pipeline,
            "windows": {"open": len(open_hours), **{state: states.get(state, 0) for state in LEDGER_STATES}},
            "closed_up_to": last_closed,
            "oldest_open": open_hours[0] if open_hours else None,
        })
    return out


def ledger_summary(settings: Settings) -> str:
    rows = [
        [p["pipeline"], *p["windows"].values(), fmt_ts(p["closed_up_to"]), fmt_ts(p["oldest_open"])]
        for p in pipeline_windows(settings)
    ]
    return render_table(
        ["pipeline", "open", *LEDGER_STATES, "closed up to", "oldest open"], rows
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
    rows = [[name, "-" if count is None else count] for name, count in _table_counts(settings)]
    out.append(render_table(["table", "rows"], rows))
    return "\n".join(out)


def _table_counts(settings: Settings) -> list[tuple[str, int | None]]:
    """(table, rows) of every table sluice writes; None for a table that does not exist yet."""
    gold = [(o.table_name, o.path(settings)) for p in settings.registry.pipelines.values() for o in p.outputs]
    named: list[tuple[str, Path]] = [(t.name, t.path(settings)) for t in tables.all_ingest_tables(settings)]
    named += [*gold, *[(t.name, t.path(settings)) for t in (WINDOW_LEDGER, tables.DQ_RESULTS, tables.ALERTS)]]
    return [(name, table_rows(path)) for name, path in named]


def home_warnings(settings: Settings) -> list[str]:
    """What a user should know before reading the numbers: a home that does not exist reports nothing."""
    if settings.home.exists():
        return []
    return [
        f"SLUICE_HOME {settings.home} does not exist: nothing has run with this home yet, so there is nothing to "
        "report; if your runs use another home, set SLUICE_HOME or pass --home (the default is .sluice in the "
        "current directory)"
    ]


def status_data(settings: Settings) -> dict[str, Any]:
    """``sluice status`` as data (``sluice status --json``; an HTTP API can serve the same dict). Every key is
    always present; timestamps are RFC 3339 UTC strings or null."""
    streams = list(settings.streams)
    return {
        "now": rfc3339(settings.now()),
        "home": str(settings.home),
        "home_exists": settings.home.exists(),
        "lake": str(settings.lake),
        "landing": str(settings.landing),
        "pipelines_path": str(settings.registry.path),
        "warnings": home_warnings(settings),
        "streams": stream_totals(settings, streams),
        "pipelines": [
            {**p, "closed_up_to": rfc3339(p["closed_up_to"]), "oldest_open": rfc3339(p["oldest_open"])}
            for p in pipeline_windows(settings)
        ],
        "failed_windows": [
            {"pipeline": r.pipeline, **window(r.window_start, r.window_end), "detail": r.detail}
            for r in read_ledger(settings) if r.state == "failed"
        ],
        "unreadable_files": [{"stream": s, "path": path} for s, path in unreadable_files(settings, streams)],
        "load_errors": [{"file": str(e.file), "message": e.message} for e in settings.registry.errors],
        "tables": [{"table": name, "rows": count} for name, count in _table_counts(settings)],
    }
