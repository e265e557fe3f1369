"""The Airflow plugin's web app over real HTTP requests (in-process ASGI): who may call it, Data Docs, status,
and the JSON behind the window-ledger page on ops tables written with delta-rs. The page itself, a real
login and the API server are in tests/web/test_ledger_page.py (slow)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import write_deltalake
from fastapi.testclient import TestClient

from sluice.airflow.api import streams_data, windows_data
from sluice.airflow.web import create_app
from sluice.config import load_settings
from sluice.quality.freshness import open_windows
from sluice.reports.status import status_data
from sluice.storage import tables
from sluice.storage.snapshots import arrow_schema
from sluice.windows.ledger import WINDOW_LEDGER, Ledger, LedgerRow, read_ledger

T0 = datetime(2024, 5, 1, tzinfo=UTC)
H = timedelta(hours=1)
ROUTES = ["/ledger", "/api/status", "/api/windows", "/api/streams", "/status", "/docs/index.html"]


def allow() -> None:
    """Stands in for Airflow's access check in the tests of the data (no auth manager, no metadata DB)."""


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SLUICE_HOME", str(tmp_path))
    monkeypatch.delenv("SLUICE_NOW", raising=False)
    docs = tmp_path / "lake" / "_data_docs"  # the lake's Data Docs site
    (docs / "validations").mkdir(parents=True)
    (docs / "index.html").write_text("<html>sluice data docs</html>")
    (docs / "validations" / "page.html").write_text("<html>window page</html>")
    (tmp_path / "secret.txt").write_text("not for the web")
    return tmp_path


@pytest.fixture
def client(home: Path) -> TestClient:
    return TestClient(create_app(reader=allow))


# -- who may call it -----------------------------------------------------------------------------------------


@pytest.fixture
def guarded(home: Path) -> TestClient:
    """The app as mounted by the plugin, behind Airflow's own access check and auth manager."""
    from airflow.api_fastapi.app import create_auth_manager

    create_auth_manager()  # what the API server has done before any plugin route is called
    return TestClient(create_app())


@pytest.mark.parametrize("path", ROUTES)
def test_anonymous_requests_get_401(guarded: TestClient, path: str) -> None:
    response = guarded.get(path)
    assert response.status_code == 401
    assert response.json() == {"detail": "Not authenticated"}


@pytest.mark.parametrize("path", ROUTES)
def test_bad_tokens_get_403(guarded: TestClient, path: str) -> None:
    assert guarded.get(path, headers={"Authorization": "Bearer not-a-jwt"}).status_code == 403
    assert guarded.get(path, cookies={"_token": "not-a-jwt"}).status_code == 403


def test_a_browser_without_a_session_is_offered_the_login(guarded: TestClient) -> None:
    response = guarded.get("/ledger", headers={"Accept": "text/html,application/xhtml+xml"})
    assert response.status_code == 401
    assert 'href="/auth/login?next=http%3A%2F%2Ftestserver%2Fledger"' in response.text
    assert "sluice" not in response.text.lower()  # nothing of the page itself


def test_every_route_is_guarded() -> None:
    """A route added later cannot forget the check: it is a dependency of the whole app."""
    app = create_app(reader=allow)
    assert [d.dependency for d in app.router.dependencies] == [allow]


# -- Data Docs and status --------------------------------------------------------------------------------------


def test_serves_data_docs(client: TestClient) -> None:
    assert "sluice data docs" in client.get("/docs/index.html").text
    assert "window page" in client.get("/docs/validations/page.html").text
    assert client.get("/docs/missing.html").status_code == 404


def test_never_serves_outside_the_docs(client: TestClient) -> None:
    assert client.get("/docs/../secret.txt").status_code == 404
    assert client.get("/docs/%2e%2e/secret.txt").status_code == 404


def test_status_is_plain_text(client: TestClient) -> None:
    response = client.get("/status")
    assert response.status_code == 200
    assert "streams (where every line went)" in response.text


def test_api_status_is_the_status_json_document(client: TestClient, home: Path) -> None:
    from sluice.reports.status import status_data

    document = client.get("/api/status").json()
    expected = status_data(load_settings())
    assert {k: v for k, v in document.items() if k != "now"} == {k: v for k, v in expected.items() if k != "now"}


