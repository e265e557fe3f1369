"""SPEC section 8's pipeline, as a user's pipelines folder holds it (the SPEC's example without its comments):
the tests that need "the SPEC 8 pipeline" take it from here, and edit a copy where they change it."""

SPEC_EXAMPLE = '''from pyspark.sql import functions as F
from sluice import Output, Pipeline, Stream, checks

readings = Stream(
    name="readings",
    fields={"reading_id": "string", "device_id": "string", "temp_c": "double", "event_time": "timestamp"},
    id="reading_id",
    required=["reading_id", "device_id", "event_time"],
    watermark_delay="2m",
)

def device_temps(inputs, window):
    r = inputs["readings"]
    return (r.where(F.col("temp_c").isNotNull())
             .groupBy(window.column("event_time"), "device_id")
             .agg(F.count("*").alias("readings"), F.avg("temp_c").alias("avg_temp_c")))

pipeline = Pipeline(
    name="device_temps",
    streams=[readings],
    window=("15m", "5m"),
    schedule="*/5 * * * *",
    outputs=[Output("device_temps", device_temps, key="device_id",
                    checks=[checks.completeness("readings", stream="readings"),
                            checks.between("avg_temp_c", -60, 100)])],
)
'''
