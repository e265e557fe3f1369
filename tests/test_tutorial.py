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

A clone's venv has sluice installed in editable mode from that clone. The venv here belongs to the repo,
so PYTHONPATH points ``sluice`` (and ``sluice_tools``) at the fresh folder's copy instead: the pipelines
folder, the DAGs and the tests all resolve in the fresh folder, and nothing is written into the repo.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import pytest

from sluice.config import without_settings
from sluice.core import jars
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


def script(steps: list[Step], clone: Path, logs: Path) -> tuple[str, list[str], list[int]]:
    """One bash script running every step in order, each command's output, exit code and time in ``logs``;
    it stops at the first command that does not exit as announced."""
    lines = ["set -uo pipefail", f"cd {shlex.quote(str(clone))}"]
    commands: list[str] = []
    codes: list[int] = []

    def add(command: str, code: int) -> None:
        i = len(commands)
        commands.append(command)
        codes.append(code)
        log = shlex.quote(str(logs / str(i)))
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
def test_the_readme_tutorial_runs_exactly_as_written(tmp_path: Path) -> None:
    steps = tutorial_steps()
    clone = fresh_clone(tmp_path / "clone")
    logs = tmp_path / "logs"
    logs.mkdir()
    (tmp_path / "home").mkdir()
    env = user_env(clone, tmp_path / "home")

    # The harness, not the tutorial: sluice must resolve in the fresh folder, or the tutorial's
    # `new-pipeline` would write into the repo's own pipelines/.
    where = subprocess.run(["python", "-c", "import sluice, sluice.core.registry as r; print(r.REPO_ROOT)"],
                           cwd=clone, env=env, capture_output=True, text=True, check=False)
    assert where.stdout.strip() == str(clone.resolve()), where.stdout + where.stderr

    text, commands, codes = script(steps, clone, logs)
    (tmp_path / "tutorial.sh").write_text(text)
    started = time.monotonic()
    done = subprocess.run(["bash", str(tmp_path / "tutorial.sh")], cwd=clone, env=env, capture_output=True,
                          text=True, check=False, timeout=2600)
    took = time.monotonic() - started
    transcript = Transcript(logs, commands, codes)
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
