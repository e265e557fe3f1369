"""Shared fixtures: one session-scoped real Spark (local[2], UI off) for the whole suite."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from sluice.config import Settings, load_settings
from sluice.spark import get_spark


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    home = tmp_path_factory.mktemp("spark-home")
    settings = load_settings({}, home=home)
    session = get_spark(settings, "sluice-tests", master="local[2]")
    session.conf.set("spark.sql.shuffle.partitions", "2")
    yield session
    session.stop()


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    """Settings rooted in a fresh SLUICE_HOME under tmp_path, with no environment leaking in."""
    return load_settings({}, home=tmp_path / "home")
