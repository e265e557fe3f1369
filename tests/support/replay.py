"""A user's commands one after the other, with files arriving in between: the end-to-end tests' replay.

Each step is ``[reveal, now, argv, kill]``: the staged files that arrived by ``reveal`` (their mtime, seconds
since the epoch) move into the landing zone, keeping their arrival time; the CLI then runs ``argv`` at ``now``.
With ``kill`` (a crash hook, ``table:n``), a process of its own first runs the command and is SIGKILLed right
after that commit; the command then runs again, recovering.

The commands run in the calling process (``sluice.cli.main.main``), on its Spark session: a test runs the
reference lake here, on the suite's session, and the lake under test in a process of its own
(``python -m support.replay STAGING LANDING STEPS_JSON``, printing the exit codes as JSON).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import MutableMapping, Sequence
from pathlib import Path
from typing import Any

TESTS = Path(__file__).resolve().parents[1]


def run_steps(staging: Path, landing: Path, steps: Sequence[Sequence[Any]],
              environ: MutableMapping[str, str] = os.environ) -> tuple[list[int], list[int]]:
    """Run ``steps``; the commands' exit codes, and those of the killed processes (-9 when the hook fired)."""
    from sluice.cli.main import main

    codes, killed = [], []
    for reveal, now, argv, kill in steps:
        for file in sorted(staging.glob("*/*")):
            if file.stat().st_mtime <= reveal:
                (landing / file.parent.name).mkdir(parents=True, exist_ok=True)
                shutil.move(file, landing / file.parent.name / file.name)  # keeps the arrival time (mtime)
        environ["SLUICE_NOW"] = now
        if kill:
            crash = subprocess.run([sys.executable, "-m", "sluice.cli", *argv], capture_output=True, text=True,
                                   env={**environ, "SLUICE_KILL_AFTER_COMMIT": kill}, check=False)
            killed.append(crash.returncode)
            if crash.returncode != -9:
                print(crash.stderr[-3000:], file=sys.stderr)
        codes.append(main(list(argv)))
    return codes, killed


def command(staging: Path, landing: Path, steps: Sequence[Sequence[Any]]) -> list[str]:
    """The argv of a process that runs ``steps`` on its own (the environment says which home and lake)."""
    return [sys.executable, "-m", "support.replay", str(staging), str(landing), json.dumps(steps)]


def environment(env: MutableMapping[str, str]) -> dict[str, str]:
    """``env`` with this folder's package importable, for :func:`command`'s process."""
    path = env.get("PYTHONPATH")
    return {**env, "PYTHONPATH": str(TESTS) + (os.pathsep + path if path else "")}


def parse(stdout: str, name: str) -> list[int]:
    """The ``name: [...]`` line that :func:`command`'s process printed last; empty when it printed none."""
    lines = [line for line in stdout.splitlines() if line.startswith(f"{name}: ")]
    return list(json.loads(lines[-1][len(name) + 2:])) if lines else []


if __name__ == "__main__":
    done, crashed = run_steps(Path(sys.argv[1]), Path(sys.argv[2]), json.loads(sys.argv[3]))
    print("killed: " + json.dumps(crashed))
    print("exit codes: " + json.dumps(done))
