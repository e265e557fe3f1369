"""Airflow-native backfills (issue 11, point 2), driven for real:

* a backfill created with ``airflow backfill create`` on a fresh AIRFLOW_HOME (``airflow db migrate``), whose
  runs (run type ``backfill``) are executed by a real ``airflow scheduler`` (LocalExecutor) and
  ``airflow api-server`` on 127.0.0.1: each run reprocesses exactly the windows of its data interval through
  ``sluice backfill``, a run whose interval holds no window start does nothing, and windows outside the
  range are not rewritten;
* scheduled-path runs (``dag.test()``) take their clock from ``data_interval_end`` unless SLUICE_NOW is set
  (that it then wins: ``tests/dags/test_dag_runs.py``, whose scheduled run has SLUICE_NOW in 2024 and its
  interval in 2025). That ``sluice_backfill`` emits Asset events for exactly the chosen pipeline's gold tables
  is checked there too, on its backfill DAG run.

Real Spark (pyspark's spark-submit, local mode), real Delta, real Airflow; nothing is mocked.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import sqlite3
import subprocess
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from deltalake import DeltaTable

from sluice.core.windows import Window, windows_starting_in
from sluice_tools.generate import GenerateOptions, generate
from support.airflow_servers import REPO, VENV_BIN, Servers, free_port, sqlite_metadata_db
from support.lake import read_rows

PIPELINE = "user_activity_hourly"  # hourly windows, schedule */15: three in four 15-minute intervals hold no hour start
START = datetime(2024, 5, 1, tzinfo=UTC)
HOUR = timedelta(hours=1)
MINUTE = timedelta(minutes=1)
W0, W1 = (START, START + HOUR), (START + HOUR, START + 2 * HOUR)  # the two generated hours
NOW = START + 4 * HOUR  # the clock of the first cycle: both hours closable (heartbeat at NOW - 30 min)



# ------------------------------------------------------------------------------------------------ helpers
def z(value: datetime) -> str:
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


def utc(value: datetime) -> datetime:
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def rows(home: Path, table: str) -> list[dict[str, Any]]:
    path = home / "lake" / table
    if not DeltaTable.is_deltatable(str(path)):
        return []
    return read_rows(path)


def window(row: dict[str, Any]) -> Window:
    return (utc(row["window_start"]), utc(row["window_end"]))


def ledger(home: Path) -> dict[Window, dict[str, Any]]:
    return {window(r): r for r in rows(home, "ops/window_ledger") if r["pipeline"] == PIPELINE}


def gold_by_window(home: Path) -> dict[Window, dict[str, float]]:
    out: dict[Window, dict[str, float]] = defaultdict(dict)
    for r in rows(home, f"gold/{PIPELINE}"):
        out[window(r)][r["user_id"]] = r["avg_events_per_10min"]
    return dict(out)


def expected_user_activity(home: Path, hour: Window, *, include_late: bool) -> dict[str, float]:
    """The pipeline's contract computed independently, in plain Python, from what sluice stored: per user,
    the average number of events per 10-minute window that has events, over the accepted (bronze, no
    heartbeats) records of the hour, plus the dead-lettered ones with ``include_late``; each id once."""
    records = [r for r in rows(home, "bronze/events") if not r.get("is_heartbeat")]
    if include_late:
        records += rows(home, "dlq/events")
    seen: set[str] = set()
    per_bucket: dict[tuple[str, datetime], int] = defaultdict(int)
    for r in records:
        ts = utc(r["event_time"])
        if not hour[0] <= ts < hour[1] or r["event_id"] in seen:
            continue
        seen.add(r["event_id"])
        per_bucket[(r["user_id"], ts.replace(minute=ts.minute - ts.minute % 10, second=0, microsecond=0))] += 1
    per_user: dict[str, list[int]] = defaultdict(list)
    for (user, _bucket), n in per_bucket.items():
        per_user[user].append(n)
    return {user: sum(counts) / len(counts) for user, counts in per_user.items()}


def assert_gold_equals(actual: dict[str, float], expected: dict[str, float]) -> None:
    assert set(actual) == set(expected)
    for user, value in expected.items():
        assert actual[user] == pytest.approx(value, rel=1e-12), user


def gold_commits(home: Path) -> list[dict[str, Any]]:
    """Every commit of the gold table: version, app transaction ids and sluice's commit metadata."""
    out = []
    for entry in sorted((home / "lake" / "gold" / PIPELINE / "_delta_log").glob("*.json")):
        apps, meta = set(), {}
        for line in entry.read_text().splitlines():
            action = json.loads(line)
            if "txn" in action:
                apps.add(action["txn"]["appId"])
            # delta-spark keeps sluice's commit metadata in userMetadata (tables of sluice 0.2's delta-rs
            # engine have it under "sluice").
            info = action.get("commitInfo") or {}
            if info.get("userMetadata") or info.get("sluice"):
                meta = json.loads(info.get("userMetadata") or info["sluice"])
        out.append({"version": int(entry.stem), "apps": apps, "meta": meta})
    return out


