"""The window-ledger page end to end, nothing mocked: a sluice home filled by real cycles on the suite's Spark
session (one window of each state), Airflow on 127.0.0.1 as it is deployed (``api-server`` with the simple auth manager,
``scheduler`` with the LocalExecutor and ``dag-processor``, on this repo's dags/ and plugins/), the API called
with and without a user, and the page opened in headless Chromium (Debian's ``chromium``, driven by
Playwright) after a real sign-in through Airflow's login form.

The page acts through Airflow's own REST API with the signed-in user's session: the tests sign in as a
``viewer`` (may look, may not act: 403), as nobody (a session gone: 401) and as an ``operator`` (role ``op``),
whose re-check creates a ``sluice_backfill`` run with ``check_only`` and whose backfill runs for real (the
scheduler starts it, Spark rewrites the windows) until the ledger shows them ``reprocessed``.

The tests share one home and one Airflow (module fixtures: the Spark cycles and the Airflow start-up cost
minutes) and run in file order: the last one changes the home."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from pyspark.sql import SparkSession

from sluice.airflow.defaults import airflow_env
from sluice.config import Settings
from support.airflow_servers import Servers, free_port, sqlite_metadata_db
from support.browser import sign_in

pytestmark = [pytest.mark.slow, pytest.mark.spark]

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
PIPELINE = "user_activity_hourly"
DAG = "sluice_backfill"
NOW = "2024-05-01T05:10:00Z"
# Two simple-auth-manager users: a viewer (reads DAGs, may not trigger them) and an operator (role op).
USER, PASSWORD = "viewer", "ledger-test-password"
OPERATOR, OPERATOR_PASSWORD = "operator", "ledger-test-operator"
ROUTES = ["/sluice/ledger", "/sluice/api/status", "/sluice/api/windows", "/sluice/api/streams", "/sluice/status",
          "/sluice/docs/index.html"]
RUNS = f"/api/v2/dags/{DAG}/dagRuns"

# The home below, window by window: a first hour with 5 % late records fails the lateness check, the next
# one passes it, a cycle without data quality leaves 02:00 closed, a backfill rewrites 03:00, and the
# watermark (about 04:55) has not passed the end of 04:00 yet.
EXPECTED = {
    "2024-05-01T00:00:00Z": "failed",
    "2024-05-01T01:00:00Z": "validated",
    "2024-05-01T02:00:00Z": "closed",
    "2024-05-01T03:00:00Z": "reprocessed",
    "2024-05-01T04:00:00Z": "open",
}
W0, W1, W2 = "2024-05-01T00:00:00Z", "2024-05-01T01:00:00Z", "2024-05-01T02:00:00Z"
W3 = "2024-05-01T03:00:00Z"


def _env(**extra: str) -> dict[str, str]:
    """The test process's environment without sluice settings, connections or proxies from the shell."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLUICE_", "AIRFLOW_CONN_", "AIRFLOW_CTX_"))
           and k.lower() not in ("http_proxy", "https_proxy", "all_proxy")}
    return {**env, "TZ": "UTC", "PYSPARK_PYTHON": sys.executable, "PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}",
            **extra}


