"""Freshness: a window still open at ``end + lateness_bound + freshness_grace`` is ``stale``.

Windows close when the pipeline watermark W (the minimum of its streams' stored watermarks, heartbeats
included) reaches ``end + lateness_bound``. An idle stream gets heartbeats, so a producer that merely
stopped does not hold windows open for long (``idle_timeout + watermark_delay``). A window that stays open
past its grace therefore means that something is stuck: a stream keeps receiving files whose event times
lag behind (a producer replaying old data, a clock gone wrong), or cycles stopped running for the streams.
The alert names the stream(s) whose watermark is W: the ones holding the window back.

Only the oldest open window is judged, and its alert is keyed by that window: a stuck pipeline raises one
``stale`` alert for it, not one per cycle. A pipeline that keeps lagging would otherwise raise one for
every window as its watermark crawls on, so a new ``stale`` alert also waits until ``freshness_grace``
has passed since the pipeline's previous one. Pure metadata (ops rows and the outbox), no Spark.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from sluice.config import Settings
from sluice.core.model import PipelineDef
from sluice.core.windows import first_window_start_at_or_after

if TYPE_CHECKING:
    from sluice.alerting.alert import Alert

_TICK = timedelta(microseconds=1)


def oldest_open_window(pipeline: PipelineDef, watermark: datetime) -> tuple[datetime, datetime]:
    """The open window with the earliest end, under pipeline watermark ``watermark``: the first window
    whose ``end + lateness_bound > watermark`` (ends are ``k * slide + size`` on the epoch grid)."""
    size, slide = pipeline.window.size, pipeline.window.slide
    start = first_window_start_at_or_after(watermark - pipeline.lateness_bound - size + _TICK, slide)
    return start, start + size


def stale_alerts(settings: Settings, pipeline: PipelineDef) -> list[Alert]:
    """The ``stale`` alert of the oldest open window, if it is past due (a list of at most one
    :class:`~sluice.alerting.alert.Alert`). Nothing before every stream has a watermark: a pipeline that
    has never seen data has no window to be late with."""
    from sluice.ingest.landing import load_state

    marks = {stream: load_state(settings, stream).watermark for stream in pipeline.streams}
    known = [mark for mark in marks.values() if mark is not None]
    if len(known) < len(marks) or not known:
        return []
    watermark = min(known)
    window = oldest_open_window(pipeline, watermark)
    due = window[1] + pipeline.lateness_bound + pipeline.freshness_grace
    now = settings.now()
    if now < due:
        return []
    from sluice.alerting.alert import STALE, Alert
    from sluice.alerting.outbox import read_outbox

    previous = [r["raised_at"] for r in read_outbox(settings, pipeline.name) if r.get("kind") == STALE]
    if previous and now - max(_utc(t) for t in previous) < pipeline.freshness_grace:
        return []

    holding = {stream: mark for stream, mark in marks.items() if mark == watermark}
    return [Alert.stale(pipeline.name, window, due, holding, now, docs_url=settings.docs_url())]


def _utc(value: datetime) -> datetime:
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value
