"""The run context (sluice.runtime.context): the kind of JVM a cycle starts is sized from what it is about to read."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from sluice.config import load_settings
from sluice.ingest.run import run_ingest
from sluice.runtime.context import open_run
from sluice.runtime.spark import INCREMENT_BYTES


def test_a_cycle_of_little_new_data_starts_its_jvm_as_an_increment(tmp_path: Path) -> None:
    settings = load_settings({}, home=tmp_path)
    small, large = open_run(settings), open_run(settings)
    small.expect(INCREMENT_BYTES)
    large.expect(INCREMENT_BYTES + 1)
    assert (small.work, large.work) == ("increment", "cycle")
    backfill = open_run(settings, work="backfill")
    backfill.expect(0)
    assert backfill.work == "backfill"


@pytest.mark.spark
def test_a_running_session_keeps_its_jvm(spark: SparkSession, tmp_path: Path) -> None:
    ctx = open_run(load_settings({}, home=tmp_path), spark)
    ctx.expect(0)
    assert ctx.work == "cycle"


def test_ingest_sizes_the_cycle_before_it_needs_spark(tmp_path: Path) -> None:
    # Nothing landed: no stream starts Spark, and the cycle is known to be an increment before any would.
    ctx = open_run(load_settings({}, home=tmp_path))
    assert run_ingest(ctx, ["impressions", "clicks"]) == {"impressions": [], "clicks": []}
    assert ctx.work == "increment" and ctx.session is None
