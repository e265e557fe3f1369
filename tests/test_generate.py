"""``sluice generate``: deterministic landing data whose manifest is exactly right under SPEC sections 2-3.

No Spark here. The core of the suite is an independent checker: a small re-implementation of the SPEC
rules that reads the landed files in arrival (mtime) order, one file per micro-batch, and must reproduce
the manifest exactly. It deliberately hard-codes the SPEC table instead of importing sluice.config.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import itertools
import json
import re
import zlib
from collections import Counter
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from sluice.config import ConfigError
from sluice_tools.generate import (
    ANCIENT_TIMESTAMPS,
    BAD_BYTES,
    BAD_TIMESTAMPS,
    BAD_TYPE_VALUES,
    GenerateOptions,
    Manifest,
    add_arguments,
    generate,
    options_from_args,
    run,
)

# SPEC section 2 (required fields, id field) and section 3 (delays, early tolerance), typed in by hand.
RULES: dict[str, tuple[str, tuple[str, ...], timedelta]] = {
    "impressions": ("impression_id", ("impression_id", "ad_id", "event_time"), timedelta(minutes=10)),
    "clicks": ("click_id", ("click_id", "impression_id", "ad_id", "event_time"), timedelta(minutes=10)),
    "events": ("event_id", ("event_id", "user_id", "event_time"), timedelta(minutes=5)),
}
# The declared string fields (SPEC section 2): an object, array or boolean there is a bad_type.
STRING_FIELDS: dict[str, tuple[str, ...]] = {
    "impressions": ("impression_id", "ad_id", "user_id"),
    "clicks": ("click_id", "impression_id", "ad_id", "user_id"),
    "events": ("event_id", "user_id", "event_type"),
}
REASONS = (
    "malformed_json", "missing_field", "bad_timestamp", "early", "bad_type", "bad_encoding", "unreadable_file",
)
# The earliest event time the product accepts; earlier ones are bad_timestamp.
EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
EARLY_TOLERANCE = timedelta(minutes=5)
JOIN_BOUND = timedelta(minutes=30)
RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$")

SMALL = GenerateOptions(hours=2, impressions_per_hour=300, events_per_hour=200)
OPTION_SETS = {
    "defaults": GenerateOptions(),
    "idle-gap-gzip-heavy": GenerateOptions(
        seed=11,
        hours=4,
        impressions_per_hour=400,
        events_per_hour=300,
        click_rate=0.3,
        idle_gap_minutes=45,
        late_share=0.03,
        early_share=0.02,
        duplicate_share=0.08,
        malformed_share=0.06,
        offset_timestamps=0.5,
        disorder=240,
        gzip=True,
    ),
    # Every class of issue 14 besides the classic ones: plain files, with unreadable .jsonl.gz among them.
    "every-class": GenerateOptions(
        seed=5,
        hours=2,
        impressions_per_hour=400,
        events_per_hour=300,
        click_rate=0.2,
        idle_gap_minutes=30,
        late_share=0.02,
        early_share=0.02,
        duplicate_share=0.05,
        malformed_share=0.03,
        bad_type_share=0.02,
        bad_encoding_share=0.02,
        ancient_share=0.01,
        unreadable_files=3,
        odd_file_names=True,
    ),
    "short-files-events-only": GenerateOptions(
        seed=3,
        start=datetime(2024, 6, 30, 22, 0, tzinfo=UTC),
        hours=1.5,
        file_minutes=3,
        events_per_hour=500,
        streams=("events",),
        late_share=0.05,
        duplicate_share=0.1,
        malformed_share=0.03,
        idle_gap_minutes=30,
    ),
}


# ------------------------------------------------------------------------------------ the checker


def parse_ts(value: Any) -> datetime | None:
    """SPEC section 2: RFC 3339 with Z or a numeric offset, normalised to UTC; None if unparsable."""
    if not isinstance(value, str) or not RFC3339.match(value):
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).astimezone(UTC)
    except ValueError:
        return None


def read_lines(path: Path) -> list[str]:
    """The lines of a file; bytes that are not UTF-8 come back as lone surrogates (``surrogateescape``).
    Raises (OSError, EOFError, zlib.error) when a .gz file cannot be read to its end."""
    raw = path.read_bytes()
    if path.name.endswith(".gz"):
        raw = gzip.decompress(raw)
    text = raw.decode("utf-8", "surrogateescape")
    assert text.endswith("\n")
    return text[:-1].split("\n")


UNREADABLE = (OSError, EOFError, zlib.error)


def line_count(path: Path) -> int:
    """What a file counts for: its lines, or one for a file that cannot be read."""
    try:
        return len(read_lines(path))
    except UNREADABLE:
        return 1


def is_utf8(line: str) -> bool:
    try:
        line.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def landed_files(directory: Path) -> list[Path]:
    """The files the product would read, in arrival order (names with . or _ are in flight)."""
    files = [p for p in directory.iterdir() if not p.name.startswith((".", "_"))]
    return sorted(files, key=lambda p: p.stat().st_mtime_ns)


@dataclass
class Checked:
    line: str
    kind: str
    event_time: datetime | None = None
    record: dict[str, Any] | None = None
    watermark: datetime | None = None


@dataclass
class CheckedFile:
    path: Path
    arrival: datetime
    lines: list[Checked] = field(default_factory=list)
    watermark_before: datetime | None = None
    watermark_after: datetime | None = None


def check_stream(directory: Path, stream: str) -> list[CheckedFile]:
    """Classify every line per SPEC: quarantine reasons, early, late against the watermark, duplicates."""
    id_field, required, delay = RULES[stream]
    watermark: datetime | None = None
    newest: datetime | None = None
    seen: set[str] = set()
    out: list[CheckedFile] = []
    for path in landed_files(directory):
        arrival = datetime.fromtimestamp(path.stat().st_mtime, UTC)
        checked = CheckedFile(path, arrival, watermark_before=watermark)
        batch_max: datetime | None = None
        try:
            lines = read_lines(path)
        except UNREADABLE:
            # One quarantine row for the whole file; it counts as one line and moves nothing.
            checked.lines.append(Checked("", "unreadable_file"))
            checked.watermark_after = watermark
            out.append(checked)
            continue
        for line in lines:
            if not is_utf8(line):
                checked.lines.append(Checked(line, "bad_encoding"))
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                checked.lines.append(Checked(line, "malformed_json"))
                continue
            if not isinstance(record, dict):
                checked.lines.append(Checked(line, "malformed_json"))
                continue
            if any(record.get(name) is None for name in required):
                checked.lines.append(Checked(line, "missing_field", record=record))
                continue
            ts = parse_ts(record["event_time"])
            if ts is None or ts < EARLIEST:
                checked.lines.append(Checked(line, "bad_timestamp", record=record))
            elif any(isinstance(record.get(name), dict | list | bool) for name in STRING_FIELDS[stream]):
                checked.lines.append(Checked(line, "bad_type", ts, record))
            elif ts > arrival + EARLY_TOLERANCE:
                checked.lines.append(Checked(line, "early", ts, record))
            elif watermark is not None and ts < watermark:
                checked.lines.append(Checked(line, "late", ts, record, watermark))
            elif record[id_field] in seen:
                checked.lines.append(Checked(line, "duplicate", ts, record, watermark))
            else:
                seen.add(record[id_field])
                checked.lines.append(Checked(line, "accepted", ts, record, watermark))
                batch_max = ts if batch_max is None else max(batch_max, ts)
        if batch_max is not None:
            newest = batch_max if newest is None else max(newest, batch_max)
            candidate = newest - delay
            watermark = candidate if watermark is None else max(watermark, candidate)
        checked.watermark_after = watermark
        out.append(checked)
    return out


def rfc(ts: datetime | None) -> str | None:
    return ts.strftime("%Y-%m-%dT%H:%M:%SZ") if ts else None


def summarise(files: list[CheckedFile]) -> dict[str, Any]:
    """The checker's findings in the manifest's per-stream format."""
    reasons = REASONS
    details = []
    for f in files:
        kinds = Counter(c.kind for c in f.lines)
        details.append(
            {
                "name": f.path.name,
                "arrival": rfc(f.arrival),
                "lines": len(f.lines),
                "accepted": kinds["accepted"],
                "quarantined": {r: kinds[r] for r in reasons},
                "late": kinds["late"],
                "duplicates": kinds["duplicate"],
                "watermark_before": rfc(f.watermark_before),
                "watermark_after": rfc(f.watermark_after),
            }
        )
    accepted = [c.event_time for f in files for c in f.lines if c.kind == "accepted" and c.event_time]
    return {
        "files": len(files),
        "lines": sum(d["lines"] for d in details),
        "accepted": sum(d["accepted"] for d in details),
        "quarantined": {r: sum(d["quarantined"][r] for d in details) for r in reasons},
        "late": sum(d["late"] for d in details),
        "duplicates": sum(d["duplicates"] for d in details),
        "min_event_time": rfc(min(accepted)) if accepted else None,
        "max_event_time": rfc(max(accepted)) if accepted else None,
        "last_arrival": rfc(files[-1].arrival) if files else None,
        "final_watermark": rfc(files[-1].watermark_after) if files else None,
        "file_details": details,
    }


def join_outcomes(clicks: list[CheckedFile], impressions: list[CheckedFile]) -> dict[str, int]:
    """SPEC section 4: a click matches when the ids agree and imp <= click <= imp + 30 min."""
    imps = {
        c.record["impression_id"]: c
        for f in impressions
        for c in f.lines
        if c.kind == "accepted" and c.record is not None
    }
    outcome: Counter[str] = Counter()
    for f in clicks:
        for c in f.lines:
            if c.kind != "accepted" or c.record is None or c.event_time is None:
                continue
            imp = imps.get(c.record["impression_id"])
            if imp is None or imp.event_time is None or imp.record is None:
                outcome["unknown_impression"] += 1
            elif imp.event_time <= c.event_time <= imp.event_time + JOIN_BOUND:
                assert c.record["ad_id"] == imp.record["ad_id"]
                outcome["matched"] += 1
            else:
                outcome["outside_bound"] += 1
    return {k: outcome[k] for k in ("matched", "outside_bound", "unknown_impression")}


def expected_view(manifest: dict[str, Any]) -> dict[str, Any]:
    """The manifest's per-stream dict, restricted to what the checker can observe."""
    keep = ("files", "lines", "accepted", "quarantined", "late", "duplicates")
    keep += ("min_event_time", "max_event_time", "last_arrival", "final_watermark")
    view = {k: manifest[k] for k in keep}
    view["file_details"] = [
        {k: d[k] for k in d if k not in ("event_start", "event_end")} for d in manifest["file_details"]
    ]
    return view


