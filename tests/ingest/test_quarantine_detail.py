"""Quarantine tells what went wrong and where (issue 53, parts 3-4; SPEC 2-3): every quarantined line keeps its
line number (as an editor shows it, blank lines counted) and, for malformed_json, what the JSON parser said;
blank lines are no records (skipped, not quarantined, not in ``lines``); ``sluice quarantine`` shows it; and a
run warns once how many files arrived after "now".

One Spark scenario (real Spark, real Delta) serves most assertions: a file of every kind of bad line, a file
spread over several splits, a .gz file and a file of blank lines only, ingested on Spark's write path for
rejected lines; then a second cycle of files from the future on two streams."""

from __future__ import annotations

import gzip
import json
import os
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from sluice.cli.main import main
from sluice.config import Settings
from sluice.ingest import microbatch
from sluice.ingest.files import source_key
from sluice.ingest.microbatch import FileCounts
from sluice.ingest.parsing import malformed_detail
from sluice.ingest.run import run_ingest
from sluice.ingest.state import BatchRow, load_state
from sluice.reports.output import ingest_warnings
from sluice.runtime.context import open_run
from support import lake
from support.lake import table
from support.shell import as_the_user

T0 = datetime(2024, 5, 1, 10, 0, tzinfo=UTC)


def ts(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def imp(record_id: str, minutes: float = 1, **extra: Any) -> str:
    return json.dumps({"impression_id": record_id, "ad_id": "a1",
                       "event_time": ts(minutes).strftime("%Y-%m-%dT%H:%M:%SZ"), **extra})


# Every kind of line, numbered as an editor numbers them.
MIXED = [
    imp("a"),                                        # 1
    "",                                              # 2 blank
    "  \t ",                                         # 3 blank (whitespace only)
    '{"impression_id": "t1", "ad_id": ',             # 4 truncated
    "this is not json",                              # 5
    imp("g1") + imp("g2"),                           # 6 two objects on one line
    "[1, 2, 3]",                                     # 7
    imp("b"),                                        # 8
    json.dumps({"impression_id": "m", "event_time": ts(1).strftime("%Y-%m-%dT%H:%M:%SZ")}),  # 9 no ad_id
    "",                                              # 10 blank
    '{"impression_id": "c" "ad_id": "a1"}',          # 11 a comma missing
    imp("a"),                                        # 12 a duplicate
    "   ",                                           # 13 blank, last
]
MIXED_QUARANTINE = {
    4: ("malformed_json", "Expecting value at column 34"),
    5: ("malformed_json", "Expecting value at column 1"),
    6: ("malformed_json", "Extra data at column 77"),
    7: ("malformed_json", "a JSON array, not an object"),
    9: ("missing_field", "missing: ad_id"),
    11: ("malformed_json", "Expecting ',' delimiter at column 23"),
}


def big_line(i: int) -> str:
    """Line i (1-based) of a file spread over several splits: blank every 50th, truncated every 37th."""
    if i % 50 == 0:
        return ""
    if i % 37 == 0:
        return f'{{"impression_id": "bad{i}", '
    return imp(f"big{i}")


BIG_LINES = 400
BIG_BAD = [i for i in range(1, BIG_LINES + 1) if i % 37 == 0 and i % 50]
ZIPPED = [imp("z1"), "", "oops", imp("z2"), imp("z3", event_time="yesterday")]


def land_gzip(settings: Settings, stream: str, name: str, lines: list[str], arrival: datetime) -> None:
    path = settings.landing_dir(stream) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress("".join(f"{line}\n" for line in lines).encode()))
    os.utime(path, (arrival.timestamp(), arrival.timestamp()))


def ingest(spark: SparkSession, settings: Settings, now: datetime, *streams: str) -> Settings:
    at_now = replace(settings, now_override=now)
    run_ingest(open_run(at_now, spark), streams)
    return at_now


def quarantine_by_line(settings: Settings) -> dict[tuple[str, int | None], tuple[str, str | None]]:
    return {(Path(source_key(r["source_file"])).name, r["line_number"]): (r["reason"], r["detail"])
            for r in table(settings, "quarantine/impressions")}


