"""Concurrent writers on the ops tables: real OS processes commit to ``ops/window_ledger`` (read-merge-rewrite
through ``write_ledger``) and ``ops/ingest_batches`` (``append_rows``) at the same time, through OpsDeltaEngine
and delta-rs. Conflicting commits are retried, so every process's rows end up in the tables exactly once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from deltalake import DeltaTable

from sluice.config import load_settings
from sluice.storage.engine import OpsDeltaEngine
from sluice.storage.snapshots import read_small_table
from sluice.storage.tables import INGEST_BATCHES
from sluice.windows.ledger import WINDOW_LEDGER, read_ledger

PROCESSES = 4
ITERATIONS = 12
BASE = datetime(2024, 1, 1, tzinfo=UTC)

# The child needs no JVM: the driver-side writes (append_rows, replace_rows, the ledger) never touch Spark,
# so the engine gets no session. Processes share a ledger app id in pairs, as two runs of the same DQ
# check or backfill would (versions from next_version); the batch log uses one app id per process, with
# explicit versions, and every batch is replayed once (it must be skipped).
_CHILD = textwrap.dedent(
    """
    import json
    import sys
    import time
    from datetime import UTC, datetime, timedelta
    from pathlib import Path

    from sluice.config import load_settings
    from sluice.storage.engine import OpsDeltaEngine
    from sluice.windows.ledger import LedgerRow, write_ledger
    from sluice.storage.tables import INGEST_BATCHES

    home, index, iterations, go, out = sys.argv[1:6]
    p, n = int(index), int(iterations)
    settings = load_settings({}, home=Path(home))
    engine = OpsDeltaEngine()
    batches = INGEST_BATCHES.path(settings)
    base = datetime(2024, 1, 1, tzinfo=UTC)
    while not Path(go).exists():
        time.sleep(0.002)
    result = {"ledger": [], "appends": [], "replays": []}
    for i in range(n):
        start = base + timedelta(hours=i)
        row = LedgerRow(f"p{p}", start, start + timedelta(hours=1), "closed", start, i, 0, start, start)
        result["ledger"].append(write_ledger(settings, engine, [row], app_id=f"sluice.ledger.test.{p % 2}"))
        values = {"stream": f"s{p}", "batch_id": i, "lines": i}
        batch = [tuple(values.get(name) for name in INGEST_BATCHES.schema.names)]
        for key in ("appends", "replays"):
            result[key].append(engine.append_rows(batch, INGEST_BATCHES.schema, batches,
                                                  app_id=f"sluice.ingest.s{p}", version=i))
    Path(out).write_text(json.dumps(result))
    """
)


@pytest.mark.slow
def test_concurrent_writers_on_ops_tables_commit_every_row_once(tmp_path: Path) -> None:
    home = tmp_path / "home"
    settings = load_settings({}, home=home)
    engine = OpsDeltaEngine()
    # Created up front: this test is about concurrent commits, not concurrent table creation.
    engine.ensure_table(WINDOW_LEDGER.path(settings), WINDOW_LEDGER.schema)
    engine.ensure_table(INGEST_BATCHES.path(settings), INGEST_BATCHES.schema, INGEST_BATCHES.partition_by)

    script = tmp_path / "child.py"
    script.write_text(_CHILD)
    go = tmp_path / "go"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK_GATEWAY", "SLUICE_KILL_AFTER"))}
    procs = []
    for p in range(PROCESSES):
        log = (tmp_path / f"child{p}.log").open("wb")
        args = [str(home), str(p), str(ITERATIONS), str(go), str(tmp_path / f"child{p}.json")]
        procs.append((subprocess.Popen([sys.executable, str(script), *args], stdout=log,
                                       stderr=subprocess.STDOUT, env=env), log))
    # The children import sluice (a second or two each) and then wait for this file, so they write at once.
    time.sleep(3)
    go.touch()
    failures = []
    for p, (proc, log) in enumerate(procs):
        code = proc.wait(timeout=300)
        log.close()
        if code != 0:
            failures.append(f"child {p} exited {code}:\n{(tmp_path / f'child{p}.log').read_text()[-2500:]}")
    assert not failures, f"{len(failures)} of {PROCESSES} writers failed\n" + "\n".join(failures)

    for p in range(PROCESSES):
        result = json.loads((tmp_path / f"child{p}.json").read_text())
        assert result["ledger"] == [True] * ITERATIONS
        assert result["appends"] == [True] * ITERATIONS
        assert result["replays"] == [False] * ITERATIONS

    ledger = read_ledger(settings)
    keys = [(r.pipeline, r.window_start, r.window_end) for r in ledger]
    expected = [
        (f"p{p}", BASE + timedelta(hours=i), BASE + timedelta(hours=i + 1))
        for p in range(PROCESSES)
        for i in range(ITERATIONS)
    ]
    assert sorted(keys) == sorted(expected)
    assert {(r.pipeline, r.window_start): r.rows for r in ledger} == {
        (f"p{p}", BASE + timedelta(hours=i)): i for p in range(PROCESSES) for i in range(ITERATIONS)
    }

    batches = read_small_table(INGEST_BATCHES.path(settings), ["stream", "batch_id"])
    assert batches is not None
    assert sorted(zip(*batches.to_pydict().values(), strict=True)) == sorted(
        (f"s{p}", i) for p in range(PROCESSES) for i in range(ITERATIONS)
    )
    table = DeltaTable(str(INGEST_BATCHES.path(settings)))
    for p in range(PROCESSES):
        assert table.transaction_version(f"sluice.ingest.s{p}") == ITERATIONS - 1
    # Both shared ledger app ids advanced once per commit of either writer sharing them.
    ledger_table = DeltaTable(str(WINDOW_LEDGER.path(settings)))
    for app in (0, 1):
        assert ledger_table.transaction_version(f"sluice.ledger.test.{app}") == 2 * ITERATIONS - 1
