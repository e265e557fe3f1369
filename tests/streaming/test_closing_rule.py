"""The closing rule, the same on every path (SPEC 4): a window [start, end) is written once, in the cycle
after which the pipeline watermark W (the minimum of the stored per-stream watermarks) satisfies
W >= end + lateness_bound. Streaming, batch catch-up, the batch close and backfills agree on it, including
for a window that lies exactly on the boundary, and whatever Spark's own watermark does after a restart."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from sluice.config import Settings, load_settings
from sluice.ingest import load_state
from sluice.runtime.context import open_run
from sluice.storage.state import lake_state
from sluice.streaming.backfill import run_backfill
from sluice.streaming.definitions import recorded_outputs, save_recorded
from sluice.streaming.runner import PipelineRunner
from sluice.windows.ledger import read_ledger
from support import two_streams
from support.lake import cycle, land, table
from support.logs import logged

pytestmark = pytest.mark.spark

DAY = datetime(2024, 5, 1, tzinfo=UTC)
PIPELINE = "ad_clicks_hourly"  # 10-min watermark delays, 30-min join bound


def at(hhmm: str) -> datetime:
    hours, minutes = hhmm.split(":")
    return DAY + timedelta(hours=int(hours), minutes=int(minutes))


def iso(hhmm: str) -> str:
    return at(hhmm).isoformat().replace("+00:00", "Z")


def imp(i: str, hhmm: str, ad: str = "a1") -> dict[str, Any]:
    return {"impression_id": i, "ad_id": ad, "event_time": iso(hhmm)}


def click(k: str, impression: str, hhmm: str, ad: str = "a1") -> dict[str, Any]:
    return {"click_id": k, "impression_id": impression, "ad_id": ad, "event_time": iso(hhmm)}


def gold(settings: Settings, name: str = PIPELINE) -> list[tuple[Any, ...]]:
    return sorted(tuple(sorted(r.items())) for r in table(settings, f"gold/{name}"))


def windows(settings: Settings) -> list[tuple[datetime, datetime]]:
    return sorted({(r["window_start"], r["window_end"]) for r in table(settings, f"gold/{PIPELINE}")})


def home(tmp_path: Path, name: str, catchup_min_windows: int) -> Settings:
    # batch_close_rows=0: every cycle that can close a window runs the streaming queries, the path under test.
    return replace(load_settings({}, home=tmp_path / name), catchup_min_windows=catchup_min_windows,
                   batch_close_rows=0)


def land_boundary_data(settings: Settings) -> None:
    """Impressions up to 06:45 (watermark 06:35), clicks up to 06:40 (watermark 06:30): W = 06:30 exactly,
    which is the end of [05:00, 06:00) plus the 30-min join bound."""
    land(settings, "impressions", "i0.jsonl", [imp("i0", "04:20")], at("04:30"))
    land(settings, "impressions", "i1.jsonl", [imp("i1", "05:10"), imp("i2", "05:50"), imp("i3", "06:45", "a2")],
         at("06:50"))
    land(settings, "clicks", "c1.jsonl", [click("k1", "i2", "06:20"), click("k2", "i3", "06:40", "a2")], at("06:50"))


def test_a_window_whose_end_plus_bound_equals_the_watermark_closes_on_every_path(
    spark: SparkSession, tmp_path: Path
) -> None:
    """The same data on a streaming home and on a batch catch-up home: each closes exactly the windows the
    rule makes final, a backfill of them reproduces each, and both homes hold the same gold."""
    homes = []
    for catchup_min_windows in (0, 1):
        settings = home(tmp_path, f"home{catchup_min_windows}", catchup_min_windows)
        land_boundary_data(settings)
        after = cycle(spark, settings, PIPELINE, at("06:55"))
        caught_up = (after.checkpoints / "pipelines" / PIPELINE / "catchup.json").exists()
        assert caught_up == bool(catchup_min_windows), "each home must take the path it is there for"
        assert min(load_state(after, s).watermark for s in ("impressions", "clicks")) == at("06:30")
        # [05:00, 06:00) ends exactly at W - 30 min: final (">="); [06:00, 07:00) is not.
        assert windows(after) == [(at("04:00"), at("05:00")), (at("05:00"), at("06:00"))]
        rows = {(r["window_start"], r["ad_id"]): (r["impressions"], r["clicks"])
                for r in table(after, f"gold/{PIPELINE}")}
        assert rows == {(at("04:00"), "a1"): (1, 0), (at("05:00"), "a1"): (2, 1)}
        ledger = read_ledger(after, PIPELINE)
        assert [(r.window_start, r.closed_by_watermark) for r in ledger] == [(at("04:00"), at("06:30")),
                                                                              (at("05:00"), at("06:30"))]
        # A backfill of the same range reproduces it exactly.
        before = gold(after)
        run_backfill(open_run(after, spark), PIPELINE, at("04:00"), at("06:00"), deliver_alerts=False)
        assert gold(after) == before
        homes.append(after)
    streamed, caught_up_home = homes
    assert gold(streamed) == gold(caught_up_home)
    assert gold(streamed, "unmatched_clicks_hourly") == gold(caught_up_home, "unmatched_clicks_hourly")


def test_a_window_closes_in_the_cycle_where_the_minimum_of_the_stored_watermarks_passes_it(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Issue 10, finding 2: after a restart, one stream idle and the other with nothing new. Spark's own
    watermark would stay behind (an input without rows in a batch); sluice's closing does not depend on it."""
    settings = home(tmp_path, "home", 0)
    land(settings, "impressions", "i1.jsonl", [imp("i1", "05:10"), imp("i2", "05:50"), imp("i3", "06:45", "a2")],
         at("06:50"))
    land(settings, "clicks", "c1.jsonl", [click("k1", "i2", "06:20")], at("06:30"))

    first = cycle(spark, settings, PIPELINE, at("06:55"))  # W = min(06:35, 06:10): nothing closes
    assert windows(first) == []
    second = cycle(spark, settings, PIPELINE, at("07:00"))  # clicks heartbeat at 06:30: W = 06:20
    assert load_state(second, "clicks").watermark == at("06:20") and windows(second) == []
    # Clicks heartbeat at 06:40: W = min(06:35, 06:30) = 06:30. Impressions get nothing at all this cycle.
    third = cycle(spark, settings, PIPELINE, at("07:10"))
    assert load_state(third, "impressions").watermark == at("06:35")
    assert load_state(third, "clicks").watermark == at("06:30")
    assert windows(third) == [(at("05:00"), at("06:00"))]
    rows = [(r["ad_id"], r["impressions"], r["clicks"], r["ctr"]) for r in table(third, f"gold/{PIPELINE}")]
    assert rows == [("a1", 2, 1, 0.5)]
    assert [r.closed_by_watermark for r in read_ledger(third, PIPELINE)] == [at("06:30")]


