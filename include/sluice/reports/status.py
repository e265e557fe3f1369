"""``sluice status``: watermarks, the window ledger and row counts, read from Delta metadata only (no
Spark, so it answers in about a second).

``sluice status --window START [--pipeline P]`` shows one window: its ledger row and, for a window a backfill
or a correction rewrote, what changed in each gold table, by Delta time travel to the versions before and
after (``gold_versions``): the window's rows only, read on the driver with delta-rs.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from sluice.config import ConfigError, Settings
from sluice.ingest.accounting import accounting_table, fmt_ts, render_table, table_rows
from sluice.ingest.files import source_key
from sluice.ingest.state import load_state
from sluice.ingest.time_rules import all_late, all_late_message
from sluice.reports.output import rfc3339, stream_totals, window
from sluice.reports.substreams import render_substreams, substreams_data, summaries
from sluice.storage import snapshots, tables
from sluice.storage.state import LakeState
from sluice.windows.ledger import WINDOW_LEDGER, Ledger, LedgerRow, parse_gold_versions, split_detail

#: The ledger states counted per pipeline, after ``open`` (windows that hold data and are not closed yet,
#: :func:`sluice.quality.freshness.open_windows`): the data-quality lifecycle (SPEC 4). Late data waiting is
#: counted apart, whatever the window's state.
LEDGER_STATES = ("closed", "validated", "failed", "reprocessed")
LATE_WAITING = "late_waiting"


def pipeline_windows(settings: Settings) -> list[dict[str, Any]]:
    """Per registered pipeline, counted in windows of the pipeline, as the ledger page and freshness count
    them: the open ones, the ledger's by state, then those with late data waiting (of any state), how far
    windows are closed and the oldest open one."""
    from sluice.quality.freshness import open_windows

    out = []
    for pipeline, definition in sorted(settings.registry.pipelines.items()):
        ledger = Ledger(settings, pipeline).rows
        states = Counter(r.state for r in ledger)
        still_open = open_windows(settings, definition, ledger)
        out.append({
            "pipeline": pipeline,
            "windows": {"open": len(still_open), **{state: states.get(state, 0) for state in LEDGER_STATES},
                        LATE_WAITING: sum(1 for r in ledger if r.late_waiting > 0)},
            "closed_up_to": max((r.window_end for r in ledger), default=None),
            "oldest_open": still_open[0][0] if still_open else None,
        })
    return out


def ledger_summary(settings: Settings) -> str:
    rows = [
        [p["pipeline"], *p["windows"].values(), fmt_ts(p["closed_up_to"]), fmt_ts(p["oldest_open"])]
        for p in pipeline_windows(settings)
    ]
    return render_table(
        ["pipeline", "open", *LEDGER_STATES, "late waiting", "closed up to", "oldest open"], rows
    )


def waiting_streams(settings: Settings) -> dict[str, list[str]]:
    """Per pipeline, the streams holding all its windows open because no file has arrived for them yet."""
    from sluice.streaming.batch import streams_without_files

    found = {p: streams_without_files(settings, d) for p, d in sorted(settings.registry.pipelines.items())}
    return {p: names for p, names in found.items() if names}


def unreadable_files(settings: Settings, streams: list[str]) -> list[tuple[str, str]]:
    """(stream, local path) of every landing file that could not be read, in batch order."""
    return [
        (name, source_key(r.source_file))
        for name in streams
        for r in load_state(settings, name).rows
        if r.unreadable and r.source_file
    ]


def older_definitions(settings: Settings, state: LakeState | None) -> list[dict[str, Any]]:
    """Per output, the closed windows built by an earlier definition than the one recorded now (an output that
    went forward, SPEC 9): how many, and the range they span. ``sluice backfill`` of a range upgrades them.
    ``state``: the lake's state objects, where the definitions are kept (None: not asked for)."""
    from sluice.streaming.definitions import recorded_outputs

    if state is None:
        return []
    out = []
    for pipeline in sorted(settings.registry.pipelines):
        current = recorded_outputs(state, pipeline)
        rows = Ledger(settings, pipeline).rows
        for output, kept in sorted(current.items()):
            older = sorted(r.window for r in rows if r.definition is not None
                           and json.loads(r.definition).get(output, kept.definition.fingerprint)
                           != kept.definition.fingerprint)
            if older:
                out.append({"pipeline": pipeline, "output": output, "windows": len(older),
                            "current": kept.definition.fingerprint, "from": older[0][0], "to": older[-1][1]})
    return out


