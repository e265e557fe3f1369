"""Freshness: a window held open past its due time is ``stale``.

**Which window.** Windows close when the pipeline watermark W (the minimum of its streams' stored watermarks,
heartbeats included) reaches ``end + lateness_bound``. An idle stream gets heartbeats, so a producer that
merely stopped does not hold windows open for long (``idle_timeout + watermark_delay``). A window that stays
open past its due time therefore means that something is stuck: a stream keeps receiving files whose event
times lag behind (a producer replaying old data, a clock gone wrong), cycles stopped running for the
streams, or a stream has never received a file. The judged window is:

* when every stream has a watermark: the oldest open window under W, held back by the stream(s) whose
  watermark is W;
* when some stream has none (it has never received a file, SPEC 3: no watermark, no heartbeat) while others
  have data: that stream holds every window of the pipeline open, so the judged window is the oldest one the
  other streams' data fills (the first window holding their earliest accepted event time, read from the
  earliest event hour of bronze). The alert names the stream and says it has received no file yet (with any
  other stream whose watermark is still short of the window's close). A pipeline none of whose streams has
  a watermark has nothing to be late with: no alert.

**When it is due.** One ``freshness_grace`` after the later of two moments: ``end + lateness_bound`` (when
live data closes the window) and the arrival of the first file that reached it (the earliest landing batch
of the pipeline's streams whose newest event time is at or past the window's start). For live data the two
are minutes apart and the rule is ``end + lateness_bound + freshness_grace``. For history (a backlog of
last year's events landing now) the second one decides: a pipeline is not late with data it has only just
received, so a first run over historical data raises nothing, and neither does a replay that keeps moving
(each window it holds open got its data recently). A replay that stops moving, files still arriving for
the same old hour, is stale one grace after that hour's data arrived. Files that landed long before the
run are covered by heartbeats: their stream is idle, and its windows close in the same cycle.

Only the judged window raises, and its alert is keyed by that window: a stuck pipeline raises one ``stale``
alert for it, not one per cycle. A pipeline that keeps lagging would otherwise raise one for every window as
its watermark crawls on, so a new ``stale`` alert also waits until ``freshness_grace`` has passed since the
pipeline's previous one. Pure metadata (ops rows, the outbox, one event hour of bronze), no Spark.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from sluice.config import Settings
from sluice.core.model import PipelineDef
from sluice.core.windows import Window, first_window_start_at_or_after
from sluice.storage import snapshots, tables

if TYPE_CHECKING:
    from sluice.alerting.alert import Alert
    from sluice.ingest.state import StreamState
    from sluice.windows.ledger import LedgerRow

_TICK = timedelta(microseconds=1)
_HOUR = timedelta(hours=1)

#: What holds a window open, per stream: its watermark, or why it has none.
Holding = dict[str, datetime | str]

NO_FILE = "no file received yet, so no watermark"
NO_RECORD = "no record accepted yet, so no watermark"


def oldest_open_window(pipeline: PipelineDef, watermark: datetime) -> Window:
    """The open window with the earliest end, under pipeline watermark ``watermark``: the first window
    whose ``end + lateness_bound > watermark`` (ends are ``k * slide + size`` on the epoch grid)."""
    size, slide = pipeline.window.size, pipeline.window.slide
    start = first_window_start_at_or_after(watermark - pipeline.lateness_bound - size + _TICK, slide)
    return start, start + size


def open_windows(settings: Settings, pipeline: PipelineDef, ledger: Iterable[LedgerRow]) -> list[Window]:
    """The pipeline's windows that are open: real windows of its grid that hold its data and that the closing
    rule has not closed yet. One definition for ``sluice status`` (its ``open`` count and ``oldest open``),
    the ledger page's "not closed yet" cells and freshness, so that they count the same windows.

    A window is open when it overlaps an event hour of the pipeline's streams in bronze (from the Delta log),
    starts at or before the newest accepted event time, is not in the ledger, and ends after ``W -
    lateness_bound`` (with no W yet, a stream having received no file, every such window is open, from the
    first one holding the earliest accepted record). An hour-grained overlap can count a hopping window of
    an hour whose records all fall outside it: open windows are those the next cycles can close, not a
    promise that each holds a row."""
    from sluice.ingest.state import load_state

    states = {stream: load_state(settings, stream) for stream in pipeline.streams}
    newest = max((r.max_event_time for state in states.values() for r in state.rows
                  if not r.is_heartbeat and r.accepted and r.max_event_time is not None), default=None)
    if newest is None:
        return []
    marks = [state.watermark for state in states.values()]
    after: datetime | None
    if all(mark is not None for mark in marks):
        after = min(m for m in marks if m is not None) - pipeline.lateness_bound  # ends at or before: closed
    else:
        earliest = earliest_event_time(settings, pipeline.streams)
        after = first_window_holding(pipeline, earliest)[1] - _TICK if earliest is not None else None
    known = {(r.window_start, r.window_end) for r in ledger}
    hours: set[datetime] = set()
    for stream in pipeline.streams:
        hours |= set(tables.bronze_hours(tables.bronze(settings.stream(stream)).path(settings)))
    size, slide = pipeline.window.size, pipeline.window.slide
    found: set[Window] = set()
    for hour in hours:
        start = first_window_start_at_or_after(hour - size + _TICK, slide)  # the first window overlapping it
        while start < hour + _HOUR and start <= newest:
            window = (start, start + size)
            if (after is None or window[1] > after) and window not in known:
                found.add(window)
            start += slide
    return sorted(found)


def first_window_holding(pipeline: PipelineDef, moment: datetime) -> Window:
    """The earliest window whose end is after ``moment``: the first one holding it (or, for windows with
    gaps between them, the first one after it)."""
    size, slide = pipeline.window.size, pipeline.window.slide
    # A record no window can hold (bronze written by another tool may hold year 1): the first window
    # that can exist is the earliest one freshness can judge.
    moment = max(moment, datetime.min.replace(tzinfo=UTC) + size + slide)
    start = first_window_start_at_or_after(moment - size + _TICK, slide)
    return start, start + size


def due_time(pipeline: PipelineDef, window: Window, states: Iterable[StreamState]) -> datetime:
    """When ``window`` is due closed (see the module docstring): one grace after the later of its
    ``end + lateness_bound`` and the arrival of the first landing batch that reached it."""
    closes = window[1] + pipeline.lateness_bound
    # (arrival, newest event time) of every landing batch; heartbeats have no arrival.
    batches = [(r.max_arrival_time, r.max_event_time) for state in states for r in state.rows
               if not r.is_heartbeat and r.max_arrival_time is not None]
    reached = [arrival for arrival, newest in batches if newest is not None and newest >= window[0]]
    # None reached it (a window past the newest data, with gaps between windows): the newest data is what
    # the pipeline has had the longest for it.
    arrived = min(reached, default=max((arrival for arrival, _ in batches), default=closes))
    return max(closes, arrived) + pipeline.freshness_grace


def judged_window(settings: Settings, pipeline: PipelineDef, states: Mapping[str, StreamState]
                  ) -> tuple[Window, Holding] | None:
    """The window freshness judges and what holds it open (see the module docstring); None when no stream
    of the pipeline has a watermark yet."""
    marks = {stream: state.watermark for stream, state in states.items()}
    known = {stream: mark for stream, mark in marks.items() if mark is not None}
    if not known:
        return None
    if len(known) == len(marks):
        watermark = min(known.values())
        return oldest_open_window(pipeline, watermark), {s: m for s, m in known.items() if m == watermark}
    first = earliest_event_time(settings, sorted(known))
    if first is None:
        return None
    window = first_window_holding(pipeline, first)
    closes = window[1] + pipeline.lateness_bound
    holding: Holding = {s: m for s, m in known.items() if m < closes}
    for stream, mark in marks.items():
        if mark is None:
            holding[stream] = NO_FILE if states[stream].last_arrival is None else NO_RECORD
    return window, holding


def stale_alerts(settings: Settings, pipeline: PipelineDef) -> list[Alert]:
    """The ``stale`` alert of the judged window, if it is past due (a list of at most one
    :class:`~sluice.alerting.alert.Alert`)."""
    from sluice.ingest.state import load_state

    states = {stream: load_state(settings, stream) for stream in pipeline.streams}
    judged = judged_window(settings, pipeline, states)
    if judged is None:
        return []
    window, holding = judged
    due = due_time(pipeline, window, states.values())
    now = settings.now()
    if now < due:
        return []
    from sluice.alerting.alert import STALE, Alert
    from sluice.alerting.outbox import read_outbox

    previous = [r["raised_at"] for r in read_outbox(settings, pipeline.name) if r.get("kind") == STALE]
    if previous and now - max(_utc(t) for t in previous) < pipeline.freshness_grace:
        return []
    return [Alert.stale(pipeline.name, window, due, holding, now, docs_url=settings.docs_url())]


#: At most this many silent substreams are named per alert (the rest in the next cycles' alerts).
SILENT_PER_ALERT = 50


def silent_substream_alert(settings: Settings, pipeline: PipelineDef) -> Alert | None:
    """One ``silent_substream`` alert naming the substreams of the pipeline's streams that have sent nothing for
    their stream's ``idle_timeout`` while the stream itself is live (it received something within it), each
    once per silence (a substream named since its last arrival is not named again); None when there are none."""
    from sluice.alerting.alert import SILENT_SUBSTREAM, Alert
    from sluice.alerting.outbox import _named_in_outbox
    from sluice.ingest.state import load_state
    from sluice.ingest.substreams import substream_maxima

    now = settings.now()
    silent: list[tuple[str, str, datetime]] = []
    for stream in pipeline.streams:
        spec = settings.stream(stream)
        last = load_state(settings, stream).last_arrival
        if spec.substream is None or last is None or now - _utc(last) >= spec.idle_timeout:
            continue
        maxima = substream_maxima(settings, spec)
        if maxima is None:
            continue
        cutoff = pa.scalar(now - spec.idle_timeout, pa.timestamp("us", "UTC"))
        quiet = maxima.filter(pc.field("max_arrival_time") <= cutoff).sort_by(
            [("max_arrival_time", "ascending"), ("substream", "ascending")])
        silent += [(stream, r["substream"], _utc(r["max_arrival_time"])) for r in quiet.to_pylist()]
    if not silent:
        return None
    alert = Alert.silent_substreams(pipeline.name, silent, now)
    named = _named_in_outbox(settings, pipeline.name, SILENT_SUBSTREAM)
    fresh = [i for i in alert.failed if (i["expectation"], i["observed_value"]) not in named][:SILENT_PER_ALERT]
    return replace(alert, failed=fresh) if fresh else None


def earliest_event_time(settings: Settings, streams: Sequence[str]) -> datetime | None:
    """The earliest event time of an accepted record (not a heartbeat) in the streams' bronze tables."""
    found = [t for s in streams if (t := _earliest_record(tables.bronze(settings.stream(s)).path(settings)))]
    return min(found, default=None)


