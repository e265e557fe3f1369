"""The README's tutorial, "Your own pipeline in five minutes", run as a newcomer runs it (issue 29).

Every shell command of the section's ```bash blocks runs in the README's order, comments stripped, in one
bash process (``set -uo pipefail``, as pasted into a terminal), in a fresh folder holding the repo's files
as a clone has them (``git ls-files``, tracked and not yet committed, copied from the working tree) with
the venv's ``bin`` first on PATH, as ``source .venv/bin/activate`` puts it. The environment is clean: no
``SLUICE_*`` or ``AIRFLOW_*`` of this process (tests/conftest.py sets some), HOME in a tmp dir. The one
editor step, "Replace the skeleton in ``pipelines/<file>``", writes the README's ``<!-- tutorial:<file> -->``
block there. Each command must exit 0, or the code its comment announces (``# ... exits 2``); the output
the README shows under a block must be what its last command printed (``...`` stands for any text); and the
steps must do what the README says they do. A command that fails fails the test with its output.
``make airflow``, a server, is started in the background as the tutorial's last command (on a free port,
``AIRFLOW_PORT``, as another Airflow may hold 8080); then the test signs in as the README says, in Chromium,
and triggers the page's first action, a re-check, and follows it to its end (issue 53).

A clone's venv has sluice installed in editable mode from that clone. The venv here belongs to the repo,
so PYTHONPATH points ``sluice`` (and ``sluice_tools``) at the fresh folder's copy instead: the pipelines
folder, the DAGs and the tests all resolve in the fresh folder, and nothing is written into the repo.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from sluice.config import without_settings
from sluice.core import jars
from sluice.storage.tables import QUARANTINE_REASONS
from support.airflow_servers import free_port
from support.browser import sign_in
from support.lake import read_rows
from support.tutorial import Step, section, shell_commands, tutorial_steps

REPO = Path(__file__).resolve().parents[1]
VENV = REPO / ".venv" if (REPO / ".venv" / "bin").is_dir() else Path(sys.executable).parent.parent
# What a user's shell has that matters here; everything else (SLUICE_*, AIRFLOW_*, PYSPARK_*, PYTEST_*, TZ
# set by the suite) stays out.
KEEP = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "JAVA_HOME", "TMPDIR", "USER", "LOGNAME", "SHELL", "TERM")


def fresh_clone(dest: Path) -> Path:
    """``dest`` with the repo's files as a clone of it would hold them (the working tree's versions)."""
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("the tutorial test copies a clone with `git ls-files`: not a git checkout")
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO, capture_output=True, check=True,
    ).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = REPO / name
        if source.is_file():  # deleted in the working tree but not yet in the index: not in the next clone
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(source, dest / name)  # no copy2: a clone's files are as new as the clone
    (dest / ".venv").symlink_to(VENV)  # `make setup` has run
    # ... from these very files: make's set-up stamps (in the shared venv) are newer than them, so a make
    # target of the clone does not install the clone into the repo's venv.
    stamp = VENV / ".installed"
    if stamp.exists():
        old = stamp.stat().st_mtime - 60
        for name in ("requirements.txt", "pyproject.toml", "include/sluice/core/jars.lock"):
            if (dest / name).exists():
                os.utime(dest / name, (old, old))
    return dest


def user_env(clone: Path, home: Path) -> dict[str, str]:
    env = {key: os.environ[key] for key in KEEP if key in os.environ}
    env.update(
        HOME=str(home),
        # `make setup` has run on this machine: its jar cache is where setup put it (the default lies under
        # the real HOME, which this user's HOME is not).
        SLUICE_JARS_DIR=str(jars.cache_dir()),
        VIRTUAL_ENV=str(VENV),
        PATH=f"{VENV / 'bin'}{os.pathsep}{env.get('PATH', os.defpath)}",
        PYTHONPATH=f"{clone / 'include'}{os.pathsep}{clone / 'tools'}",
    )
    return env


def expected_line(line: str) -> re.Pattern[str]:
    """A line of output the README shows: ``...`` stands for any text, a run of blanks for any blanks."""
    parts = [r"\s+".join(re.escape(word) for word in part.split()) for part in line.strip().split("...")]
    lead = r"\s*" if line.strip() else ""
    return re.compile(lead + r".*".join(parts) + r"\s*")


class Transcript:
    """What each command printed, and its exit code, keyed by the command's index."""

    def __init__(self, logs: Path, commands: list[str], expected_codes: list[int]) -> None:
        self.logs, self.commands, self.expected_codes = logs, commands, expected_codes

    def output(self, i: int) -> str:
        return "".join((self.logs / f"{i}.{kind}").read_text(errors="replace") for kind in ("out", "err")
                       if (self.logs / f"{i}.{kind}").exists())

    def code(self, i: int) -> int | None:
        rc = self.logs / f"{i}.rc"
        return int(rc.read_text()) if rc.exists() else None

    def seconds(self, i: int) -> float:
        started, ended = (self.logs / f"{i}.time").read_text().split()
        return float(ended) - float(started)

    def describe(self, i: int, problem: str) -> str:
        out = self.output(i)
        return (f"tutorial command {i + 1} of {len(self.commands)} {problem}:\n$ {self.commands[i]}\n"
                f"--- its output (last 6000 characters) ---\n{out[-6000:]}")

    def index(self, prefix: str) -> int:
        found = [i for i, c in enumerate(self.commands) if c.startswith(prefix)]
        assert found, f"the tutorial has no `{prefix} ...` command; it must show one"
        return found[0]