def generate_events(home: Path, *, late_share: float) -> None:
    """Two hours of events from START, deterministic (seeded); arrival times are the files' mtimes."""
    generate(home / "landing", GenerateOptions(hours=2, events_per_hour=200, late_share=late_share,
                                               streams=("events",)))


# ------------------------------------------------------------------------------------------------ the range
M15 = timedelta(minutes=15)


@pytest.mark.parametrize(
    ("start", "end", "slide", "expected"),
    [
        # The 15-minute interval holding the hour start reprocesses that hour; the other three hold none.
        (START, START + M15, HOUR, (START, START + HOUR)),
        (START + M15, START + 2 * M15, HOUR, None),
        (START + 3 * M15, START + HOUR, HOUR, None),  # the end is exclusive: 01:00 is not in [00:45, 01:00)
        (START + 3 * M15, START + HOUR + MINUTE, HOUR, (START + HOUR, START + 2 * HOUR)),
        # A daily interval of an hourly pipeline: its 24 windows.
        (START, START + 24 * HOUR, HOUR, (START, START + 24 * HOUR)),
        # Unaligned bounds round up to the grid, on the slide of hopping windows (every 5 min).
        (START + 7 * MINUTE, START + 40 * MINUTE, timedelta(minutes=5),
         (START + 10 * MINUTE, START + 40 * MINUTE)),
        (START + timedelta(microseconds=1), START + HOUR, HOUR, None),
        # The grid is the Unix epoch's, whatever the offset the interval is given in.
        (datetime(2024, 5, 1, 2, 0, tzinfo=ZoneInfo("Europe/Berlin")),
         datetime(2024, 5, 1, 3, 0, tzinfo=ZoneInfo("Europe/Berlin")), HOUR, (START, START + HOUR)),
        (datetime(1969, 12, 31, 23, 30, tzinfo=UTC), datetime(1970, 1, 1, 1, tzinfo=UTC), HOUR,
         (datetime(1970, 1, 1, tzinfo=UTC), datetime(1970, 1, 1, 1, tzinfo=UTC))),
        (START, START, HOUR, None),  # an empty interval (a trigger timetable's [t, t))
    ],
)
def test_windows_starting_in_an_interval(
    start: datetime, end: datetime, slide: timedelta, expected: tuple[datetime, datetime] | None
) -> None:
    assert windows_starting_in(start, end, slide) == expected


def test_windows_starting_in_takes_pendulum_times_and_refuses_naive_ones() -> None:
    import pendulum

    assert windows_starting_in(pendulum.datetime(2024, 5, 1, 0, 45, tz="UTC"),
                               pendulum.datetime(2024, 5, 1, 1, 0, tz="UTC"), HOUR) is None
    assert windows_starting_in(pendulum.datetime(2024, 5, 1, 1, 0, tz="UTC"),
                               pendulum.datetime(2024, 5, 1, 1, 15, tz="UTC"), HOUR) == W1
    with pytest.raises(ValueError, match="timezone-aware"):
        windows_starting_in(datetime(2024, 5, 1), datetime(2024, 5, 2), HOUR)


