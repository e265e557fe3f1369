"""The window-ledger page end to end, nothing mocked: a sluice home filled by real ``sluice`` CLI cycles (one
window of each state), ``airflow api-server`` on 127.0.0.1 with the simple auth manager, the API called with
and without a user, and the page opened in headless Chromium (Debian's ``chromium``, driven by Playwright)
after a real sign-in through Airflow's login form."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

pytestmark = [pytest.mark.slow, pytest.mark.spark]

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
PIPELINE = "user_activity_hourly"
NOW = "2024-05-01T05:10:00Z"
USER, PASSWORD = "viewer", "ledger-test-password"
ROUTES = ["/sluice/ledger", "/sluice/api/status", "/sluice/api/windows", "/sluice/api/streams", "/sluice/status",
          "/sluice/docs/index.html"]

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


def _env(**extra: str) -> dict[str, str]:
    """The test process's environment without sluice settings, connections or proxies from the shell."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLUICE_", "AIRFLOW_CONN_")) and k.lower() not in ("http_proxy", "https_proxy",
                                                                                  "all_proxy")}
    return {**env, "TZ": "UTC", "PYSPARK_PYTHON": sys.executable, "PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}",
            **extra}


def _run(args: list[str], env: dict[str, str], ok: tuple[int, ...] = (0,)) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(args, env=env, cwd=REPO, capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode in ok, f"{args} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
def sluice_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Real cycles through the CLI, as a user would run them (about three Spark runs)."""
    home = tmp_path_factory.mktemp("ledger-home")
    env = _env(SLUICE_HOME=str(home))
    sluice = [str(BIN / "sluice")]
    generate = [*sluice, "generate", "--streams", "events", "--events-per-hour", "240", "--seed", "11"]
    _run([*generate, "--hours", "1", "--late-share", "0.05"], env)
    _run([*generate, "--start", "2024-05-01T01:00:00Z", "--hours", "2", "--late-share", "0"], env)
    _run([*sluice, "run", PIPELINE, "--now", "2024-05-01T03:10:00Z", "--no-deliver"], env, ok=(2,))  # 00:00 fails
    _run([*generate, "--start", "2024-05-01T03:00:00Z", "--hours", "2", "--late-share", "0"], env)
    _run([*sluice, "run", PIPELINE, "--now", NOW, "--skip-quality"], env)
    _run([*sluice, "backfill", PIPELINE, "--start", "2024-05-01T03:00:00Z", "--end", "2024-05-01T04:00:00Z"], env)
    return home


@dataclass
class Airflow:
    url: str
    env: dict[str, str]
    # No proxy from the environment between the test and 127.0.0.1.
    http: httpx.Client

    def token(self, username: str = USER, password: str = PASSWORD) -> str:
        """A JWT from the simple auth manager's login endpoint, as any API client gets one."""
        response = self.http.post("/auth/token", json={"username": username, "password": password})
        assert response.status_code == 201, response.text
        return str(response.json()["access_token"])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def airflow(sluice_home: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Airflow]:
    """``airflow api-server`` on a fresh, migrated AIRFLOW_HOME, with one simple-auth-manager user (a viewer)
    whose password is set up front in the passwords file (the manager only generates missing ones)."""
    airflow_home = tmp_path_factory.mktemp("ledger-airflow")
    passwords = airflow_home / "passwords.json"
    passwords.write_text(json.dumps({USER: PASSWORD}))
    port = _free_port()
    env = _env(
        AIRFLOW_HOME=str(airflow_home), SLUICE_HOME=str(sluice_home), SLUICE_NOW=NOW,
        AIRFLOW__CORE__AUTH_MANAGER="airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
        AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS=f"{USER}:viewer",
        AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS="False",
        AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE=str(passwords),
        AIRFLOW__API_AUTH__JWT_SECRET="sluice-ledger-test-secret",
        AIRFLOW__API__BASE_URL=f"http://127.0.0.1:{port}",
    )
    _run([str(BIN / "airflow"), "db", "migrate"], env)
    log = airflow_home / "api-server.log"
    with log.open("w") as out:
        server = subprocess.Popen(
            [str(BIN / "airflow"), "api-server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
            env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    http = httpx.Client(base_url=url, trust_env=False, timeout=60)
    try:
        deadline = time.monotonic() + 300
        while True:
            assert server.poll() is None, f"api-server exited {server.returncode}:\n{log.read_text()[-5000:]}"
            with contextlib.suppress(httpx.HTTPError):
                if http.get("/api/v2/monitor/health", timeout=5).status_code == 200:
                    break
            assert time.monotonic() < deadline, f"api-server not up after 300 s:\n{log.read_text()[-5000:]}"
            time.sleep(1)
        yield Airflow(url, env, http)
    finally:
        http.close()
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=30)


def _ledger_states(home: Path) -> dict[str, str]:
    from sluice.cli.output import rfc3339
    from sluice.config import load_settings
    from sluice.storage.ledger import read_ledger

    return {str(rfc3339(r.window_start)): r.state for r in read_ledger(load_settings({}, home=home), PIPELINE)}


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
    ours = next(p for p in windows["pipelines"] if p["pipeline"] == PIPELINE)
    assert {w["window_start"]: w["state"] for w in ours["windows"]} == EXPECTED
    failed = next(w for w in ours["windows"] if w["state"] == "failed")
    assert failed["dq"]["failed"] >= 1 and failed["late_rows"] > 0
    assert airflow.http.get(failed["docs_url"], headers=auth).status_code == 200

    streams = airflow.http.get("/sluice/api/streams", headers=auth).json()["streams"]
    events = next(s for s in streams if s["stream"] == "events")
    assert events["points"] and events["hourly"]

    # The API's status is the `sluice status --json` document (same home, same injected now).
    status = airflow.http.get("/sluice/api/status", headers=auth).json()
    cli = _run([str(BIN / "sluice"), "status", "--json"], {**airflow.env, "SLUICE_HOME": str(sluice_home)})
    assert status == json.loads(cli.stdout)


def test_the_page_in_a_real_browser(airflow: Airflow, sluice_home: Path, tmp_path: Path) -> None:
    from playwright.sync_api import expect, sync_playwright

    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    assert Path(chromium).exists(), "Debian's chromium is missing: `make setup` installs it (apt-get install chromium)"
    with sync_playwright() as p:
        # --no-sandbox: Chromium's sandbox refuses to run as root, which CI and these machines are.
        browser = p.chromium.launch(executable_path=chromium, headless=True, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            # Not signed in: the page is refused, with a way to Airflow's login that comes back to it.
            response = page.goto(f"{airflow.url}/sluice/ledger")
            assert response is not None and response.status == 401
            page.get_by_role("link", name="Sign in").click()
            page.locator("input[name=username]").fill(USER)
            page.locator("input[name=password]").fill(PASSWORD)
            page.get_by_role("button", name="Sign in").click()
            page.wait_for_url(f"{airflow.url}/sluice/ledger", timeout=60_000)
            expect(page.locator("body")).to_have_attribute("data-loaded", "true", timeout=60_000)

            grid = page.locator(f'table.grid[data-pipeline="{PIPELINE}"]')
            for start, state in EXPECTED.items():
                cell = grid.locator(f'td.cell[data-window-start="{start}"]')
                expect(cell).to_have_count(1)
                expect(cell).to_have_attribute("data-state", state)
                # In the row of its state, coloured as that state.
                expect(grid.locator(f'tr[data-state="{state}"] td[data-window-start="{start}"]')).to_have_count(1)
                expect(cell).to_have_class(f"cell {state}")
            failed = grid.locator('td.cell[data-state="failed"]')
            expect(failed).to_contain_text("DQ ✗")
            expect(failed).to_contain_text("late")
            docs = failed.get_by_role("link", name="Data Docs")
            href = docs.get_attribute("href")
            assert href and page.request.get(f"{airflow.url}{href}").status == 200  # with the session cookie
            expect(grid.locator('td.cell[data-state="validated"]')).to_contain_text("DQ ✓")

            plots = page.locator('div.plots[data-stream="events"] svg polyline')
            expect(plots).to_have_count(2)  # watermark and lag
            expect(page.locator('table.counts[data-stream="events"] tbody tr').first).to_be_visible()

            shot = tmp_path / "ledger.png"
            page.screenshot(path=str(shot), full_page=True)
            assert shot.stat().st_size > 10_000

            # The page is in Airflow's own navigation: the UI frames it at /plugin/<url_route>.
            page.goto(f"{airflow.url}/plugin/sluice-ledger")
            framed = page.frame_locator("iframe").locator(f'table.grid[data-pipeline="{PIPELINE}"] td.cell')
            expect(framed).to_have_count(len(EXPECTED), timeout=60_000)
            page.screenshot(path=str(tmp_path / "airflow-ui.png"))
        finally:
            browser.close()