SERVER = "make airflow"  # the one tutorial command that does not end: it serves the UI until stopped


def script(steps: list[Step], clone: Path, logs: Path) -> tuple[str, list[str], list[int]]:
    """One bash script running every step in order, each command's output, exit code and time in ``logs``;
    it stops at the first command that does not exit as announced. ``make airflow`` is started in a session
    of its own, in the background (its pid in ``<i>.pid``), as a user leaves it running in a terminal."""
    lines = ["set -uo pipefail", f"cd {shlex.quote(str(clone))}"]
    commands: list[str] = []
    codes: list[int] = []

    def add(command: str, code: int) -> None:
        i = len(commands)
        commands.append(command)
        codes.append(code)
        log = shlex.quote(str(logs / str(i)))
        if command == SERVER:
            lines.extend([f"setsid {command} > {log}.out 2> {log}.err < /dev/null &", f"echo $! > {log}.pid",
                          f'echo 0 > {log}.rc; echo "$EPOCHREALTIME $EPOCHREALTIME" > {log}.time'])
            return
        lines.extend([
            f'echo "$EPOCHREALTIME" > {log}.time',
            "{ " + command,
            f"}} > {log}.out 2> {log}.err < /dev/null",
            f'rc=$?; echo "$rc" > {log}.rc; echo "$EPOCHREALTIME" >> {log}.time',
            f'[ "$rc" -eq {code} ] || exit 97',
        ])

    for step in steps:
        if step.file is not None:
            # The editor step: the README says where the file goes; the harness writes it there.
            target = f"pipelines/{step.file}"
            assert f"`{target}`" in section(), f"the tutorial no longer says to create `{target}`"
            (logs / step.file).write_text(step.source)
            add(f"cp {shlex.quote(str(logs / step.file))} {target}  # editor: the README's {step.file}", 0)
        for command in step.commands:
            add(command.text, command.exit_code)
    return "\n".join(lines) + "\n", commands, codes


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.timeout(2700)
def test_the_readme_tutorial_runs_exactly_as_written(tmp_path: Path, browser: Any) -> None:
    steps = tutorial_steps()
    clone = fresh_clone(tmp_path / "clone")
    logs = tmp_path / "logs"
    logs.mkdir()
    (tmp_path / "home").mkdir()
    env = {**user_env(clone, tmp_path / "home"), "AIRFLOW_PORT": str(free_port())}

    # The harness, not the tutorial: sluice must resolve in the fresh folder, or the tutorial's
    # `new-pipeline` would write into the repo's own pipelines/.
    where = subprocess.run(["python", "-c", "import sluice, sluice.core.registry as r; print(r.REPO_ROOT)"],
                           cwd=clone, env=env, capture_output=True, text=True, check=False)
    assert where.stdout.strip() == str(clone.resolve()), where.stdout + where.stderr

    text, commands, codes = script(steps, clone, logs)
    assert commands[-1] == SERVER, f"the tutorial must end with `{SERVER}` (the UI and the page's first action)"
    (tmp_path / "tutorial.sh").write_text(text)
    started = time.monotonic()
    try:
        done = subprocess.run(["bash", str(tmp_path / "tutorial.sh")], cwd=clone, env=env, capture_output=True,
                              text=True, check=False, timeout=2600)
        took = time.monotonic() - started
        transcript = Transcript(logs, commands, codes)
        _check_the_commands(steps, commands, codes, transcript, done, took, clone)
        _recheck_from_the_page(transcript, len(commands) - 1, browser, int(env["AIRFLOW_PORT"]))
    finally:
        _stop(logs / f"{len(commands) - 1}.pid")


