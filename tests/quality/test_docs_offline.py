"""Data Docs that work offline (sluice.quality.docs_assets), on pages built by a real WindowValidator (no
Spark): no page loads anything from the network, every reference resolves at the page's own depth (Font
Awesome's fonts included), a second pass changes nothing, a rebuild rewrites only what GE wrote again, and
the plugin serves a page with its assets. The vendored copy itself matches its MANIFEST and covers every
CDN address in GE's page templates."""

from __future__ import annotations

import hashlib
import json
import logging
import re
from datetime import UTC, datetime, timedelta
from html.parser import HTMLParser
from importlib.util import find_spec
from pathlib import Path
from urllib.parse import quote, unquote, urljoin, urlsplit

import pandas as pd
import pytest
from fastapi.testclient import TestClient

from sluice import checks
from sluice.airflow.web import create_app
from sluice.quality.docs_assets import (
    BLANK_IMAGE,
    GE_ASSETS,
    MANIFEST,
    STATIC,
    VENDORED,
    make_offline,
    offline_html,
    vendored,
)
from sluice.quality.frames import OutputFrame
from sluice.quality.validator import WindowValidator

START = datetime(2024, 5, 1, 12, tzinfo=UTC)
HOUR = timedelta(hours=1)
PIPELINE = "ad_clicks_hourly"
REMOTE = re.compile(r"^(?:https?:)?//", re.IGNORECASE)
CSS_URL = re.compile(r"""url\(\s*["']?([^)"']+)""")


