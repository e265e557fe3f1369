"""Backfills (SPEC section 6) on real Spark and real Delta tables.

* Bad requests are refused before any Spark work: by ``validate_request`` and by the ``sluice backfill`` CLI.
* Determinism: twice gives identical tables; without late data the output equals what streaming wrote; with
  ``include_late`` exactly the windows with DLQ records change; the ledger says ``reprocessed`` and the DQ
  checks re-run; windows the watermark has not closed are never written.
* A backfill and a scheduled run of the same pipeline never write at the same time (two real processes).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from sluice.config import ConfigError, Settings, load_settings
from sluice.core.windows import Window
from sluice.runtime.context import open_run
from sluice.streaming.backfill import run_backfill, validate_request
from sluice.streaming.cycle import run_cycle
from sluice.streaming.rewrite import BackfillResult
from sluice_tools.generate import GenerateOptions, generate
from support.lake import read_rows

START = datetime(2024, 5, 1, tzinfo=UTC)
HOUR = timedelta(hours=1)
JOIN_BOUND = timedelta(minutes=30)
PIPELINE = "ad_clicks_hourly"
GOLD = ("gold/ad_clicks_hourly", "gold/unmatched_clicks_hourly")
SLUICE = Path(sys.executable).parent / "sluice"
# Lateness is not what these tests are about: a high threshold keeps DQ verdicts on completeness/validity.
ENV = {"SLUICE_LATENESS_THRESHOLD": "0.5"}



# ------------------------------------------------------------------------------------------------ helpers
def utc(value: datetime) -> datetime:
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def rows(settings: Settings, table: str) -> list[dict[str, Any]]:
    path = settings.lake.local() / table
    if not DeltaTable.is_deltatable(str(path)):
        return []
    return read_rows(path)


def window_of(row: dict[str, Any]) -> Window:
    return (utc(row["window_start"]), utc(row["window_end"]))


def snapshot(settings: Settings) -> dict[str, list[tuple[Any, ...]]]:
    """Every gold table's content, as sorted rows (the comparison SPEC 6 asks for)."""
    return {t: sorted(tuple(sorted(r.items())) for r in rows(settings, t)) for t in GOLD}


def by_window(settings: Settings, table: str) -> dict[Window, list[tuple[Any, ...]]]:
    out: dict[Window, list[tuple[Any, ...]]] = defaultdict(list)
    for r in rows(settings, table):
        out[window_of(r)].append(tuple(sorted(r.items())))
    return {w: sorted(v) for w, v in out.items()}


def ledger(settings: Settings, pipeline: str = PIPELINE) -> dict[Window, str]:
    return {window_of(r): r["state"] for r in rows(settings, "ops/window_ledger") if r["pipeline"] == pipeline}


def hour_of(ts: datetime) -> Window:
    start = utc(ts).replace(minute=0, second=0, microsecond=0)
    return (start, start + HOUR)


def version(settings: Settings, table: str) -> int:
    return DeltaTable(str(settings.lake.local() / table)).version()


def rfc3339(value: datetime) -> str:
    return value.isoformat().replace("+00:00", "Z")


# ------------------------------------------------------------------------------------------------ requests
def test_validate_request_accepts_aligned_range_and_normalises_to_utc(settings: Settings) -> None:
    request = validate_request(settings, PIPELINE, "2024-05-01T02:00:00+02:00", "2024-05-01T03:00:00Z", True)
    assert request.pipeline.name == PIPELINE
    assert request.start == START and request.end == START + 3 * HOUR
    assert request.start.utcoffset() == timedelta(0)
    assert request.include_late is True