# ------------------------------------------------------------------------------------------------ a deployment
@dataclass
class Deployment(Servers):
    """A fresh AIRFLOW_HOME (``airflow db migrate``) with ``airflow api-server`` and ``airflow scheduler``
    (LocalExecutor) running on 127.0.0.1 for the test's duration, all sharing one environment."""

    port: int = 0

    @property
    def airflow_home(self) -> Path:
        return Path(self.env["AIRFLOW_HOME"])

    @property
    def sluice_home(self) -> Path:
        return Path(self.env["SLUICE_HOME"])

    def wait(self, proc: subprocess.Popen[bytes], name: str, timeout: float) -> None:
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{name} still running after {timeout:.0f}s:\n{self.log(name)[-3000:]}") from None
        assert code == 0, f"{name} failed ({code}):\n{self.log(name)[-5000:]}"

    def query(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        """Read the metadata DB (SQLite, read-only) the scheduler writes."""
        db = self.airflow_home / "airflow.db"
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)) as con:
            return con.execute(sql, params).fetchall()

    def task_log(self, dag_id: str, run_id: str, task_id: str, attempt: int = 1) -> str:
        """The messages of a task attempt's log (Airflow 3 writes one JSON object per line)."""
        path = (self.airflow_home / "logs" / f"dag_id={dag_id}" / f"run_id={run_id}" / f"task_id={task_id}"
                / f"attempt={attempt}.log")
        if not path.exists():
            return f"(no log at {path})"
        lines = []
        for line in path.read_text(errors="replace").splitlines():
            try:
                lines.append(str(json.loads(line).get("event", line)))
            except json.JSONDecodeError:
                lines.append(line)
        return "\n".join(lines)


@pytest.fixture
def deployment(tmp_path: Path, clean_env: None) -> Iterator[Deployment]:
    port = free_port()
    # Nothing of the suite's own Airflow set-up (tests/conftest.py) leaks in: a fresh home, configured the
    # way a user would configure one (environment variables).
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "SLUICE_"))}
    env.update({
        "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "TZ": "UTC",
        "AIRFLOW_HOME": str(tmp_path / "airflow-home"),
        **sqlite_metadata_db(tmp_path / "airflow-home"),
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__PARALLELISM": "4",
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API__WORKERS": "1",
        "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
        # The scheduler signs the tasks' tokens and the api-server checks them: one secret for both.
        "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(32),
        # Only the backfill's runs: the scheduler creates no scheduled run of the unpaused DAG (what runs is
        # then exactly what `airflow backfill create` asked for; queued runs are still started).
        "AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE": "False",
        "SLUICE_HOME": str(tmp_path / "sluice-home"),
        "SLUICE_NOW": z(NOW),
        # The windows carry late data on purpose; this test is about which windows are rewritten, so the
        # lateness check must not fail them (alerts would fail send_alerts and the run).
        "SLUICE_LATENESS_THRESHOLD": "1",
        "SLUICE_CATCHUP_MIN_WINDOWS": "1",  # the first cycle closes its two hours in batch: same rows, less time
    })
    d = Deployment(tmp_path, env, port=port)
    try:
        yield d
    finally:
        d.stop()