def snapshot(root: Path) -> dict[str, tuple[bytes, int]]:
    return {
        str(p.relative_to(root)): (p.read_bytes(), p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def landed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Manifest]]:
    """Each option set generated once for the module: the checker and the property tests share them."""
    out = {}
    for name, options in OPTION_SETS.items():
        root = tmp_path_factory.mktemp(name)
        out[name] = (root, generate(root, options))
    return out


# ----------------------------------------------------------------------------------------- tests


@pytest.mark.parametrize("name", list(OPTION_SETS))
def test_checker_reproduces_manifest_exactly(landed: dict[str, tuple[Path, Manifest]], name: str) -> None:
    root, manifest = landed[name]
    data = manifest.to_dict()
    assert sorted(data["streams"]) == sorted(OPTION_SETS[name].streams)
    checked = {stream: check_stream(root / stream, stream) for stream in data["streams"]}
    for stream, files in checked.items():
        assert summarise(files) == expected_view(data["streams"][stream]), stream
    if "clicks" in checked:
        assert join_outcomes(checked["clicks"], checked["impressions"]) == data["streams"]["clicks"]["join"]
    # Every kind of line the options ask for is really there, so the comparison above is not vacuous.
    options = OPTION_SETS[name]
    asked = {
        "early": options.early_share,
        "bad_type": options.bad_type_share,
        "bad_encoding": options.bad_encoding_share,
        "unreadable_file": options.unreadable_files,
        "ancient": options.ancient_share,
    }
    for stream, files in checked.items():
        kinds = Counter(c.kind for f in files for c in f.lines)
        kinds["ancient"] = sum(
            1 for f in files for c in f.lines
            if c.kind == "bad_timestamp" and c.record and c.record["event_time"] in ANCIENT_TIMESTAMPS
        )
        for kind in (
            "accepted",
            "late",
            "early",
            "duplicate",
            "malformed_json",
            "missing_field",
            "bad_timestamp",
            *asked,
        ):
            assert (kinds[kind] > 0) == bool(asked.get(kind, True)), (stream, kind)
        assert kinds["unreadable_file"] == options.unreadable_files, stream


