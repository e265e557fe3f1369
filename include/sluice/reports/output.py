"""``--json``: one JSON document per command on stdout, for scripts (logs stay on stderr).

Conventions, the same in every document (the README's CLI section lists each shape):

* keys are ``snake_case`` and always present (``null`` or ``[]`` when there is nothing), so a script never
  has to test whether a key exists;
* timestamps are RFC 3339 in UTC with a ``Z`` (``2024-05-01T07:00:00Z``; fractional seconds only when
  there are some); durations are whole seconds in keys ending ``_seconds``;
* ``run``, ``backfill`` and ``check`` carry ``outcome`` (``passed``, ``checks_failed``, ``failed``) and
  ``exit_code`` (the process's exit code); a failed command prints ``{"outcome": "failed", "exit_code": 1,
  "error": {"type": ..., "message": ...}}``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sluice.alerting.outbox import AlertTally
    from sluice.config import Settings
    from sluice.ingest.state import BatchRow
    from sluice.quality.checker import QualityReport
    from sluice.streaming.cycle import CycleResult
    from sluice.streaming.retry import RetryResult
    from sluice.streaming.rewrite import BackfillResult

PASSED = "passed"
CHECKS_FAILED = "checks_failed"
FAILED = "failed"

COUNTS = ("lines", "accepted", "quarantined", "late", "duplicates")


def rfc3339(value: datetime | None) -> str | None:
    """``2024-05-01T10:00:00Z`` (naive values mean UTC, as Spark and Arrow return them), or None."""
    if value is None:
        return None
    moment = value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    return moment.isoformat(timespec="microseconds" if moment.microsecond else "seconds").replace("+00:00", "Z")


def window(start: datetime | None, end: datetime | None) -> dict[str, str | None]:
    return {"window_start": rfc3339(start), "window_end": rfc3339(end)}


def dumps(document: Mapping[str, Any]) -> str:
    """The document as printed: indented, keys in the order built, anything unexpected as its text."""
    return json.dumps(document, indent=2, default=str, ensure_ascii=False)


def error_document(exc_type: str, message: str, exit_code: int) -> dict[str, Any]:
    return {"outcome": FAILED, "exit_code": exit_code, "error": {"type": exc_type, "message": message}}


def quality_data(report: QualityReport | None) -> dict[str, Any] | None:
    """The data-quality step: windows checked, passed and failed (with each failing expectation)."""
    if report is None:
        return None
    return {
        "checked": len(report.checked),
        "passed": len(report.checked) - len(report.failed),
        "failed": [
            {**window(start, end),
             "failures": [{"expectation": e, "observed_value": v} for e, v in failures]}
            for (start, end), failures in sorted(report.failed.items())
        ],
        "data_docs": str(report.docs_index) if report.docs_index else None,
        "alerts_sent_via": list(report.alerts_sent),
    }


def _outcome(report: QualityReport | None) -> str:
    return CHECKS_FAILED if report is not None and report.failed else PASSED


def stream_totals(settings: Settings, streams: Iterable[str]) -> list[dict[str, Any]]:
    """Per stream, over every batch so far: where the lines went, the watermark and the last arrival."""
    from sluice.ingest.state import load_state

    out = []
    for name in streams:
        state = load_state(settings, name)
        totals = state.totals()
        out.append({
            "stream": name,
            **totals,
            "balanced": totals["lines"] == sum(totals[k] for k in COUNTS[1:]),
            "watermark": rfc3339(state.watermark),
            "last_arrival": rfc3339(state.last_arrival),
        })
    return out


def ingest_warnings(batches: Mapping[str, list[BatchRow]], now: datetime) -> list[str]:
    """What a run's ingest warned about: files whose lines were all late (per stream), and, once for the run,
    files that arrived after ``now``."""
    from sluice.ingest.time_rules import all_late, all_late_message, arrived_after, arrived_after_message

    out = [f"{stream}: {all_late_message(row)}" for stream, rows in batches.items() for row in rows if all_late(row)]
    future = arrived_after(batches, now)
    if future:
        out.append(arrived_after_message(future, now))
    return out


def cycle_data(result: CycleResult, exit_code: int) -> dict[str, Any]:
    """``sluice run --json``."""
    totals = {s["stream"]: s for s in stream_totals(result.settings, result.batches)}
    streams = []
    for name, batches in result.batches.items():
        this_cycle = {k: sum(getattr(b, k) for b in batches) for k in COUNTS}
        total = totals[name]
        streams.append({
            "stream": name,
            "batches": len(batches),
            "this_cycle": this_cycle,
            "total": {k: total[k] for k in COUNTS},
            "watermark": total["watermark"],
            "last_arrival": total["last_arrival"],
        })
    closed = result.aggregate.windows if result.aggregate is not None else []
    return {
        "pipeline": result.pipeline,
        "outcome": _outcome(result.quality),
        "exit_code": exit_code,
        "now": rfc3339(result.settings.now()),
        "seconds": round(result.seconds, 3),
        "streams": streams,
        "warnings": ingest_warnings(result.batches, result.settings.now()),
        "windows_closed": [window(s, e) for s, e in closed],
        # Closed windows that late records landed for (now amended), and those re-computed with them.
        "windows_amended": [window(s, e) for s, e in result.amended],
        "windows_corrected": [window(s, e) for s, e in result.corrected],
        "quality": quality_data(result.quality),
        "alerts": alerts_data(result.alerts),
    }


def retry_data(result: RetryResult) -> dict[str, Any]:
    """``sluice retry --json``."""
    return {
        "pipeline": result.pipeline,
        "outcome": _outcome(result.quality),
        "exit_code": result.exit_code,
        "action": "check" if result.check_only else "recompute",
        "include_late": result.include_late,
        "seconds": round(result.seconds, 3),
        "windows": [window(s, e) for s, e in result.windows],
        "backfills": [{"start": rfc3339(s), "end": rfc3339(e)} for s, e in result.ranges],
        "quality": quality_data(result.quality),
        "alerts": alerts_data(result.alerts),
    }


def alerts_data(tally: AlertTally) -> dict[str, int]:
    """What became of the alerts a run recorded: sent, ``no_channel`` (none configured) or pending."""
    return {"sent": tally.sent, "no_channel": tally.unrouted, "pending": tally.pending}


def backfill_data(result: BackfillResult, exit_code: int) -> dict[str, Any]:
    """``sluice backfill --json``."""
    request = result.request
    return {
        "pipeline": request.pipeline.name,
        "outcome": _outcome(result.quality),
        "exit_code": exit_code,
        "start": rfc3339(request.start),
        "end": rfc3339(request.end),
        "include_late": request.include_late,
        "seconds": round(result.seconds, 3),
        "windows": [window(s, e) for s, e in result.windows],
        "rows": dict(result.rows),
        "skipped_open": [window(s, e) for s, e in result.skipped_open],
        "gold_versions": {table: list(pair) for table, pair in sorted(result.gold_versions.items())},
        "late_waiting": [{**window(s, e), "late_waiting": n} for (s, e), n in sorted(result.late_waiting.items())],
        "quality": quality_data(result.quality),
        "alerts": alerts_data(result.alerts),
    }


def check_data(pipeline: str, report: QualityReport, exit_code: int, alerts: AlertTally) -> dict[str, Any]:
    """``sluice check --json``."""
    return {"pipeline": pipeline, "outcome": _outcome(report), "exit_code": exit_code,
            "quality": quality_data(report), "alerts": alerts_data(alerts)}