def _check_the_commands(steps: list[Step], commands: list[str], codes: list[int], transcript: Transcript,
                        done: subprocess.CompletedProcess[str], took: float, clone: Path) -> None:
    for i, expected in enumerate(codes):
        code = transcript.code(i)
        assert code is not None, f"tutorial command {i + 1} never ran:\n$ {commands[i]}\n{done.stderr[-3000:]}"
        assert code == expected, transcript.describe(i, f"exited {code}, not {expected}")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    print(f"\nthe tutorial ran in {took:.0f}s:")
    for i, command in enumerate(commands):
        print(f"  {transcript.seconds(i):6.1f}s  {command.splitlines()[0]}")

    # The output the README shows is what the commands printed.
    for step in steps:
        if step.expected:
            i = commands.index(step.commands[-1].text)
            printed = transcript.output(i).splitlines()
            for line in step.expected:
                assert any(expected_line(line).fullmatch(p) for p in printed), transcript.describe(
                    i, f"did not print the README's line\n    {line}")

    # Each step did what the README says it does.
    new = transcript.index("sluice new-pipeline")
    for line in ("created pipelines/device_temps.py", "created tests/test_device_temps.py",
                 "landing .sluice/landing/readings/"):
        assert line in transcript.output(new), transcript.describe(new, f"did not print {line!r}")
    backfill = transcript.index("sluice backfill")
    for line in ("3 window(s) rewritten", "data quality: 3 passed, 0 failed"):
        assert line in transcript.output(backfill), transcript.describe(backfill, f"did not print {line!r}")
    dag = transcript.index("airflow dags test")
    assert re.search(r"DagRun Finished: dag_id=device_temps,.*state=success", transcript.output(dag)), \
        transcript.describe(dag, "did not end in a successful DAG run")
    test = transcript.index("pytest")
    assert re.search(r"\b1 passed\b", transcript.output(test)), transcript.describe(test, "did not pass")


    lake = clone / ".sluice" / "lake"
    ledger = read_rows(lake / "ops" / "window_ledger")
    states = Counter(r["state"] for r in ledger if r["pipeline"] == "device_temps")
    # 3 failed completeness (the reading without a temperature), 3 backfilled with the late reading, the
    # last 3 closed by the Airflow run's heartbeat: all 11 windows holding readings.
    assert states == {"failed": 3, "reprocessed": 3, "validated": 5}, ledger
    gold = read_rows(lake / "gold" / "device_temps")
    late_window = [r for r in gold if r["device_id"] == "dev-4"
                   and r["window_start"] == datetime(2024, 5, 1, 10, 10, tzinfo=UTC)]
    assert [r["readings"] for r in late_window] == [30], late_window  # 29 on time + the late one


def _recheck_from_the_page(transcript: Transcript, i: int, browser: Any, port: int) -> None:
    """What the README says after `make airflow`: sign in with the user and the password file it printed,
    open the ledger page, "Re-check failed windows" of device_temps, and see the run end. The three windows
    still hold the reading without a temperature: the run fails at check_quality, its data-quality outcome."""
    from playwright.sync_api import expect

    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while not re.search(r"password file: (\S+)", transcript.output(i)) or not _answers(url):
        assert time.monotonic() < deadline, transcript.describe(i, "did not serve the UI within 300 s")
        assert _alive(transcript.logs / f"{i}.pid"), transcript.describe(i, "ended")
        time.sleep(2)
    printed = transcript.output(i)
    user = re.search(r"user: (\S+)", printed)
    password_file = re.search(r"password file: (\S+)", printed)
    assert user and password_file, transcript.describe(i, "did not print the user and the password file")
    passwords = json.loads(Path(password_file.group(1)).read_text())
    page = sign_in(browser, url, user.group(1), passwords[user.group(1)])
    card = page.locator('article.pipeline[data-pipeline="device_temps"]')
    card.get_by_role("button", name="Re-check failed windows").click()
    outcome = card.locator(".outcomes li")
    expect(outcome).to_have_attribute("data-status", "ok")
    expect(outcome).to_have_attribute("data-run-state", re.compile("success|failed"), timeout=900_000)
    assert outcome.get_attribute("data-run-state") == "failed", outcome.inner_text()
    expect(outcome.locator("[data-failed-task]")).to_have_attribute("data-failed-task", "check_quality")
    expect(outcome).to_contain_text("windows still fail their checks")
    page.close()


