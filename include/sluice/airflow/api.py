"""The JSON documents behind ``/sluice/api/...`` (the window-ledger page reads nothing else).

Delta metadata and the small ops tables only, read with delta-rs on the API server: no Spark, so a page
load costs about what ``sluice status`` costs. Timestamps are RFC 3339 UTC strings, as in every
``--json`` document of the CLI.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import quote

from sluice.config import Settings
from sluice.ingest.state import load_state
from sluice.quality.freshness import open_windows
from sluice.quality.outcomes import LATENESS, NO_NULL_KEYS
from sluice.quality.site import docs_site
from sluice.reports.output import COUNTS, rfc3339
from sluice.reports.substreams import substreams_data, summarize
from sluice.storage import tables
from sluice.storage.snapshots import read_small_table
from sluice.windows.ledger import STATES, Ledger, LedgerRow

#: Grid rows, in lifecycle order (late data waiting is ``late_waiting``, apart from the state); any other state
#: found in the ledger is appended after these.
GRID_STATES = STATES

WindowKey = tuple[str, str | None, str | None]  # (pipeline, window_start, window_end) as RFC 3339


def windows_data(settings: Settings, docs_url: Callable[[str], str], *, limit: int = 500,
                 airflow_url: Callable[[str], str] = lambda path: path) -> dict[str, Any]:
    """Per pipeline: its last ``limit`` windows with their ledger state, row and late counts, DQ result and
    Data Docs page. Windows not closed yet (``open``) are counted as ``sluice status`` and freshness count
    them (:func:`sluice.quality.freshness.open_windows`). ``docs_url`` turns a page path relative to the Data
    Docs folder into a URL."""
    dq = _dq_by_window(settings, docs_url)
    for entry in dq.values():
        entry["failures"] = [{"expectation": e, "observed": o, "expected": expected_value(e, o, settings)}
                             for e, o in entry["failures"]]
    ledger = Ledger(settings).rows
    found = sorted({r.state for r in ledger} - set(GRID_STATES))
    pipelines = []
    for name in sorted(settings.registry.pipelines):
        definition = settings.pipeline(name)
        rows = [r for r in ledger if r.pipeline == name]
        windows = [_window(r, dq.get(_key(name, r.window_start, r.window_end)), airflow_url) for r in rows]
        windows += [
            {"window_start": rfc3339(s), "window_end": rfc3339(e), "state": "open", "rows": None, "late_rows": None,
             "late_waiting": None, "closed_by_watermark": None, "detail": None, "dq": None, "docs_url": None,
             "closed_by": None, "validated_by": None}
            for s, e in open_windows(settings, definition, rows)
        ]
        windows.sort(key=lambda w: (w["window_start"], w["window_end"]))
        pipelines.append({
            "pipeline": name,
            "definition": _definition(settings, name, rows),
            "window_seconds": int(definition.window.size.total_seconds()),
            "hop_seconds": int(definition.window.slide.total_seconds()),
            "windows": windows[-limit:],
            "omitted": max(0, len(windows) - limit),
            "substreams": substreams_data([summarize(settings, settings.stream(s)) for s in definition.streams
                                           if settings.stream(s).substream]),
        })
    return {"now": rfc3339(settings.now()), "states": [*GRID_STATES, *found], "pipelines": pipelines}


def _definition(settings: Settings, pipeline: str, rows: list[LedgerRow]) -> dict[str, Any]:
    """The pipeline's definitions (SPEC 9) as its last run saw them: each output's fingerprint and how many
    closed windows an older definition built (an output that went forward), and the last plan a run made,
    when it found a change (``status`` changed or refused, with its text)."""
    from sluice.storage.state import lake_state
    from sluice.streaming.changes import saved_plan
    from sluice.streaming.definitions import recorded_outputs

    state = lake_state(settings)
    outputs = []
    for output, kept in sorted(recorded_outputs(state, pipeline).items()):
        fingerprint = kept.definition.fingerprint
        older = sum(1 for r in rows
                    if r.definition and json.loads(r.definition).get(output, fingerprint) != fingerprint)
        outputs.append({"output": output, "fingerprint": fingerprint, "older_windows": older})
    plan = saved_plan(state, pipeline)
    shown = plan if plan is not None and plan.get("status") in ("changed", "refused") else None
    return {"outputs": outputs, "plan": None if shown is None else {k: shown.get(k) for k in ("status", "text", "at")}}


def streams_data(settings: Settings, *, hours: float = 24) -> dict[str, Any]:
    """Per stream, over the ``hours`` before its last batch arrived: the watermark and the lag behind
    arrival (``max_arrival_time - watermark_after``) of every batch, and accepted, quarantined, late and
    duplicate records per arrival hour. Anchored on the last arrival rather than the clock, so a stream that
    went quiet (or a replayed demo) still shows its last day. Heartbeats carry no arrival time, so they are
    not points; their effect shows in the next batch's watermark.

    Each point has two lags: ``lag_seconds``, arrival minus watermark (how far behind the wall clock the
    stream's watermark was when the batch arrived: years for history landed today), and
    ``event_lag_seconds``, the newest accepted event time seen so far minus the watermark (the lag on the
    data's own clock: the watermark delay, plus any time a slower stream or early record holds it back)."""
    out = []
    for name in sorted(settings.streams):
        rows = load_state(settings, name).rows
        newest: dict[int, datetime] = {}  # batch_id -> newest event time of any batch up to it
        seen: datetime | None = None
        for r in sorted(rows, key=lambda r: r.batch_id):
            if not r.is_heartbeat and r.max_event_time is not None:
                seen = r.max_event_time if seen is None else max(seen, r.max_event_time)
            if seen is not None:
                newest[r.batch_id] = seen
        batches = [r for r in rows if r.max_arrival_time is not None]
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
                 "lag_seconds": (r.max_arrival_time - r.watermark_after).total_seconds(),
                 "event_lag_seconds": (newest[r.batch_id] - r.watermark_after).total_seconds()
                 if r.batch_id in newest else None}
                for r in recent if r.max_arrival_time and r.watermark_after
            ],
            "hourly": [{"hour": rfc3339(h), **hourly[h]} for h in sorted(hourly)],
        })
    return {"hours": hours, "streams": out}