class Loads(HTMLParser):
    """What a page loads: ``<script src>``, ``<link href>``, ``<img src>`` and ``url(...)`` in its styles."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.refs: list[str] = []
        self._in_style = False
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attr = dict(attrs)
        ref = {"script": attr.get("src"), "link": attr.get("href"), "img": attr.get("src")}.get(tag)
        if ref:
            self.refs.append(ref)
        self._in_style = tag == "style"

    def handle_endtag(self, tag: str) -> None:
        self._in_style = self._in_style and tag != "style"

    def handle_data(self, data: str) -> None:
        if self._in_style:
            self.refs += CSS_URL.findall(data)


def local_refs(refs: list[str]) -> list[str]:
    return [r for r in refs if not r.startswith(("data:", "#"))]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[WindowValidator, Path]:
    """Data Docs of a passing and a failing window: the index, suite pages and validation pages 5 folders deep."""
    docs = tmp_path_factory.mktemp("home") / "lake" / "_data_docs"  # where a home's lake keeps them
    validator = WindowValidator(docs, run_time=START + 3 * HOUR)
    for hour, ctr in enumerate((0.5, 1.5)):
        start = START + hour * HOUR
        gold = pd.DataFrame({
            "window_start": pd.Series([start, start], dtype="datetime64[us, UTC]"),
            "window_end": pd.Series([start + HOUR] * 2, dtype="datetime64[us, UTC]"),
            "ad_id": ["ad-1", "ad-2"],
            "ctr": [0.1, ctr],
        })
        output = OutputFrame(PIPELINE, gold, keys=("ad_id",), checks=(checks.between("ctr", 0, 1),))
        validator.validate(PIPELINE, start, start + HOUR, outputs=[output],
                           completeness={"completeness:clicks": (3, 3)}, late_rows=0, total_rows=10)
    validator.build_docs()
    return validator, docs


@pytest.fixture
def docs(built: tuple[WindowValidator, Path]) -> Path:
    return built[1]


def pages(docs: Path) -> list[Path]:
    return sorted(p for p in docs.rglob("*.html") if STATIC not in p.relative_to(docs).parts)


def snapshot(docs: Path) -> dict[Path, tuple[int, bytes]]:
    return {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in docs.rglob("*") if p.is_file()}


def test_no_page_loads_anything_from_the_network(docs: Path) -> None:
    found = pages(docs)
    depths = {len(p.relative_to(docs).parts) for p in found}
    assert {1, 3, 6} <= depths, depths  # index.html, expectations/<a>/<b>.html, validations/<a>/<b>/<run>/<time>/x.html
    for page in found:
        text = page.read_text()
        refs = Loads(text).refs
        assert not [r for r in refs if REMOTE.match(r)], page
        assert any(f"{STATIC}/jquery-" in r for r in refs), page
        # The copies are byte-identical to the CDN files, but a CORS-mode load of a file:// page fails.
        assert "integrity=" not in text and "crossorigin" not in text, page
        # What may stay: plain links to greatexpectations.io, which load nothing.
        assert "greatexpectations.io/newsletter" in text


def test_every_local_reference_resolves_from_the_page_s_own_folder(docs: Path) -> None:
    checked = 0
    for page in pages(docs):
        for ref in local_refs(Loads(page.read_text()).refs):
            target = (page.parent / unquote(urlsplit(ref).path)).resolve()
            assert target.is_file() and docs.resolve() in target.parents, (page, ref)
            checked += 1
    # Scripts, stylesheets, the logo and the favicon (GE's own favicon link is one level short on validation pages).
    assert checked >= 10 * len(pages(docs))


def test_the_stylesheets_find_their_fonts(docs: Path) -> None:
    fonts = []
    for css in (docs / STATIC).rglob("*.css"):
        for ref in local_refs(CSS_URL.findall(css.read_text())):
            assert (css.parent / urlsplit(ref).path).resolve().is_file(), (css, ref)
            fonts.append(ref)
    assert "../webfonts/fa-solid-900.woff2" in fonts and "../webfonts/fa-solid-900.ttf" in fonts


def test_a_second_pass_changes_nothing(docs: Path) -> None:
    before = snapshot(docs)
    assert make_offline(docs) == 0
    assert snapshot(docs) == before


def test_a_rebuild_rewrites_only_what_great_expectations_wrote_again(built: tuple[WindowValidator, Path]) -> None:
    validator, docs = built
    kept = [*(docs / "validations").rglob("*.html"), *(docs / STATIC).rglob("*")]
    untouched = {p: p.stat().st_mtime_ns for p in kept}

    validator.build_docs()  # nothing new: GE renders the index and the suite pages again, with CDN links

    assert {p: p.stat().st_mtime_ns for p in untouched} == untouched
    for page in pages(docs):
        assert not [r for r in Loads(page.read_text()).refs if REMOTE.match(r)], page


def test_the_plugin_serves_a_page_and_its_assets(docs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLUICE_HOME", str(docs.parent.parent))
    monkeypatch.delenv("SLUICE_NOW", raising=False)
    client = TestClient(create_app(reader=lambda: None))
    page = next((docs / "validations").rglob("*.html"))
    url = "/docs/" + quote(page.relative_to(docs).as_posix())

    response = client.get(url)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/html")
    types = {".js": "javascript", ".css": "text/css", ".png": "image/png", ".ico": "image/"}
    refs = local_refs(Loads(response.text).refs)
    assert sum(ref.startswith(f"../../../../../{STATIC}/") for ref in refs) == 15  # 9 scripts, 6 stylesheets
    for ref in refs:
        asset = client.get(urlsplit(urljoin(f"http://testserver{url}", ref)).path)
        assert asset.status_code == 200, ref
        assert types[Path(ref).suffix] in asset.headers["content-type"], (ref, asset.headers["content-type"])
    css = urljoin(f"http://testserver{url}", next(r for r in Loads(response.text).refs if r.endswith("all.min.css")))
    font = client.get(urlsplit(urljoin(css, "../webfonts/fa-solid-900.woff2")).path)
    assert font.status_code == 200
    assert font.content == (VENDORED / "fontawesome-free-6.6.0" / "webfonts" / "fa-solid-900.woff2").read_bytes()


# -- the vendored copy, and the rewrite on its own (no Great Expectations) ------------------------------------


def test_the_vendored_copy_is_what_its_manifest_lists() -> None:
    manifest = json.loads((VENDORED / MANIFEST).read_text())
    listed = {MANIFEST}
    for package in manifest["packages"]:
        names = [f["path"] for f in package["files"]]
        assert any(Path(n).name.startswith("LICENSE") for n in names), package["name"]
        assert package["dir"].endswith(package["version"]) and package["integrity"].startswith("sha512-")
        for entry in package["files"]:
            path = f"{package['dir']}/{entry['path']}"
            assert hashlib.sha256((VENDORED / path).read_bytes()).hexdigest() == entry["sha256"], path
            listed.add(path)
    on_disk = {p.relative_to(VENDORED).as_posix() for p in VENDORED.rglob("*") if p.is_file()}
    assert on_disk == listed


def test_every_cdn_address_in_the_page_templates_has_a_copy() -> None:
    spec = find_spec("great_expectations")  # located, not imported
    assert spec is not None and spec.submodule_search_locations
    templates = Path(next(iter(spec.submodule_search_locations))) / "render" / "view" / "templates"
    addresses = set()
    for template in templates.glob("*.j2"):
        for tag in re.findall(r"<(?:script|link|img)\b[^>]*>", template.read_text()):
            addresses.update(re.findall(r"""(?:src|href)=["'](https?://[^"']+)""", tag))
    assert addresses, templates
    assert addresses <= set(vendored().by_url), addresses - set(vendored().by_url)


def test_a_page_is_rewritten_tag_by_tag(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    docs = tmp_path / "docs"
    (docs / "static" / "images").mkdir(parents=True)
    for image in ("logo-long.png", "favicon.ico"):  # GE's own copies, installed with every build
        (docs / "static" / "images" / image).write_bytes(b"image")
    page = docs / "expectations" / "suite.html"
    text = (
        '<link rel="stylesheet" href="https://maxcdn.bootstrapcdn.com/bootstrap/4.3.1/css/bootstrap.min.css"/>\n'
        '<script src="https://code.jquery.com/jquery-3.7.1.min.js" integrity="sha384-x" crossorigin="anonymous">'
        "</script>\n"
        f'<img class="NO-CACHE" src="{GE_ASSETS}logo-long.png?d=1&amp;dataContextId=2" alt="GX"/>\n'
        f'<img src="{GE_ASSETS}elsewhere.png"/>\n'
        f"<style>.navbar-brand a {{ background: url('{GE_ASSETS}full_logo_dark.png') 0 0 no-repeat; }}</style>\n"
        '<link rel="shortcut icon" href="../../../static/images/favicon.ico"/>\n'
        '<script src="https://example.org/unknown.js"></script>\n'
        '<a href="https://greatexpectations.io">GX</a>\n'
    )
    with caplog.at_level(logging.WARNING, logger="sluice.quality.docs_assets"):
        offline = offline_html(text, page, docs)

    assert offline.splitlines() == [
        '<link rel="stylesheet" href="../_static/bootstrap-4.3.1/dist/css/bootstrap.min.css"/>',
        '<script src="../_static/jquery-3.7.1/dist/jquery.min.js"></script>',
        '<img class="NO-CACHE" src="../static/images/logo-long.png" alt="GX"/>',
        f'<img src="{BLANK_IMAGE}"/>',
        "<style>.navbar-brand a { background: none 0 0 no-repeat; }</style>",
        '<link rel="shortcut icon" href="../static/images/favicon.ico"/>',
        '<script src="https://example.org/unknown.js"></script>',
        '<a href="https://greatexpectations.io">GX</a>',
    ]
    assert "https://example.org/unknown.js" in caplog.text
    assert make_offline(tmp_path / "missing") == 0