def test_manifest_totals_equal_physical_lines(landed: dict[str, tuple[Path, Manifest]]) -> None:
    for root, manifest in landed.values():
        for stream, sm in manifest.streams.items():
            files = landed_files(root / stream)
            assert [p.name for p in files] == [d.name for d in sm.file_details]
            assert sm.files == len(files)
            assert sm.lines == sum(line_count(p) for p in files)
            assert sm.lines == sm.accepted + sm.quarantined_total + sm.late + sm.duplicates
            for d, p in zip(sm.file_details, files, strict=True):
                assert d.lines == line_count(p)
                assert d.lines == d.accepted + sum(d.quarantined.values()) + d.late + d.duplicates
            totals = manifest.totals()[stream]
            assert totals["lines"] == sm.lines and totals["files"] == sm.files


def test_to_dict_is_json_and_write_manifest(landed: dict[str, tuple[Path, Manifest]], tmp_path: Path) -> None:
    _, manifest = landed["defaults"]
    data = manifest.to_dict()
    assert json.loads(json.dumps(data)) == data
    target = manifest.write_manifest(tmp_path / "sub" / "manifest.json")
    assert json.loads(target.read_text()) == data
    assert data["options"]["start"] == "2024-05-01T00:00:00Z"
    assert data["streams"]["clicks"]["join"]["matched"] > 0
    assert "impressions" in manifest.summary() and str(manifest.landing) in manifest.describe()
    assert data["totals"] == manifest.totals()
    assert data["totals"]["events"]["lines"] == data["streams"]["events"]["lines"]