def test_the_page_is_served(client: TestClient) -> None:
    response = client.get("/ledger")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    # Relative API URLs, so that the page works wherever the app is mounted.
    for path in ('getJson("api/status")', "getJson(`api/windows?", 'getJson("api/streams")'):
        assert path in response.text
    assert "/sluice/api" not in response.text


# -- the JSON behind the page ----------------------------------------------------------------------------------


def write_table(path: Path, schema: Any, rows: Sequence[dict[str, Any]]) -> None:
    write_deltalake(str(path), pa.Table.from_pylist(list(rows), arrow_schema(schema)))


def ledger_row(start: datetime, state: str, *, rows: int = 10, late: int = 0, detail: str | None = None) -> LedgerRow:
    return LedgerRow("user_activity_hourly", start, start + H, state, start + 2 * H, rows, late, start + 2 * H,
                     start + 2 * H, detail)


def test_windows_carry_state_counts_dq_and_their_data_docs_page(home: Path) -> None:
    settings = load_settings()
    ledger = [ledger_row(T0, "validated"), ledger_row(T0 + H, "failed", late=3, detail="lateness (0.3)"),
              ledger_row(T0 + 2 * H, "closed")]
    write_table(WINDOW_LEDGER.path(settings), WINDOW_LEDGER.schema, [vars(r) for r in ledger])
    page = home / "lake" / "_data_docs" / "validations" / "page.html"
    dq = [("completeness:users", True, T0), ("lateness:dlq_share_within_threshold", True, T0),
          ("completeness:users", True, T0 + H), ("lateness:dlq_share_within_threshold", False, T0 + H)]
    write_table(tables.DQ_RESULTS.path(settings), tables.DQ_RESULTS.schema, [
        {"pipeline": "user_activity_hourly", "window_start": start, "window_end": start + H, "expectation": name,
         "observed_value": "0.3", "success": ok, "validated_at": T0, "docs_path": str(page)}
        for name, ok, start in dq
    ])

    document = windows_data(settings, lambda p: f"/sluice/docs/{p}")

    pipelines = {p["pipeline"]: p for p in document["pipelines"]}
    assert set(pipelines) == set(settings.registry.pipelines)  # every pipeline, with windows or not
    windows = pipelines["user_activity_hourly"]["windows"]
    assert [(w["window_start"], w["state"]) for w in windows] == [
        ("2024-05-01T00:00:00Z", "validated"), ("2024-05-01T01:00:00Z", "failed"), ("2024-05-01T02:00:00Z", "closed")
    ]
    assert windows[0]["dq"] == {"passed": 2, "failed": 0, "failures": []}
    # Which check failed, with what it observed and what it expected (issue 29 section 4).
    assert windows[1]["dq"] == {"passed": 1, "failed": 1, "failures": [
        {"expectation": "lateness:dlq_share_within_threshold", "observed": "0.3", "expected": "<= 0.01"}]}
    assert (windows[1]["rows"], windows[1]["late_rows"], windows[1]["detail"]) == (10, 3, "lateness (0.3)")
    assert windows[0]["docs_url"] == "/sluice/docs/validations/page.html"
    assert windows[2]["dq"] is None and windows[2]["docs_url"] is None  # closed, not validated yet
    assert document["states"] == ["open", "closed", "validated", "failed", "reprocessed"]
    assert pipelines["ad_clicks_hourly"]["windows"] == []


