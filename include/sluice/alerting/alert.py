"""The alert itself, free of Airflow: what a closed window's failure (or a notice) says, as a webhook payload
and as an email. :mod:`sluice.alerting.notifiers` delivers it through Airflow's notifiers; everything that
only builds, records or reads alerts (data quality, the ops/alerts outbox, corrections, freshness) imports
this module instead, so that a cycle whose checks pass never pays Airflow's import (seconds)."""

from __future__ import annotations

import hashlib
import html
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:  # a type only: importing this module must stay light (no PySpark)
    from sluice.core.windows import Window


def _utc(value: datetime) -> datetime:
    # Window bounds come back from Spark/Arrow naive but mean UTC; aware values may be in any zone.
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _rfc3339(value: datetime) -> str:
    """``2024-05-01T10:00:00Z``; fractional seconds only when there are some."""
    moment = _utc(value)
    return moment.isoformat(timespec="microseconds" if moment.microsecond else "seconds").replace("+00:00", "Z")


def one_line(value: object) -> str:
    # Observed values may be multi-line reprs; the alert message must stay one line for logs and subjects.
    return " ".join(str(value).split())


#: The Airflow connections that route alerts (:mod:`sluice.alerting.notifiers` delivers through them). Here, so
#: that naming them (in a cycle's summary) does not import Airflow.
WEBHOOK_CONN_ID = "sluice_webhook"
SMTP_CONN_ID = "sluice_smtp"

#: Alert kinds: a closed window failed its checks; landing files could not be read (quarantined whole); a
#: closed window was re-computed with its late records (a notice, level info); a window stayed open past
#: end + lateness_bound + freshness_grace; an Airflow task of sluice crashed; a Kafka topic's retention deleted
#: offsets before they were read.
DQ_FAILURE = "dq_failure"
UNREADABLE_FILE = "unreadable_file"
CORRECTION = "correction"
STALE = "stale"
TASK_FAILURE = "task_failure"
KAFKA_OFFSETS_LOST = "kafka_offsets_lost"
SILENT_SUBSTREAM = "silent_substream"
KINDS = (DQ_FAILURE, UNREADABLE_FILE, CORRECTION, STALE, TASK_FAILURE, KAFKA_OFFSETS_LOST, SILENT_SUBSTREAM)
#: The level of each kind: only notices are informational.
LEVELS = {DQ_FAILURE: "error", UNREADABLE_FILE: "error", CORRECTION: "info", STALE: "error", TASK_FAILURE: "error",
          KAFKA_OFFSETS_LOST: "error", SILENT_SUBSTREAM: "error"}


