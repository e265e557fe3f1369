"""Changing a stream's declaration after it has ingested records (issue 54, SPEC 9 "Streams"), on the README's
tutorial pipeline (SPEC 8's example), real Spark and Delta: a field added is a new bronze column, null for the
records before it; a field's type changed, a field removed, another id or another event-time field would change
what the ingested records mean, and are refused before anything is written, naming the stream, the field and
both declarations."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from sluice.cli.main import main
from sluice.config import Settings, load_settings
from sluice.ingest.declarations import DECLARATION, Declaration, DeclarationChanged, changes
from sluice.ingest.run import run_ingest
from sluice.ingest.state import load_state
from sluice.runtime.context import open_run
from sluice.storage.snapshots import open_table
from sluice.storage.state import lake_state
from support.lake import land, table
from support.tutorial import write_tutorial

T0 = datetime(2024, 5, 1, 10, 0, tzinfo=UTC)
FIELDS = '"temp_c": "double", "battery": "long",'


def reading(rid: str, minutes: int, **extra: Any) -> dict[str, Any]:
    return {"reading_id": rid, "device_id": "d1", "temp_c": 20.5, "battery": 90,
            "event_time": (T0 + timedelta(minutes=minutes)).strftime("%Y-%m-%dT%H:%M:%SZ"), **extra}


def declare(folder: Path, old: str, new: str) -> Path:
    source = (folder / "device_temps.py").read_text()
    assert old in source, f"the tutorial pipeline no longer declares {old!r}"
    (folder / "device_temps.py").write_text(source.replace(old, new))
    return folder


def settings_of(folder: Path, home: Path) -> Settings:
    settings = load_settings({"SLUICE_PIPELINES": str(folder), "SLUICE_NOW": "2024-05-01T10:30:00Z"}, home=home)
    assert settings.registry.errors == []
    return settings


@pytest.mark.spark
def test_a_change_of_meaning_is_refused_before_anything_is_written_and_a_new_field_is_a_column(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder, home = write_tutorial(tmp_path / "pipelines"), tmp_path / "home"
    first = settings_of(folder, home)
    land(first, "readings", "r1.jsonl", [reading("r1", 1), reading("r2", 2)], T0 + timedelta(minutes=5))
    run_ingest(open_run(first, spark), ["readings"])
    bronze = first.lake.table("bronze/readings")
    version = open_table(bronze).version()  # type: ignore[union-attr]
    assert lake_state(first).read_json("ingest", "readings", DECLARATION) == {
        "fields": {"reading_id": "string", "device_id": "string", "temp_c": "double", "battery": "long",
                   "event_time": "timestamp"}, "id": "reading_id", "event_time": "event_time"}
    original = (folder / "device_temps.py").read_text()
    land(first, "readings", "r2.jsonl", [reading("r3", 6)], T0 + timedelta(minutes=8))

    refused = {
        "a type": ('"temp_c": "double"', '"temp_c": "string"',
                   ["'temp_c' changed type: ingested as double, now declared string"]),
        "a field removed": (' "battery": "long",', "", ["field 'battery' was removed (ingested as long)"]),
        "the id": ('id="reading_id"', 'id="device_id"', ["the id changed: ingested with id 'reading_id', now "
                                                          "'device_id'"]),
    }
    for what, (old, new, said) in refused.items():
        changed = settings_of(declare(folder, old, new), home)
        with pytest.raises(DeclarationChanged) as caught:
            run_ingest(open_run(changed, spark), ["readings"])
        message = str(caught.value)
        assert message.startswith("stream 'readings': its declaration changed"), (what, message)
        assert all(s in message for s in said) and "a new stream" in message, (what, message)
        (folder / "device_temps.py").write_text(original)
        # Nothing was written: bronze and the stream's batches are as they were, r2.jsonl still waits.
        assert open_table(bronze).version() == version, what  # type: ignore[union-attr]
        assert len(load_state(first, "readings").rows) == 1, what

    # The CLI says it, exit 1, no traceback.
    declare(folder, '"temp_c": "double"', '"temp_c": "string"')
    code = main(["--home", str(home), "--pipelines", str(folder), "run", "device_temps",
                 "--now", "2024-05-01T10:30:00Z"])
    err = capsys.readouterr().err
    assert code == 1 and "'temp_c' changed type: ingested as double, now declared string" in err, err
    assert "Traceback" not in err
    declare(folder, '"temp_c": "string"', '"temp_c": "double"')

    # A new field: a new bronze column, null for the records before it; the next file fills it.
    added = settings_of(declare(folder, FIELDS, FIELDS + ' "humidity": "double",'), home)
    land(added, "readings", "r3.jsonl", [reading("r4", 9, humidity=41.5)], T0 + timedelta(minutes=12))
    run_ingest(open_run(added, spark), ["readings"])
    rows = {r["reading_id"]: r for r in table(added, "bronze/readings") if not r["is_heartbeat"]}
    assert {rid: r["humidity"] for rid, r in rows.items()} == {"r1": None, "r2": None, "r3": None, "r4": 41.5}


def test_what_changes_meaning_and_what_does_not() -> None:
    """The rule without Spark: an added field is no change of meaning; a lake whose declaration was not kept
    (only bronze's schema is known) is judged on its fields and types alone."""
    before = Declaration({"reading_id": "string", "temp_c": "double", "ts": "timestamp"}, "reading_id", "ts")
    assert changes(before, Declaration({**before.fields, "humidity": "double"}, "reading_id", "ts")) == []
    assert changes(before, Declaration(dict(before.fields), "reading_id", "event_time")) == [
        "the event-time field changed: ingested from 'ts', now 'event_time'"]
    from_bronze = Declaration(dict(before.fields), None, None)
    assert changes(from_bronze, Declaration(dict(before.fields), "other_id", "other_ts")) == []