def test_a_ledger_written_before_late_data_was_kept_apart_reads_each_window_with_its_dq_outcome(home: Path) -> None:
    """Older ledgers put a window with late data waiting in state ``amended``, which hid whether it had
    failed (issue 29). Read now, such a window has the state its last validation left in ops/dq_results,
    and keeps its ``late_waiting``: in the ledger, the page's document and ``sluice status``."""
    settings = load_settings()
    failed = replace(ledger_row(T0, "amended", late=2), late_waiting=1)
    passed = replace(ledger_row(T0 + H, "amended", late=1), late_waiting=1)
    rewritten = replace(ledger_row(T0 + 2 * H, "amended", late=2), late_waiting=2,
                        gold_versions='{"gold/user_activity_hourly": [3, 4]}')
    write_table(WINDOW_LEDGER.path(settings), WINDOW_LEDGER.schema, [vars(r) for r in (failed, passed, rewritten)])
    results = [(T0, "lateness:dlq_share_within_threshold", False), (T0, "completeness:users", True),
               (T0 + H, "lateness:dlq_share_within_threshold", True),
               (T0 + 2 * H, "lateness:dlq_share_within_threshold", True)]
    write_table(tables.DQ_RESULTS.path(settings), tables.DQ_RESULTS.schema, [
        {"pipeline": "user_activity_hourly", "window_start": start, "window_end": start + H, "expectation": name,
         "observed_value": "0.2", "success": ok, "validated_at": T0, "docs_path": None}
        for start, name, ok in results
    ])

    rows = read_ledger(settings, "user_activity_hourly")
    assert [(r.state, r.late_waiting) for r in rows] == [("failed", 1), ("validated", 1), ("reprocessed", 2)]
    document = windows_data(settings, lambda p: p)
    assert "amended" not in document["states"]
    [pipeline] = [p for p in document["pipelines"] if p["pipeline"] == "user_activity_hourly"]
    assert [w["state"] for w in pipeline["windows"]] == ["failed", "validated", "reprocessed"]
    [counts] = [p["windows"] for p in status_data(settings)["pipelines"] if p["pipeline"] == "user_activity_hourly"]
    assert counts == {"open": 0, "closed": 0, "validated": 1, "failed": 1, "reprocessed": 1, "late_waiting": 3}


def test_docs_links_follow_the_mount_prefix(home: Path) -> None:
    settings = load_settings()
    write_table(WINDOW_LEDGER.path(settings), WINDOW_LEDGER.schema, [vars(ledger_row(T0, "validated"))])
    write_table(tables.DQ_RESULTS.path(settings), tables.DQ_RESULTS.schema, [
        {"pipeline": "user_activity_hourly", "window_start": T0, "window_end": T0 + H, "expectation": "e",
         "observed_value": "1", "success": True, "validated_at": T0,
         "docs_path": str(home / "lake" / "_data_docs" / "validations" / "page.html")}
    ])
    mounted = TestClient(create_app(reader=allow), root_path="/sluice")
    windows = {p["pipeline"]: p["windows"] for p in mounted.get("/api/windows").json()["pipelines"]}
    url = windows["user_activity_hourly"][0]["docs_url"]
    assert url == "/sluice/docs/validations/page.html"
    assert mounted.get(url.removeprefix("/sluice")).text == "<html>window page</html>"


def test_streams_plot_watermark_and_lag_and_count_per_arrival_hour(home: Path) -> None:
    settings = load_settings()
    batch = {"stream": "events", "quarantined": 1, "late": 2, "duplicates": 3, "source_file": "file:/x.jsonl",
             "is_heartbeat": False, "spark_batch_id": 0, "query_id": "q"}
    rows = [
        # An old batch, more than a day before the last one: outside the plot.
        {**batch, "batch_id": 0, "lines": 16, "accepted": 10, "watermark_after": None,
         "max_arrival_time": T0 - 30 * H},
        {**batch, "batch_id": 1, "lines": 16, "accepted": 10, "watermark_after": T0 - timedelta(minutes=5),
         "max_arrival_time": T0 + timedelta(minutes=10)},
        {**batch, "batch_id": 2, "lines": 26, "accepted": 20, "watermark_after": T0 + timedelta(minutes=10),
         "max_arrival_time": T0 + timedelta(minutes=40)},
        {**batch, "batch_id": 3, "lines": 6, "accepted": 0, "watermark_after": T0 + timedelta(minutes=50),
         "max_arrival_time": T0 + timedelta(minutes=70)},
        # A heartbeat has no arrival time: it moves the watermark but is no point of the plot.
        {"stream": "events", "batch_id": 4, "lines": 0, "accepted": 0, "quarantined": 0, "late": 0, "duplicates": 0,
         "watermark_after": T0 + 2 * H, "is_heartbeat": True},
    ]
    write_table(tables.INGEST_BATCHES.path(settings), tables.INGEST_BATCHES.schema, rows)

    events = {s["stream"]: s for s in streams_data(settings)["streams"]}["events"]

    assert (events["since"], events["until"]) == ("2024-04-30T01:10:00Z", "2024-05-01T01:10:00Z")
    assert [(p["batch_id"], p["lag_seconds"]) for p in events["points"]] == [(1, 900.0), (2, 1800.0), (3, 1200.0)]
    assert events["hourly"] == [
        {"hour": "2024-05-01T00:00:00Z", "lines": 42, "accepted": 30, "quarantined": 2, "late": 4, "duplicates": 6},
        {"hour": "2024-05-01T01:00:00Z", "lines": 6, "accepted": 0, "quarantined": 1, "late": 2, "duplicates": 3},
    ]