def kafka_warnings(settings: Settings, state: LakeState | None) -> list[str]:
    """A warning per Kafka stream whose topic stamps records with the producer's clock (``CreateTime``), as its
    ingest last found it: arrival times are then the producers', not the broker's (SPEC 2)."""
    from sluice.ingest.topics import CREATE_TIME, checkpoint_path

    out = []
    for name, spec in sorted(settings.streams.items()):
        if spec.source is None or state is None:
            continue
        topic = state.read_json(*checkpoint_path(name, "kafka_topic.json"))
        if topic is not None and topic.get("timestamp_type") == CREATE_TIME:
            out.append(f"stream {name}: Kafka topic {topic.get('topic')} uses CreateTime, so each record's arrival "
                       "time is its producer's clock and the early rule trusts it; set message.timestamp.type="
                       "LogAppendTime on the topic for the broker's arrival times")
    return out


def render_status(settings: Settings, state: LakeState | None = None) -> str:
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
    out += render_substreams(summaries(settings))
    topics = kafka_warnings(settings, state)
    if topics:
        out += ["", "warnings:", *(f"  {w}" for w in topics)]
    unreadable = unreadable_files(settings, streams)
    if unreadable:
        out += ["", "unreadable landing files (quarantined whole, reason unreadable_file; land a good copy under a "
                    "new name):"]
        out += [f"  {stream}: {path}" for stream, path in unreadable]
    waiting = waiting_streams(settings)
    if waiting:
        out += ["", "windows held open by streams that have received no file or record yet:"]
        for pipeline, names in waiting.items():
            topics = [f"{n} (Kafka topic {spec.source.topic})" for n in names
                      if (spec := settings.stream(n)).source is not None]
            folders = [n for n in names if settings.stream(n).source is None]
            where = [f"{', '.join(folders)} (land files in {settings.landing.uri}/<stream>/)"] if folders else []
            out.append(f"  {pipeline}: {'; '.join([*where, *topics])}")
    replayed = [(name, r) for name in streams for r in load_state(settings, name).rows if all_late(r)]
    if replayed:
        out += ["", "landing files whose lines were all late (in dlq/<stream>):"]
        out += [f"  {stream}: {all_late_message(r)}" for stream, r in replayed[-10:]]
    if settings.registry.errors:
        out += ["", "pipeline files that failed to load:"]
        out += [f"  {e}" for e in settings.registry.errors]
    older = older_definitions(settings, state)
    if older:
        out += ["", "windows built by an older definition (on_change='forward'; `sluice backfill` of a range "
                    "upgrades them):"]
        out += [f"  {o['pipeline']}: {o['windows']} window(s) built by an older definition of gold/{o['output']} "
                f"({fmt_ts(o['from'])} .. {fmt_ts(o['to'])}); current {o['current']}" for o in older]
    ledger = Ledger(settings).rows
    failed = [r for r in ledger if r.state == "failed"]
    if failed:
        out += ["", "failed windows:"]
        out += [f"  {r.pipeline} {r.window_start:%Y-%m-%d %H:%M}: {r.detail}" for r in failed[-10:]]
    late = [r for r in ledger if r.late_waiting > 0]
    if late:
        out += ["", "windows with late data waiting (late records not in gold yet; `sluice status --window START` "
                    "for one):"]
        # The findings of a failed window are listed above: here, what is to be done about its late data.
        out += [f"  {r.pipeline} {r.window_start:%Y-%m-%d %H:%M} ({r.state}, {r.late_waiting} waiting): "
                f"{split_detail(r.detail)[1] or r.detail}" for r in late[-10:]]
    out += ["", "tables (rows):"]
    rows = [[name, "-" if count is None else count] for name, count in _table_counts(settings)]
    out.append(render_table(["table", "rows"], rows))
    return "\n".join(out)


def _table_counts(settings: Settings) -> list[tuple[str, int | None]]:
    """(table, rows) of every table sluice writes; None for a table that does not exist yet."""
    gold = [(o.table_name, o.path(settings)) for p in settings.registry.pipelines.values() for o in p.outputs]
    named: list[tuple[str, str]] = [(t.name, t.path(settings)) for t in tables.all_ingest_tables(settings)]
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