@pytest.mark.parametrize(
    ("pipeline", "start", "end", "says"),
    [
        (PIPELINE, "2024-05-01T02:00:00Z", "2024-05-01T01:00:00Z", ["must be before", "swap"]),
        (PIPELINE, "2024-05-01T01:00:00Z", "2024-05-01T01:00:00Z", ["must be before"]),
        (PIPELINE, "2024-05-01T00:30:00Z", "2024-05-01T02:00:00Z",
         ["start", "not aligned", "use e.g. 2024-05-01T00:00:00+00:00"]),
        ("user_activity_hourly", "2024-05-01T00:00:00Z", "2024-05-01T01:15:00Z",
         ["end", "not aligned", "use e.g. 2024-05-01T01:00:00+00:00"]),
        ("no_such_pipeline", "2024-05-01T00:00:00Z", "2024-05-01T01:00:00Z",
         ["unknown pipeline", "ad_clicks_hourly", "user_activity_hourly"]),
        (PIPELINE, "yesterday", "2024-05-01T01:00:00Z", ["start", "RFC 3339", "e.g."]),
    ],
    ids=["reversed", "empty", "misaligned-start", "misaligned-end", "unknown-pipeline", "not-a-timestamp"],
)
def test_validate_request_refuses_with_a_message_that_says_what_to_do(
    settings: Settings, pipeline: str, start: str, end: str, says: list[str]
) -> None:
    with pytest.raises(ConfigError) as info:
        validate_request(settings, pipeline, start, end)
    for fragment in says:
        assert fragment in str(info.value), str(info.value)
    assert not settings.home.exists()


def _cli_env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLUICE_", "AIRFLOW_CONN_"))}
    env.update(SLUICE_HOME=str(home), TZ="UTC", **extra)
    return env


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("args", "says"),
    [
        ([PIPELINE, "--start", "2024-05-01T03:00:00Z", "--end", "2024-05-01T01:00:00Z"], "must be before"),
        ([PIPELINE, "--start", "2024-05-01T00:20:00Z", "--end", "2024-05-01T01:00:00Z"], "not aligned"),
        (["no_such_pipeline", "--start", "2024-05-01T00:00:00Z", "--end", "2024-05-01T01:00:00Z"],
         "unknown pipeline"),
    ],
    ids=["reversed", "misaligned", "unknown-pipeline"],
)
def test_cli_backfill_refuses_bad_params_before_spark(tmp_path: Path, args: list[str], says: str) -> None:
    home = tmp_path / "home"
    started = time.monotonic()
    done = subprocess.run([str(SLUICE), "backfill", *args], env=_cli_env(home), cwd=tmp_path,
                          capture_output=True, text=True, timeout=240, check=False)
    elapsed = time.monotonic() - started
    assert done.returncode not in (0, 2), (done.returncode, done.stderr)
    assert says in done.stderr, done.stderr
    assert "sluice: error:" in done.stderr
    assert "Traceback" not in done.stderr
    # No Spark: nothing under SLUICE_HOME (not even the lock directory), no JVM output, and quick.
    assert not home.exists(), sorted(str(p) for p in home.rglob("*"))
    assert "SparkContext" not in done.stderr and "log4j" not in done.stderr
    assert elapsed < 60, f"refusing bad params took {elapsed:.0f}s: did it start Spark?"


# ------------------------------------------------------------------------------------------------ determinism
# Six hours of impressions and clicks with one late impression and one late click (so at most four windows
# can see late data); "now" is just after the last file arrived, so the watermark closes the first windows
# and leaves the last one open (no idle heartbeat yet).
OPTIONS = GenerateOptions(
    seed=11, hours=6, impressions_per_hour=100, click_rate=0.3, late_share=0.002, ads=8, users=20,
    streams=("impressions", "clicks"),
)


@dataclass
class Base:
    home: Path
    now: datetime
    gold: dict[str, list[tuple[Any, ...]]]
    closed: list[Window]
    open: list[Window]
    dlq_impressions: dict[Window, set[str]]
    dlq_click_times: list[datetime]

    def settings(self, home: Path) -> Settings:
        return load_settings(ENV, home=home, now=self.now)

    def copy(self, target: Path) -> Settings:
        shutil.copytree(self.home, target)
        return self.settings(target)

    def clean(self, w: Window) -> bool:
        """No DLQ record can reach window ``w`` of either gold table (impressions in it, clicks up to the
        join bound after it, impressions up to the join bound before it for unmatched clicks)."""
        if self.dlq_impressions.get(w):
            return False
        if any(w[0] - JOIN_BOUND <= t < w[1] + JOIN_BOUND for t in self.dlq_click_times):
            return False
        return not any(s[0] < w[1] and s[1] > w[0] - JOIN_BOUND for s, ids in self.dlq_impressions.items() if ids)