def test_same_seed_is_byte_identical_and_other_seed_differs(tmp_path: Path) -> None:
    options = replace(SMALL, idle_gap_minutes=30, gzip=True)
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    ma, mb = generate(a, options), generate(b, options)
    generate(c, replace(options, seed=options.seed + 1))
    assert snapshot(a) == snapshot(b)
    assert snapshot(a)
    da, db = ma.to_dict(), mb.to_dict()
    da.pop("landing"), db.pop("landing")
    assert da == db
    first, other = snapshot(a), snapshot(c)
    common = other.keys() & first.keys()
    assert len(common) > 10
    assert all(other[k][0] != first[k][0] for k in common)


def test_files_arrive_in_order_in_the_past_and_nothing_is_left_in_flight(
    landed: dict[str, tuple[Path, Manifest]],
) -> None:
    for root, manifest in landed.values():
        span_end = manifest.options.end
        assert not [p for p in root.rglob("*") if p.name.startswith((".", "_"))]
        for stream in manifest.streams:
            files = landed_files(root / stream)
            mtimes = [p.stat().st_mtime_ns for p in files]
            assert mtimes == sorted(set(mtimes))
            if not manifest.options.odd_file_names:
                assert [p.name for p in files] == sorted(p.name for p in files)
            assert all(m % 1_000_000_000 == 0 for m in mtimes)  # whole seconds
            assert datetime.fromtimestamp(mtimes[-1] / 1e9, UTC) <= span_end + timedelta(minutes=2)


