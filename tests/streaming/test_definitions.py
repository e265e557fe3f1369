"""An output's definition (issue 54, SPEC 9), on the README's tutorial pipeline (SPEC 8's example): taken from
Spark's analyzed plan of the build function over the declared stream schemas (no Spark job), so that a comment
or a reformatting is no change, while a metric, the window, a check or a stream's declaration is."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from sluice.config import load_settings
from sluice.streaming.definitions import OutputDefinition, fingerprints, output_definition
from support.tutorial import write_tutorial

AVG = 'F.avg("temp_c").alias("avg_temp_c")'


def definition(spark: SparkSession, folder: Path, home: Path) -> OutputDefinition:
    settings = load_settings({"SLUICE_PIPELINES": str(folder)}, home=home)
    assert settings.registry.errors == []
    pipeline = settings.pipeline("device_temps")
    return output_definition(spark, settings, pipeline, pipeline.output("device_temps"))


@pytest.mark.spark
def test_what_changes_a_definition_and_what_does_not(spark: SparkSession, tmp_path: Path) -> None:
    folder = write_tutorial(tmp_path / "pipelines")
    source = (folder / "device_temps.py").read_text()

    def edited(old: str, new: str) -> OutputDefinition:
        assert old in source, old
        (folder / "device_temps.py").write_text(source.replace(old, new))
        return definition(spark, folder, tmp_path / "home")

    first = definition(spark, folder, tmp_path / "home")
    assert first.columns == (("window_start", "timestamp"), ("window_end", "timestamp"), ("device_id", "string"),
                             ("readings", "bigint"), ("avg_temp_c", "double"), ("min_battery", "bigint"))
    assert (first.window, first.keys, first.lateness_bound) == ("15m every 5m", ("device_id",), "0")
    assert first.checks == ("completeness:readings(metric=readings, stream=readings)",
                            "validity:avg_temp_c_between_-60_and_100(column=avg_temp_c, high=100, low=-60)")

    # A comment and a reformatting are no change: the same plan, the same fingerprint.
    same = edited(AVG, AVG.replace(".alias", "  # the mean\n                  .alias"))
    assert same == first and same.fingerprint == first.fingerprint

    metric = edited(AVG, AVG + ', F.max("temp_c").alias("max_temp_c")')
    assert metric.plan != first.plan and metric.columns[5] == ("max_temp_c", "double")
    filtered = edited('r.where(F.col("temp_c").isNotNull())', 'r.where(F.col("temp_c") > -100)')
    assert filtered.plan != first.plan and filtered.columns == first.columns
    window = edited('window=("15m", "5m")', 'window="10m"')
    assert window.window == "10m tumbling" and window.plan != first.plan
    check = edited("checks.between(\"avg_temp_c\", -60, 100)", "checks.between(\"avg_temp_c\", -50, 100)")
    assert check.plan == first.plan and check.checks != first.checks
    stream = edited('watermark_delay="2m",', 'watermark_delay="2m", early_tolerance="10m",')
    assert stream == first  # time semantics apply to what arrives next: not part of what gold means
    typed = edited('"battery": "long"', '"battery": "double"')
    assert typed.streams != first.streams and typed.columns[-1] == ("min_battery", "double")

    changed = {d.fingerprint for d in (metric, filtered, window, check, typed)}
    assert len(changed) == 5 and first.fingerprint not in changed
    assert OutputDefinition.from_dict(metric.to_dict()) == metric
    assert fingerprints({"device_temps": first}) == f'{{"device_temps": "{first.fingerprint}"}}'
