"""Which Delta engine writes the lake: ``rs`` (delta-rs from the driver) or ``native`` (delta-spark).

Apart from both engines so that neither imports the other: :mod:`sluice.storage.native` builds on
:mod:`sluice.storage.engine` (the protocol and the delta-rs engine, which also writes the ops tables), and
only this module knows them both.
"""

from __future__ import annotations

from collections.abc import Mapping

from pyspark.sql import SparkSession

from sluice.config import Settings
from sluice.storage.engine import DeltaEngine, RsDeltaEngine
from sluice.storage.native import NativeDeltaEngine


def get_engine(
    spark: SparkSession, choice: str | None = None, *, properties: Mapping[str, str] | None = None
) -> DeltaEngine:
    """The engine ``choice`` names (default: the settings' ``delta_engine``, ``SLUICE_DELTA_ENGINE``):
    ``rs`` (delta-rs, from the driver) or ``native`` (delta-spark). ``properties``: the Delta table
    properties new tables get (``sluice.storage.tables.table_properties(settings)``)."""
    if choice is None:
        from sluice.config import load_settings

        choice = load_settings().delta_engine
    choice = choice.lower()
    if choice not in {"rs", "native"}:
        raise ValueError(f"SLUICE_DELTA_ENGINE={choice!r}; allowed: rs, native")
    if choice == "native":
        return NativeDeltaEngine(spark, properties)
    return RsDeltaEngine(spark, properties)


def engine_for(spark: SparkSession, settings: Settings) -> DeltaEngine:
    """The engine ``settings`` choose (``delta_engine``), creating tables with sluice's table properties."""
    from sluice.storage.tables import table_properties

    return get_engine(spark, settings.delta_engine, properties=table_properties(settings))


def ops_engine(settings: Settings) -> RsDeltaEngine:
    """The engine of the small ops tables (``ops/*``): delta-rs from the driver whatever ``delta_engine``
    says, so it needs no Spark session (the alert outbox, ``sluice alerts``, Airflow's callbacks)."""
    from sluice.storage.tables import table_properties

    return RsDeltaEngine(None, table_properties(settings))  # type: ignore[arg-type]
