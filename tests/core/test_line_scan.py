"""sluice's line reader (``core/jvm/LineScan.java``) gives ingest the VARIANT path's answers, line for line.

One corpus of lines, typed through ``parse_lines`` + ``classify_invalid`` twice in the same session: with the
reader and without it. Every column that leaves the parse (each field's JSON type, text and typed value, the
flags, the quarantine reason and detail) must be equal. The corpus holds the lines the reader answers (flat
objects of strings, whole numbers, plain decimals, booleans and nulls) and, for each way a line can differ from
them, one that it must leave to the VARIANT path; a third assertion says which is which, so a reader that
answered nothing (or everything) fails here too."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from sluice.core import line_scan
from sluice.core.model import StreamSpec
from sluice.ingest.parsing import classify_invalid, parse_lines

pytestmark = pytest.mark.spark

SPEC = StreamSpec(
    name="readings", id_field="reading_id", required=("reading_id", "device_id", "event_time"),
    optional=("count", "ok", "note", "temperature"), watermark_delay=timedelta(minutes=10),
    types={"count": "long", "ok": "boolean", "temperature": "double"},
)
T = "2024-05-01T10:00:00Z"

# Lines the reader answers itself.
ANSWERED = [
    json.dumps({"reading_id": "r1", "device_id": "d1", "event_time": T}),
    json.dumps({"reading_id": "r2", "device_id": "d1", "event_time": T, "count": 3, "ok": True, "note": None}),
    json.dumps({"reading_id": 7, "device_id": "d2", "event_time": T, "count": -0, "ok": False}),
    '  {"reading_id":"r3","device_id":"d1","event_time":"2024-05-01t10:00:00z","count":"12"}  ',
    '{"reading_id":"r4","device_id":"","event_time":"  ","extra":123456789012345678,"x":"y"}',
    '{"reading_id":"r5","device_id":"d1","event_time":"2024-05-01T10:00:00","count":true,"ok":"true"}',
    '{"reading_id":"r6","device_id":"d1","event_time":"1969-12-31T23:59:59Z","count":-123}',
    '{"reading_id":"r7","device_id":"d1","event_time":"2099-01-01T00:00:00Z","temperature":21}',
    '{"reading_id":"r8","device_id":"caf\u00e9 \\"quoted\\" \\\\ \\n","event_time":"' + T + '","note":"\u4e2d"}',
    '{"reading_id":"r9","event_time":"' + T + '","note":"  "}',
    '{"reading_id":"r10","device_id":"d1","event_time":"' + T + '","count":999999999999999999}',
    '{"reading_id":"r12","device_id":"d1","event_time":"' + T + '","count":-0,"note":-0}',
    '{}',
    # Fractions, as Spark's VARIANT keeps them (a decimal, trailing zeros dropped), on each kind of field.
    '{"reading_id":"r13","device_id":"d1","event_time":"' + T + '","temperature":21.5,"count":1.0,"note":1.10}',
    '{"reading_id":1.5,"device_id":"d1","event_time":"' + T + '","temperature":-0.0,"count":2.5,"note":100.000}',
    '{"reading_id":"r14","device_id":0.05,"event_time":"' + T + '","temperature":-12.340,"count":-0.001}',
    '{"reading_id":"r15","device_id":"d1","event_time":"' + T + '","temperature":0.000}',
    '{"reading_id":"r16","device_id":"d1","event_time":"' + T + '","temperature":'
    + "1234567890123456789012345678901234567.8" + ',"note":0.' + "1" * 38 + '}',  # 38 digits, 38 places
    '\t{"reading_id":"r11","device_id":"d1","event_time":"' + T + '"} ',
]
# Lines the reader leaves to the VARIANT path, one per way a line can differ from the common one.
LEFT = [
    '{"reading_id":"r1","device_id":"d1","event_time":"' + T + '","temperature":'
    + "1" * 38 + '.5}',  # a fraction of 39 digits (a double in the VARIANT)
    '{"reading_id":"r1","device_id":"d1","event_time":"' + T + '","temperature":0.' + "0" * 38 + '1}',  # 39 places
    '{"reading_id":"r1","device_id":"d1","event_time":"' + T + '","temperature":1.5e3}',  # an exponent
    '{"reading_id":"r1","device_id":"d1","event_time":"' + T + '","count":1234567890123456789}',  # 19 digits
    '{"reading_id":"r1","device_id":{"id":"d1"},"event_time":"' + T + '"}',  # a nested value
    '{"reading_id":"r1","device_id":"d1","event_time":"' + T + '","tags":["a"]}',  # nested, undeclared
    '{"reading_id":"r1","device_id":"d1","device_id":"d2","event_time":"' + T + '"}',  # a key twice
    '{"reading_id":"r1","device_id":"\\u00e9","event_time":"' + T + '"}',  # a \u escape
    '{"reading_id":"r1","device_id":"d1","event_time":"' + T + '"}{"reading_id":"r2"}',  # two objects
    '{"reading_id":"r1","device_id":"d1","event_time":"' + T + '"} xyz',  # trailing text
    '{"reading_id":"r1","device_id":"d1","event_time":"' + T + '",}',  # malformed
    '{"reading_id":"r1","count":01}',  # a leading zero
    '{"reading_id":"r1","count":NaN}',  # not JSON
    '["r1","d1"]',  # not an object
    '"just a string"',
    '',
    '   ',
    '\ufeff{"reading_id":"r1","device_id":"d1","event_time":"' + T + '"}',  # a byte order mark
    '\x0b{"reading_id":"r1","device_id":"d1","event_time":"' + T + '"}',  # whitespace JSON does not know
    '{"reading_id":"r1","device_id":"d1\x01","event_time":"' + T + '"}',  # a raw control character
    '{"reading_id":"r1"',  # cut short
]


@pytest.fixture(scope="module")
def lines(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Path:
    assert line_scan.registered(spark), "make setup builds the line reader on this machine (javac is present)"
    path = tmp_path_factory.mktemp("line-scan") / "lines.jsonl"
    # Written as bytes, with one line that is not UTF-8 beside them.
    path.write_bytes(b"\n".join([s.encode() for s in ANSWERED + LEFT] + [b'{"reading_id":"\xff\xfe"}']) + b"\n")
    return path


def _typed(spark: SparkSession, path: Path, use_scan: bool) -> list[tuple]:
    df = (spark.read.format("text").option("wholetext", "false").load(str(path))
          .select(F.col("value").alias("raw"), F.lit("2024-05-01 10:00:00").cast("timestamp").alias("arrival_time")))
    typed = df.transform(parse_lines(SPEC, line_scan=use_scan)).transform(classify_invalid(SPEC))
    return sorted(tuple(map(repr, row)) for row in typed.collect())


def test_the_reader_gives_every_column_the_variant_path_gives(spark: SparkSession, lines: Path) -> None:
    with_reader, without = _typed(spark, lines, True), _typed(spark, lines, False)
    assert len(with_reader) == len(ANSWERED) + len(LEFT) + 1
    assert with_reader == without


def test_the_reader_answers_the_common_line_and_leaves_every_other(spark: SparkSession, lines: Path) -> None:
    names = F.array(*[F.lit(SPEC.json_name(f)) for f in SPEC.fields])
    # Called as parse_lines calls it: on UTF-8 lines only (the JVM reads other bytes as U+FFFD).
    scan = F.when(F.is_valid_utf8("value"), F.call_function(line_scan.FUNCTION, F.col("value"), names))
    rows = spark.read.text(str(lines)).select("value", scan.alias("scan")).collect()
    answered = {r["value"] for r in rows if r["scan"] is not None}
    assert answered == set(ANSWERED)
    first = next(r["scan"] for r in rows if r["value"] == ANSWERED[1])
    # Per declared field (reading_id, device_id, count, ok, note, temperature, event_time): type, text.
    assert first == ["STRING", "r2", "STRING", "d1", "BIGINT", "3", "BOOLEAN", "true",
                     "VOID", None, None, None, "STRING", T]