def _query_batches(settings: Settings) -> dict[str, int]:
    """How many micro-batches each output's stateful query has planned (its checkpoint's offsets)."""
    root = settings.checkpoints / "pipelines" / PIPELINE
    return {output: len(list((root / output / "offsets").glob("[0-9]*")))
            for output in ("ad_clicks_hourly", "unmatched_clicks_hourly")}


def test_a_cycle_that_cannot_close_a_window_leaves_its_rows_to_the_cycle_that_can(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Issue 13: most scheduled cycles cannot close a window; they skip the stateful queries, whose next
    run takes the deferred rows. The window they close is the one a backfill computes."""
    settings = home(tmp_path, "home", 0)
    land_boundary_data(settings)
    first = cycle(spark, settings, PIPELINE, at("06:55"))
    assert windows(first) == [(at("04:00"), at("05:00")), (at("05:00"), at("06:00"))]
    ran = _query_batches(first)
    assert all(ran.values()), ran

    # W = min(06:40, 06:45) = 06:40: the closing boundary 06:10 is short of [06:00, 07:00)'s end.
    land(settings, "impressions", "i2.jsonl", [imp("i4", "06:50", "a2")], at("07:00"))
    land(settings, "clicks", "c2.jsonl", [click("k3", "i3", "06:55", "a2"), click("k4", "i0", "06:52")], at("07:00"))
    second = cycle(spark, settings, PIPELINE, at("07:05"))
    assert load_state(second, "impressions").watermark == at("06:40")
    assert _query_batches(second) == ran, "the stateful queries must not run when no window can close"
    assert windows(second) == windows(first)

    # W = 07:35: [06:00, 07:00) closes, with the rows the second cycle left in bronze.
    land(settings, "impressions", "i3.jsonl", [imp("i5", "07:45")], at("07:50"))
    land(settings, "clicks", "c3.jsonl", [click("k5", "i5", "07:45")], at("07:50"))
    with logged("sluice.aggregate") as said:
        third = cycle(spark, settings, PIPELINE, at("07:55"))
    assert all(n > ran[o] for o, n in _query_batches(third).items())
    # Both outputs' queries wrote [06:00, 07:00), the only window final now: the batch close has nothing to do
    # and is skipped (it would read bronze and run the transforms to find no window left).
    assert any("no batch close needed" in m for m in said), said
    assert not any("batch close up to" in m for m in said), said
    assert windows(third)[-1] == (at("06:00"), at("07:00"))
    rows = {r["ad_id"]: (r["impressions"], r["clicks"])
            for r in table(third, f"gold/{PIPELINE}") if r["window_start"] == at("06:00")}
    assert rows == {"a2": (2, 1)}  # i3 clicked twice (k2, k3) is one clicked impression; i4 none
    unmatched = {(r["window_start"], r["ad_id"]): r["unmatched_clicks"]
                 for r in table(third, "gold/unmatched_clicks_hourly")}
    assert unmatched[(at("06:00"), "a1")] == 1  # k4: i0 is 2.5 h older, outside the join bound

    before = (gold(third), gold(third, "unmatched_clicks_hourly"))
    run_backfill(open_run(third, spark), PIPELINE, at("06:00"), at("07:00"), deliver_alerts=False)
    assert (gold(third), gold(third, "unmatched_clicks_hourly")) == before


def _ledger(settings: Settings) -> list[tuple[Any, ...]]:
    return [(r.window_start, r.window_end, r.state, r.closed_by_watermark) for r in read_ledger(settings, PIPELINE)]


def test_small_cycles_close_in_batch_and_a_query_that_missed_them_restarts_from_the_open_windows(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Issue 57: a cycle whose closable windows read at most ``batch_close_rows`` bronze rows closes them in batch,
    without the stateful queries. A home that always streams, one that always closes in batch, and one that
    alternates hold the same gold and ledger after every cycle. When the alternating home's queries run again,
    each starts a new checkpoint that reads only the rows that can still reach an open window."""
    streamed, batched, mixed = (replace(home(tmp_path, name, 0), batch_close_rows=limit)
                                for name, limit in (("streamed", 0), ("batched", 1000), ("mixed", 1000)))
    cycles = [
        ("06:55", None, None),  # W = 06:30: [04:00, 05:00) and [05:00, 06:00) close
        ("07:05", [imp("i4", "06:50", "a2")],  # nothing closes (W = 06:40)
         [click("k3", "i3", "06:55", "a2"), click("k4", "i0", "06:52")]),  # k4: i0 is 2.5 h older, unmatched
        ("07:55", [imp("i5", "07:45")], [click("k5", "i5", "07:45")]),  # W = 07:35: [06:00, 07:00) closes
        ("08:55", [imp("i6", "08:10"), imp("i7", "08:45", "a2")],  # W = 08:35: [07:00, 08:00) closes
         [click("k6", "i6", "08:20"), click("k7", "i7", "08:50", "a2")]),
        ("09:55", [imp("i8", "09:40", "a2")], [click("k8", "i8", "09:45", "a2")]),  # W = 09:30: [08:00, 09:00)
    ]
    # The alternating home streams in the 3rd and 5th cycles, each after a cycle closed in batch.
    mixed_streams = {2: "04:30", 4: "06:35"}  # reach_from(closed through 06:00 / 08:05): - 1 h - 30 min
    for index, (now, imps, clicks) in enumerate(cycles):
        for settings in (streamed, batched, mixed):
            if imps is None:
                land_boundary_data(settings)
            else:
                land(settings, "impressions", f"i-{now}.jsonl", imps, at(now) - timedelta(minutes=5))
                land(settings, "clicks", f"c-{now}.jsonl", clicks, at(now) - timedelta(minutes=5))
        cycle(spark, streamed, PIPELINE, at(now))
        with logged("sluice.aggregate") as said:
            cycle(spark, batched, PIPELINE, at(now))
        assert not any("new checkpoint" in m for m in said), said
        mode = replace(mixed, batch_close_rows=0) if index in mixed_streams else mixed
        with logged("sluice.aggregate") as said:
            cycle(spark, mode, PIPELINE, at(now))
        if index in mixed_streams:
            restarts = [m for m in said if "new checkpoint" in m]
            assert len(restarts) == 2 and all(f"reads from {at(mixed_streams[index]).isoformat()}" in m
                                              for m in restarts), said
            # The generation each query left is deleted, state store and all; the new one ran.
            new, old = (1, 0) if index == 2 else (2, 1)
            for output in (PIPELINE, "unmatched_clicks_hourly"):
                folder = mixed.checkpoints / "pipelines" / PIPELINE
                assert not (folder / (f"{output}.g{old}" if old else output)).exists(), (now, output, old)
                assert any((folder / f"{output}.g{new}" / "commits").iterdir()), (now, output, new)
                assert any(f"{output}: deleted the retired checkpoint" in m for m in said), said
            assert not any(r.retired for r in recorded_outputs(lake_state(mixed), PIPELINE).values())
        elif index != 1:
            assert any("closing them in batch" in m for m in said), said
        for output in (PIPELINE, "unmatched_clicks_hourly"):
            assert gold(batched, output) == gold(streamed, output), (now, output)
            assert gold(mixed, output) == gold(streamed, output), (now, output)
        assert _ledger(batched) == _ledger(streamed) == _ledger(mixed), now
    assert [w for w, _e, _s, _c in _ledger(streamed)] == [at(f"0{h}:00") for h in range(4, 9)]
    unmatched = {(r["window_start"], r["ad_id"]): r["unmatched_clicks"]
                 for r in table(streamed, "gold/unmatched_clicks_hourly")}
    assert unmatched[(at("06:00"), "a1")] == 1
    # The batch home's queries never ran; the alternating home keeps only the checkpoints of its last restart.
    root = mixed.checkpoints / "pipelines" / PIPELINE
    assert not (batched.checkpoints / "pipelines" / PIPELINE / PIPELINE / "commits").exists()
    assert sorted(p.name for p in root.iterdir() if p.is_dir()) == [f"{PIPELINE}.g2", "unmatched_clicks_hourly.g2"]
    assert _query_batches(streamed)[PIPELINE] > 0

    # A run killed after it saved the new generation and before it deleted the old one: the next streaming cycle
    # deletes what is still listed as retired, and only that.
    leftover = root / f"{PIPELINE}.g1" / "state" / "0"
    leftover.mkdir(parents=True)
    (leftover / "1.delta").write_bytes(b"state")
    state = lake_state(mixed)
    kept = recorded_outputs(state, PIPELINE)
    save_recorded(state, PIPELINE, {**kept, PIPELINE: replace(kept[PIPELINE], retired=(1,))})
    ctx = open_run(mixed, spark)
    PipelineRunner(ctx, ctx.settings.registry.pipelines[PIPELINE])._restart_behind(at("09:00"))
    assert not (root / f"{PIPELINE}.g1").exists()
    assert recorded_outputs(state, PIPELINE) == kept
    assert sorted(p.name for p in root.iterdir() if p.is_dir()) == [f"{PIPELINE}.g2", "unmatched_clicks_hourly.g2"]


# -- A team's own two-stream pipeline (issue 25): one W per pipeline, and records at the watermark -------------
def two_home(tmp_path: Path) -> Settings:
    # 15-min windows every 5 min, 2-min delays, 10-min join bound; no batch catch-up, so streaming is under test.
    return replace(two_streams.two_stream_home(tmp_path, with_join=False), catchup_min_windows=0,
                   batch_close_rows=0)


def two_gold(settings: Settings, output: str, metric: str) -> dict[tuple[datetime, datetime], dict[str, int]]:
    out: dict[tuple[datetime, datetime], dict[str, int]] = {}
    for r in table(settings, f"gold/{output}"):
        out.setdefault((r["window_start"], r["window_end"]), {})[r["device_id"]] = r[metric]
    return out


def from_bronze(settings: Settings, stream: str, boundary: datetime) -> dict[tuple[datetime, datetime], dict[str, int]]:
    """What gold must hold: per final 15-min window (every 5 min, ending at or before ``boundary``) and device,
    the accepted records of bronze in it."""
    rows = [r for r in table(settings, f"bronze/{stream}") if not r["is_heartbeat"]]
    out: dict[tuple[datetime, datetime], dict[str, int]] = {}
    for r in rows:
        t = r["event_time"]
        start = t.replace(minute=t.minute - t.minute % 5, second=0, microsecond=0)
        for k in range(3):
            window = (start - timedelta(minutes=5 * k), start - timedelta(minutes=5 * k) + timedelta(minutes=15))
            if window[1] <= boundary:
                per_device = out.setdefault(window, {})
                per_device[r["device_id"]] = per_device.get(r["device_id"], 0) + 1
    return out


def assert_gold_is_exactly_the_final_windows(settings: Settings) -> datetime:
    from sluice.streaming.batch import closing_boundary

    boundary = closing_boundary(settings, settings.pipeline(two_streams.PIPELINE))
    assert boundary is not None
    for stream, output, metric in (("readings", two_streams.READINGS_OUT, "readings"),
                                   ("txns", two_streams.TXNS_OUT, "txns")):
        assert two_gold(settings, output, metric) == from_bronze(settings, stream, boundary), output
    return boundary


def test_a_record_accepted_exactly_at_the_watermark_is_in_every_streaming_window_that_holds_it(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Ingest accepts ``event_time == watermark`` (late is below it); Spark's stateful operators drop
    ``event_time <= their watermark``. On both streams (``readings`` and ``txns``, whose event time is declared
    as ``ts``), the record at 09:58 must reach all three hopping windows that hold it, on the streaming path,
    as a backfill computes them."""
    settings = two_home(tmp_path)
    rec = two_streams.record
    for stream in two_streams.STREAMS:
        land(settings, stream, f"{stream}-1.jsonl", [rec(stream, f"{stream}-x0", at("09:50")),
                                                     rec(stream, f"{stream}-x1", at("10:00"))], at("10:01"))
    cycle(spark, settings, two_streams.PIPELINE, at("10:01"))
    # Exactly at each stream's watermark (10:00 - 2 min): accepted.
    for stream in two_streams.STREAMS:
        land(settings, stream, f"{stream}-2.jsonl", [rec(stream, f"{stream}-at-watermark", at("09:58"))],
             at("10:03"))
    second = cycle(spark, settings, two_streams.PIPELINE, at("10:03"))
    for stream in two_streams.STREAMS:
        [batch] = [r for r in load_state(second, stream).rows
                   if r.source_file and r.source_file.endswith(f"{stream}-2.jsonl")]
        assert (batch.accepted, batch.late, batch.watermark_before) == (1, 0, at("09:58")), stream
    # Both streams move on: W = 10:23, so the windows ending by 10:13 close, through the streaming queries.
    for stream in two_streams.STREAMS:
        land(settings, stream, f"{stream}-3.jsonl", [rec(stream, f"{stream}-late-on", at("10:25"))], at("10:26"))
    third = cycle(spark, settings, two_streams.PIPELINE, at("10:26"))
    boundary = assert_gold_is_exactly_the_final_windows(third)
    assert boundary == at("10:13")
    holding = [(at(s), at(e)) for s, e in (("09:45", "10:00"), ("09:50", "10:05"), ("09:55", "10:10"))]
    outputs = ((two_streams.READINGS_OUT, "readings"), (two_streams.TXNS_OUT, "txns"))
    for output, metric in outputs:
        assert [two_gold(third, output, metric)[w]["d1"] for w in holding] == [2, 3, 2], output
    # The same windows from a backfill.
    before = {output: two_gold(third, output, metric) for output, metric in outputs}
    run_backfill(open_run(third, spark), two_streams.PIPELINE, at("09:45"), at("10:00"), deliver_alerts=False)
    assert {output: two_gold(third, output, metric) for output, metric in outputs} == before


@pytest.mark.parametrize("ahead", two_streams.STREAMS)
def test_an_output_of_one_stream_closes_on_the_pipelines_watermark_not_its_streams(
    spark: SparkSession, tmp_path: Path, ahead: str
) -> None:
    """README: one W per pipeline. An output reading only the stream that is ahead must not write a window
    before W (the minimum over the pipeline's streams) reaches its end + bound; it writes it once W does."""
    settings = two_home(tmp_path)
    behind = "txns" if ahead == "readings" else "readings"
    rec = two_streams.record
    land(settings, ahead, "a1.jsonl", [rec(ahead, f"a{i}", at("10:00") + timedelta(minutes=4 * i)) for i in range(11)],
         at("10:40"))
    land(settings, behind, "b1.jsonl", [rec(behind, "b0", at("10:00")), rec(behind, "b1", at("10:12"))], at("10:13"))
    first = cycle(spark, settings, two_streams.PIPELINE, at("10:41"))
    # W = min(10:38, 10:10) = 10:10: nothing ending after 10:00 may be in any gold table.
    assert assert_gold_is_exactly_the_final_windows(first) == at("10:00")
    assert {e for o in (two_streams.READINGS_OUT, two_streams.TXNS_OUT)
            for (_s, e) in two_gold(first, o, "device_id")} <= {at("10:00")}

    land(settings, behind, "b2.jsonl", [rec(behind, "b2", at("10:39"))], at("10:40"))
    second = cycle(spark, settings, two_streams.PIPELINE, at("10:42"))
    # W = 10:37: the windows the ahead output's query emitted early are written now, complete.
    assert assert_gold_is_exactly_the_final_windows(second) == at("10:27")
    ends = {e for (_s, e) in two_gold(second, f"two_streams_{ahead}", "device_id")}
    assert max(ends) == at("10:25")