def test_an_empty_home_has_no_windows_and_no_batches(client: TestClient) -> None:
    windows = client.get("/api/windows").json()
    assert windows["pipelines"] and all(p["windows"] == [] for p in windows["pipelines"])
    streams = client.get("/api/streams").json()["streams"]
    assert streams and all(s["points"] == [] and s["hourly"] == [] and s["until"] is None for s in streams)


def test_open_windows_are_counted_one_way_in_status_and_on_the_page(home: Path) -> None:
    """Issue 29 section 3: open windows are real windows of the pipeline (here hourly), holding data the
    closing rule has not closed: over the event hours in bronze, starting at or before the newest accepted
    event, not in the ledger, ending after W. Not event hours: the 00:00 hour below is closed, and the
    window of 03:00 holds nothing yet."""
    settings = load_settings()
    events = settings.stream("events")
    bronze = tables.bronze(events)
    names = arrow_schema(bronze.schema).names
    records = [T0 + timedelta(minutes=m) for m in (10, 70, 130, 140)]  # hours 00, 01, 02; newest 02:20
    write_deltalake(str(bronze.path(settings)), pa.Table.from_pylist([
        {**dict.fromkeys(names), "event_time": t, "event_id": f"e{i}", "user_id": "u", "is_heartbeat": False,
         "event_date": t.date(), "event_hour": t.hour} for i, t in enumerate(records)], arrow_schema(bronze.schema)),
        partition_by=list(bronze.partition_by))
    write_table(tables.INGEST_BATCHES.path(settings), tables.INGEST_BATCHES.schema, [
        {"stream": "events", "batch_id": 0, "lines": 4, "accepted": 4, "quarantined": 0, "late": 0,
         "duplicates": 0, "watermark_after": T0 + timedelta(minutes=135), "max_event_time": records[-1],
         "max_arrival_time": records[-1], "is_heartbeat": False, "source_file": "file:/e.jsonl",
         "spark_batch_id": 0, "query_id": "q"}])
    write_table(WINDOW_LEDGER.path(settings), WINDOW_LEDGER.schema, [vars(ledger_row(T0, "validated"))])

    # W = 02:15: [01:00, 02:00) is closable but not closed yet (the next cycle closes it), [02:00, 03:00) open.
    # Every window the ledger does not hold and that ends after W - lateness_bound is open.
    expected = [(T0 + 2 * H, T0 + 3 * H)]
    assert open_windows(settings, settings.pipeline("user_activity_hourly"),
                        Ledger(settings, "user_activity_hourly").rows) == expected
    [page] = [p for p in windows_data(settings, lambda page: page)["pipelines"]
              if p["pipeline"] == "user_activity_hourly"]
    assert [w["window_start"] for w in page["windows"] if w["state"] == "open"] == ["2024-05-01T02:00:00Z"]
    [counts] = [p for p in status_data(settings)["pipelines"] if p["pipeline"] == "user_activity_hourly"]
    assert (counts["windows"]["open"], counts["oldest_open"]) == (1, "2024-05-01T02:00:00Z")