def status_data(settings: Settings, state: LakeState | None = None) -> dict[str, Any]:
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
        "warnings": home_warnings(settings) + kafka_warnings(settings, state),
        "streams": stream_totals(settings, streams),
        "substreams": substreams_data(summaries(settings)),
        "pipelines": [
            {**p, "closed_up_to": rfc3339(p["closed_up_to"]), "oldest_open": rfc3339(p["oldest_open"])}
            for p in pipeline_windows(settings)
        ],
        "failed_windows": [
            {"pipeline": r.pipeline, **window(r.window_start, r.window_end), "detail": r.detail}
            for r in Ledger(settings).rows if r.state == "failed"
        ],
        "unreadable_files": [{"stream": s, "path": path} for s, path in unreadable_files(settings, streams)],
        "older_definitions": [{**o, "from": rfc3339(o["from"]), "to": rfc3339(o["to"])}
                              for o in older_definitions(settings, state)],
        "load_errors": [{"file": str(e.file), "message": e.message} for e in settings.registry.errors],
        "tables": [{"table": name, "rows": count} for name, count in _table_counts(settings)],
    }


# -- one window: sluice status --window --------------------------------------------------------------------
@dataclass
class TableChange:
    """One gold table's rows of a window at the versions before and after its last rewrite."""

    table: str
    version_before: int
    version_after: int
    keys: tuple[str, ...]
    added: list[dict[str, Any]] = field(default_factory=list)
    removed: list[dict[str, Any]] = field(default_factory=list)
    # (key, {column: (before, after)}) for rows present at both versions whose values differ
    changed: list[tuple[dict[str, Any], dict[str, tuple[Any, Any]]]] = field(default_factory=list)
    unchanged: int = 0
    error: str | None = None  # a version that cannot be read any more (vacuumed)


def find_windows(settings: Settings, start: datetime, pipeline: str | None) -> list[LedgerRow]:
    """The ledger rows of windows starting at ``start`` (of ``pipeline``, or of every pipeline); a message
    that says what exists when there is none."""
    if pipeline is not None:
        settings.pipeline(pipeline)  # an unknown name says which ones exist
    ledger = Ledger(settings, pipeline).rows
    found = [r for r in ledger if r.window_start == start]
    if not found:
        whose = f"of {pipeline} " if pipeline else ""
        known = (f"closed windows {whose}start from {rfc3339(ledger[0].window_start)} to "
                 f"{rfc3339(ledger[-1].window_start)}" if ledger else f"no window {whose}has closed yet")
        raise ConfigError(f"no window {whose}starts at {rfc3339(start)} in ops/window_ledger; {known} "
                          "(`sluice status` lists them by state)")
    return found


def _window_rows(path: str, version: int, row: LedgerRow) -> list[dict[str, Any]]:
    """The gold rows of the window at ``version`` (time travel), without the window bounds."""
    dataset = snapshots.dataset(path, version)
    if dataset is None:
        return []
    utc = pa.timestamp("us", "UTC")
    only = (pc.field("window_start") == pa.scalar(row.window_start, utc)) & (
        pc.field("window_end") == pa.scalar(row.window_end, utc))
    rows = dataset.to_table(filter=only).to_pylist()
    return [{k: v for k, v in r.items() if k not in ("window_start", "window_end")} for r in rows]


def diff_rows(change: TableChange, before: Sequence[Mapping[str, Any]], after: Sequence[Mapping[str, Any]]) -> None:
    """Fill ``change`` with the rows added, removed and changed between two versions, matched by key."""
    def key(r: Mapping[str, Any]) -> tuple[Any, ...]:
        return tuple(r.get(k) for k in change.keys)

    def order(k: tuple[Any, ...]) -> tuple[Any, ...]:
        return tuple((v is not None, str(v)) for v in k)

    old = {key(r): dict(r) for r in before}
    new = {key(r): dict(r) for r in after}
    for k in sorted(set(old) | set(new), key=order):
        if k not in old:
            change.added.append(new[k])
        elif k not in new:
            change.removed.append(old[k])
        else:
            columns = {c: (old[k].get(c), new[k].get(c)) for c in {**old[k], **new[k]}
                       if c not in change.keys and old[k].get(c) != new[k].get(c)}
            if columns:
                change.changed.append((dict(zip(change.keys, k, strict=True)), columns))
            else:
                change.unchanged += 1


