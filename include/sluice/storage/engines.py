"""The engines a process uses: delta-spark for the tables Spark writes, delta-rs for the ops tables.

Apart from both engines so that neither imports the other's module: :mod:`sluice.storage.spark_engine`
builds on :mod:`sluice.storage.engine` (the protocol and the ops tables' engine), and only this module
hands them out.
"""

from __future__ import annotations

from collections.abc import Callable

from pyspark.sql import SparkSession

from sluice.config import Settings
from sluice.storage.engine import DeltaEngine, OpsDeltaEngine
from sluice.storage.spark_engine import SparkDeltaEngine
from sluice.storage.tables import table_properties


def engine_for(spark: SparkSession | Callable[[], SparkSession], settings: Settings) -> DeltaEngine:
    """The engine of a Spark session (or of what starts it on first use): delta-spark for every table Spark
    writes (and the ops tables through :func:`ops_engine`'s delta-rs), creating tables with sluice's table
    properties."""
    return SparkDeltaEngine(spark, table_properties(settings))


def ops_engine(settings: Settings) -> OpsDeltaEngine:
    """The engine of the small ops tables (``ops/*``): delta-rs from the driver, so it needs no Spark
    session (the alert outbox, ``sluice alerts``, Airflow's callbacks, compaction of the ops tables)."""
    return OpsDeltaEngine(table_properties(settings))
