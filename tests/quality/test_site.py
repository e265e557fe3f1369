"""The Data Docs site and Great Expectations' stores under the lake (SPEC 1, sluice.quality.site), the same on a
local lake and in a bucket of a real S3 server (s3proxy): two hosts that share only the lake build one site,
whose index links the windows each validated, and the Airflow plugin serves its pages from there. Real
WindowValidators (GE), no Spark."""

from __future__ import annotations

import os
import re
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import quote

import pandas as pd
import pytest
from fastapi.testclient import TestClient

from sluice.airflow.web import create_app
from sluice.config import Settings, load_settings
from sluice.quality.checker import docs_url
from sluice.quality.frames import OutputFrame
from sluice.quality.site import docs_site
from sluice.quality.validator import WindowValidator
from support.s3 import S3Server

START = datetime(2024, 5, 1, 12, tzinfo=UTC)
HOUR = timedelta(hours=1)
PIPELINE = "ad_clicks_hourly"


@pytest.fixture(params=["file", "s3"])
def lake_env(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, str]:
    """The settings' environment of a lake that two homes share: a local folder, or a bucket."""
    if request.param == "file":
        return {"SLUICE_LAKE": str(tmp_path / "shared-lake")}
    s3: S3Server = request.getfixturevalue("s3")
    return {**s3.env(), "SLUICE_LAKE": f"s3://{s3.bucket('docs')}/lake"}


def _validate(settings: Settings, hour: int) -> str:
    """One window validated and built from ``settings``' home, as a cycle does; the page's location."""
    site = docs_site(settings)
    validator = WindowValidator(site, run_time=START + (hour + 3) * HOUR)
    start = START + hour * HOUR
    gold = pd.DataFrame({
        "window_start": pd.Series([start], dtype="datetime64[us, UTC]"),
        "window_end": pd.Series([start + HOUR], dtype="datetime64[us, UTC]"),
        "ad_id": ["ad-1"],
        "ctr": [0.25],
    })
    output = OutputFrame(PIPELINE, gold, keys=("ad_id",))
    validation = validator.validate(PIPELINE, start, start + HOUR, outputs=[output],
                                    completeness={"completeness:clicks": (3, 3)}, late_rows=0, total_rows=10)
    index = site.location(validator.build_docs())
    assert index == site.root.join("index.html")
    location = site.location(validation.docs_path)
    assert location is not None
    return location


def test_two_hosts_that_share_the_lake_build_one_site(lake_env: dict[str, str], tmp_path: Path) -> None:
    hosts = [load_settings(lake_env, home=tmp_path / name) for name in ("host-a", "host-b")]
    pages = [_validate(settings, hour) for hour, settings in enumerate(hosts)]
    site = docs_site(hosts[0])
    assert site.root.uri == f"{hosts[0].lake.uri}/_data_docs"
    # Each window's page is where ops/dq_results says it is, under the lake, whichever host rendered it.
    for location in pages:
        assert location.startswith(site.root.uri + "/validations/")
        page = site.read(location)
        assert page is not None and b"</html>" in page
    # The index, last built by host B, links host A's window too: GE's stores are the lake's, not a host's.
    index = site.read("index.html")
    assert index is not None
    linked = set(re.findall(r'validations/[^"\']+\.html', index.decode()))
    assert {site.relative(p) for p in pages} <= linked, linked
    # Nothing of the site or the stores is kept under a home except a render cache on object storage.
    for settings in hosts:
        assert not (settings.home / "data_docs").exists()
        assert not (settings.home / "gx_store").exists()
        assert (settings.home / "cache").exists() == (not site.root.is_local)
    # An alert's link names the page by its path in the site, under the configured base.
    linking = replace(hosts[1], data_docs_url="https://airflow.example.com/sluice/docs")
    assert docs_url(linking, pages[0]) == f"https://airflow.example.com/sluice/docs/{site.relative(pages[0])}"


def test_a_build_uploads_only_what_it_changed(lake_env: dict[str, str], tmp_path: Path) -> None:
    settings = load_settings(lake_env, home=tmp_path / "home")
    site = docs_site(settings)
    _validate(settings, 0)
    if site.root.is_local:
        assert site.publish() == []  # the site is the folder GE renders into
        return
    assert site.publish() == []  # build_docs published it all
    cache = sorted(p.relative_to(site.staging).as_posix() for p in site.staging.rglob("*") if p.is_file()
                   and not p.name.startswith("."))
    assert all(site.read(name) == (site.staging / name).read_bytes() for name in cache)
    # GE copies its static assets again on every build, byte for byte the same: nothing to upload for them.
    assets = [name for name in cache if name.startswith(("static/", "_static/"))]
    assert len(assets) > 20
    for name in assets:
        (site.staging / name).write_bytes((site.staging / name).read_bytes())
    index = site.staging / "index.html"
    index.write_text(index.read_text().replace("</body>", "<!-- rebuilt --></body>"))
    assert site.publish() == ["index.html"]
    assert b"<!-- rebuilt -->" in (site.read("index.html") or b"")


def test_the_plugin_serves_the_lakes_pages_and_nothing_else(lake_env: dict[str, str], tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    settings = load_settings(lake_env, home=home)
    page = _validate(settings, 0)
    for name in [k for k in list(os.environ) if k.startswith(("SLUICE_", "AWS_"))]:
        monkeypatch.delenv(name)
    for name, value in {**lake_env, "SLUICE_HOME": str(home)}.items():
        monkeypatch.setenv(name, value)
    (home / "secret.txt").parent.mkdir(parents=True, exist_ok=True)
    (home / "secret.txt").write_text("not for the web")
    client = TestClient(create_app(reader=lambda: None))
    site = docs_site(settings)

    index = client.get("/docs/")
    assert index.status_code == 200 and index.headers["content-type"].startswith("text/html")
    shown = client.get("/docs/" + quote(site.relative(page) or ""))
    assert shown.status_code == 200 and shown.content == site.read(page)
    css = client.get("/docs/_static/MANIFEST.json")
    assert css.status_code == 200 and css.headers["content-type"].startswith("application/json")
    assert client.get("/docs/validations/nothing-here.html").status_code == 404
    # The ledger page's data reads the same lake (no pipeline has run: every pipeline, no windows yet).
    status = client.get("/api/status")
    assert status.status_code == 200 and status.json()["pipelines"], status.text
    assert client.get("/docs/..%2F..%2Fsecret.txt").status_code == 404