@pytest.mark.parametrize("name", ["idle-gap-gzip-heavy", "every-class"])
def test_malformed_lines_are_what_they_claim(landed: dict[str, tuple[Path, Manifest]], name: str) -> None:
    root, manifest = landed[name]
    for stream in manifest.streams:
        _, required, _ = RULES[stream]
        for f in check_stream(root / stream, stream):
            for c in f.lines:
                if c.kind == "malformed_json":
                    with pytest.raises(json.JSONDecodeError):
                        json.loads(c.line)
                    assert c.line.strip()
                elif c.kind == "missing_field":
                    assert c.record is not None
                    absent = [name for name in required if name not in c.record]
                    assert len(absent) == 1 and absent[0] != "event_time"
                    assert parse_ts(c.record["event_time"]) is not None
                elif c.kind == "bad_timestamp":
                    assert c.record is not None
                    assert all(c.record.get(name) is not None for name in required)
                    if c.record["event_time"] in ANCIENT_TIMESTAMPS:
                        # Well-formed, but before 1970.
                        when = parse_ts(c.record["event_time"])
                        assert when is not None and when < EARLIEST
                        continue
                    assert c.record["event_time"] in BAD_TIMESTAMPS
                    with pytest.raises(ValueError):
                        datetime.fromisoformat(c.record["event_time"].replace("Z", "+00:00"))
                elif c.kind == "bad_type":
                    # Exactly one string field holds a value no string can; everything else is valid.
                    assert c.record is not None and c.event_time is not None
                    assert all(c.record.get(name) is not None for name in required)
                    bad = [n for n in STRING_FIELDS[stream] if isinstance(c.record.get(n), dict | list | bool)]
                    assert len(bad) == 1 and c.record[bad[0]] in BAD_TYPE_VALUES
                    assert c.event_time <= f.arrival
                elif c.kind == "bad_encoding":
                    raw = c.line.encode("utf-8", "surrogateescape")
                    with pytest.raises(UnicodeDecodeError):
                        raw.decode("utf-8")
                    assert any(b in raw for b in BAD_BYTES) and b"\r" not in raw
                elif c.kind == "unreadable_file":
                    assert f.path.name.endswith(".jsonl.gz")
                    with pytest.raises(UNREADABLE):
                        gzip.decompress(f.path.read_bytes())


def test_time_rules_hold_with_clear_margins(landed: dict[str, tuple[Path, Manifest]]) -> None:
    for root, manifest in landed.values():
        for stream in manifest.streams:
            files = check_stream(root / stream, stream)
            assert not [c for c in files[0].lines if c.kind == "late"]  # never in the first file
            for k, f in enumerate(files):
                for c in f.lines:
                    t = c.event_time
                    if c.kind == "early":
                        assert t is not None and t > f.arrival + EARLY_TOLERANCE + timedelta(hours=1)
                    elif c.kind == "late":
                        # Far below the watermark, and below the newest accepted time of earlier files.
                        assert t is not None and c.watermark is not None and k > 0
                        assert t <= c.watermark - timedelta(minutes=20)
                    elif c.kind in ("accepted", "duplicate"):
                        assert t is not None and t <= f.arrival
                        if c.watermark is not None:
                            assert t >= c.watermark + timedelta(seconds=60)


@pytest.mark.parametrize("name", ["idle-gap-gzip-heavy", "every-class"])
def test_duplicates_are_byte_identical_copies_of_accepted_lines(
    landed: dict[str, tuple[Path, Manifest]], name: str
) -> None:
    root, manifest = landed[name]
    for stream in manifest.streams:
        id_field = RULES[stream][0]
        accepted: dict[str, tuple[int, str]] = {}
        where = Counter()
        # "The next file" is the next regular one: an unreadable file in between holds no records.
        readable = [f for f in check_stream(root / stream, stream) if f.lines[0].kind != "unreadable_file"]
        for k, f in enumerate(readable):
            for c in f.lines:
                assert c.record is not None or c.kind in ("malformed_json", "bad_encoding")
                if c.kind == "accepted":
                    assert c.record is not None
                    accepted[c.record[id_field]] = (k, c.line)
                elif c.kind == "duplicate":
                    assert c.record is not None
                    k0, original = accepted[c.record[id_field]]
                    assert c.line == original
                    where["same file" if k0 == k else "next file"] += 1
                    assert k - k0 in (0, 1)
        assert where["same file"] > 0 and where["next file"] > 0, (stream, where)
        # Late, early and quarantined records all carry ids of their own (a bad_type id is no id).
        ids = Counter(
            c.record.get(id_field)
            for f in check_stream(root / stream, stream)
            for c in f.lines
            if c.record is not None and c.kind != "duplicate" and isinstance(c.record.get(id_field), str)
        )
        assert max(ids.values()) == 1


