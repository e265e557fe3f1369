"""Ingest of a run's streams (SPEC 2-3): each stream's ingest, its landing folder's
(:class:`sluice.ingest.landing.StreamIngest`) or its Kafka topic's (:class:`sluice.ingest.kafka.KafkaIngest`), side
by side, one thread each, under the stream's lock; and the per-stream totals over every batch."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any

from sluice.config import Settings
from sluice.core.model import StreamSpec
from sluice.ingest.declarations import check_declaration
from sluice.ingest.kafka import KafkaIngest
from sluice.ingest.landing import StreamIngest, nothing_to_wait_for
from sluice.ingest.state import BatchRow, load_state
from sluice.ingest.time_rules import arrived_after, arrived_after_message
from sluice.runtime.context import RunContext
from sluice.storage import tables

log = logging.getLogger("sluice.ingest")


def stream_ingest(ctx: RunContext, spec: StreamSpec,
                  before_write: Callable[[], None] = nothing_to_wait_for) -> StreamIngest:
    """The ingest of one stream: its landing folder's, or its Kafka topic's (:mod:`sluice.ingest.kafka`)."""
    if spec.source is not None:
        return KafkaIngest(ctx, spec, before_write)
    return StreamIngest(ctx, spec, before_write)


def run_ingest(ctx: RunContext, streams: Sequence[str],
               on_new_input: Callable[[], None] | None = None) -> dict[str, list[BatchRow]]:
    """Ingest each stream once (availableNow) and return the batches committed in this cycle. Each stream
    is ingested under its own lock: a stream shared by several pipelines is never ingested by two
    processes at once, and whichever cycle comes first ingests it for all of them (bronze is shared; each
    pipeline's streaming query reads it from its own checkpoint, so every pipeline sees every record).

    The streams are ingested side by side, one thread each, but write one after the other: a stream waits,
    before its first write, until every stream before it in the write order is done. So a stream's query
    start, its listing and its parse overlap another's Spark work, and the tables still get the commits of
    one stream after the other (ops/ingest_batches is shared). The write order is the streams' new bytes,
    fewest first (then the order given): the same for the same landing files, and a small stream does not
    wait for a large one's writes. A stream that fails stops the streams after it before their first write,
    as running them one after the other would.

    Files that arrived after "now" are taken under their own arrival time (SPEC 3); the run warns once how
    many, over all its streams. ``on_new_input`` is called once, before any stream starts Spark, when some
    stream has new input (a caller's work to overlap with the JVM's start)."""
    # Every stream's declaration first: a change that would change what ingested records mean is refused
    # before any stream of the cycle writes anything (SPEC 9).
    for name in streams:
        spec = ctx.settings.stream(name)
        check_declaration(spec, ctx.state, tables.bronze(spec).path(ctx.settings))
    # The shared ops table before the threads (delta-rs, no JVM): they would race to create it.
    ops = tables.INGEST_BATCHES
    ctx.ops_engine.ensure_table(ops.path(ctx.settings), ops.schema, ops.partition_by)
    done = [threading.Event() for _ in streams]
    failed: set[int] = set()
    # Each stream's place in the write order (see above); an estimate from a listing is enough to order by.
    new_bytes = [stream_ingest(ctx, ctx.settings.stream(name)).new_bytes() for name in streams]
    order = sorted(range(len(streams)), key=lambda i: (new_bytes[i], i))
    # And, before any stream starts Spark, the kind of JVM this cycle needs (RunContext.expect).
    ctx.expect(sum(new_bytes))
    if on_new_input is not None and sum(new_bytes) > 0:
        on_new_input()
    rank = {index: place for place, index in enumerate(order)}

    def wait_for_earlier(index: int) -> Callable[[], None]:
        def wait() -> None:
            earlier = order[: rank[index]]
            for j in earlier:
                done[j].wait()
            # Only an earlier stream's failure stops this one: run one after the other, a later stream's
            # failure would have come after this stream was ingested.
            stopped = [j for j in earlier if j in failed]
            if stopped:
                raise IngestAborted(f"{streams[index]}: not ingested, because {streams[stopped[0]]} failed first")
        return wait

    def ingest(index: int, name: str) -> list[BatchRow]:
        try:
            with ctx.stream_lock(name, purpose=f"ingest now={ctx.now.isoformat()}"):
                return stream_ingest(ctx, ctx.settings.stream(name), wait_for_earlier(index)).run()
        except BaseException:
            failed.add(index)
            raise
        finally:
            done[index].set()

    # The run's resources before the threads share them (each is made on first use).
    _ = ctx.engine, ctx.state
    with ThreadPoolExecutor(max(1, len(streams)), thread_name_prefix="sluice-ingest") as pool:
        futures = {name: pool.submit(ingest, i, name) for i, name in enumerate(streams)}
        wait(list(futures.values()))
    # The first failure in write order (the others may only say that they were stopped by it).
    errors = [e for e in (futures[streams[i]].exception() for i in order) if e is not None]
    first = next((e for e in errors if not isinstance(e, IngestAborted)), errors[0] if errors else None)
    if first is not None:
        raise first
    out = {name: future.result() for name, future in futures.items()}
    future = arrived_after(out, ctx.now)
    if future:
        log.warning("%s", arrived_after_message(future, ctx.now))
    return out


class IngestAborted(RuntimeError):
    """A stream was not ingested because a stream before it in the run failed."""


def summary(settings: Settings, streams: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Per-stream totals over all batches ever committed: where every line went."""
    out = {}
    for name in streams:
        state = load_state(settings, name)
        out[name] = {
            **state.totals(),
            "watermark": state.watermark,
            "last_arrival": state.last_arrival,
            "batches": len(state.rows),
        }
    return out


__all__ = ["IngestAborted", "run_ingest", "stream_ingest", "summary"]