# ---------------------------------------------------------------------------------------- airflow backfill create
@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_airflow_backfill_create_reprocesses_the_windows_of_each_run(deployment: Deployment) -> None:
    """``airflow backfill create --dag-id user_activity_hourly --from-date 00:00 --to-date 00:15`` with
    ``{"include_late": true}`` creates two runs of type backfill, [00:00, 00:15) and [00:15, 00:30). The
    first holds the start of the hour [00:00, 01:00): it rewrites exactly that window, late records included
    (what the conf asks for), marks it ``reprocessed`` and emits the gold Asset event. The second holds no
    window start: it does nothing, and says so. The hour [01:00, 02:00) is left as the cycle wrote it."""
    d = deployment
    home = d.sluice_home
    generate_events(home, late_share=0.03)

    d.airflow("db", "migrate")
    d.start("api-server")
    # While it starts: one cycle through the CLI (ingest; both hours closed), as a scheduled run would have
    # done (its checks are not what this test is about); and the DAGs into the metadata DB (what the
    # dag-processor does), the DAG unpaused (tasks of a paused DAG are never scheduled, backfill or not).
    cycle = d.spawn("sluice-run", str(VENV_BIN / "sluice"), "run", PIPELINE, "--skip-quality")
    d.airflow("dags", "reserialize")
    d.airflow("dags", "unpause", PIPELINE)
    d.wait_healthy(f"http://127.0.0.1:{d.port}", timeout=180)
    d.wait(cycle, "sluice-run", timeout=600)
    before = ledger(home)
    assert {w: r["state"] for w, r in before.items()} == {W0: "closed", W1: "closed"}
    gold_before = gold_by_window(home)
    assert_gold_equals(gold_before[W0], expected_user_activity(home, W0, include_late=False))
    assert before[W0]["late_rows"] > 0, "the generated data must dead-letter records of the hour reprocessed"
    # Including them changes that hour: the reprocessing is visible in the table, not only in the ledger.
    assert expected_user_activity(home, W0, include_late=True) != gold_before[W0]
    commits_before = gold_commits(home)

    created = d.airflow("backfill", "create", "--dag-id", PIPELINE,
                        "--from-date", z(START), "--to-date", z(START + M15),
                        "--dag-run-conf", json.dumps({"include_late": True}))
    # The scheduler starts once the backfill's runs are in the metadata DB, and runs them. Not before: on SQLite,
    # a scheduler loop writing while the CLI inserts its second run made the CLI fail at once with 'database is
    # locked' (a transaction that read cannot wait for a write lock another holds: SQLite's busy timeout does
    # not apply, CI 2026-11-28). Airflow's PostgreSQL (make platform, tests/platform) has no such limit.
    d.start("scheduler")

    deadline = time.monotonic() + 600
    while True:
        d.assert_alive()
        retried = d.query("SELECT run_id, task_id, try_number FROM task_instance "
                          "WHERE dag_id = ? AND state IN ('up_for_retry', 'failed')", PIPELINE)
        assert not retried, "\n\n".join(
            f"{run_id} {task_id} failed:\n{d.task_log(PIPELINE, run_id, task_id, attempt)[-6000:]}"
            for run_id, task_id, attempt in retried)
        runs = d.query("SELECT run_id, state FROM dag_run WHERE dag_id = ?", PIPELINE)
        if len(runs) == 2 and all(state in ("success", "failed") for _run_id, state in runs):
            break
        assert time.monotonic() < deadline, f"backfill runs not finished: {runs}\n{created.stdout[-3000:]}"
        time.sleep(1)
    backfills = d.query("SELECT id FROM backfill WHERE dag_id = ?", PIPELINE)
    assert len(backfills) == 1

    runs = d.query("SELECT run_id, run_type, state, data_interval_start, data_interval_end, backfill_id, conf "
                   "FROM dag_run WHERE dag_id = ? ORDER BY data_interval_start", PIPELINE)
    assert [(r[1], r[2], r[5]) for r in runs] == [("backfill", "success", backfills[0][0])] * 2, runs
    intervals = [(utc(datetime.fromisoformat(r[3])), utc(datetime.fromisoformat(r[4]))) for r in runs]
    assert intervals == [(START, START + M15), (START + M15, START + 2 * M15)]
    (first, *_), (second, *_) = runs
    states = {(run_id, task): state for run_id, task, state in d.query(
        "SELECT run_id, task_id, state FROM task_instance WHERE dag_id = ?", PIPELINE)}
    assert {task: states[(first, task)] for run_id, task in states if run_id == first} == {
        "choose_path": "success", "run_cycle": "skipped", "reprocess_interval": "success",
        "send_alerts": "success", "check_quality": "success"}  # the run's data-quality outcome, last
    assert {task: states[(second, task)] for run_id, task in states if run_id == second} == {
        "choose_path": "success", "run_cycle": "skipped", "check_quality": "skipped",
        "reprocess_interval": "skipped", "send_alerts": "skipped"}
    assert "nothing to reprocess" in d.task_log(PIPELINE, second, "choose_path")
    assert f"[{z(W0[0])}, {z(W0[1])}), include_late=True" in d.task_log(PIPELINE, first, "choose_path")

    # The ledger: the window of the first run's interval reprocessed; the other hour untouched.
    after = ledger(home)
    assert {w: r["state"] for w, r in after.items()} == {W0: "reprocessed", W1: "closed"}
    assert after[W1] == before[W1]

    # Gold: the reprocessed hour now holds its late records too; the other hour is what the cycle wrote.
    gold_after = gold_by_window(home)
    assert_gold_equals(gold_after[W0], expected_user_activity(home, W0, include_late=True))
    assert gold_after[W1] == gold_before[W1]

    # Exactly one rewrite of gold, the backfill's app transaction, for [00:00, 01:00) with the late records.
    new = [c for c in gold_commits(home) if c["version"] > commits_before[-1]["version"]]
    assert [c["apps"] for c in new] == [{f"sluice.backfill.{PIPELINE}"}], new
    meta = new[0]["meta"]
    assert (utc(datetime.fromisoformat(meta["start"])), utc(datetime.fromisoformat(meta["end"]))) == W0
    assert meta["include_late"] is True

    # The backfill path's outlet: one Asset event for the pipeline's gold table, from the run that rewrote it.
    events = d.query("SELECT a.uri, e.source_task_id, e.source_run_id, e.extra FROM asset_event e "
                     "JOIN asset a ON a.id = e.asset_id")
    assert [(uri, task, run_id) for uri, task, run_id, _extra in events] == \
        [(f"sluice://gold/{PIPELINE}", "reprocess_interval", first)]
    extra = json.loads(events[0][3])
    assert {k: extra[k] for k in ("pipeline", "start", "end", "include_late")} == {
        "pipeline": PIPELINE, "start": z(W0[0]), "end": z(W0[1]), "include_late": "true"}
    # What the run did to the windows, from the ledger rows it changed: only the reprocessed hour.
    assert (extra["window_count"], extra["states"], extra["windows_truncated"]) == (1, {"reprocessed": 1}, False)
    assert extra["windows"] == [{"window_start": z(W0[0]), "window_end": z(W0[1]), "state": "reprocessed",
                                 "rows": after[W0]["rows"]}]
    assert extra["rows"] == after[W0]["rows"] > 0