def test_offset_timestamps_only_change_spelling_not_instant(tmp_path: Path) -> None:
    plain = generate(tmp_path / "z", replace(SMALL, offset_timestamps=0.0))
    offset = generate(tmp_path / "o", replace(SMALL, offset_timestamps=1.0))
    pd, od = plain.to_dict()["streams"], offset.to_dict()["streams"]
    assert pd == od  # same classification, file by file
    numeric = 0
    for stream in SMALL.streams:
        for pz, po in zip(
            landed_files(tmp_path / "z" / stream), landed_files(tmp_path / "o" / stream), strict=True
        ):
            for lz, lo in zip(read_lines(pz), read_lines(po), strict=True):
                try:
                    rz, ro = json.loads(lz), json.loads(lo)
                except json.JSONDecodeError:
                    continue
                if parse_ts(rz.get("event_time")) is None:
                    assert rz == ro
                    continue
                assert rz["event_time"].endswith("Z")
                assert parse_ts(ro["event_time"]) == parse_ts(rz["event_time"])
                if not ro["event_time"].endswith(("Z", "+00:00")):
                    numeric += 1
                assert {**rz, "event_time": None} == {**ro, "event_time": None}
    assert numeric > 100


def test_gzip_reads_back_to_the_plain_content(tmp_path: Path) -> None:
    plain = generate(tmp_path / "plain", SMALL)
    packed = generate(tmp_path / "gz", replace(SMALL, gzip=True))
    for stream in SMALL.streams:
        p_files, g_files = landed_files(tmp_path / "plain" / stream), landed_files(tmp_path / "gz" / stream)
        assert all(p.name.endswith(".jsonl.gz") for p in g_files)
        for p, g in zip(p_files, g_files, strict=True):
            assert g.name == p.name + ".gz"
            with gzip.open(g, "rb") as handle:
                assert handle.read() == p.read_bytes()
            assert g.stat().st_mtime_ns == p.stat().st_mtime_ns
        assert plain.streams[stream].lines == packed.streams[stream].lines


def test_streams_are_independent_of_each_other(tmp_path: Path) -> None:
    generate(tmp_path / "all", SMALL)
    generate(tmp_path / "clicks", replace(SMALL, streams=("clicks",)))
    assert snapshot(tmp_path / "clicks" / "clicks") == snapshot(tmp_path / "all" / "clicks")
    assert not (tmp_path / "clicks" / "impressions").exists()


def test_idle_gap_has_no_files_and_clicks_follow_impressions(
    landed: dict[str, tuple[Path, Manifest]],
) -> None:
    _, manifest = landed["idle-gap-gzip-heavy"]
    assert manifest.idle_gap is not None
    gap_start, gap_end = manifest.idle_gap
    assert gap_end - gap_start >= timedelta(minutes=45)
    assert manifest.options.start < gap_start and gap_end < manifest.options.end
    for stream, sm in manifest.streams.items():
        arrivals = [d.arrival for d in sm.file_details]
        assert max(b - a for a, b in itertools.pairwise(arrivals)) >= timedelta(minutes=45)
        for d in sm.file_details:
            assert d.event_end <= gap_start or d.event_start >= gap_end, stream
    join = manifest.streams["clicks"].join
    assert join is not None and all(v > 0 for v in join.values())


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(argv)