def run_main(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.spark
def test_quarantined_lines_keep_their_line_number_and_the_parsers_words_and_blank_lines_are_no_records(
    spark: SparkSession, settings: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Spark writes the rejected lines (the path of a batch with more than DRIVER_WRITE_ROWS of them), so the
    # parser's words come from the UDF over the malformed lines; test_ingest's writer test compares both paths.
    monkeypatch.setattr(microbatch, "DRIVER_WRITE_ROWS", 0)
    lake.land(settings, "impressions", "big.jsonl", [big_line(i) for i in range(1, BIG_LINES + 1)], ts(2))
    lake.land(settings, "impressions", "blanks.jsonl", ["", "   ", "\t"], ts(2.1))
    lake.land(settings, "impressions", "mixed.jsonl", MIXED, ts(2.2))
    land_gzip(settings, "impressions", "zipped.jsonl.gz", ZIPPED, ts(2.3))
    # Splits of 4 kB: big.jsonl (about 30 kB) is read as several, by both of the session's cores.
    spark.conf.set("spark.sql.files.maxPartitionBytes", "4096")
    try:
        done = ingest(spark, settings, ts(3), "impressions")
    finally:
        spark.conf.unset("spark.sql.files.maxPartitionBytes")

    quarantine = quarantine_by_line(done)
    assert {k: v for k, v in quarantine.items() if k[0] == "mixed.jsonl"} == {
        ("mixed.jsonl", line): expected for line, expected in MIXED_QUARANTINE.items()}
    assert {k: v for k, v in quarantine.items() if k[0] == "big.jsonl"} == {
        ("big.jsonl", i): ("malformed_json", "Expecting property name enclosed in double quotes at column "
                           f"{len(big_line(i)) + 1}") for i in BIG_BAD}
    assert {k: v for k, v in quarantine.items() if k[0] == "zipped.jsonl.gz"} == {
        ("zipped.jsonl.gz", 3): ("malformed_json", "Expecting value at column 1"),
        ("zipped.jsonl.gz", 5): ("bad_timestamp", "event_time: yesterday"),
    }
    assert len(table(done, "quarantine/impressions")) == len(quarantine)  # one row per line, no blank one

    # Blank lines are no records: skipped, and lines = accepted + quarantined + late + duplicates per file.
    rows = {Path(source_key(r.source_file or "")).name: r for r in load_state(done, "impressions").rows}
    counts = {name: (r.lines, r.accepted, r.quarantined, r.late, r.duplicates, r.skipped) for name, r in rows.items()}
    assert counts == {
        "big.jsonl": (BIG_LINES - 8, BIG_LINES - 8 - len(BIG_BAD), len(BIG_BAD), 0, 0, 8),
        # A file of blank lines only has its ops row, so it is never listed as new again.
        "blanks.jsonl": (0, 0, 0, 0, 0, 3),
        "mixed.jsonl": (9, 2, 6, 0, 1, 4),
        "zipped.jsonl.gz": (4, 2, 2, 0, 0, 1),
    }
    assert all(r.lines == r.accepted + r.quarantined + r.late + r.duplicates for r in rows.values())
    bronze = {r["impression_id"] for r in table(done, "bronze/impressions")}
    assert {"a", "b", "z1", "z2", "big1", "big399"} <= bronze and len(bronze) == BIG_LINES - 8 - len(BIG_BAD) + 4

    # -- files from after "now", on two streams: taken, and one warning for the run --------------------------
    lake.land(settings, "impressions", "future.jsonl", [imp("f", 20)], ts(90))
    click = {"click_id": "k", "impression_id": "f", "ad_id": "a1", "event_time": ts(21).strftime("%Y-%m-%dT%H:%M:%SZ")}
    lake.land(settings, "clicks", "future-clicks.jsonl", [click], ts(95))
    with caplog.at_level("WARNING", logger="sluice.ingest"):
        later = ingest(spark, settings, ts(30), "impressions", "clicks")
    warnings = [r.getMessage() for r in caplog.records if "arrived after now" in r.getMessage()]
    assert warnings == ["2 files arrived after now (2024-05-01T10:30:00Z; the latest at 2024-05-01T11:35:00Z) and "
                        "were taken under their own arrival time; was --now meant?"]
    assert "f" in {r["impression_id"] for r in table(later, "bronze/impressions")}
    assert [r["click_id"] for r in table(later, "bronze/clicks")] == ["k"]
    future = [r for r in load_state(later, "impressions").rows if (r.source_file or "").endswith("future.jsonl")]
    assert [(r.max_arrival_time, r.accepted) for r in future] == [(ts(90), 1)]  # under its own arrival time
    # Every file has exactly one ops row: the file of blank lines was not taken again.
    names = [Path(source_key(r.source_file or "")).name for r in load_state(later, "impressions").rows]
    assert sorted(names) == ["big.jsonl", "blanks.jsonl", "future.jsonl", "mixed.jsonl", "zipped.jsonl.gz"]

    # -- sluice quarantine, on that home (it starts no Spark) ---------------------------------------------
    as_the_user(monkeypatch)
    home = str(done.home)
    code, out, err = run_main(capsys, "--home", home, "quarantine", "impressions")
    assert code == 0, err
    assert out.startswith(f"quarantine/impressions: {len(quarantine)} record(s)\n")
    assert "malformed_json  " in out and "bad_timestamp" in out and "missing_field" in out
    # Newest file first, lines in file order: the .gz file's line 3, then mixed.jsonl's first two.
    shown = out[out.index("malformed_json (3 of 16, newest file first):"):]
    assert shown.index("zipped.jsonl.gz:3") < shown.index("mixed.jsonl:4") < shown.index("mixed.jsonl:5")
    assert "mixed.jsonl:4  batch 2  Expecting value at column 34" in out
    assert "'{\"impression_id\": \"t1\", \"ad_id\": '" in out  # the raw line

    code, out, err = run_main(capsys, "--home", home, "quarantine", "impressions", "--reason", "malformed_json",
                              "--reason", "bad_timestamp", "--limit", "20", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert list(doc) == ["stream", "table", "table_exists", "reasons", "since", "total", "counts", "examples"]
    assert doc["counts"] == {"malformed_json": 16, "bad_timestamp": 1} and doc["total"] == 17
    malformed = [(e["file"], e["line_number"]) for e in doc["examples"] if e["reason"] == "malformed_json"]
    assert malformed == [("zipped.jsonl.gz", 3), *(("mixed.jsonl", n) for n in (4, 5, 6, 7, 11)),
                         *(("big.jsonl", n) for n in BIG_BAD)]
    [bad_ts] = [e for e in doc["examples"] if e["reason"] == "bad_timestamp"]
    assert bad_ts == {
        "reason": "bad_timestamp", "source_file": str(done.landing_dir("impressions") / "zipped.jsonl.gz"),
        "file": "zipped.jsonl.gz", "line_number": 5, "detail": "event_time: yesterday", "raw": ZIPPED[4],
        "raw_chars": len(ZIPPED[4]), "arrival_time": "2024-05-01T10:02:18Z", "ingest_batch_id": 3,
    }


# -- without Spark ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("raw", "detail"), [
    ('{"a": 1 "b": 2}', "Expecting ',' delimiter at column 9"),
    ('{"a": "b", "c', "Unterminated string starting at column 12"),
    ('{"a":1}{"b":2}', "Extra data at column 8"),
    ('{"a": 1} xyz', "Extra data at column 10"),
    ("[1, 2]", "a JSON array, not an object"),
    ('"text"', "a JSON string, not an object"),
    ("12", "a JSON number, not an object"),
    ("true", "a JSON boolean, not an object"),
    ("null", "JSON null, not an object"),
    ('{"a": NaN}', "NaN is not a JSON value (JSON has no NaN or Infinity)"),
    ("\ufeff{}", "a byte order mark (U+FEFF) before the JSON at column 1"),
    ('{"a":' * 5000, "nested too deeply to parse"),
])
def test_the_detail_of_a_malformed_line_is_what_the_parser_said(raw: str, detail: str) -> None:
    assert malformed_detail(raw) == detail


def test_line_numbers_count_the_lines_of_the_splits_before_their_own() -> None:
    # Three splits, listed out of order, with ids as monotonically_increasing_id gives them per partition.
    counts = FileCounts(T0, splits=[(8192, 5, 2 << 33), (0, 10, 7), (4096, 20, 1 << 33)])
    offsets = dict(counts.line_offsets())
    assert 7 + offsets[0] == 1 and 16 + offsets[0] == 10
    assert (1 << 33) + offsets[4096] == 11 and (2 << 33) + 4 + offsets[8192] == 35


def test_the_run_document_warns_once_of_files_that_arrived_after_now() -> None:
    now = ts(30)

    def row(stream: str, batch: int, arrival: datetime | None, **extra: Any) -> BatchRow:
        return BatchRow(stream, batch, max_arrival_time=arrival, source_file=f"file:/l/{stream}/{batch}.jsonl",
                        spark_batch_id=0, **extra)

    batches = {"impressions": [row("impressions", 0, ts(20)), row("impressions", 1, ts(31))],
               "clicks": [row("clicks", 0, ts(40)), BatchRow("clicks", 1, max_event_time=ts(0), is_heartbeat=True)]}
    assert ingest_warnings(batches, now) == [
        "2 files arrived after now (2024-05-01T10:30:00Z; the latest at 2024-05-01T10:40:00Z) and were taken under "
        "their own arrival time; was --now meant?"]
    assert ingest_warnings({"impressions": batches["impressions"][:1]}, now) == []
