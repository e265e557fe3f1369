"""The benchmark harness runs end to end on tiny data (``bench/run.py --smoke``) and ends with its summary line."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FINAL = re.compile(
    r"^bench: cycle/bare_spark=(?P<cycle>[0-9.]+) backfill/spark_batch=(?P<backfill>[0-9.]+) "
    r"empty_cycle_s=(?P<empty>[0-9.]+) events_per_s=(?P<eps>[0-9]+)$"
)


@pytest.mark.slow
def test_bench_smoke(tmp_path: Path) -> None:
    results = tmp_path / "results"
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / "run.py"), "--smoke", "--results-dir", str(results),
         "--data-dir", str(tmp_path / "data")],
        cwd=REPO, capture_output=True, text=True, timeout=1800,
    )
    assert done.returncode == 0, f"stdout:\n{done.stdout[-4000:]}\nstderr:\n{done.stderr[-8000:]}"
    last = done.stdout.strip().splitlines()[-1]
    match = FINAL.match(last)
    assert match, f"unexpected final line: {last!r}"
    for name, value in match.groupdict().items():
        assert float(value) > 0, f"{name} must be positive in {last!r}"

    written = list(results.glob("*-smoke.json"))
    assert len(written) == 1
    data = json.loads(written[0].read_text())
    stages = {s["stage"] for s in data["summary"] if s["runs"]}
    assert {"bare_spark", "cycle", "backfill", "spark_batch", "duckdb", "empty_cycle", "empty_job"} <= stages
    assert all(r["rc"] == 0 for r in data["runs"]), [(r["stage"], r["rc"]) for r in data["runs"]]