def window_changes(settings: Settings, row: LedgerRow) -> list[TableChange]:
    """Per gold table of the window's last rewrite: its rows at the versions before and after."""
    registered = row.pipeline in settings.registry.pipelines
    keys = {o.table_name: o.keys for o in settings.pipeline(row.pipeline).outputs} if registered else {}
    changes = []
    for table, (before, after) in sorted(parse_gold_versions(row.gold_versions).items()):
        path = settings.lake.table(table)
        try:
            old, new = _window_rows(path, before, row), _window_rows(path, after, row)
        except Exception as exc:  # a vacuumed version (its files are gone) or a dropped table
            changes.append(TableChange(table, before, after, (), error=f"{type(exc).__name__}: {exc}"))
            continue
        # Without the definition (a pipeline no longer registered) the non-numeric columns are the key.
        sample = (old or new or [{}])[0]
        columns = keys.get(table) or tuple(c for c, v in sample.items() if not isinstance(v, int | float))
        change = TableChange(table, before, after, tuple(columns))
        diff_rows(change, old, new)
        changes.append(change)
    return changes


def _json_value(value: Any) -> Any:
    return rfc3339(value) if isinstance(value, datetime) else value


def _json_row(row: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _json_value(v) for k, v in row.items()}


def change_data(change: TableChange) -> dict[str, Any]:
    return {
        "table": change.table,
        "version_before": change.version_before,
        "version_after": change.version_after,
        "keys": list(change.keys),
        "added": [_json_row(r) for r in change.added],
        "removed": [_json_row(r) for r in change.removed],
        "changed": [{"key": _json_row(k), "columns": {c: {"before": _json_value(b), "after": _json_value(a)}
                                                      for c, (b, a) in sorted(cols.items())}}
                    for k, cols in change.changed],
        "unchanged": change.unchanged,
        "error": change.error,
    }


def window_data(settings: Settings, start: datetime, pipeline: str | None = None) -> dict[str, Any]:
    """``sluice status --window START --json``: every key always present."""
    windows = []
    for row in find_windows(settings, start, pipeline):
        versions = parse_gold_versions(row.gold_versions)
        windows.append({
            "pipeline": row.pipeline,
            **window(row.window_start, row.window_end),
            "state": row.state,
            "closed_by_watermark": rfc3339(row.closed_by_watermark),
            "closed_at": rfc3339(row.closed_at),
            "updated_at": rfc3339(row.updated_at),
            "rows": row.rows,
            "late_rows": row.late_rows,
            "late_waiting": row.late_waiting,
            "attempt": row.attempt,
            "detail": row.detail,
            "gold_versions": {t: {"before": b, "after": a} for t, (b, a) in sorted(versions.items())} or None,
            "changes": [change_data(c) for c in window_changes(settings, row)],
        })
    return {"now": rfc3339(settings.now()), "home": str(settings.home), "window_start": rfc3339(start),
            "pipeline": pipeline, "windows": windows}


def _cells(row: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={_shown(v)}" for k, v in row.items())


def _shown(value: Any) -> str:
    if isinstance(value, float):
        return format(value, ".10g")
    if isinstance(value, datetime):
        return rfc3339(value) or "-"
    return "null" if value is None else str(value)


def render_change(change: TableChange) -> list[str]:
    head = f"  {change.table}: version {change.version_before} -> {change.version_after}"
    if change.error:
        return [f"{head}: cannot be read any more ({change.error}); time travel reaches as far as VACUUM "
                "keeps files (vacuum_retention_hours)"]
    lines = [f"{head}: {len(change.changed)} changed, {len(change.added)} added, {len(change.removed)} removed, "
             f"{change.unchanged} unchanged row(s)"]
    for key, columns in change.changed:
        lines.append(f"    ~ {_cells(key)}: " + ", ".join(
            f"{c} {_shown(b)} -> {_shown(a)}" for c, (b, a) in sorted(columns.items())))
    lines += [f"    + {_cells(r)}" for r in change.added]
    lines += [f"    - {_cells(r)}" for r in change.removed]
    return lines


def render_window(settings: Settings, start: datetime, pipeline: str | None = None) -> str:
    out: list[str] = []
    for row in find_windows(settings, start, pipeline):
        if out:
            out.append("")
        out += [
            f"{row.pipeline} window [{fmt_ts(row.window_start)}, {fmt_ts(row.window_end)}): {row.state}",
            f"  closed at {fmt_ts(row.closed_at)} (watermark {fmt_ts(row.closed_by_watermark)}); "
            f"updated {fmt_ts(row.updated_at)}",
            f"  gold rows {row.rows}, late records {row.late_rows} (not in gold yet: {row.late_waiting}), "
            f"validation rounds {row.attempt}",
            f"  detail: {row.detail or '-'}",
        ]
        changes = window_changes(settings, row)
        if not changes:
            out.append("  no backfill or correction has rewritten this window: nothing to compare")
        for change in changes:
            out += render_change(change)
    return "\n".join(out)