def _key(pipeline: str, start: datetime | None, end: datetime | None) -> WindowKey:
    return (pipeline, rfc3339(start), rfc3339(end))


def _window(r: LedgerRow, dq: dict[str, Any] | None, airflow_url: Callable[[str], str]) -> dict[str, Any]:
    result = {k: v for k, v in dq.items() if k != "docs_url"} if dq else None
    return {
        "window_start": rfc3339(r.window_start), "window_end": rfc3339(r.window_end), "state": r.state,
        "rows": r.rows, "late_rows": r.late_rows, "late_waiting": r.late_waiting,
        "closed_by_watermark": rfc3339(r.closed_by_watermark),
        "detail": r.detail, "dq": result, "docs_url": dq["docs_url"] if dq else None,
        "closed_by": airflow_task_links(r.closed_by, airflow_url),
        "validated_by": airflow_task_links(r.validated_by, airflow_url),
    }


def airflow_task_links(recorded: str | None, airflow_url: Callable[[str], str]) -> dict[str, Any] | None:
    """The Airflow task a ledger row names (``closed_by``, ``validated_by``), with its DAG run's page and the
    task's log in the Airflow UI; None when the row names none (a CLI run)."""
    if not recorded:
        return None
    try:
        task = json.loads(recorded)
        dag, run, task_id = (quote(str(task[k]), safe="") for k in ("dag_id", "run_id", "task_id"))
    except (ValueError, KeyError, TypeError):
        return None
    tries = f"?try_number={task['try_number']}" if task.get("try_number") else ""
    return {**task, "run_url": airflow_url(f"/dags/{dag}/runs/{run}"),
            "log_url": airflow_url(f"/dags/{dag}/runs/{run}/tasks/{task_id}{tries}")}


def expected_value(expectation: str, observed: str, settings: Settings) -> str | None:
    """What a failed expectation expected, read against its observed value (ops/dq_results keeps only the
    observed one), so that the ledger page can show both: "gold 45" against "46 (bronze)"."""
    name = expectation.rsplit(".", 1)[-1]  # an output's checks are prefixed with its name
    if observed.startswith("error:"):
        return None
    if name.startswith("completeness:"):
        found = re.fullmatch(r"gold=(\S+) bronze=(\S+)", observed)
        return f"gold = bronze count ({found.group(2)})" if found else "gold = bronze count"
    if name == LATENESS:
        return f"<= {settings.lateness_threshold:g}"
    if name == NO_NULL_KEYS or " null" in observed:
        return "0 nulls"
    bounds = re.search(r"outside (\[[^]]*\])", observed)
    if bounds:
        return f"every value within {bounds.group(1)}"
    seconds = re.search(r"!= (\d+)s", observed)
    if seconds:
        return f"every window {seconds.group(1)}s long"
    return None


def _dq_by_window(settings: Settings, docs_url: Callable[[str], str]) -> dict[WindowKey, dict[str, Any]]:
    """The latest DQ result of each validated window (ops/dq_results keeps only the latest): expectations
    passed and failed, with the observed value, and its Data Docs page."""
    data = read_small_table(tables.DQ_RESULTS.path(settings))
    out: dict[WindowKey, dict[str, Any]] = {}
    site = docs_site(settings)
    for row in data.to_pylist() if data is not None else []:
        entry = out.setdefault(_key(row["pipeline"], row["window_start"], row["window_end"]),
                               {"passed": 0, "failed": 0, "failures": [], "docs_url": None})
        if row["success"]:
            entry["passed"] += 1
        else:
            entry["failed"] += 1
            entry["failures"].append((row["expectation"], row["observed_value"]))
        # Every row of one validation names the same page (its first failing suite, else its totals).
        page = site.relative(row["docs_path"])  # None for a page elsewhere (a lake moved since)
        if page and entry["docs_url"] is None:
            entry["docs_url"] = docs_url(page)
    return out
