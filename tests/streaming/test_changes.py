"""Changing a pipeline that has run (issue 54, SPEC 9), on SPEC 8's example and its example files, with real Spark
and Delta: one home, edited step by step, each step checked against an oracle computed here from bronze (and the
DLQ, for the window a backfill filled with its late record).

- a comment-only edit is no change;
- an added metric is rebuilt into every closed window (the late record stays in), gold's schema replaced;
- reverting the file rebuilds the first gold (its doubles to the last bits a sum's order moves);
- a window change to 10m tumbling, killed (SIGKILL) after its gold commit, after its ledger commit and in its
  validation, leaves only 10-minute windows in gold and the ledger once rerun, validated;
- ``on_change="forward"`` keeps the closed windows and their definition, new windows (from a new checkpoint whose
  state covers the open windows) use the new one, and a backfill upgrades a range;
- ``"fail"`` and a forward window change are refused with exit 1 and the plan.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from sluice.airflow.api import windows_data
from sluice.cli import main as cli_main
from sluice.config import Settings, load_settings
from sluice.runtime.context import open_run
from sluice.storage.state import lake_state
from sluice.streaming.backfill import run_backfill
from sluice.streaming.batch import closed_through
from sluice.streaming.changes import ChangeRefused, plan_pipeline
from sluice.streaming.cycle import run_cycle
from sluice.streaming.definitions import recorded_outputs
from sluice.windows.ledger import read_ledger
from support.lake import land, table
from support.spec_example import SPEC_EXAMPLE
from support.tutorial import write_tutorial

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "readings"
AVG = 'F.avg("temp_c").alias("avg_temp_c")'
MAX = AVG + ', F.max("temp_c").alias("max_temp_c")'
WINDOW = 'window=("15m", "5m")'


def at(hhmm: str) -> datetime:
    return datetime.fromisoformat(f"2024-05-01T{hhmm}:00+00:00")


def utc(value: datetime) -> datetime:
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def oracle(settings: Settings, size: int, hop: int, *, metric: bool, late: set[tuple[datetime, datetime]] = frozenset()
           ) -> dict[tuple[datetime, datetime, str], tuple[Any, ...]]:
    """The pipeline's gold as its definition says, from bronze (plus the DLQ for ``late`` windows), for every
    window ending by the boundary gold is built to."""
    boundary = closed_through(lake_state(settings), "device_temps")
    assert boundary is not None
    accepted = {r["reading_id"]: r for r in table(settings, "bronze/readings") if not r.get("is_heartbeat")}
    held_back = {r["reading_id"]: r for r in table(settings, "dlq/readings")}
    groups: dict[tuple[datetime, datetime, str], list[dict[str, Any]]] = {}
    for source, records in (("bronze", accepted), ("dlq", held_back)):
        for r in records.values():
            if r["temp_c"] is None:
                continue
            t = utc(r["event_time"])
            first = datetime(2024, 5, 1, tzinfo=UTC) + (t - datetime(2024, 5, 1, tzinfo=UTC)) // timedelta(
                minutes=hop) * timedelta(minutes=hop)
            for k in range(size // hop):
                start = first - k * timedelta(minutes=hop)
                window = (start, start + timedelta(minutes=size))
                if window[1] > boundary or (source == "dlq" and window not in late):
                    continue
                groups.setdefault((*window, r["device_id"]), []).append(r)
    result = {}
    for key, rows in groups.items():
        temps = [r["temp_c"] for r in rows]
        values: tuple[Any, ...] = (len(rows), round(sum(temps) / len(temps), 9), min(r["battery"] for r in rows))
        result[key] = (*values, max(temps)) if metric else values
    return result


def gold(settings: Settings, *, metric: bool) -> dict[tuple[datetime, datetime, str], tuple[Any, ...]]:
    out = {}
    for r in table(settings, "gold/device_temps"):
        values = (r["readings"], round(r["avg_temp_c"], 9), r["min_battery"])
        out[(utc(r["window_start"]), utc(r["window_end"]), r["device_id"])] = (
            (*values, r["max_temp_c"]) if metric else values)
    return out


def kill_run(settings: Settings, folder: Path, now: str, kill_after: str) -> None:
    env = {**os.environ, "SLUICE_HOME": str(settings.home), "SLUICE_PIPELINES": str(folder), "SLUICE_NOW": now,
           "PYSPARK_PYTHON": sys.executable, "SLUICE_KILL_AFTER_COMMIT": kill_after,
           "SLUICE_BATCH_CLOSE_ROWS": str(settings.batch_close_rows)}
    crashed = subprocess.run([sys.executable, "-m", "sluice.cli", "run", "device_temps"], env=env,
                             capture_output=True, text=True, timeout=900)
    assert crashed.returncode == -9, f"no SIGKILL after {kill_after}: {crashed.returncode} {crashed.stderr[-3000:]}"


@pytest.mark.spark
@pytest.mark.slow
def test_a_pipeline_changes_and_sluice_rebuilds_goes_forward_or_refuses(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = write_tutorial(tmp_path / "pipelines")
    source = (folder / "device_temps.py").read_text()
    # Every cycle streams (no batch close of small cycles): the checkpoint generations a change starts are under
    # test, beside the rebuild.
    environ = {"SLUICE_PIPELINES": str(folder), "SLUICE_BATCH_CLOSE_ROWS": "0"}
    settings = load_settings(environ, home=tmp_path / "home")

    def edit(text: str) -> Settings:
        (folder / "device_temps.py").write_text(text)
        edited = load_settings(environ, home=tmp_path / "home")
        assert edited.registry.errors == []
        return edited

    def run(current: Settings, now: str) -> Any:
        at_now = replace(current, now_override=datetime.fromisoformat(now))
        return run_cycle(open_run(at_now, spark), "device_temps", deliver_alerts=False)

    def plan(current: Settings) -> Any:
        return plan_pipeline(open_run(current, spark), current.pipeline("device_temps"))

    assert plan(settings).status == "new"
    for name, arrival in (("readings-1015.jsonl", "10:15"), ("readings-1030.jsonl", "10:30")):
        land(settings, "readings", name, (EXAMPLES / name).read_text().splitlines(), at(arrival))
    run(settings, "2024-05-01T10:31:00Z")
    land(settings, "readings", "readings-1045.jsonl", (EXAMPLES / "readings-1045.jsonl").read_text().splitlines(),
         at("10:45"))
    run(settings, "2024-05-01T11:00:00Z")
    # The held-back reading's windows get it through a backfill with --include-late.
    late_times = [utc(r["event_time"]) for r in table(settings, "dlq/readings")]
    assert late_times, "the example files hold one late reading"
    late = {(s, s + timedelta(minutes=15)) for t in late_times
            for s in (t - (t - at("00:00")) % timedelta(minutes=5) - k * timedelta(minutes=5) for k in range(3))}
    filled = run_backfill(open_run(replace(settings, now_override=at("11:00")), spark), "device_temps",
                          min(late)[0], max(late)[0] + timedelta(minutes=5), include_late=True, deliver_alerts=False)
    assert set(filled.windows) == late
    first_gold = table(settings, "gold/device_temps")
    assert gold(settings, metric=False) == oracle(settings, 15, 5, metric=False, late=late)
    first_fp = recorded_outputs(lake_state(settings), "device_temps")["device_temps"].definition.fingerprint
    closed = sorted((utc(r.window_start), utc(r.window_end)) for r in read_ledger(settings, "device_temps"))

    # A comment and a reformatting are no change: nothing to plan, nothing rewritten.
    commented = edit(source.replace(AVG, AVG.replace(".alias", "  # the mean\n                  .alias")))
    assert plan(commented).status == "unchanged"
    version = DeltaTable(str(tmp_path / "home/lake/gold/device_temps")).version()
    assert run(commented, "2024-05-01T11:00:00Z").changes is None
    assert DeltaTable(str(tmp_path / "home/lake/gold/device_temps")).version() == version

    # An added metric: `sluice plan` says what changes and what the next run does; the run rebuilds every closed
    # window into gold in one commit, with the new column, and validates them again.
    metric = edit(source.replace(AVG, MAX))
    assert cli_main(["--pipelines", str(folder), "--home", str(tmp_path / "home"), "plan", "device_temps"]) == 0
    printed = capsys.readouterr().out
    assert "columns added: max_temp_c double" in printed, printed
    assert f"rebuild: recomputes the {len(closed)} closed window(s) (2024-05-01 " in printed, printed
    assert cli_main(["--pipelines", str(folder), "--home", str(tmp_path / "home"), "plan", "--json"]) == 0
    [doc] = json.loads(capsys.readouterr().out)["pipelines"]
    assert (doc["status"], doc["closed_windows"]) == ("changed", len(closed))
    [out] = doc["outputs"]
    assert (out["before"], out["columns"]["added"], out["on_change"]) == (first_fp, ["max_temp_c double"], "rebuild")
    result = run(metric, "2024-05-01T11:00:00Z")
    assert result.changes is not None and result.changes.rebuilt == {"device_temps": len(first_gold)}
    assert "definition changed: rebuilt gold/device_temps" in result.render()
    assert DeltaTable(str(tmp_path / "home/lake/gold/device_temps")).version() == version + 1
    assert gold(metric, metric=True) == oracle(metric, 15, 5, metric=True, late=late)
    ledger = read_ledger(metric, "device_temps")
    new_fp = recorded_outputs(lake_state(metric), "device_temps")["device_temps"].definition.fingerprint
    assert new_fp != first_fp
    assert {r.definition for r in ledger} == {json.dumps({"device_temps": new_fp})}
    assert sorted((utc(r.window_start), utc(r.window_end)) for r in ledger) == closed
    assert {r.state for r in ledger} <= {"reprocessed", "failed"} and {r.late_in_gold for r in ledger if r.window
                                                                       in late} != {0}
    assert recorded_outputs(lake_state(metric), "device_temps")["device_temps"].generation == 1
    assert (tmp_path / "home/lake/_checkpoints/pipelines/device_temps/device_temps/commits").is_dir()  # kept

    # Reverting the file is a change like any other, and its rebuild gives the first gold: the same rows, columns
    # and values (doubles to the last bits that the order of a sum moves: streaming added them batch by batch).
    reverted = edit(source)
    run(reverted, "2024-05-01T11:00:00Z")
    assert same_rows(table(reverted, "gold/device_temps"), first_gold)
    assert {r.definition for r in read_ledger(reverted, "device_temps")} == {json.dumps({"device_temps": first_fp})}
    assert recorded_outputs(lake_state(reverted), "device_temps")["device_temps"].generation == 2

    # A window change, killed after the rebuild's gold commit, then after its ledger commit: once rerun, gold and
    # the ledger hold only 10-minute windows, as the oracle says; the old windows' DQ history stays.
    tumbling = edit(source.replace(WINDOW, 'window="10m"'))
    dq_before = table(tumbling, "ops/dq_results")
    kill_run(tumbling, folder, "2024-05-01T11:00:00Z", "gold/device_temps@sluice.rebuild:1")
    kill_run(tumbling, folder, "2024-05-01T11:00:00Z", "ops/window_ledger@sluice.ledger.rebuild:1")
    # ... and once more in its validation, after the new definitions were recorded: the rerun still finishes it.
    kill_run(tumbling, folder, "2024-05-01T11:00:00Z", "ops/dq_results:1")
    run(tumbling, "2024-05-01T11:00:00Z")
    tumbled = gold(tumbling, metric=False)
    assert tumbled == oracle(tumbling, 10, 10, metric=False)
    windows = {(utc(r.window_start), utc(r.window_end)) for r in read_ledger(tumbling, "device_temps")}
    assert windows == {(s, e) for s, e, _d in gold(tumbling, metric=False)}
    assert {e - s for s, e in windows} == {timedelta(minutes=10)}
    assert {r.state for r in read_ledger(tumbling, "device_temps")} <= {"reprocessed", "failed"}
    assert json.loads((tmp_path / "home/lake/_checkpoints/pipelines/device_temps/rebuild.json").read_text())["done"]
    dq_after = table(tumbling, "ops/dq_results")
    assert [r for r in dq_before if r not in dq_after] == []
    rebuilds = [c for c in DeltaTable(str(tmp_path / "home/lake/gold/device_temps")).history()
                if "rebuild" in str(c.get("userMetadata", ""))]
    assert len(rebuilds) == 3  # the metric, the rollback, the window: the killed runs committed gold once

    # "fail" refuses with the plan; "forward" cannot take a window change.
    failing = edit(source.replace(WINDOW, 'window="10m", on_change="fail"').replace(AVG, MAX))
    with pytest.raises(ChangeRefused, match=r"(?s)on_change='fail'.*columns added: max_temp_c"):
        run(failing, "2024-05-01T11:00:00Z")
    page = windows_data(failing, str)["pipelines"][0]["definition"]  # the ledger page's view of it
    assert page["plan"]["status"] == "refused" and "columns added: max_temp_c" in page["plan"]["text"]
    with pytest.raises(ChangeRefused, match="cannot go forward"):
        run(edit(source.replace(WINDOW, 'on_change="forward"')), "2024-05-01T11:00:00Z")

    # "forward": the closed windows keep their rows (the new column null) and their definition; new windows,
    # from a checkpoint whose state covers the open windows, use the new one; a backfill upgrades a range.
    forward = edit(source.replace(WINDOW, 'window="10m", on_change="forward"').replace(AVG, MAX))
    run(forward, "2024-05-01T11:00:00Z")
    kept = table(forward, "gold/device_temps")
    assert {r["max_temp_c"] for r in kept} == {None} and len(kept) == len(tumbled)
    old_windows = {(s, e) for s, e, _d in tumbled}
    land(forward, "readings", "readings-1110.jsonl", [
        {"reading_id": f"dev-{d}-{m}", "device_id": f"dev-{d}", "temp_c": 20.0 + d + m / 100, "battery": 70 + d,
         "event_time": f"2024-05-01T{10 + m // 60}:{m % 60:02d}:00Z"} for d in range(1, 5) for m in range(46, 66)],
         at("11:10"))
    run(forward, "2024-05-01T11:11:00Z")
    expected = oracle(forward, 10, 10, metric=True)
    rows = table(forward, "gold/device_temps")
    new_rows = {k: v for k, v in gold_with_nulls(rows).items() if k[:2] not in old_windows}
    assert new_rows and new_rows == {k: v for k, v in expected.items() if k[:2] not in old_windows}
    fp = recorded_outputs(lake_state(forward), "device_temps")["device_temps"].definition.fingerprint
    by_def = {(utc(r.window_start), utc(r.window_end)): json.loads(r.definition)["device_temps"]
              for r in read_ledger(forward, "device_temps")}
    assert {w for w, d in by_def.items() if d != fp} == old_windows
    assert cli_main(["--home", str(tmp_path / "home"), "--pipelines", str(folder), "status"]) == 0
    printed = capsys.readouterr().out
    assert f"{len(old_windows)} window(s) built by an older definition of gold/device_temps" in printed, printed
    page = windows_data(forward, str)["pipelines"][0]["definition"]
    assert page["outputs"] == [{"output": "device_temps", "fingerprint": fp, "older_windows": len(old_windows)}]
    assert page["plan"] is None  # the change is applied: nothing left to show
    upgraded = sorted(old_windows)[-2:]
    run_backfill(open_run(replace(forward, now_override=at("11:11")), spark), "device_temps", upgraded[0][0],
                 upgraded[-1][1], deliver_alerts=False)
    by_def = {(utc(r.window_start), utc(r.window_end)): json.loads(r.definition)["device_temps"]
              for r in read_ledger(forward, "device_temps")}
    assert {w for w, d in by_def.items() if d != fp} == old_windows - set(upgraded)
    for key, values in gold_with_nulls(table(forward, "gold/device_temps")).items():
        if key[:2] in upgraded:
            assert values == expected[key]
    shutil.rmtree(tmp_path / "home", ignore_errors=True)


def same_rows(got: list[dict[str, Any]], want: list[dict[str, Any]]) -> bool:
    def key(r: dict[str, Any]) -> tuple[Any, ...]:
        return (r["window_start"], r["window_end"], r["device_id"])

    got, want = sorted(got, key=key), sorted(want, key=key)
    assert [list(r) for r in got] == [list(r) for r in want]  # the same columns, in order
    for a, b in zip(got, want, strict=True):
        assert a.keys() == b.keys()
        for name in a:
            if isinstance(a[name], float):
                assert math.isclose(a[name], b[name], rel_tol=1e-12), (key(a), name, a[name], b[name])
            else:
                assert a[name] == b[name], (key(a), name)
    return len(got) == len(want)


def gold_with_nulls(rows: list[dict[str, Any]]) -> dict[tuple[datetime, datetime, str], tuple[Any, ...]]:
    return {(utc(r["window_start"]), utc(r["window_end"]), r["device_id"]):
            (r["readings"], round(r["avg_temp_c"], 9), r["min_battery"], r["max_temp_c"]) for r in rows}

@pytest.mark.spark
@pytest.mark.slow
def test_a_window_change_after_a_catch_up_gives_the_gold_of_a_fresh_home(spark: SparkSession, tmp_path: Path) -> None:
    """SPEC 8's pipeline catches up past its last data (an idle heartbeat moved W to 11:28, so every window
    ending by then is final, most of them empty); a window change must rebuild every window final by then, not
    only those up to the last one that held rows: the edited pipeline's gold is that of a fresh home."""
    readings = [{"reading_id": f"r{i}", "device_id": f"d{i % 2}", "temp_c": 20.0 + i,
                 "event_time": f"2024-05-01T10:{2 * i:02d}:00Z"} for i in range(20)]
    edited = SPEC_EXAMPLE.replace('F.avg("temp_c").alias("avg_temp_c")',
                                  'F.avg("temp_c").alias("avg_temp_c"), F.max("temp_c").alias("max_temp_c")'
                                  ).replace('window=("15m", "5m")', 'window="30m"')

    def home(name: str, source: str) -> Settings:
        folder = tmp_path / f"{name}-pipelines"
        folder.mkdir(exist_ok=True)
        (folder / "device_temps.py").write_text(source)
        settings = load_settings({"SLUICE_PIPELINES": str(folder)}, home=tmp_path / name)
        assert settings.registry.errors == []
        return replace(settings, now_override=at("12:00"))

    def run(settings: Settings) -> None:
        run_cycle(open_run(settings, spark), "device_temps", deliver_alerts=False)

    def gold_and_ledger(settings: Settings) -> tuple[list[tuple[Any, ...]], list[tuple[datetime, datetime, str]]]:
        rows = sorted((utc(r["window_start"]), utc(r["window_end"]), r["device_id"], r["readings"],
                       round(r["avg_temp_c"], 9), r["max_temp_c"]) for r in table(settings, "gold/device_temps"))
        ledger = sorted((utc(r.window_start), utc(r.window_end), r.definition)
                        for r in read_ledger(settings, "device_temps"))
        return rows, ledger

    changed = home("changed", SPEC_EXAMPLE)
    land(changed, "readings", "r1.jsonl", readings, at("10:45"))
    run(changed)
    assert (changed.checkpoints / "pipelines/device_temps/catchup.json").exists()
    changed = home("changed", edited)
    plan = plan_pipeline(open_run(changed, spark), changed.pipeline("device_temps"))
    assert plan.boundary == at("11:28"), plan.render()
    # It says so: the windows the watermark passed after the last one with rows are rebuilt too.
    assert "and every window ending by 2024-05-01 11:28 UTC, which the watermark has passed, from bronze" in \
        plan.render(), plan.render()
    assert plan.to_json()["closed_through"] == at("11:28").isoformat()
    run(changed)
    fresh = home("fresh", edited)
    land(fresh, "readings", "r1.jsonl", readings, at("10:45"))
    run(fresh)
    expected = gold_and_ledger(fresh)
    assert [w[:2] for w in expected[1]] == [(at("10:00"), at("10:30")), (at("10:30"), at("11:00"))]
    assert gold_and_ledger(changed) == expected