def test_cli_flags_build_options_and_run_writes_manifest(tmp_path: Path) -> None:
    assert options_from_args(parse([])) == GenerateOptions()
    ns = parse(
        [
            "--seed", "5", "--start", "2024-05-02T01:00:00+02:00", "--hours", "1.5",
            "--impressions-per-hour", "100", "--click-rate", "0.2", "--events-per-hour", "60",
            "--file-minutes", "5", "--disorder", "2m", "--late-share", "0.01", "--early-share", "0",
            "--duplicate-share", "0.02", "--malformed-share", "0.03", "--idle-gap-minutes", "20",
            "--streams", "impressions,clicks", "--offset-timestamps", "0.5", "--gzip",
            "--bad-type-share", "0.01", "--bad-encoding-share", "0.02", "--ancient-share", "0.03",
            "--unreadable-files", "2", "--odd-file-names",
            "--manifest", str(tmp_path / "m.json"),
        ]
    )  # fmt: skip
    options = options_from_args(ns)
    assert options == GenerateOptions(
        seed=5,
        start=datetime(2024, 5, 1, 23, 0, tzinfo=UTC),
        hours=1.5,
        impressions_per_hour=100,
        click_rate=0.2,
        events_per_hour=60,
        file_minutes=5,
        disorder=120,
        late_share=0.01,
        early_share=0.0,
        duplicate_share=0.02,
        malformed_share=0.03,
        idle_gap_minutes=20,
        streams=("impressions", "clicks"),
        offset_timestamps=0.5,
        gzip=True,
        bad_type_share=0.01,
        bad_encoding_share=0.02,
        ancient_share=0.03,
        unreadable_files=2,
        odd_file_names=True,
    )
    manifest = run(ns, tmp_path / "landing")
    assert json.loads((tmp_path / "m.json").read_text()) == manifest.to_dict()
    assert sorted(p.name for p in (tmp_path / "landing").iterdir()) == ["clicks", "impressions"]


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--late-share", "1.5"], "--late-share"),
        (["--malformed-share", "-0.1"], "--malformed-share"),
        (["--hours", "0"], "--hours"),
        (["--hours", "soon"], "--hours"),
        (["--seed", "x"], "--seed"),
        (["--file-minutes", "0"], "--file-minutes"),
        (["--streams", "impressions,views"], "--streams"),
        (["--streams", ","], "--streams"),
        (["--disorder", "300"], "--disorder"),  # above events' 5 min delay minus the margin
        (["--start", "tomorrow"], "--start"),
        (["--idle-gap-minutes", "170"], "--idle-gap-minutes"),
        (["--click-rate", "2"], "--click-rate"),
        (["--bad-type-share", "1.5"], "--bad-type-share"),
        (["--bad-encoding-share", "-1"], "--bad-encoding-share"),
        (["--ancient-share", "x"], "--ancient-share"),
        (["--unreadable-files", "-1"], "--unreadable-files"),
        (["--unreadable-files", "0.5"], "--unreadable-files"),
    ],
)
def test_invalid_flags_raise_config_error_naming_the_flag(argv: list[str], flag: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(flag)):
        options_from_args(parse(argv))


def test_disorder_limit_depends_on_the_streams() -> None:
    # Impressions and clicks have a 10 min delay, so 5 min of disorder is fine without events.
    assert GenerateOptions(disorder=300, streams=("impressions", "clicks")).disorder == 300
    with pytest.raises(ConfigError, match="events"):
        GenerateOptions(disorder=300)


def test_some_records_carry_unknown_fields_or_lack_optional_ones(
    landed: dict[str, tuple[Path, Manifest]],
) -> None:
    root, _ = landed["defaults"]
    known = {
        "impressions": {"impression_id", "ad_id", "user_id", "event_time"},
        "clicks": {"click_id", "impression_id", "ad_id", "user_id", "event_time"},
        "events": {"event_id", "user_id", "event_type", "event_time"},
    }
    for stream in ("impressions", "events"):
        records = [
            c.record for f in check_stream(root / stream, stream) for c in f.lines if c.kind == "accepted"
        ]
        assert any(set(r or {}) - known[stream] for r in records)
        assert any(known[stream] - set(r or {}) for r in records)


# ----------------------------------------------------------------------- bad-input options (issue 14)

BAD_INPUT_OFF: dict[str, Any] = {
    "bad_type_share": 0.0,
    "bad_encoding_share": 0.0,
    "ancient_share": 0.0,
    "unreadable_files": 0,
    "odd_file_names": False,
}
# sha256 over the names, mtimes and bytes of SMALL's files (see digest), computed with the generator as it
# was before the bad-input options existed: off by default, they must not change a byte of it.
SMALL_DIGEST = "34094859117fd421e6c9b14e3c5d7e6ed09c6ae9d250ffa0b1189ab44f837dd8"


