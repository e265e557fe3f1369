"""The JSON documents behind ``/sluice/api/...`` (the window-ledger page reads nothing else).

Delta metadata and the small ops tables only, read with delta-rs on the API server: no Spark, so a page
load costs about what ``sluice status`` costs. Timestamps are RFC 3339 UTC strings, as in every
``--json`` document of the CLI.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from sluice.cli.output import COUNTS, rfc3339
from sluice.config import Settings
from sluice.ingest.landing import load_state
from sluice.quality.checker import docs_dir
from sluice.quality.freshness import open_windows
from sluice.storage import tables
from sluice.storage.engine import read_small_table
from sluice.storage.ledger import STATES, LedgerRow, read_ledger

#: Grid rows, in lifecycle order (late data waiting is ``late_waiting``, apart from the state); any other state
#: found in the ledger is appended after these.
GRID_STATES = STATES

WindowKey = tuple[str, str | None, str | None]  # (pipeline, window_start, window_end) as RFC 3339


def windows_data(settings: Settings, docs_url: Callable[[str], str], *, limit: int = 500) -> dict[str, Any]:
    """Per pipeline: its last ``limit`` windows with their ledger state, row and late counts, DQ result and
    Data Docs page. Windows not closed yet (``open``) are counted as ``sluice status`` and freshness count
    them (:func:`sluice.quality.freshness.open_windows`). ``docs_url`` turns a page path relative to the Data
    Docs folder into a URL."""
    dq = _dq_by_window(settings, docs_url)
    ledger = read_ledger(settings)
    found = sorted({r.state for r in ledger} - set(GRID_STATES))
    pipelines = []
    for name in sorted(settings.registry.pipelines):
        definition = settings.pipeline(name)
        rows = [r for r in ledger if r.pipeline == name]
        windows = [_window(r, dq.get(_key(name, r.window_start, r.window_end))) for r in rows]
        windows += [
            {"window_start": rfc3339(s), "window_end": rfc3339(e), "state": "open", "rows": None, "late_rows": None,
             "late_waiting": None, "closed_by_watermark": None, "detail": None, "dq": None, "docs_url": None}
            for s, e in open_windows(settings, definition, rows)
        ]
        windows.sort(key=lambda w: (w["window_start"], w["window_end"]))
        pipelines.append({
            "pipeline": name,
            "window_seconds": int(definition.window.size.total_seconds()),
            "hop_seconds": int(definition.window.slide.total_seconds()),
            "windows": windows[-limit:],
            "omitted": max(0, len(windows) - limit),
        })
    return {"now": rfc3339(settings.now()), "states": [*GRID_STATES, *found], "pipelines": pipelines}


def streams_data(settings: Settings, *, hours: float = 24) -> dict[str, Any]:
    """Per stream, over the ``hours`` before its last batch arrived: the watermark and the lag behind
    arrival (``max_arrival_time - watermark_after``) of every batch, and accepted, quarantined, late and
    duplicate records per arrival hour. Anchored on the last arrival rather than the clock, so a stream that
    went quiet (or a replayed demo) still shows its last day. Heartbeats carry no arrival time, so they are
    not points; their effect shows in the next batch's watermark."""
    out = []
    for name in sorted(settings.streams):
        batches = [r for r in load_state(settings, name).rows if r.max_arrival_time is not None]
        until = max((r.max_arrival_time for r in batches if r.max_arrival_time), default=None)
        since = until - timedelta(hours=hours) if until else None
        recent = [r for r in batches if since and r.max_arrival_time and r.max_arrival_time >= since]
        hourly: dict[datetime, dict[str, int]] = defaultdict(lambda: dict.fromkeys(COUNTS, 0))
        for r in recent:
            assert r.max_arrival_time is not None
            bucket = hourly[r.max_arrival_time.replace(minute=0, second=0, microsecond=0)]
            for k in COUNTS:
                bucket[k] += getattr(r, k)
        out.append({
            "stream": name,
            "since": rfc3339(since),
            "until": rfc3339(until),
            "points": [
                {"batch_id": r.batch_id, "arrival": rfc3339(r.max_arrival_time),
                 "watermark": rfc3339(r.watermark_after),
                 "lag_seconds": (r.max_arrival_time - r.watermark_after).total_seconds()}
                for r in recent if r.max_arrival_time and r.watermark_after
            ],
            "hourly": [{"hour": rfc3339(h), **hourly[h]} for h in sorted(hourly)],
        })
    return {"hours": hours, "streams": out}


def _key(pipeline: str, start: datetime | None, end: datetime | None) -> WindowKey:
    return (pipeline, rfc3339(start), rfc3339(end))


def _window(r: LedgerRow, dq: dict[str, Any] | None) -> dict[str, Any]:
    result = {k: v for k, v in dq.items() if k != "docs_url"} if dq else None
    return {
        "window_start": rfc3339(r.window_start), "window_end": rfc3339(r.window_end), "state": r.state,
        "rows": r.rows, "late_rows": r.late_rows, "late_waiting": r.late_waiting,
        "closed_by_watermark": rfc3339(r.closed_by_watermark),
        "detail": r.detail, "dq": result, "docs_url": dq["docs_url"] if dq else None,
    }


def _dq_by_window(settings: Settings, docs_url: Callable[[str], str]) -> dict[WindowKey, dict[str, Any]]:
    """The latest DQ result of each validated window (ops/dq_results keeps only the latest): expectations
    passed and failed, with the observed value, and its Data Docs page."""
    data = read_small_table(tables.DQ_RESULTS.path(settings))
    out: dict[WindowKey, dict[str, Any]] = {}
    root = docs_dir(settings).resolve()
    for row in data.to_pylist() if data is not None else []:
        entry = out.setdefault(_key(row["pipeline"], row["window_start"], row["window_end"]),
                               {"passed": 0, "failed": 0, "failures": [], "docs_url": None})
        if row["success"]:
            entry["passed"] += 1
        else:
            entry["failed"] += 1
            entry["failures"].append(f"{row['expectation']} ({row['observed_value']})")
        # Every row of one validation names the same page (its first failing suite, else its totals).
        page = _docs_page(root, row["docs_path"])
        if page and entry["docs_url"] is None:
            entry["docs_url"] = docs_url(page)
    return out


def _docs_page(root: Path, docs_path: str | None) -> str | None:
    """The page's path inside the Data Docs folder, or None for a page elsewhere (a home moved since)."""
    if not docs_path:
        return None
    page = Path(docs_path).resolve()
    return page.relative_to(root).as_posix() if page.is_relative_to(root) else None
