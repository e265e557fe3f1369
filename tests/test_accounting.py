"""Every line is accounted for, over several cycles, on generated data of known composition; and a job
killed with SIGKILL mid-cycle loses nothing and doubles nothing when it runs again."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from sluice.config import Settings, load_settings
from sluice.ingest.landing import load_state, run_ingest
from sluice.storage.engine import RsDeltaEngine
from sluice_tools.generate import GenerateOptions, Manifest, generate

pytestmark = pytest.mark.spark

STREAMS = ("impressions", "clicks", "events")
OPTIONS = GenerateOptions(
    seed=11,
    hours=2,
    impressions_per_hour=400,
    events_per_hour=300,
    late_share=0.02,
    early_share=0.02,
    duplicate_share=0.05,
    malformed_share=0.03,
    idle_gap_minutes=30,
    offset_timestamps=0.2,
)


def _generate(root: Path, settings: Settings, options: GenerateOptions = OPTIONS) -> tuple[Path, Manifest]:
    staging = root / "staging"
    return staging, generate(staging, options, specs=settings.streams)


def _reveal(staging: Path, landing: Path, upto_arrival: float) -> None:
    """Move files whose arrival (mtime) is <= upto_arrival into the landing zone, as producers would."""
    for file in sorted(staging.glob("*/*.json*")):
        if file.stat().st_mtime <= upto_arrival:
            target = landing / file.parent.name / file.name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(file, target)  # keeps the mtime


def _expected(manifest: Manifest, stream: str) -> dict[str, int]:
    m = manifest.streams[stream]
    return {
        "lines": m.lines,
        "accepted": m.accepted,
        "quarantined": m.quarantined_total,
        "late": m.late,
        "duplicates": m.duplicates,
    }


def _table_rows(settings: Settings, name: str) -> list[dict[str, object]]:
    return pa.table(DeltaTable(str(settings.lake / name)).to_pyarrow_table()).to_pylist()


def test_every_line_is_accounted_for_over_several_cycles(
    spark: SparkSession, settings: Settings, tmp_path: Path
) -> None:
    staging, manifest = _generate(tmp_path, settings)
    start = OPTIONS.start.timestamp()
    engine = RsDeltaEngine(spark)
    # Three cycles, each seeing the files that have arrived by then (one inside the idle gap).
    for cut_hours in (0.75, 1.25, 2.2):
        cut = start + cut_hours * 3600
        _reveal(staging, settings.landing, cut)
        now = OPTIONS.start + timedelta(hours=cut_hours)
        run_ingest(spark, replace(settings, now_override=now), engine, STREAMS)
        for stream in STREAMS:
            totals = load_state(settings, stream).totals()
            assert totals["lines"] == (
                totals["accepted"] + totals["quarantined"] + totals["late"] + totals["duplicates"]
            )
    assert not list(staging.glob("*/*.json*"))

    for stream in STREAMS:
        assert load_state(settings, stream).totals() == _expected(manifest, stream), stream
        bronze = [r for r in _table_rows(settings, f"bronze/{stream}") if not r["is_heartbeat"]]
        assert len(bronze) == manifest.streams[stream].accepted
        id_field = settings.stream(stream).id_field
        assert len({r[id_field] for r in bronze}) == len(bronze)
        quarantine = _table_rows(settings, f"quarantine/{stream}")
        by_reason: dict[str, int] = {}
        for row in quarantine:
            by_reason[str(row["reason"])] = by_reason.get(str(row["reason"]), 0) + 1
        expected_reasons = {k: v for k, v in manifest.streams[stream].quarantined.items() if v}
        assert by_reason == expected_reasons, stream
        assert len(_table_rows(settings, f"dlq/{stream}")) == manifest.streams[stream].late


def _table_snapshot(home: Path) -> dict[str, list[tuple[object, ...]]]:
    """Sorted content of every table (lineage ids and arrival included, ops rows minus the lineage of the
    Spark checkpoint, which legitimately differs between a crashed and a clean run). Paths are made
    relative to the home so two homes compare."""
    lake = home / "lake"
    out = {}
    for log_dir in sorted(lake.glob("**/_delta_log")):
        table = log_dir.parent
        name = str(table.relative_to(lake))
        data = pa.table(DeltaTable(str(table)).to_pyarrow_table())
        drop = [c for c in ("spark_batch_id", "query_id") if c in data.column_names]
        data = data.drop_columns(drop)
        out[name] = sorted(
            tuple(str(v).replace(str(home), "<home>") for v in row.values()) for row in data.to_pylist()
        )
    return out


def _run_cli(home: Path, now: str, extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "SLUICE_HOME": str(home),
        "SLUICE_NOW": now,
        "SLUICE_MAX_FILES_PER_TRIGGER": "3",
        # This test is about crash recovery; the generated late share would (rightly) fail lateness checks.
        "SLUICE_LATENESS_THRESHOLD": "1",
        "PYSPARK_PYTHON": sys.executable,
        **(extra_env or {}),
    }
    return subprocess.run(
        [sys.executable, "-m", "sluice.cli", "run", "ad_clicks_hourly"],
        env=env, capture_output=True, text=True, timeout=1200,
    )


CRASH_OPTIONS = replace(OPTIONS, hours=1.25, streams=("impressions", "clicks"), idle_gap_minutes=0)
CRASH_NOW = (CRASH_OPTIONS.start + timedelta(hours=3)).isoformat()


# The same crash, with the aggregate going through the batch catch-up (sluice.aggregate) instead.
CATCH_UP = {"SLUICE_CATCHUP_MIN_WINDOWS": "1"}


@pytest.fixture(scope="module")
def clean_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[bool, dict[str, list[tuple[object, ...]]]]:
    """The references: the same data through one uninterrupted cycle, streamed and caught up in batch."""
    out = {}
    for catch_up in (False, True):
        home = tmp_path_factory.mktemp("clean")
        generate(home / "landing", CRASH_OPTIONS)
        clean = _run_cli(home, CRASH_NOW, CATCH_UP if catch_up else None)
        assert clean.returncode == 0, clean.stderr[-3000:]
        assert (home / "lake/_checkpoints/pipelines/ad_clicks_hourly/catchup.json").exists() == catch_up
        out[catch_up] = _table_snapshot(home)
    return out


@pytest.mark.slow
@pytest.mark.parametrize(
    ("kill_after", "catch_up"),
    [
        ("bronze/impressions:2", False),  # between the tables of one ingest micro-batch (ops row committed)
        ("gold/ad_clicks_hourly:1", False),  # in the middle of the aggregate: gold written, ledger not yet
        ("ops/window_ledger:1", False),  # between the two outputs of the pipeline
        ("gold/ad_clicks_hourly:1", True),  # the catch-up's first gold commit, before its ledger rows
        ("ops/window_ledger:1", True),  # between the catch-up's two outputs
    ],
)
def test_sigkill_mid_cycle_then_rerun_loses_nothing_and_doubles_nothing(
    tmp_path: Path, kill_after: str, catch_up: bool, clean_runs: dict[bool, dict[str, list[tuple[object, ...]]]]
) -> None:
    clean_run = clean_runs[catch_up]
    env = CATCH_UP if catch_up else {}
    crash_home = tmp_path / "crash"
    generate(crash_home / "landing", CRASH_OPTIONS)
    crashed = _run_cli(crash_home, CRASH_NOW, {**env, "SLUICE_KILL_AFTER_COMMIT": kill_after})
    assert crashed.returncode == -9, f"expected SIGKILL, got {crashed.returncode}: {crashed.stderr[-2000:]}"
    rerun = _run_cli(crash_home, CRASH_NOW, env)
    assert rerun.returncode == 0, rerun.stderr[-3000:]

    crash_tables = _table_snapshot(crash_home)
    assert clean_run.keys() == crash_tables.keys()
    for name in clean_run:
        assert crash_tables[name] == clean_run[name], name
    settings = load_settings({}, home=crash_home)
    for stream in ("impressions", "clicks"):
        totals = load_state(settings, stream).totals()
        assert totals["lines"] == sum(totals[k] for k in ("accepted", "quarantined", "late", "duplicates"))