@pytest.fixture(scope="module")
def base(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Base:
    home = tmp_path_factory.mktemp("backfill-base") / "home"
    landing_settings = load_settings(ENV, home=home)
    manifest = generate(landing_settings.landing.local(), OPTIONS, specs=landing_settings.streams)
    assert manifest.last_arrival is not None
    now = manifest.last_arrival + timedelta(minutes=5)
    settings = load_settings(ENV, home=home, now=now)
    result = run_cycle(open_run(settings, spark), PIPELINE)
    assert result.exit_code == 0, result.render()

    states = ledger(settings)
    closed = sorted(states)
    assert all(s == "validated" for s in states.values()), states
    gold_windows = {window_of(r) for r in rows(settings, "gold/ad_clicks_hourly")}
    assert gold_windows == set(closed)
    all_windows = [(START + i * HOUR, START + (i + 1) * HOUR) for i in range(int(OPTIONS.hours))]
    open_windows = [w for w in all_windows if w not in states]
    dlq_impressions: dict[Window, set[str]] = defaultdict(set)
    for r in rows(settings, "dlq/impressions"):
        dlq_impressions[hour_of(r["event_time"])].add(r["impression_id"])
    click_times = [utc(r["event_time"]) for r in rows(settings, "dlq/clicks")]
    b = Base(home, now, snapshot(settings), closed, open_windows, dict(dlq_impressions), click_times)

    # Preconditions of the scenario (a different generator would need a different seed).
    assert len(closed) >= 2 and open_windows, f"closed {closed}, open {open_windows}"
    assert any(b.dlq_impressions.get(w) for w in closed), f"no late impressions in a closed window: {dlq_impressions}"
    assert any(b.clean(w) for w in closed), f"every closed window has late data: {dlq_impressions} {click_times}"
    return b


def _backfill(settings: Settings, spark: SparkSession, start: datetime, end: datetime, late: bool) -> BackfillResult:
    return run_backfill(open_run(settings, spark), PIPELINE, rfc3339(start), rfc3339(end), include_late=late)


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_backfill_without_late_equals_streaming_reprocesses_and_skips_open(
    base: Base, spark: SparkSession, tmp_path: Path
) -> None:
    """(b) output == what streaming wrote, (a) twice == once, (d) ledger ``reprocessed`` + DQ re-run,
    (e) a window the watermark has not closed is neither written nor marked."""
    settings = base.copy(tmp_path / "home")
    dq_version = version(settings, "ops/dq_results")
    end = base.open[-1][1]  # the range covers every closed window and the open one(s)

    result = _backfill(settings, spark, START, end, late=False)
    assert result.exit_code == 0, result.render()
    assert result.windows == base.closed
    assert set(base.open) <= set(result.skipped_open), result.skipped_open
    assert snapshot(settings) == base.gold, "without late data a backfill must reproduce the streaming output"

    states = ledger(settings)
    assert {w: states[w] for w in base.closed} == {w: "reprocessed" for w in base.closed}
    assert not set(base.open) & set(states), "an open window got a ledger row"
    for table in GOLD:
        assert not set(base.open) & set(by_window(settings, table)), f"{table}: an open window was written"
    # DQ re-ran for exactly the reprocessed windows.
    assert version(settings, "ops/dq_results") > dq_version
    dq = [r for r in rows(settings, "ops/dq_results") if r["pipeline"] == PIPELINE]
    assert {window_of(r) for r in dq} == set(base.closed)
    assert all(r["success"] for r in dq), [(window_of(r), r["expectation"], r["observed_value"]) for r in dq]
    assert Counter(window_of(r) for r in dq) == Counter(
        {w: len(dq) // len(base.closed) for w in base.closed}
    ), "each window must have one row per expectation, no stale duplicates"

    again = _backfill(settings, spark, START, end, late=False)
    assert again.windows == result.windows
    assert snapshot(settings) == base.gold


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_include_late_changes_exactly_the_late_windows_and_is_repeatable(
    base: Base, spark: SparkSession, tmp_path: Path
) -> None:
    """(c) with include_late, windows with DLQ impressions gain exactly those impressions, windows that no
    late record can reach stay identical, windows outside the range are untouched, and the backfill passes
    its own quality checks; (a) twice == once."""
    settings = base.copy(tmp_path / "home")
    before = {t: by_window(settings, t) for t in GOLD}
    late_window = next(w for w in base.closed if base.dlq_impressions.get(w))

    # Exactly the range: only the late window, whatever late data its neighbours have.
    _backfill(settings, spark, late_window[0], late_window[1], late=True)
    after = {t: by_window(settings, t) for t in GOLD}
    for table in GOLD:
        for w in set(before[table]) | set(after[table]):
            if w != late_window:
                assert after[table].get(w) == before[table].get(w), f"{table} {w} is outside the range"

    # The whole closed range.
    first = _backfill(settings, spark, base.closed[0][0], base.closed[-1][1], late=True)
    assert first.windows == base.closed
    # SPEC 6: a backfill re-runs DQ and marks the ledger ``reprocessed``. Bringing the DLQ records back in is the
    # point of include_late, so the completeness check must count them on the bronze side too: nothing fails,
    # nothing alerts.
    assert first.quality is not None
    assert first.quality.failed == {}, first.render()
    assert ledger(settings) == {w: "reprocessed" for w in base.closed}
    assert rows(settings, "ops/alerts") == []
    once = snapshot(settings)
    after = {t: by_window(settings, t) for t in GOLD}

    def impressions(table: dict[Window, list[tuple[Any, ...]]], w: Window) -> int:
        return sum(dict(r)["impressions"] for r in table.get(w, []))

    changed = 0
    for w in base.closed:
        n_late = len(base.dlq_impressions.get(w, set()))
        gained = impressions(after["gold/ad_clicks_hourly"], w) - impressions(before["gold/ad_clicks_hourly"], w)
        assert gained == n_late, f"{w}: {n_late} late impressions, gold gained {gained}"
        changed += n_late > 0
        if base.clean(w):
            for table in GOLD:
                assert after[table].get(w) == before[table].get(w), f"{table} {w} has no late data but changed"
    assert changed, "no window changed: include_late brought nothing in"

    # Twice == once, byte for byte in content.
    second = _backfill(settings, spark, base.closed[0][0], base.closed[-1][1], late=True)
    assert second.windows == first.windows
    assert snapshot(settings) == once
    states = ledger(settings)
    assert set(states) == set(base.closed)
    assert set(states.values()) <= {"reprocessed", "failed"}


# ------------------------------------------------------------------------------------------------ serialisation
def _commits(table: Path) -> list[tuple[int, int, set[str]]]:
    """(version, commit timestamp ms, app ids) of every commit in a Delta log."""
    out = []
    for entry in sorted((table / "_delta_log").glob("*.json")):
        ts, apps = None, set()
        for line in entry.read_text().splitlines():
            action = json.loads(line)
            if "commitInfo" in action:
                ts = int(action["commitInfo"]["timestamp"])
            if "txn" in action:
                apps.add(action["txn"]["appId"])
        assert ts is not None, entry
        out.append((int(entry.stem), ts, apps))
    return out


def _wait_for(predicate: Any, timeout: float, what: str, proc: subprocess.Popen[Any] | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc is not None and proc.poll() is not None and not predicate():
            raise AssertionError(f"process exited ({proc.returncode}) before {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.1)


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[Any]]]:
    procs: list[subprocess.Popen[Any]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=20)


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_backfill_waits_for_a_running_cycle_and_commits_after_it(
    spark: SparkSession, tmp_path: Path, processes: list[subprocess.Popen[Any]]
) -> None:
    pipeline = "user_activity_hourly"
    home = tmp_path / "home"
    events = {"streams": ("events",), "events_per_hour": 150, "late_share": 0.0, "users": 20}
    # Phase 1 (in process): three hours, windows 0-1 closed.
    first = load_settings({}, home=home)
    manifest = generate(first.landing.local(), GenerateOptions(seed=5, hours=3, **events), specs=first.streams)
    assert manifest.last_arrival is not None
    first = load_settings({}, home=home, now=manifest.last_arrival + timedelta(minutes=5))
    assert run_cycle(open_run(first, spark), pipeline).exit_code == 0
    closed = sorted(ledger(first, pipeline))
    assert len(closed) >= 2, closed
    # Phase 2: two more hours arrive; the scheduled run (a real `sluice run` process) closes more windows.
    generate(first.landing.local(), GenerateOptions(seed=6, start=START + 3 * HOUR, hours=2, **events),
             specs=first.streams)
    now = START + 7 * HOUR
    tables = [home / "lake" / t for t in ("gold/user_activity_hourly", "ops/window_ledger", "ops/dq_results")]
    baseline = {t: max(v for v, _ts, _apps in _commits(t)) for t in tables}

    env = _cli_env(home, SLUICE_NOW=rfc3339(now))
    run_log, backfill_log = tmp_path / "run.log", tmp_path / "backfill.log"
    with open(run_log, "w") as run_err:
        run = subprocess.Popen([str(SLUICE), "run", pipeline], env=env, cwd=tmp_path,
                               stdout=subprocess.DEVNULL, stderr=run_err)
    processes.append(run)
    lock = home / "locks" / f"{pipeline}.lock"
    _wait_for(lambda: lock.exists() and lock.read_text().startswith(f"pid {run.pid} "), 600,
              "the run to take the pipeline lock", run)

    with open(backfill_log, "w") as bf_err:
        backfill = subprocess.Popen(
            [str(SLUICE), "backfill", pipeline, "--start", rfc3339(closed[0][0]), "--end", rfc3339(closed[-1][1])],
            env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=bf_err,
        )
    processes.append(backfill)
    _wait_for(lambda: "waiting for the pipeline lock" in backfill_log.read_text(), 120,
              "the backfill to wait for the lock", backfill)
    assert f"held by pid {run.pid}" in backfill_log.read_text()
    assert run.poll() is None, "the run must still hold the lock while the backfill waits"

    # Poll the run tightly: the first moment it is seen gone bounds its last commit from above.
    deadline = time.monotonic() + 900
    while run.poll() is None:
        assert time.monotonic() < deadline, "sluice run did not finish"
        time.sleep(0.05)
    run_gone_ms = int(time.time() * 1000)
    assert run.returncode == 0, run_log.read_text()[-3000:]
    assert backfill.wait(timeout=900) == 0, backfill_log.read_text()[-3000:]

    new = {t: [c for c in _commits(t) if c[0] > baseline[t]] for t in tables}
    gold_commits = new[tables[0]]
    bf_gold = [c for c in gold_commits if any(a.startswith("sluice.backfill.") for a in c[2])]
    assert len(bf_gold) == 1, gold_commits
    run_gold = [c for c in gold_commits if c not in bf_gold]
    assert run_gold, "the scheduled run closed new windows, so it must have committed to gold"
    bf_ledger = [c for c in new[tables[1]] if any(a.startswith("sluice.ledger.backfill.") for a in c[2])]
    assert bf_ledger, new[tables[1]]
    backfill_first = min(ts for _v, ts, _a in bf_gold + bf_ledger)

    # Never interleaved: the backfill's first commit comes after the run process had gone, so after every
    # commit the run made; and in gold's version order the backfill's commit is the last one.
    assert backfill_first > run_gone_ms, (backfill_first, run_gone_ms)
    run_side = [ts for t in tables for _v, ts, _a in new[t] if ts < run_gone_ms]
    assert run_side and max(run_side) < backfill_first
    assert gold_commits[-1] == bf_gold[0]
    states = ledger(load_settings({}, home=home), pipeline)
    assert {w: states[w] for w in closed} == {w: "reprocessed" for w in closed}