def _run(args: list[str], env: dict[str, str], ok: tuple[int, ...] = (0,)) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(args, env=env, cwd=REPO, capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode in ok, f"{args} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
def sluice_home(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Real cycles and a backfill, on the suite's Spark session: the page reads what they wrote, and how a
    cycle is started (CLI, DAG) is other tests' subject."""
    from sluice.config import load_settings
    from sluice.runtime.context import open_run
    from sluice.streaming.backfill import run_backfill
    from sluice.streaming.cycle import run_cycle
    from sluice_tools.generate import GenerateOptions, generate

    home = tmp_path_factory.mktemp("ledger-home")
    settings = load_settings({}, home=home)

    def land(start: str, hours: int, late_share: float) -> None:
        options = GenerateOptions(streams=("events",), events_per_hour=240, seed=11, start=_at(start), hours=hours,
                                  late_share=late_share)
        generate(settings.landing.local(), options, specs=settings.streams)

    def at(now: str) -> Settings:
        return replace(settings, now_override=_at(now))

    land("2024-05-01T00:00:00Z", 1, 0.05)
    land("2024-05-01T01:00:00Z", 2, 0)
    # 00:00 fails. Its alert is delivered right away (no channel is configured: it is marked so), as any run
    # does: left pending, the next delivery, the send_alerts task of the page's backfill, would send it and
    # fail that run for a window it did not touch.
    assert run_cycle(open_run(at("2024-05-01T03:10:00Z"), spark), PIPELINE).exit_code == 2
    land("2024-05-01T03:00:00Z", 2, 0)
    assert run_cycle(open_run(at(NOW), spark), PIPELINE, check_quality=False).exit_code == 0
    assert run_backfill(open_run(settings, spark), PIPELINE, "2024-05-01T03:00:00Z",
                        "2024-05-01T04:00:00Z").exit_code == 0
    return home


def _at(value: str) -> datetime:
    return datetime.fromisoformat(value)


# -------------------------------------------------------------------------------------------------- Airflow
@dataclass
class Airflow:
    url: str
    # No proxy from the environment between the test and 127.0.0.1.
    http: httpx.Client
    servers: Servers

    @property
    def env(self) -> dict[str, str]:
        return self.servers.env

    @property
    def home(self) -> Path:
        return self.servers.root

    def token(self, username: str = USER, password: str = PASSWORD) -> str:
        """A JWT from the simple auth manager's login endpoint, as any API client gets one."""
        response = self.http.post("/auth/token", json={"username": username, "password": password})
        assert response.status_code == 201, response.text
        return str(response.json()["access_token"])

    def operator(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token(OPERATOR, OPERATOR_PASSWORD)}"}

    def assert_alive(self) -> None:
        self.servers.assert_alive()

    def task_logs(self, run_id: str) -> str:
        """Every task attempt's log of a sluice_backfill run (Airflow 3 writes one JSON object per line)."""
        out = []
        for path in sorted((self.home / "logs" / f"dag_id={DAG}" / f"run_id={run_id}").glob("task_id=*/attempt=*.log")):
            lines = []
            for line in path.read_text(errors="replace").splitlines():
                try:
                    record = json.loads(line)
                    lines.append(f"{record.get('level', '')} {record.get('event', line)}")
                except json.JSONDecodeError:
                    lines.append(line)
            out.append(f"--- {path.parent.name}/{path.name}\n" + "\n".join(lines)[-6000:])
        return "\n".join(out) or f"(no task logs for {run_id}); scheduler:\n{self.servers.log('scheduler')[-5000:]}"


@pytest.fixture(scope="module")
def airflow(sluice_home: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Airflow]:
    """A fresh, migrated AIRFLOW_HOME with ``api-server``, ``scheduler`` (LocalExecutor) and ``dag-processor``,
    one set for the whole module, all with the same environment (the home, its injected now, the JWT secret).
    Two users of the simple auth manager, whose passwords are set up front in the passwords file (the manager
    only generates missing ones). ``sluice_backfill`` is loaded before the tests run: unpaused, as it ships."""
    airflow_home = tmp_path_factory.mktemp("ledger-airflow")
    passwords = airflow_home / "passwords.json"
    passwords.write_text(json.dumps({USER: PASSWORD, OPERATOR: OPERATOR_PASSWORD}))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = _env(
        AIRFLOW_HOME=str(airflow_home), SLUICE_HOME=str(sluice_home), SLUICE_NOW=NOW,
        **sqlite_metadata_db(airflow_home),
        AIRFLOW__CORE__AUTH_MANAGER="airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
        AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS=f"{USER}:viewer,{OPERATOR}:op",
        AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS="False",
        AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE=str(passwords),
        # The scheduler signs the tasks' tokens and the api-server checks them: one secret for both.
        AIRFLOW__API_AUTH__JWT_SECRET="sluice-ledger-test-secret",
        AIRFLOW__API__BASE_URL=url,
        AIRFLOW__CORE__EXECUTOR="LocalExecutor",
        AIRFLOW__CORE__PARALLELISM="2",
        # The scheduler's log server, on a free port rather than the fixed 8793 another Airflow may hold.
        AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT=str(free_port()),
        AIRFLOW__CORE__EXECUTION_API_SERVER_URL=f"{url}/execution/",
        # Only the runs the page triggers: no scheduled run of the pipeline DAGs (manual runs still start).
        AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE="False",
        # One parse of the DAG files is all the tests need; fewer re-parses leave the 2 cores to Spark.
        AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL="300",
        # This clone's dags/ and plugins/, no examples (what `python -m sluice.airflow.defaults` prints).
        **airflow_env({}, REPO),
    )
    servers = Servers(airflow_home, env)
    servers.airflow("db", "migrate")
    af = Airflow(url, httpx.Client(base_url=url, trust_env=False, timeout=60), servers)
    try:
        servers.start("api-server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1")
        servers.start("scheduler")
        servers.start("dag-processor")
        servers.wait_healthy(url)
        # The dag-processor's first parse puts the DAGs in the metadata DB.
        deadline = time.monotonic() + 300
        auth = af.operator()
        while (dag := af.http.get(f"/api/v2/dags/{DAG}", headers=auth)).status_code != 200:
            af.assert_alive()
            errors = af.http.get("/api/v2/importErrors", headers=auth).text
            assert time.monotonic() < deadline, f"{DAG} not loaded: {dag.text}\n{errors}\n" \
                f"{servers.log('dag-processor')[-5000:]}"
            time.sleep(1)
        # Issue 53: the page's actions run on a fresh AIRFLOW_HOME, without an `airflow dags unpause` first.
        assert not dag.json()["is_paused"], "sluice_backfill must not start paused: the page's runs would wait"
        yield af
    finally:
        af.http.close()
        servers.stop()


def _ledger_states(home: Path) -> dict[str, str]:
    from sluice.config import load_settings
    from sluice.reports.output import rfc3339
    from sluice.windows.ledger import read_ledger

    return {str(rfc3339(r.window_start)): r.state for r in read_ledger(load_settings({}, home=home), PIPELINE)}


def _windows(airflow: Airflow) -> dict[str, Any]:
    auth = {"Authorization": f"Bearer {airflow.token()}"}
    return dict(airflow.http.get("/sluice/api/windows", headers=auth).json())


def _pipeline(doc: dict[str, Any], name: str = PIPELINE) -> dict[str, Any]:
    return dict(next(p for p in doc["pipelines"] if p["pipeline"] == name))


# ----------------------------------------------------------------------------------------------- the API
def test_the_home_has_a_window_in_each_state(sluice_home: Path) -> None:
    assert _ledger_states(sluice_home) == {k: v for k, v in EXPECTED.items() if v != "open"}


@pytest.mark.parametrize("path", ROUTES)
def test_every_route_needs_an_airflow_user(airflow: Airflow, path: str) -> None:
    assert airflow.http.get(path).status_code == 401
    assert airflow.http.get(path, headers={"Authorization": "Bearer forged"}).status_code == 403
    signed_in = airflow.http.get(path, headers={"Authorization": f"Bearer {airflow.token()}"})
    assert signed_in.status_code == 200, signed_in.text


def test_the_api_serves_the_ledger_and_sluice_status_json(airflow: Airflow, sluice_home: Path) -> None:
    auth = {"Authorization": f"Bearer {airflow.token()}"}
    windows = airflow.http.get("/sluice/api/windows", headers=auth).json()
    ours = _pipeline(windows)
    assert {w["window_start"]: w["state"] for w in ours["windows"]} == EXPECTED
    assert (ours["window_seconds"], ours["hop_seconds"]) == (3600, 3600)
    failed = next(w for w in ours["windows"] if w["state"] == "failed")
    assert failed["dq"]["failed"] >= 1 and failed["late_rows"] > 0
    # Each failed check with what it observed and what it expected (the page shows both).
    assert all({"expectation", "observed", "expected"} <= set(f) for f in failed["dq"]["failures"])
    assert any(f["expectation"].startswith("lateness") for f in failed["dq"]["failures"])
    # CLI runs are no DAG runs: nothing to link.
    assert all(w["closed_by"] is None and w["validated_by"] is None for w in ours["windows"])
    assert airflow.http.get(failed["docs_url"], headers=auth).status_code == 200

    streams = airflow.http.get("/sluice/api/streams", headers=auth).json()["streams"]
    events = next(s for s in streams if s["stream"] == "events")
    assert events["points"] and events["hourly"]
    # On the data's own clock the lag is minutes, whatever the wall clock says of 2024's data.
    assert all(0 <= p["event_lag_seconds"] < 3600 for p in events["points"])

    # The API's status is the `sluice status --json` document (same home, same injected now).
    status = airflow.http.get("/sluice/api/status", headers=auth).json()
    cli = _run([str(BIN / "sluice"), "status", "--json"], {**airflow.env, "SLUICE_HOME": str(sluice_home)})
    assert status == json.loads(cli.stdout)


# ---------------------------------------------------------------------------------------------- the page
def _sign_in(browser: Any, airflow: Airflow, username: str, password: str, **options: Any) -> Any:
    return sign_in(browser, airflow.url, username, password, **options)


def _trigger_requests(page: Any) -> list[dict[str, Any]]:
    """The bodies of the page's POSTs to Airflow's trigger endpoint, recorded from now on."""
    bodies: list[dict[str, Any]] = []
    page.on("request", lambda r: bodies.append(r.post_data_json)
            if r.method == "POST" and r.url.endswith(RUNS) else None)
    return bodies


def _conf(start: str, end: str, *, include_late: bool = False, check_only: bool = False,
          pipeline: str = PIPELINE) -> dict[str, Any]:
    return {"logical_date": None, "conf": {"pipeline": pipeline, "start": start, "end": end,
                                           "include_late": include_late, "check_only": check_only}}


def _theme(page: Any) -> str:
    return str(page.evaluate("getComputedStyle(document.body).backgroundColor"))


def test_the_page_in_a_real_browser(airflow: Airflow, browser: Any, tmp_path: Path) -> None:
    from playwright.sync_api import expect

    doc = _pipeline(_windows(airflow))
    page = _sign_in(browser, airflow, USER, PASSWORD)
    card = page.locator(f'article.pipeline[data-pipeline="{PIPELINE}"]')
    # One bar per pipeline, a segment per window in time order: no grid of state rows any more.
    expect(page.locator("table.grid")).to_have_count(0)
    bar = card.locator("div.bar")
    expect(bar).to_have_count(1)
    expect(bar.locator(".cell")).to_have_count(len(EXPECTED))
    assert bar.locator(".cell").evaluate_all("cs => cs.map(c => c.dataset.windowStart)") == list(EXPECTED)
    for start, state in EXPECTED.items():
        cell = bar.locator(f'.cell[data-window-start="{start}"]')
        expect(cell).to_have_attribute("data-state", state)
        expect(cell).to_have_class(re.compile(rf"\bs-{state}\b"))   # coloured as its state
        expect(cell).to_contain_text(state)
    # Wide enough to read, each segment says what its window holds; the failed one which check failed, with
    # the value it observed and the one it expected, in the segment itself.
    expect(bar).to_have_attribute("data-mode", "wide")
    failed = bar.locator('.cell[data-state="failed"]')
    expect(failed).to_contain_text("DQ ✗")
    expect(failed).to_contain_text("late")
    for f in next(w for w in doc["windows"] if w["state"] == "failed")["dq"]["failures"]:
        expect(failed.locator("[data-failure]").filter(has_text=f["expectation"]).first).to_contain_text(
            f"{f['observed']}, expected {f['expected']}")
    docs = failed.get_by_role("link", name="Data Docs")
    href = docs.get_attribute("href")
    assert href and page.request.get(f"{airflow.url}{href}").status == 200  # with the session cookie
    expect(bar.locator('.cell[data-state="validated"]')).to_contain_text("DQ ✓")
    expect(card.locator(".chip")).to_have_text(["1 open", "1 closed", "1 validated", "1 failed", "1 reprocessed"])

    # Rows per window on the same time axis, and axis labels.
    expect(card.locator("svg.rows rect.col")).to_have_count(len(EXPECTED) - 1)  # the open window has no rows
    expect(card.locator(".axis .tick").first).to_be_visible()

    # The details panel of a selected window.
    failed.click()
    expect(failed).to_have_attribute("aria-selected", "true")
    details = card.locator(".details")
    expect(details).to_contain_text("1 window selected")
    expect(details.locator("[data-failure]").first).to_contain_text("lateness")
    expect(details.get_by_role("link", name="Data Docs")).to_have_attribute("href", href)
    expect(details.locator("[data-run]")).to_have_count(0)   # CLI runs: no DAG run to link
    expect(card.locator(".actions .plan")).to_contain_text(f"1 run of {DAG}: [05-01 00:00, 05-01 01:00)")

    # Streams: the watermark, and its lag on the data's own clock (event time), not the wall clock.
    plots = page.locator('div.plots[data-stream="events"]')
    expect(plots.locator("svg polyline")).to_have_count(2)
    expect(plots.locator("svg.event-lag")).to_have_count(1)
    expect(plots.locator("svg.event-lag")).to_contain_text(re.compile(r"\d min"))   # minutes, not years in days
    expect(plots.locator("svg.event-lag")).not_to_contain_text(re.compile(r"\d d\b"))
    expect(page.locator('table.counts[data-stream="events"] tbody tr').first).to_be_visible()
    assert not page.errors

    # Light and dark, following the user's colour scheme.
    assert _theme(page) == "rgb(255, 255, 255)"
    page.screenshot(path=str(tmp_path / "ledger-light.png"), full_page=True)
    page.emulate_media(color_scheme="dark")
    assert _theme(page) == "rgb(26, 32, 44)"
    page.screenshot(path=str(tmp_path / "ledger-dark.png"), full_page=True)
    assert (tmp_path / "ledger-light.png").stat().st_size > 10_000
    assert (tmp_path / "ledger-dark.png").stat().st_size > 10_000

    # The page is in Airflow's own navigation: the UI frames it at /plugin/<url_route>, and the page takes
    # Airflow's theme (here the system's dark one) and a smaller margin.
    page.goto(f"{airflow.url}/plugin/sluice-ledger")
    frame = page.frame_locator("iframe")
    expect(frame.locator(f'div.bar[data-pipeline="{PIPELINE}"] .cell')).to_have_count(len(EXPECTED), timeout=60_000)
    expect(frame.locator("body")).to_have_class(re.compile(r"\bframed\b"))
    expect(frame.locator("html")).to_have_attribute("data-theme", "dark")
    page.screenshot(path=str(tmp_path / "airflow-ui-dark.png"))
    page.close()


def _hopping(start: datetime, hours: int) -> dict[str, Any]:
    """A pipeline of 15-minute windows every 5 minutes, ``hours`` of them up to ``start + hours``: validated,
    with a failed, a reprocessed and a late-data-waiting one now and then, the last three still open."""
    z = lambda t: t.strftime("%Y-%m-%dT%H:%M:%SZ")  # noqa: E731
    windows = []
    n = hours * 12
    for i in range(n):
        s = start + timedelta(minutes=5 * i)
        state = ("open" if i >= n - 3 else "failed" if i % 50 == 20 else "reprocessed" if i % 50 == 30
                 else "validated")
        failures = [{"expectation": "completeness:users", "observed": f"gold={40 + i % 7} bronze=50",
                     "expected": "gold = bronze count (50)"}] if state == "failed" else []
        run = f"scheduled__{z(s + timedelta(minutes=15))}"
        by = {"dag_id": "clicks_15m", "run_id": run, "task_id": "run_cycle", "try_number": 1,
              "run_url": f"/dags/clicks_15m/runs/{quote(run, safe='')}",
              "log_url": f"/dags/clicks_15m/runs/{quote(run, safe='')}/tasks/run_cycle?try_number=1"}
        windows.append({
            "window_start": z(s), "window_end": z(s + timedelta(minutes=15)), "state": state,
            "rows": None if state == "open" else 40 + i % 7, "late_rows": None if state == "open" else i % 3,
            "late_waiting": 4 if i % 50 == 40 else 0 if state != "open" else None, "closed_by_watermark": None,
            "detail": None, "docs_url": None,
            "dq": None if state == "open" else {"passed": 4 - len(failures), "failed": len(failures),
                                                "failures": failures},
            "closed_by": None if state == "open" else by, "validated_by": None if state == "open" else by,
        })
    return {"pipeline": "clicks_15m", "window_seconds": 900, "hop_seconds": 300, "windows": windows, "omitted": 0}


def test_hopping_windows_make_one_bar_that_zooms(airflow: Airflow, browser: Any, tmp_path: Path) -> None:
    """A pipeline of hopping windows (none ships with sluice, so the windows document gets one added on its
    way to the browser; everything else is the real page on the real API): one bar that fits the page,
    zoomed with the presets and the mouse wheel; the selection's backfill is aligned on the slide."""
    from playwright.sync_api import expect

    hop = _hopping(datetime(2024, 4, 29, 5, tzinfo=UTC), hours=48)   # 576 windows, up to 05-01 05:00

    def add_hopping(route: Any) -> None:
        doc = route.fetch().json()
        doc["pipelines"].append(hop)
        route.fulfill(json=doc)

    page = _sign_in(browser, airflow, USER, PASSWORD)
    page.route("**/sluice/api/windows*", add_hopping)
    page.reload()
    expect(page.locator("body")).to_have_attribute("data-loaded", "true", timeout=60_000)
    card = page.locator('article.pipeline[data-pipeline="clicks_15m"]')
    bar = card.locator("div.bar")
    expect(bar).to_have_count(1)
    expect(card).to_contain_text("15 min windows every 5 min")
    # It fits the page: no horizontal scrolling, the segments side by side within the bar.
    width = page.evaluate("document.documentElement.clientWidth")
    assert page.evaluate("document.documentElement.scrollWidth") <= width
    box = bar.bounding_box()
    assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= width
    cells = bar.locator(".cell")

    def fitted() -> None:
        widths = cells.evaluate_all("cs => cs.map(c => c.getBoundingClientRect().width)")
        assert sum(widths) <= bar.evaluate("b => b.clientWidth") + 1

    fitted()
    # Zoom: the last 6 hours are 72 windows of 5 minutes' slide.
    card_of_time = page.locator("#view-range")
    page.get_by_role("button", name="6 h").click()
    expect(cells).to_have_count(72)
    expect(page.get_by_role("button", name="6 h")).to_have_attribute("aria-pressed", "true")
    expect(card_of_time).to_contain_text("04-30 23:00 → 05-01 05:00")
    fitted()
    page.get_by_role("button", name="All").click()
    expect(cells).to_have_count(len(hop["windows"]))
    fitted()
    # The wheel over the bar zooms in around the pointer, until the segments have room for their text.
    page.get_by_role("button", name="6 h").click()
    for _ in range(30):
        if bar.get_attribute("data-mode") == "wide":
            break
        box = bar.bounding_box()
        assert box is not None
        page.mouse.move(box["x"] + box["width"] * 0.5, box["y"] + box["height"] / 2)
        page.mouse.wheel(0, -200)
        page.wait_for_timeout(100)
    expect(bar).to_have_attribute("data-mode", "wide")
    assert cells.count() < 12
    fitted()
    # Late data waiting marks a window of any state.
    page.get_by_role("button", name="All").click()
    waiting = [w["window_start"] for w in hop["windows"] if (w["late_waiting"] or 0) > 0]
    expect(bar.locator(".cell.late-waiting")).to_have_count(len(waiting))
    # Zoomed out, the failed windows are named with their checks under the bar.
    failed = [w for w in hop["windows"] if w["state"] == "failed"]
    expect(card.locator(".attention li")).to_have_count(min(8, len(failed)))
    expect(card.locator(".attention")).to_contain_text("completeness:users: gold=")

    # Select three consecutive windows (click, shift-click) plus one apart (Ctrl-click): two backfill runs,
    # each [first start, last start + 5 min).
    page.get_by_role("button", name="6 h").click()
    starts = cells.evaluate_all("cs => cs.map(c => c.dataset.windowStart)")
    cells.nth(10).click()
    cells.nth(12).click(modifiers=["Shift"])
    cells.nth(20).click(modifiers=["Control"])
    expect(bar.locator(".cell.selected")).to_have_count(4)
    details = card.locator(".details")
    expect(details.locator("tbody tr")).to_have_count(4)
    # Each window links the DAG run that closed and the one that validated it, and their task logs.
    first = next(w for w in hop["windows"] if w["window_start"] == starts[10])
    expect(details.get_by_role("link", name=f"clicks_15m · {first['closed_by']['run_id']}").first) \
        .to_have_attribute("href", first["closed_by"]["run_url"])
    expect(details.get_by_role("link", name="run_cycle log (try 1)").first) \
        .to_have_attribute("href", first["closed_by"]["log_url"])

    def plus5(ts: str) -> str:
        return (datetime.fromisoformat(ts.replace("Z", "+00:00")) + timedelta(minutes=5)).strftime("%Y-%m-%dT%H:%M:%SZ")

    bodies = _trigger_requests(page)
    card.get_by_role("button", name="Backfill", exact=True).click()
    outcomes = card.locator(".outcomes li")
    expect(outcomes).to_have_count(2)
    expect(outcomes.filter(has_text="sending")).to_have_count(0)
    assert bodies == [_conf(starts[10], plus5(starts[12]), pipeline="clicks_15m"),
                      _conf(starts[20], plus5(starts[20]), pipeline="clicks_15m")]
    # A viewer may not trigger DAG runs: Airflow refuses, the page says so.
    for li in outcomes.all():
        expect(li).to_have_attribute("data-http", "403")
    assert not page.errors
    page.screenshot(path=str(tmp_path / "ledger-hopping.png"), full_page=True)
    page.close()


def test_a_viewer_and_a_signed_out_user_cannot_act(airflow: Airflow, browser: Any) -> None:
    """Airflow decides: the viewer's request is refused (403), and so is one without a session (401). The
    page shows why, per request; no DAG run is created."""
    from playwright.sync_api import expect

    page = _sign_in(browser, airflow, USER, PASSWORD)
    bodies = _trigger_requests(page)
    card = page.locator(f'article.pipeline[data-pipeline="{PIPELINE}"]')
    bar = card.locator("div.bar")
    expect(card.locator(".actions .who")).to_contain_text("read-only (Viewer) user")
    bar.locator(f'.cell[data-window-start="{W0}"]').click()
    bar.locator(f'.cell[data-window-start="{W2}"]').click(modifiers=["Control"])
    card.get_by_role("button", name="Backfill with late data").click()
    outcomes = card.locator(".outcomes li")
    expect(outcomes).to_have_count(2)
    for li in outcomes.all():
        expect(li).to_have_attribute("data-status", "error")
        expect(li).to_have_attribute("data-http", "403")
        expect(li).to_contain_text("your Airflow role may not trigger DAG runs")
    # Newest first: the second range on top.
    expect(outcomes.first).to_contain_text("[05-01 02:00, 05-01 03:00)")
    assert bodies == [_conf(W0, W1, include_late=True), _conf(W2, W3, include_late=True)]

    # The session gone (signed out elsewhere, expired): 401, and a way to sign in again.
    page.context.clear_cookies()
    card.get_by_role("button", name="Backfill", exact=True).click()
    expect(outcomes).to_have_count(4)
    for li in outcomes.all()[:2]:
        expect(li).to_have_attribute("data-http", "401")
        expect(li).to_contain_text("not signed in to Airflow")
        expect(li.get_by_role("link", name="Sign in")).to_have_attribute("href", "/sluice/ledger")
    assert bodies[2:] == [_conf(W0, W1), _conf(W2, W3)]
    assert not page.errors
    page.close()

    runs = airflow.http.get(RUNS, headers=airflow.operator()).json()
    assert runs["total_entries"] == 0, runs


def _wait_for_run(airflow: Airflow, run_id: str, timeout: float = 900) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        airflow.assert_alive()
        run = airflow.http.get(f"{RUNS}/{quote(run_id, safe='')}", headers=airflow.operator()).json()
        if run["state"] in ("success", "failed"):
            return dict(run)
        assert time.monotonic() < deadline, f"{run_id} still {run['state']}:\n{airflow.task_logs(run_id)}"
        time.sleep(2)


def test_an_operator_rechecks_the_failed_windows(airflow: Airflow, browser: Any, sluice_home: Path) -> None:
    """With no window selected, "Re-check failed windows" takes every failed window of the pipeline (here
    00:00): one sluice_backfill run with ``check_only``, created with the operator's own permissions. While
    the DAG is paused (an operator paused it) the page says the run waits for that, and how to unpause; once
    unpaused the run goes on. The window still fails: the run ends ``failed`` at ``check_quality`` (its
    data-quality outcome), not at send_alerts, whose log never says "sent" with no channel configured."""
    from playwright.sync_api import expect

    auth = airflow.operator()
    assert airflow.http.patch(f"/api/v2/dags/{DAG}", json={"is_paused": True}, headers=auth).status_code == 200
    page = _sign_in(browser, airflow, OPERATOR, OPERATOR_PASSWORD)
    bodies = _trigger_requests(page)
    card = page.locator(f'article.pipeline[data-pipeline="{PIPELINE}"]')
    expect(card.locator(".actions")).to_contain_text(f"Re-check triggers 1 run of {DAG}: [05-01 00:00, 05-01 01:00)")
    card.get_by_role("button", name="Re-check failed windows").click()
    outcome = card.locator(".outcomes li")
    expect(outcome).to_have_attribute("data-status", "ok")
    run_id = outcome.get_attribute("data-run-id")
    assert run_id
    assert bodies == [_conf(W0, W1, check_only=True)]
    # The outcome links the run in the Airflow UI.
    expect(outcome.get_by_role("link", name=run_id)).to_have_attribute(
        "href", f"/dags/{DAG}/runs/{quote(run_id, safe='')}")
    expect(outcome.locator(".paused")).to_contain_text(f"{DAG} is paused in Airflow", timeout=30_000)
    expect(outcome.locator(".paused")).to_contain_text(f"airflow dags unpause {DAG}")

    assert airflow.http.patch(f"/api/v2/dags/{DAG}", json={"is_paused": False}, headers=auth).status_code == 200
    run = _wait_for_run(airflow, run_id)
    assert run["conf"] == _conf(W0, W1, check_only=True)["conf"]
    tasks = {t["task_id"]: t["state"] for t in airflow.http.get(
        f"{RUNS}/{quote(run_id, safe='')}/taskInstances", headers=auth).json()["task_instances"]}
    assert (run["state"], tasks) == ("failed", {"validate_params": "success", "backfill": "success",
                                               "send_alerts": "success", "check_quality": "failed"}), \
        airflow.task_logs(run_id)
    logs = airflow.task_logs(run_id)
    assert "data-quality problem(s) of" in logs and "raised and sent" not in logs, logs
    assert "not sent: no channel is configured" in logs, logs
    expect(outcome).to_have_attribute("data-run-state", "failed", timeout=60_000)
    expect(outcome.locator("[data-failed-task]")).to_have_attribute("data-failed-task", "check_quality")
    expect(outcome).to_contain_text("windows still fail their checks")
    expect(outcome.locator(".paused")).to_have_count(0)
    assert _ledger_states(sluice_home)[W0] == "failed"
    page.close()


def test_a_backfill_from_the_page_runs_and_the_ledger_shows_it(
    airflow: Airflow, browser: Any, sluice_home: Path, tmp_path: Path
) -> None:
    """01:00 clicked, 02:00 shift-clicked, "Backfill": one sluice_backfill run for [01:00, 03:00), which the
    scheduler runs (Spark in local mode on the same home); the page follows it and shows both windows
    ``reprocessed``, linked to the run and its task log. Runs last: it changes the home."""
    from playwright.sync_api import expect

    page = _sign_in(browser, airflow, OPERATOR, OPERATOR_PASSWORD)
    bodies = _trigger_requests(page)
    card = page.locator(f'article.pipeline[data-pipeline="{PIPELINE}"]')
    bar = card.locator("div.bar")
    bar.locator(f'.cell[data-window-start="{W1}"]').click()
    bar.locator(f'.cell[data-window-start="{W2}"]').click(modifiers=["Shift"])
    expect(card.locator(".actions .plan")).to_contain_text(f"1 run of {DAG}: [05-01 01:00, 05-01 03:00)")
    card.get_by_role("button", name="Backfill", exact=True).click()
    outcome = card.locator(".outcomes li")
    expect(outcome).to_have_attribute("data-status", "ok")
    run_id = outcome.get_attribute("data-run-id")
    assert run_id
    assert bodies == [_conf(W1, W3)]

    # The scheduler runs it (the DAG ships unpaused): validate_params, backfill (spark-submit), send_alerts,
    # check_quality.
    run = _wait_for_run(airflow, run_id)
    assert run["state"] == "success", f"{run_id} failed:\n{airflow.task_logs(run_id)}"
    assert run["conf"] == _conf(W1, W3)["conf"]
    assert _ledger_states(sluice_home) == {W0: "failed", W1: "reprocessed", W2: "reprocessed", W3: "reprocessed"}

    # The page followed the run and read the ledger again.
    expect(outcome).to_have_attribute("data-run-state", "success", timeout=60_000)
    for start in (W1, W2):
        expect(bar.locator(f'.cell[data-window-start="{start}"]')).to_have_attribute("data-state", "reprocessed",
                                                                                   timeout=30_000)
    expect(bar.locator(f'.cell[data-window-start="{W0}"]')).to_have_attribute("data-state", "failed")

    # Both windows now name the task of that run that rewrote and checked them, with its log.
    windows = {w["window_start"]: w for w in _pipeline(_windows(airflow))["windows"]}
    links = [(start, key, windows[start][key]) for start in (W1, W2) for key in ("closed_by", "validated_by")
             if windows[start][key]]
    assert any(by["run_id"] == run_id and by["dag_id"] == DAG for _start, _key, by in links), windows[W1]
    bar.locator(f'.cell[data-window-start="{W1}"]').click()
    details = card.locator(".details")
    for start, key, by in links:
        if start != W1:
            continue
        row = details.locator(f'[data-run="{key.replace("_", " ")}"]')
        run_link = row.get_by_role("link", name=f"{by['dag_id']} · {by['run_id']}")
        expect(run_link).to_have_attribute("href", by["run_url"])
        expect(row.locator("a").nth(1)).to_have_attribute("href", by["log_url"])
    page.screenshot(path=str(tmp_path / "ledger-after-backfill.png"), full_page=True)

    # In Airflow's frame (sandboxed: no popups, no top-level navigation), a run link opens the run in the
    # Airflow UI itself, not a second UI inside the frame.
    by = next(by for start, _key, by in links if start == W1)
    page.goto(f"{airflow.url}/plugin/sluice-ledger")
    frame = page.frame_locator("iframe")
    frame.locator(f'div.bar[data-pipeline="{PIPELINE}"] .cell[data-window-start="{W1}"]').click(timeout=60_000)
    frame.locator(".details").get_by_role("link", name=f"{by['dag_id']} · {by['run_id']}").first.click()
    page.wait_for_url(re.compile(re.escape(by["run_url"]) + r"$"), timeout=30_000)
    expect(page.locator("iframe")).to_have_count(0)
    page.close()