def _earliest_record(path: str) -> datetime | None:
    """The bronze table's earliest record: its event hours come from the Delta log (partition values), and
    only the files of the earliest hour holding a record are read (two columns). A table whose files alone
    are not its rows (reader protocol above 1) answers with that hour's start."""
    table = snapshots.open_table(path)
    if table is None:
        return None
    by_hour: dict[datetime, list[str]] = {}
    for file in snapshots.live_files(path, table):
        hour = tables.partition_hour(file.partition)
        if hour is not None:
            by_hour.setdefault(hour, []).append(str(file.path))
    plain = snapshots.rows_are_files(table)
    for hour in sorted(by_hour):
        if not plain:
            return hour
        found = _earliest_in(by_hour[hour])
        if found is not None:
            return found
    return None


def _earliest_in(files: Sequence[str]) -> datetime | None:
    """The earliest event time of a record (heartbeats excluded) in these bronze data files."""
    parts = [pq.read_table(f, columns=["event_time", "is_heartbeat"]) for f in files]
    data = pa.concat_tables(parts)
    records = data.filter(pc.invert(pc.fill_null(data.column("is_heartbeat"), False)))
    if not records.num_rows:
        return None
    earliest = pc.min(records.column("event_time")).as_py()
    return None if earliest is None else _utc(earliest)


def _utc(value: datetime) -> datetime:
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value
