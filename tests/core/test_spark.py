"""The session sluice builds (sluice.core.spark), on the suite's Spark session, which get_spark built."""

from __future__ import annotations

import pytest
from pyspark.sql import SparkSession

pytestmark = pytest.mark.spark


def test_the_code_spark_generates_for_a_cycles_worth_of_plans_is_compiled_once(spark: SparkSession) -> None:
    """A cycle runs a few hundred distinct plans. Spark's default cache of generated classes (100) turned over
    within one cycle, and the same plans were compiled again (Janino, then the JIT) on every run."""
    metrics = spark._jvm.org.apache.spark.metrics.source.CodegenMetrics  # type: ignore[union-attr]
    plans = [f"id * {i} + {i} AS x" for i in range(7000, 7060)]  # two classes each, with their literals compiled in
    for expression in plans:
        spark.range(3).selectExpr(expression).collect()
    compiled = metrics.METRIC_COMPILATION_TIME().getCount()
    for expression in plans:
        assert spark.range(3).selectExpr(expression).collect()[2]["x"] == 3 * int(expression.split()[2])
    assert metrics.METRIC_COMPILATION_TIME().getCount() == compiled