def digest(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file():
            h.update(f"{p.relative_to(root).as_posix()}\0{p.stat().st_mtime_ns}\0".encode())
            h.update(p.read_bytes())
    return h.hexdigest()


def test_bad_input_options_default_off_and_change_no_byte(tmp_path: Path) -> None:
    defaults = GenerateOptions()
    assert {k: getattr(defaults, k) for k in BAD_INPUT_OFF} == BAD_INPUT_OFF
    assert options_from_args(parse([])) == defaults
    implicit = generate(tmp_path / "implicit", SMALL)
    explicit = generate(tmp_path / "explicit", replace(SMALL, **BAD_INPUT_OFF))
    assert snapshot(tmp_path / "implicit") == snapshot(tmp_path / "explicit")
    assert digest(tmp_path / "implicit") == SMALL_DIGEST
    di, de = implicit.to_dict(), explicit.to_dict()
    di.pop("landing"), de.pop("landing")
    assert di == de
    for totals in implicit.totals().values():
        assert totals["bad_type"] == totals["bad_encoding"] == totals["unreadable_file"] == 0


def test_bad_input_options_only_add_lines_and_files_and_the_manifest_counts_them(tmp_path: Path) -> None:
    shares: dict[str, Any] = {"bad_type_share": 0.02, "bad_encoding_share": 0.03, "ancient_share": 0.01}
    base = generate(tmp_path / "base", SMALL)
    more = generate(tmp_path / "more", replace(SMALL, **shares, unreadable_files=2))
    for stream in SMALL.streams:
        b, m = base.totals()[stream], more.totals()[stream]
        on_time = b["accepted"]  # the shares are fractions of the on-time records
        expected = {k: max(round(share * on_time), 1) for k, share in shares.items()}
        # The classic classes are untouched; ancient event times count as bad_timestamp.
        for key in ("accepted", "late", "duplicates", "early", "malformed_json", "missing_field"):
            assert m[key] == b[key], (stream, key)
        assert m["bad_timestamp"] == b["bad_timestamp"] + expected["ancient_share"]
        assert m["bad_type"] == expected["bad_type_share"]
        assert m["bad_encoding"] == expected["bad_encoding_share"]
        assert m["unreadable_file"] == 2 and m["files"] == b["files"] + 2
        assert m["lines"] == b["lines"] + sum(expected.values()) + 2

        # Every line of the plain output is still there, in the same order, in the file of the same name.
        base_files = landed_files(tmp_path / "base" / stream)
        more_files = {p.name: p for p in landed_files(tmp_path / "more" / stream)}
        for p in base_files:
            extra = iter(read_lines(more_files.pop(p.name)))
            assert all(line in extra for line in read_lines(p)), p.name  # a subsequence
        assert len(more_files) == 2 and all(n.endswith(".jsonl.gz") for n in more_files)

        # What was written is what the manifest says: bytes that are not UTF-8 and unreadable files.
        written = landed_files(tmp_path / "more" / stream)
        details = {d.name: d for d in more.streams[stream].file_details}
        assert sorted(details) == sorted(p.name for p in written)
        for p in written:
            d = details[p.name]
            if p.name in more_files:
                with pytest.raises(UNREADABLE):
                    gzip.decompress(p.read_bytes())
                assert (d.lines, d.quarantined["unreadable_file"]) == (1, 1)
                assert d.watermark_before == d.watermark_after
            else:
                not_utf8 = [ln for ln in p.read_bytes().split(b"\n")[:-1] if not _decodes(ln)]
                assert d.quarantined["bad_encoding"] == len(not_utf8)
                assert d.quarantined["unreadable_file"] == 0


def _decodes(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def test_odd_file_names_use_every_odd_character(landed: dict[str, tuple[Path, Manifest]]) -> None:
    root, manifest = landed["every-class"]
    for stream, sm in manifest.streams.items():
        names = [d.name for d in sm.file_details]
        for odd in (":", "%", "#", " ", "ü"):
            assert any(odd in n for n in names), (stream, odd)
        assert any(re.fullmatch(rf"{stream}-\d{{8}}T\d{{6}}Z\.jsonl", n) for n in names)  # ordinary ones too
        assert sorted(p.name for p in (root / stream).iterdir()) == sorted(names)