# ------------------------------------------------------------------------------------------------ dag.test()
@dataclass
class CycledHome:
    home: Path
    dag_run: Any


def _clean(mp: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith(("SLUICE_", "AIRFLOW_CONN_")) or name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY",
                                                                     "http_proxy", "https_proxy", "all_proxy"):
            mp.delenv(name)


# A logical date that is not on the cron grid: dag.test() gives the run the last complete interval before
# it, [03:45, 04:00), so the run's data_interval_end (04:00) differs from its logical date (04:07).
LOGICAL = START + 4 * HOUR + 7 * MINUTE
INTERVAL_END = START + 4 * HOUR


@pytest.fixture(scope="module")
def cycled_home(tmp_path_factory: pytest.TempPathFactory, run_dag: Callable[..., Any]) -> CycledHome:
    """One run of the pipeline DAG with ``dag.test()`` and **no** SLUICE_NOW: its cycle's clock must be the
    run's data_interval_end. Shared by the tests below (a Spark DAG run costs a minute or two)."""
    home = tmp_path_factory.mktemp("native-backfill-dag") / "sluice-home"
    with pytest.MonkeyPatch.context() as mp:
        _clean(mp)
        mp.setenv("SLUICE_HOME", str(home))
        mp.setenv("SLUICE_CATCHUP_MIN_WINDOWS", "1")  # both hours close in batch: the same rows, sooner
        generate_events(home, late_share=0.002)
        run = run_dag(PIPELINE, LOGICAL)
    return CycledHome(home, run)


def _task_states(dag_run: Any) -> dict[str, str]:
    return {ti.task_id: str(getattr(ti.state, "value", ti.state)) for ti in dag_run.get_task_instances()}


def _heartbeats(home: Path) -> list[datetime]:
    return sorted(utc(r["max_event_time"]) for r in rows(home, "ops/ingest_batches") if r["is_heartbeat"])


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_a_cycle_takes_its_clock_from_the_data_interval(cycled_home: CycledHome) -> None:
    home, run = cycled_home.home, cycled_home.dag_run
    assert utc(run.logical_date) == LOGICAL
    assert (utc(run.data_interval_start), utc(run.data_interval_end)) == (INTERVAL_END - M15, INTERVAL_END)
    assert _task_states(run) == {"choose_path": "success", "run_cycle": "success", "check_quality": "success",
                                 "reprocess_interval": "skipped", "send_alerts": "success"}

    # now = 04:00: the idle heartbeat lands at now - 30 min, and both hours close (and are checked) at 04:00.
    assert _heartbeats(home) == [INTERVAL_END - 30 * MINUTE]
    closed = ledger(home)
    assert {w: r["state"] for w, r in closed.items()} == {W0: "validated", W1: "validated"}
    assert {utc(r["closed_at"]) for r in closed.values()} == {INTERVAL_END}
    dq = [r for r in rows(home, "ops/dq_results") if r["pipeline"] == PIPELINE]
    assert dq and {utc(r["validated_at"]) for r in dq} == {INTERVAL_END}