def test_plugin_registers_the_app_and_the_page() -> None:
    import importlib.util

    plugin_file = Path(__file__).parents[1] / "plugins" / "sluice_plugin.py"
    spec = importlib.util.spec_from_file_location("sluice_plugin", plugin_file)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    plugin = module.SluicePlugin
    assert plugin.name == "sluice"
    assert plugin.fastapi_apps[0]["url_prefix"] == "/sluice"
    ledger = next(v for v in plugin.external_views if v["href"] == "/sluice/ledger")
    assert ledger["url_route"] and ledger["destination"] == "nav"


def test_importing_the_plugin_leaves_the_api_server_alone() -> None:
    """Task runners import plugins too: the app and Airflow's API security are only built on a request."""
    code = ("import runpy, sys; runpy.run_path('plugins/sluice_plugin.py'); "
            "print('airflow.api_fastapi.core_api.security' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).parents[1], capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "False"


@pytest.mark.parametrize(
    ("expectation", "observed", "expected"),
    [
        ("completeness:users", "gold=45 bronze=46", "gold = bronze count (46)"),
        ("unmatched_clicks_hourly.completeness:clicks", "gold=3 bronze=4", "gold = bronze count (4)"),
        ("lateness:dlq_share_within_threshold", "0.0793", "<= 0.01"),
        ("validity:ctr_between_0_and_1", "2 outside [0, 1] (ctr: 1.5, 2)", "every value within [0, 1]"),
        ("validity:no_null_keys", "3 nulls (ad_id: 3)", "0 nulls"),
        ("validity:window_is_one_hour", "1 of 4 rows != 3600s (1800)", "every window 3600s long"),
        ("validity:ctr_between_0_and_1", "error: column ctr missing", None),
    ],
)
def test_a_failed_check_says_what_it_expected(home: Path, expectation: str, observed: str,
                                              expected: str | None) -> None:
    from sluice.airflow.api import expected_value

    assert expected_value(expectation, observed, load_settings()) == expected


def test_windows_link_the_airflow_task_that_closed_and_validated_them(home: Path) -> None:
    settings = load_settings()
    task = '{"dag_id": "user_activity_hourly", "run_id": "scheduled__2024-05-01T01:00:00+00:00", ' \
           '"task_id": "run_cycle", "try_number": "2"}'
    row = replace(ledger_row(T0, "validated"), closed_by=task, validated_by=None)
    write_table(WINDOW_LEDGER.path(settings), WINDOW_LEDGER.schema, [vars(row)])
    mounted = TestClient(create_app(reader=allow), root_path="/base/sluice")
    [window] = {p["pipeline"]: p["windows"] for p in mounted.get("/api/windows").json()["pipelines"]}[
        "user_activity_hourly"]
    run = "/base/dags/user_activity_hourly/runs/scheduled__2024-05-01T01%3A00%3A00%2B00%3A00"
    assert window["closed_by"] == {"dag_id": "user_activity_hourly", "run_id": "scheduled__2024-05-01T01:00:00+00:00",
                                   "task_id": "run_cycle", "try_number": "2", "run_url": run,
                                   "log_url": f"{run}/tasks/run_cycle?try_number=2"}
    assert window["validated_by"] is None


def test_the_ledger_records_the_airflow_task_of_the_process(monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    from sluice.windows.ledger import airflow_task

    for var in ("AIRFLOW_CTX_DAG_ID", "AIRFLOW_CTX_DAG_RUN_ID", "AIRFLOW_CTX_TASK_ID", "AIRFLOW_CTX_TRY_NUMBER"):
        monkeypatch.delenv(var, raising=False)
    assert airflow_task() is None  # the CLI
    monkeypatch.setenv("AIRFLOW_CTX_DAG_ID", "d")
    monkeypatch.setenv("AIRFLOW_CTX_DAG_RUN_ID", "r")
    monkeypatch.setenv("AIRFLOW_CTX_TASK_ID", "t")
    monkeypatch.setenv("AIRFLOW_CTX_TRY_NUMBER", "1")
    assert json.loads(airflow_task() or "") == {"dag_id": "d", "run_id": "r", "task_id": "t", "try_number": "1"}