def _answers(url: str) -> bool:
    try:
        return httpx.get(f"{url}/api/v2/version", timeout=5, trust_env=False).status_code in (200, 401)
    except httpx.HTTPError:
        return False


def _alive(pid_file: Path) -> bool:
    try:
        os.kill(int(pid_file.read_text()), 0)
        return True
    except (OSError, ValueError):
        return False


def _stop(pid_file: Path) -> None:
    """Ctrl-C to `make airflow`'s session, as a terminal sends it; whatever is left after a minute is killed."""
    if not pid_file.exists():
        return
    pgid = int(pid_file.read_text())
    for sig, wait in ((signal.SIGINT, 60), (signal.SIGKILL, 10)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return
            time.sleep(1)


def test_shell_commands_are_read_as_a_user_pastes_them() -> None:
    """Comments go, continuation lines stay one command, and a comment may announce the exit code."""
    block = ("# a comment line\nsluice run x --now T   # ingest; exits 2 (below)\n\n"
             "export A=1 \\\n       B='#not a comment'  # trailing\necho \"a # b\" #c\n")
    assert [(c.text, c.exit_code) for c in shell_commands(block)] == [
        ("sluice run x --now T", 2), ("export A=1 \\\n       B='#not a comment'", 0), ('echo "a # b"', 0),
    ]


def test_new_pipeline_creates_and_prints_the_landing_folder_of_its_stream(tmp_path: Path) -> None:
    """`sluice new-pipeline` creates `$SLUICE_HOME/landing/<stream>/` (the home defaults to .sluice in the
    working directory; SLUICE_LANDING moves the landing root), and refuses a stream another file declares."""
    env = without_settings(os.environ)

    def new(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "sluice.cli", "--pipelines", str(tmp_path / "pipes"),
                               "new-pipeline", *args], cwd=tmp_path, env={**env, **extra},
                              capture_output=True, text=True, check=False, timeout=120)

    done = new("device_temps", "--stream", "readings", "--tests", "tests")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / ".sluice" / "landing" / "readings").is_dir()
    assert "created tests/test_device_temps.py" in done.stdout
    assert "landing .sluice/landing/readings/" in done.stdout, done.stdout
    done = new("page_views", SLUICE_LANDING=str(tmp_path / "drop"))
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "drop" / "page_views_events").is_dir() and "landing drop/page_views_events/" in done.stdout
    done = new("other_temps", "--stream", "readings")
    assert done.returncode == 1 and "stream 'readings' is already declared in" in done.stderr, done.stderr
    assert not (tmp_path / "pipes" / "other_temps.py").exists()


def test_the_readme_is_a_newcomers_first_hour() -> None:
    """Issue 53: what sluice is, the two commands, the tutorial, operations and links to the reference, in
    under about 400 lines; the details live in docs/ (each link to a doc file points at one that exists)."""
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 400, f"README.md has {len(text.splitlines())} lines: move details to docs/"
    for target in re.findall(r"\]\(((?:docs|bench)/[^)#]+)", text):
        assert (REPO / target).is_file(), f"README links {target}, which does not exist"


def test_the_readme_shows_what_make_run_prints(tmp_path: Path) -> None:
    """Issue 53: the README's `make run` row is what `make run` prints for impressions. The demo's day is
    generated (no Spark here), and the generator's manifest is exact: it says what ingest makes of every
    line (tests/test_generate.py holds it to that), so the row's counts and last arrival must be its."""
    from sluice.config import load_settings
    from sluice_tools.generate import GenerateOptions, generate

    two_commands = section("Two commands")
    [row] = [line.split() for line in two_commands.splitlines() if line.startswith("impressions ")]
    settings = load_settings(without_settings(os.environ), home=tmp_path / "home")
    # What sluice_tools.demo.run_demo generates.
    manifest = generate(tmp_path / "incoming", GenerateOptions(hours=24, idle_gap_minutes=45),
                        specs=settings.streams)
    impressions = manifest.streams["impressions"]
    totals = manifest.totals()["impressions"]
    quarantined = sum(totals.get(reason, 0) for reason in QUARANTINE_REASONS)
    assert impressions.last_arrival is not None
    expected = [str(n) for n in (impressions.lines, impressions.accepted, quarantined, impressions.late,
                                 impressions.duplicates)]
    assert row[1:6] == expected, f"README shows {row[1:6]}; make run prints {expected}"
    assert row[-2:] == [impressions.last_arrival.strftime("%Y-%m-%d"),
                        impressions.last_arrival.strftime("%H:%M:%SZ")], row
