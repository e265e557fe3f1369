"""sluice's small state (markers, plans, caches) kept with the lake (sluice.storage.state), the same on a local
lake and on a lake in a real S3 bucket (s3proxy, tests/support/s3.py)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from sluice.config import Settings, load_settings
from sluice.storage.state import lake_state
from support.s3 import S3Server


@pytest.fixture(params=["file", "s3"])
def lake(request: pytest.FixtureRequest, tmp_path: Path) -> Settings:
    if request.param == "file":
        return load_settings({}, home=tmp_path / "home")
    s3: S3Server = request.getfixturevalue("s3")
    return load_settings({**s3.env(), "SLUICE_LAKE": f"s3://{s3.bucket('state')}/lake"}, home=tmp_path / "home")


def test_state_objects_are_replaced_whole_and_read_back(lake: Settings) -> None:
    state = lake_state(lake)
    marker = ("pipelines", "p", "closed_through.json")
    assert state.read(*marker) is None and state.read_json(*marker) is None and not state.exists(*marker)
    state.write('{"boundary": "2024-05-01T10:00:00+00:00"}', *marker)
    state.write('{"boundary": "2024-05-01T11:00:00+00:00"}', *marker)
    assert state.read_json(*marker) == {"boundary": "2024-05-01T11:00:00+00:00"} and state.exists(*marker)
    state.delete(*marker)
    assert state.read(*marker) is None


def test_create_keeps_the_first_writers_content_when_writers_race(lake: Settings) -> None:
    """The ingest query's lineage id: every process that races to start a lineage reads the same one."""
    state = lake_state(lake)
    seen: list[str] = []
    threads = [threading.Thread(target=lambda i=i: seen.append(state.create(f"id-{i}", "ingest", "s", "query_id")))
               for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(seen) == 8 and len(set(seen)) == 1 and seen[0].startswith("id-")
    assert state.read("ingest", "s", "query_id") == seen[0]


def test_a_folder_lists_its_own_objects(lake: Settings) -> None:
    state = lake_state(lake)
    for name in ("0", "1", ".1.crc"):
        state.write("v1", "pipelines", "p", "out", "commits", name)
    state.write("x", "pipelines", "p", "out", "commits", "nested", "2")
    names = sorted(o.name for o in state.list("pipelines", "p", "out", "commits"))
    assert names == [".1.crc", "0", "1"]
    assert list(state.list("pipelines", "p", "other", "commits")) == []


def test_a_local_lake_keeps_its_state_where_earlier_sluice_versions_did(tmp_path: Path) -> None:
    """Homes of earlier versions keep working: the objects are the files they wrote, under the lake."""
    settings = load_settings({}, home=tmp_path / "home")
    lake_state(settings).write("{}", "pipelines", "p", "corrections.json")
    assert (tmp_path / "home" / "lake" / "_checkpoints" / "pipelines" / "p" / "corrections.json").read_text() == "{}"