@dataclass(frozen=True)
class Alert:
    """One data-quality failure of one closed window of one pipeline (kind ``dq_failure``), or the landing
    files a cycle of it could not read (kind ``unreadable_file``: no window, one item per file)."""

    pipeline: str
    window_start: datetime | None
    window_end: datetime | None
    failed: list[dict[str, str]]  # each {"expectation": ..., "observed_value": ...}
    docs_url: str | None  # the Data Docs page to look at (a URL, never a server path)
    raised_at: datetime
    kind: str = DQ_FAILURE
    # With pipeline, window and kind, the alert's key in the ops/alerts outbox: a window's n-th validation
    # round (or correction) raises attempt n, so a retried task re-raises the same alert, not a new one.
    attempt: int = 1

    @property
    def level(self) -> str:
        """``error`` for failures, ``info`` for notices (corrections)."""
        return LEVELS.get(self.kind, "error")

    @property
    def alert_id(self) -> str:
        """The outbox key as one stable string: ``<pipeline>/<start>/<end>/<kind>/<attempt>``. Alerts with no
        window (unreadable files, task failures) add a digest of what they report, so that the same files
        or the same failed task instance give the same id on a retry, and different ones do not collide."""
        start = _rfc3339(self.window_start) if self.window_start else "-"
        end = _rfc3339(self.window_end) if self.window_end else "-"
        key = f"{self.pipeline}/{start}/{end}/{self.kind}/{self.attempt}"
        if self.window_start is None:
            items = json.dumps(self.failed, sort_keys=True).encode("utf-8")
            key += "/" + hashlib.sha256(items).hexdigest()[:12]
        return key

    @classmethod
    def unreadable_files(cls, pipeline: str, files: Iterable[tuple[str, str]], raised_at: datetime) -> Alert:
        """``files``: (stream, path) of each landing file quarantined whole in one cycle."""
        failed = [{"expectation": f"{UNREADABLE_FILE}:{stream}", "observed_value": path} for stream, path in files]
        return cls(pipeline, None, None, failed, None, raised_at, UNREADABLE_FILE)

    @classmethod
    def kafka_offsets_lost(cls, pipeline: str, batches: Iterable[tuple[str, str, int]], raised_at: datetime) -> Alert:
        """``batches``: (stream, micro-batch address, offsets lost) of each Kafka micro-batch that could not read
        offsets the topic's retention had deleted."""
        failed = [{"expectation": f"{KAFKA_OFFSETS_LOST}:{stream}", "observed_value": f"{lost} offset(s) of {where}"}
                  for stream, where, lost in batches]
        return cls(pipeline, None, None, failed, None, raised_at, KAFKA_OFFSETS_LOST)

    @classmethod
    def silent_substreams(cls, pipeline: str, silent: Iterable[tuple[str, str, datetime]], raised_at: datetime
                          ) -> Alert:
        """``silent``: (stream, substream key, its last arrival) of substreams silent for the stream's
        ``idle_timeout`` while their stream is live (SPEC 3): a device that stopped sending, or lost its clock."""
        failed = [{"expectation": f"freshness:{stream}/{key}", "observed_value": f"silent since {_rfc3339(last)}"}
                  for stream, key, last in silent]
        return cls(pipeline, None, None, failed, None, raised_at, SILENT_SUBSTREAM)

    @classmethod
    def stale(cls, pipeline: str, window: Window, due: datetime,
              holding: Mapping[str, datetime | str | None], raised_at: datetime, docs_url: str | None = None
              ) -> Alert:
        """The window was due closed at ``due`` (see :mod:`sluice.quality.freshness`) and is still open;
        ``holding``: the stream(s) holding it back -> their watermark, or why they have none (text)."""
        def state(mark: datetime | str | None) -> str:
            if isinstance(mark, datetime):
                return f"watermark {_rfc3339(mark)}"
            return mark or "no watermark yet"

        failed = [{"expectation": f"freshness:{stream}",
                   "observed_value": f"{state(mark)}, window due closed by {_rfc3339(due)}"}
                  for stream, mark in sorted(holding.items())]
        return cls(pipeline, window[0], window[1], failed, docs_url, raised_at, STALE)

    @classmethod
    def task_failure(cls, pipeline: str, context: Mapping[str, Any], raised_at: datetime) -> Alert:
        """An Airflow task of the pipeline failed for good (its retries used up): its on_failure_callback."""
        event = task_event(context)
        ti = context.get("ti") or context.get("task_instance")
        try_number = getattr(ti, "try_number", None)
        failed = [{"expectation": f"task:{event['dag_id']}.{event['task_id']}",
                   "observed_value": f"run {event['run_id']}"
                                     + (f" try {try_number}" if try_number else "")
                                     + (f": {event['exception']}" if event["exception"] else "")}]
        return cls(pipeline, None, None, failed, None, raised_at, TASK_FAILURE)

    @property
    def window_label(self) -> str:
        """``2024-05-01 10:00-11:00 UTC``; the end gets its date too when the window spans a day or more."""
        if self.window_start is None or self.window_end is None:
            return "-"
        start, end = _utc(self.window_start), _utc(self.window_end)
        end_format = "%H:%M" if timedelta(0) < end - start < timedelta(days=1) else "%Y-%m-%d %H:%M"
        return f"{start:%Y-%m-%d %H:%M}-{end.strftime(end_format)} UTC"

    @property
    def summary(self) -> str:
        """Pipeline, window and the number of failed checks: the email subject."""
        count = len(self.failed)
        if self.kind == CORRECTION:
            return f"sluice: {self.pipeline} window {self.window_label} corrected with its late records"
        if self.kind == STALE:
            return f"sluice: {self.pipeline} window {self.window_label} is stale: not closed in time"
        if self.kind == TASK_FAILURE:
            return f"sluice: {self.pipeline}: an Airflow task failed"
        if self.kind == UNREADABLE_FILE:
            files = "1 landing file could not be read and was" if count == 1 else (
                f"{count} landing files could not be read and were")
            return f"sluice: {self.pipeline}: {files} quarantined whole (unreadable_file)"
        if self.kind == KAFKA_OFFSETS_LOST:
            return (f"sluice: {self.pipeline}: Kafka offsets were deleted by the topic's retention before they were "
                    "read (kafka_offsets_lost)")
        if self.kind == SILENT_SUBSTREAM:
            keys = "1 substream has" if count == 1 else f"{count} substreams have"
            return f"sluice: {self.pipeline}: {keys} been silent past idle_timeout while the stream is live"
        checks = f"{count} check" if count == 1 else f"{count} checks"
        return f"sluice: {self.pipeline} window {self.window_label} failed {checks}"

    @property
    def message(self) -> str:
        """One readable line, e.g. ``sluice: p window 2024-05-01 10:00-11:00 UTC failed 1 check: c (x=1)``."""
        details = []
        for item in self.failed:
            name = one_line(item.get("expectation", "?"))
            observed = one_line(item.get("observed_value", ""))
            details.append(f"{name} ({observed})" if observed else name)
        return f"{self.summary}: {', '.join(details)}" if details else self.summary

    def payload(self) -> dict[str, Any]:
        """The webhook JSON body."""
        return {
            "event": "sluice.dq_failure" if self.kind == DQ_FAILURE else f"sluice.{self.kind}",
            "pipeline": self.pipeline,
            "window_start": _rfc3339(self.window_start) if self.window_start else None,
            "window_end": _rfc3339(self.window_end) if self.window_end else None,
            "failed": [
                {"expectation": str(item.get("expectation", "")), "observed_value": str(item.get("observed_value", ""))}
                for item in self.failed
            ],
            "docs_url": self.docs_url,
            "message": self.message,
            "raised_at": _rfc3339(self.raised_at),
            "kind": self.kind,
            "level": self.level,
            "attempt": self.attempt,
            # Receivers can drop repeats by this id: delivery is at-least-once when a crash falls between
            # sending and recording the delivery.
            "alert_id": self.alert_id,
        }

    def email(self) -> tuple[str, str]:
        """(subject, HTML body). Everything is escaped: observed values are data, not markup."""
        rows = "".join(
            f"<li><b>{html.escape(str(item.get('expectation', '?')))}</b>: "
            f"{html.escape(str(item.get('observed_value', '')))}</li>"
            for item in self.failed
        )
        docs = (f'<p>Data Docs: <a href="{html.escape(self.docs_url)}">{html.escape(self.docs_url)}</a></p>'
                if self.docs_url else "")
        window = (
            f"<br>Window: {html.escape(_rfc3339(self.window_start))} to {html.escape(_rfc3339(self.window_end))}"
            if self.window_start and self.window_end else ""
        )
        heading = {DQ_FAILURE: "Failed expectations", UNREADABLE_FILE: "Files quarantined whole",
                   CORRECTION: "What changed (before -> after)", STALE: "Streams holding it back",
                   TASK_FAILURE: "Failed task", KAFKA_OFFSETS_LOST: "Offsets lost to retention",
                   SILENT_SUBSTREAM: "Silent substreams"}.get(self.kind, "Details")
        body = (
            f"<p>{html.escape(self.message)}</p>"
            f"<p>Pipeline: <b>{html.escape(self.pipeline)}</b>{window}</p>"
            f"<p>{heading}:</p><ul>{rows}</ul>{docs}"
            f"<p>Raised at {html.escape(_rfc3339(self.raised_at))}.</p>"
        )
        return self.summary, body


def task_event(context: Mapping[str, Any]) -> dict[str, Any]:
    """What to report when a notifier runs as an Airflow callback with no sluice alert in the context."""
    ctx = cast("Mapping[str, Any]", context)
    ti = ctx.get("ti") or ctx.get("task_instance")
    dag_id = getattr(ti, "dag_id", None) or getattr(ctx.get("dag"), "dag_id", None) or "?"
    task_id = getattr(ti, "task_id", None) or "?"
    run_id = ctx.get("run_id") or getattr(ti, "run_id", None) or "?"
    state = getattr(ti, "state", None) or "failed"
    state = getattr(state, "value", state)  # TaskInstanceState is an enum whose str() is "TaskInstanceState.X"
    exception = ctx.get("exception")
    message = f"sluice: Airflow task {dag_id}.{task_id} (run {run_id}) {state}"
    if exception:
        message += f": {one_line(exception)}"
    return {
        "event": "sluice.task_callback",
        "dag_id": str(dag_id),
        "task_id": str(task_id),
        "run_id": str(run_id),
        "state": str(state),
        "exception": one_line(exception) if exception else None,
        "message": message,
        "raised_at": _rfc3339(datetime.now(UTC)),
    }
