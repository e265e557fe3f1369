"""Data Docs that work offline: every asset a page loads comes from the Data Docs folder itself.

Great Expectations' page templates load Bootstrap, jQuery, bootstrap-table, Font Awesome, Vega and a few
more from CDNs, and the navbar logo from GE's S3 bucket; behind a firewall the pages come out unstyled, with
dead tables and filters. sluice ships copies of those files (``docs_static/``: each one byte for byte from
its npm package, listed with the CDN addresses it stands in for in ``docs_static/MANIFEST.json``;
``tools/fetch_docs_assets.py`` downloads them again), and :func:`make_offline`, run after every Data Docs
build, installs them in ``<docs>/_static/`` and points the pages at them with paths relative to each page's
own folder, so the pages work served by the Airflow plugin (``/sluice/docs/...``) and opened as ``file://``.

Rewriting a page, for every ``<script src>``, ``<link href>`` and ``<img src>``:

* a CDN address of the MANIFEST becomes the relative path of its copy; the tag loses ``integrity`` and
  ``crossorigin`` (the two scripts that carry them match their hashes, but a CORS-mode load from a
  ``file://`` page fails);
* GE's logo on S3 becomes GE's own copy under ``<docs>/static/images/`` (GE installs that folder with every
  build), or a blank inline image for a file GE does not ship; the dark-theme logo, a CSS background on S3,
  becomes no background;
* a reference into GE's ``static/`` folder is made relative to the page's real depth (GE's templates count
  one folder too few on validation pages, so their favicon link points nowhere).

A page GE has just written names CDN addresses at its very top, a rewritten page none, so each call reads
only the first few KiB of every page (about a second per 10,000 pages; GE's own index build parses every
stored result, which costs far more) and rewrites just the new ones (GE writes the index again on every build):
running it twice changes nothing. Another process may be building the same folder: a page is replaced
atomically, and left alone when it is incomplete or changed while it was being rewritten (the other
process's own call takes care of it).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import re
import shutil
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

log = logging.getLogger(__name__)

VENDORED = Path(__file__).parent / "docs_static"
MANIFEST = "MANIFEST.json"
STATIC = "_static"  # under the Data Docs folder; GE's own assets (images, its CSS) are in "static"
GE_ASSETS = "https://great-expectations-web-assets.s3.us-east-2.amazonaws.com/"
# No request at all, for a GE image that has no local copy.
BLANK_IMAGE = "data:image/gif;base64,R0lGODlhAQABAAAAACH5BAEKAAEALAAAAAABAAEAAAICTAEAOw=="
# How much of a page tells whether it needs work: GE's pages name the first stylesheets' CDN addresses within
# their first few hundred bytes (a rewritten page names none).
_HEAD_BYTES = 8 * 1024

_TAG = re.compile(r"<(?:script|link|img)\b[^>]*>", re.IGNORECASE)
_REF = re.compile(r"""(\s(?:src|href)\s*=\s*)(["'])(.*?)\2""", re.IGNORECASE | re.DOTALL)
_SRI = re.compile(r"""\s(?:integrity|crossorigin)(?=[\s=/>])(?:\s*=\s*(?:"[^"]*"|'[^']*'|[^\s>]+))?""", re.IGNORECASE)
_GE_STATIC = re.compile(r"^(?:\./|(?:\.\./)+)?static/(?P<rest>.+)$")
_REMOTE = re.compile(r"^(?:https?:)?//", re.IGNORECASE)
_CSS_GE_URL = re.compile(r"""url\(\s*(["']?)""" + re.escape(GE_ASSETS) + r"""[^)"']*\1\s*\)""")
_CSS_REMOTE_URL = re.compile(r"""url\(\s*["']?((?:https?:)?//[^)"']+)""", re.IGNORECASE)


@dataclass(frozen=True)
class Vendored:
    """What ``docs_static/MANIFEST.json`` lists."""

    paths: tuple[str, ...]  # every file, under docs_static/ and <docs>/_static/ alike
    by_url: dict[str, str]  # CDN address -> path
    hosts: tuple[bytes, ...]  # where those addresses (and GE's logo) live: a page naming none needs no work


@functools.cache
def vendored() -> Vendored:
    manifest = json.loads((VENDORED / MANIFEST).read_text())
    paths = [MANIFEST]
    by_url: dict[str, str] = {}
    for package in manifest["packages"]:
        for entry in package["files"]:
            path = f"{package['dir']}/{entry['path']}"
            paths.append(path)
            by_url.update(dict.fromkeys(entry.get("urls", ()), path))
    hosts = {_host(url).encode() for url in [*by_url, GE_ASSETS]}
    return Vendored(tuple(paths), by_url, tuple(sorted(hosts)))


def _host(url: str) -> str:
    return url.split("//", 1)[1].split("/", 1)[0]


# Beside the pages: which of them make_offline has looked at (relative path -> modification time, ns).
CHECKED = ".offline.json"


def make_offline(docs_dir: Path) -> int:
    """Install the vendored assets in ``docs_dir/_static/`` and point every page that still loads an asset
    from a CDN at them; returns the number of pages rewritten (0 when there was nothing to do)."""
    docs_dir = Path(docs_dir)
    if not docs_dir.is_dir():
        return 0
    # The pages are a convenience next to the results in ops/dq_results: a file that cannot be written is
    # reported, and leaves its pages as GE wrote them (online-only) rather than fail the validation run.
    try:
        install_assets(docs_dir / STATIC)
    except OSError as exc:
        log.warning("Data Docs stay online-only: cannot install their assets in %s: %s", docs_dir / STATIC, exc)
        return 0
    # The pages already looked at, by modification time: a build renders only its new pages and the index, so
    # opening every page of the site on every build made a window's check cost what the lake holds.
    record = docs_dir / CHECKED
    try:
        checked: dict[str, int] = json.loads(record.read_text())
    except (FileNotFoundError, ValueError):
        checked = {}
    before = dict(checked)
    rewritten = 0
    for page in _pages(docs_dir):
        relative = page.relative_to(docs_dir).as_posix()
        try:
            if checked.get(relative) == page.stat().st_mtime_ns:
                continue
            rewritten += _rewrite_page(page, docs_dir)
            checked[relative] = page.stat().st_mtime_ns
        except FileNotFoundError:
            continue
        except OSError as exc:
            log.warning("Data Docs page %s stays online-only: %s", page, exc)
    if checked == before:
        return rewritten
    try:
        temporary = _temporary(record)
        temporary.write_text(json.dumps(checked, sort_keys=True))
        os.replace(temporary, record)
    except OSError as exc:  # a cache: the next build looks at every page again
        log.debug("cannot record the checked Data Docs pages in %s: %s", record, exc)
    return rewritten


def install_assets(target: Path) -> None:
    """Copy each vendored file that is missing from ``target`` or differs from the package's (by size and
    modification time, which the copy keeps)."""
    for path in vendored().paths:
        source, dest = VENDORED / path, target / path
        src = source.stat()
        try:
            dst = dest.stat()
            if (dst.st_size, dst.st_mtime_ns) == (src.st_size, src.st_mtime_ns):
                continue
        except FileNotFoundError:
            dest.parent.mkdir(parents=True, exist_ok=True)
        temporary = _temporary(dest)
        shutil.copy2(source, temporary)
        os.replace(temporary, dest)


def _pages(docs_dir: Path) -> Iterator[Path]:
    for folder, subfolders, files in os.walk(docs_dir):
        if folder == str(docs_dir):
            subfolders[:] = [s for s in subfolders if s not in (STATIC, "static")]
        for name in files:
            if name.endswith(".html"):
                yield Path(folder, name)


def _temporary(path: Path) -> Path:
    return path.with_name(f".{path.name}.{os.getpid()}-{threading.get_ident()}.tmp")


def _rewrite_page(page: Path, docs_dir: Path) -> bool:
    hosts = vendored().hosts
    try:
        with page.open("rb") as file:
            head = file.read(_HEAD_BYTES)
            if not any(host in head for host in hosts):
                return False
            seen = os.fstat(file.fileno())
            data = head + file.read()
    except FileNotFoundError:
        return False
    text = data.decode("utf-8", "surrogateescape")
    if "</html>" not in text[-256:].lower():  # still being written; its writer's own call will get to it
        return False
    offline = offline_html(text, page, docs_dir)
    if offline == text:
        return False
    temporary = _temporary(page)
    temporary.write_bytes(offline.encode("utf-8", "surrogateescape"))
    now = page.stat()
    if (now.st_ino, now.st_size, now.st_mtime_ns) != (seen.st_ino, seen.st_size, seen.st_mtime_ns):
        temporary.unlink()  # rewritten by another process meanwhile: its version stands
        return False
    os.replace(temporary, page)
    return True


def offline_html(text: str, page: Path, docs_dir: Path) -> str:
    """``text``, the page ``page`` under ``docs_dir``, with every asset it loads made local."""
    root = PurePosixPath(os.path.relpath(docs_dir, page.parent).replace(os.sep, "/"))
    by_url = vendored().by_url
    left: list[str] = []

    def local(path: str) -> str:
        return str(root / path) if str(root) != "." else path

    def tag(match: re.Match[str]) -> str:
        original = match.group(0)
        ref = _REF.search(original)
        if ref is None:
            return original
        url = ref.group(3)
        new = url
        if url in by_url:
            new = local(f"{STATIC}/{by_url[url]}")
        elif url.startswith(GE_ASSETS):
            name = url[len(GE_ASSETS):].split("?", 1)[0].split("#", 1)[0]
            new = local(f"static/images/{name}") if (docs_dir / "static" / "images" / name).is_file() else BLANK_IMAGE
        elif (ge_static := _GE_STATIC.match(url)) and (docs_dir / "static" / ge_static["rest"]).exists():
            new = local(f"static/{ge_static['rest']}")
        elif _REMOTE.match(url):
            left.append(url)
        if new == url:
            return original
        start, end = ref.span(3)
        rewritten = original[:start] + new + original[end:]
        return _SRI.sub("", rewritten) if url in by_url else rewritten

    offline = _TAG.sub(tag, text)
    offline = _CSS_GE_URL.sub("none", offline)
    left += _CSS_REMOTE_URL.findall(offline)
    if left:
        log.warning("Data Docs page %s still loads %s: no local copy known", page, ", ".join(sorted(set(left))))
    return offline
