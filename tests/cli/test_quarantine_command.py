"""``sluice quarantine <stream>`` (issue 53, part 3) on tables written here with delta-rs: filters, a table from
before ``line_number`` existed, a home without the table, and its errors. No Spark; the command on a home
that a real ingest wrote is tested in tests/ingest/test_quarantine_detail.py."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from sluice.cli.main import main
from sluice.config import load_settings
from sluice.storage import tables
from sluice.storage.snapshots import arrow_schema
from support.shell import as_the_user

T0 = datetime(2024, 5, 1, 10, 0, tzinfo=UTC)
# quarantine/<stream> as sluice wrote it before line_number: a table that older homes hold.
OLD_COLUMNS = ["raw", "source_file", "reason", "detail", "arrival_time", "ingest_batch_id"]


@pytest.fixture(autouse=True)
def _no_sluice_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    as_the_user(monkeypatch)


def run_main(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


def write_quarantine(home: Path, rows: list[dict[str, object]], *, old: bool = False) -> None:
    settings = load_settings({}, home=home)
    definition = tables.quarantine(settings.stream("impressions"))
    schema = arrow_schema(definition.schema)
    if old:
        schema = pa.schema([schema.field(name) for name in OLD_COLUMNS])
    write_deltalake(definition.path(settings), pa.Table.from_pylist(rows, schema=schema))


def row(batch: int, line: int | None, reason: str, detail: str | None, raw: str | None, minutes: float,
        name: str = "f.jsonl") -> dict[str, object]:
    return {"raw": raw, "source_file": f"file:/landing/impressions/{name}", "reason": reason, "detail": detail,
            "arrival_time": T0 + timedelta(minutes=minutes), "ingest_batch_id": batch, "line_number": line}


@pytest.fixture
def home(tmp_path: Path) -> Path:
    long_line = '{"impression_id": "x", ' + '"pad": "' + "p" * 300 + '", '
    write_quarantine(tmp_path, [
        row(0, 2, "malformed_json", "Expecting value at column 1", "oops", 1, "a.jsonl"),
        row(0, 7, "early", "arrival_time + 0:05:00 exceeded", '{"impression_id": "e"}', 1, "a.jsonl"),
        row(1, 3, "malformed_json", "Expecting property name enclosed in double quotes at column 328", long_line, 5,
            "b%20c.jsonl"),
        row(1, 9, "malformed_json", "Extra data at column 8", '{"a":1}{"b":2}', 5, "b%20c.jsonl"),
        row(2, None, "unreadable_file", "file cannot be read: BadGzipFile: Not a gzipped file (b'no')", None, 9,
            "z.jsonl.gz"),
    ])
    return tmp_path


def test_counts_per_reason_and_the_newest_examples_in_line_order(home: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_main(capsys, "--home", str(home), "quarantine", "impressions", "--limit", "2")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == "quarantine/impressions: 5 record(s)"
    assert lines[2].split() == ["reason", "records", "files", "last", "arrival"]
    assert [line.split()[:3] for line in lines[4:7]] == [
        ["malformed_json", "3", "2"], ["early", "1", "1"], ["unreadable_file", "1", "1"]]
    text = out[out.index("malformed_json (2 of 3, newest file first):"):]
    # Newest file first, then in line order; the file name decoded; the raw line cut short.
    assert text.index("b c.jsonl:3  batch 1  Expecting property name") < text.index("b c.jsonl:9  batch 1  Extra data")
    assert "a.jsonl:2" not in text.split("early (all")[0]
    assert "'{\"impression_id\": \"x\", \"pad\": \"ppp" in out and "pppp...'" in out
    # A file quarantined whole has no line number.
    assert "unreadable_file (all, newest file first):\n  z.jsonl.gz  batch 2  file cannot be read" in out


def test_json_filters_by_reason_and_arrival(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_main(capsys, "--home", str(home), "quarantine", "impressions", "--reason", "malformed_json",
                              "--since", "2024-05-01T10:03:00Z", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["stream"] == "impressions" and doc["table_exists"] is True
    assert doc["reasons"] == ["malformed_json"] and doc["since"] == "2024-05-01T10:03:00Z"
    assert (doc["total"], doc["counts"]) == (2, {"malformed_json": 2})
    assert [(e["file"], e["line_number"], e["detail"]) for e in doc["examples"]] == [
        ("b c.jsonl", 3, "Expecting property name enclosed in double quotes at column 328"),
        ("b c.jsonl", 9, "Extra data at column 8")]
    first = doc["examples"][0]
    assert first["source_file"] == "/landing/impressions/b c.jsonl" and first["ingest_batch_id"] == 1
    assert first["raw_chars"] == len(first["raw"]) > 300 and first["arrival_time"] == "2024-05-01T10:05:00Z"

    # Every reason is a key of counts when none is chosen; --limit 0 gives counts only.
    code, out, _ = run_main(capsys, "--home", str(home), "quarantine", "impressions", "--limit", "0", "--json")
    doc = json.loads(out)
    assert list(doc["counts"]) == list(tables.QUARANTINE_REASONS) and doc["examples"] == []
    assert doc["counts"]["malformed_json"] == 3 and doc["counts"]["missing_field"] == 0


def test_a_table_written_before_line_numbers_is_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old = [{k: v for k, v in row(0, None, "malformed_json", None, f"bad {i}", 1).items() if k in OLD_COLUMNS}
           for i in range(2)]
    write_quarantine(tmp_path, old, old=True)
    code, out, err = run_main(capsys, "--home", str(tmp_path), "quarantine", "impressions", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["counts"]["malformed_json"] == 2
    assert sorted((e["line_number"], e["detail"], e["raw"]) for e in doc["examples"]) == [
        (None, None, "bad 0"), (None, None, "bad 1")]
    code, out, _ = run_main(capsys, "--home", str(tmp_path), "quarantine", "impressions")
    assert "  f.jsonl  batch 0  -\n    'bad " in out


def test_a_home_without_the_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_main(capsys, "--home", str(tmp_path), "quarantine", "clicks")
    assert (code, out.strip()) == (0, "quarantine/clicks: no table yet (nothing of clicks has been ingested with "
                                      "this home)")
    code, out, _ = run_main(capsys, "--home", str(tmp_path / "missing"), "quarantine", "clicks", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["table_exists"] is False and doc["total"] == 0 and doc["examples"] == []
    assert set(doc["counts"].values()) == {0}


def test_errors_name_what_exists(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_main(capsys, "--home", str(tmp_path), "quarantine", "orders")
    assert code == 1 and out == ""
    assert err.startswith("sluice: error: unknown stream 'orders'; choose one of: clicks, events, impressions")
    code, out, err = run_main(capsys, "--home", str(tmp_path), "quarantine", "orders", "--json")
    assert code == 1 and json.loads(out)["error"]["type"] == "ConfigError"

    code, _, err = run_main(capsys, "--home", str(tmp_path), "quarantine", "impressions", "--reason", "malformed")
    assert code == 64
    assert "invalid choice: 'malformed'" in err and all(reason in err for reason in tables.QUARANTINE_REASONS)
    code, _, err = run_main(capsys, "--home", str(tmp_path), "quarantine", "impressions", "--since", "yesterday")
    assert code == 64 and "argument --since:" in err
    code, _, err = run_main(capsys, "--home", str(tmp_path), "quarantine", "impressions", "--limit", "-1")
    assert code == 64 and "argument --limit: expected a whole number >= 0, got '-1'" in err


def test_help_has_examples_and_a_json_option(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_main(capsys, "quarantine", "--help")
    assert code == 0 and "examples:\n  sluice quarantine readings" in out and "--json" in out
    code, out, _ = run_main(capsys, "--help")
    assert "sluice quarantine readings" in out and "alerts or quarantine" in out
