"""Where the Data Docs and Great Expectations' stores live: under the lake (SPEC 1), so that every host that
shares the lake sees one site.

* ``<lake>/_data_docs/``: the Data Docs site (index, suites, one page per validated window, their assets).
* ``<lake>/_gx/``: GE's expectations and validation results stores, which the site's index lists. They are
  written through :class:`sluice.quality.gx_store.LakeStoreBackend`, on a local folder or in a bucket.

GE renders pages into a local folder only. On a local lake that folder is the site itself. On object storage
GE renders into a cache under the home (``<home>/cache/data_docs``), and :meth:`DocsSite.publish` uploads
what a build wrote or changed: new validation pages, the suites, the index; the assets once per cache. Pages
other hosts published stay in the bucket, and the index, built from the stores in the bucket, links them all.

``ops/dq_results.docs_path`` and the CLI name a page where readers find it: its local path on a local lake,
its ``s3://`` URI otherwise. The Airflow plugin serves it from there (:meth:`DocsSite.read`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from sluice.core.lake import Credentials, Root
from sluice.quality.docs_assets import CHECKED

if TYPE_CHECKING:
    from sluice.config import Settings
    from sluice.storage.objects import ObjectStore

log = logging.getLogger(__name__)

SITE = "_data_docs"
STORES = "_gx"
# What the cache last published: each file's content digest, so a build that writes a file again with the
# same bytes (GE copies its static assets on every build) uploads nothing.
_PUBLISHED = ".published.json"


@dataclass(frozen=True)
class DocsSite:
    root: Root  # where readers find the pages
    stores: str  # GE's stores: a local path or a URI
    staging: Path  # where GE renders the pages: the site's own folder on a local lake
    credentials: Credentials | None = None

    @classmethod
    def local(cls, folder: Path, stores: Path | None = None) -> DocsSite:
        """A site in a local folder, its stores beside it (``gx_store``) unless given."""
        folder = Path(folder).absolute()
        return cls(Root("file", str(folder)), str(Path(stores).absolute() if stores else folder.parent / "gx_store"),
                   folder)

    @property
    def published(self) -> bool:
        """Whether pages are uploaded after each build (the site is not the folder GE renders into)."""
        return self.root.local_path() != self.staging

    @cached_property
    def _store(self) -> ObjectStore:
        from sluice.storage.objects import store_for

        return store_for(self.root, self.credentials)

    def location(self, page: Path | str | None) -> str | None:
        """Where readers find ``page`` (a path in the staging folder, a location, or a path relative to the
        site): its local path, or its URI on object storage. None for a page outside the site."""
        relative = self.relative(page)
        return None if relative is None else self.root.join(relative)

    def relative(self, page: Path | str | None) -> str | None:
        """``page``'s path inside the site (``validations/.../x.html``), or None for one elsewhere (a page of a
        home or lake that has moved since)."""
        if page is None or page == "":
            return None
        text = os.fspath(page)
        for base in {self.root.uri, str(self.staging)}:
            if text.startswith(base.rstrip("/") + "/"):
                relative = text[len(base.rstrip("/")) + 1:]
                break
        else:
            if "://" in text or os.path.isabs(text):
                return None
            relative = text
        parts = [p for p in relative.split("/") if p not in ("", ".")]
        return "/".join(parts) if parts and ".." not in parts else None

    def read(self, relative: str) -> bytes | None:
        """A page or asset of the site; None when there is none (or ``relative`` leaves the site)."""
        clean = self.relative(relative)
        return None if clean is None else self._store.get(clean)

    def publish(self) -> list[str]:
        """Upload what the last build wrote or changed in the staging folder; the files uploaded (paths in the
        site). Nothing to do when the staging folder is the site."""
        if not self.published:
            return []
        record = self.staging / _PUBLISHED
        try:
            known: dict[str, list[str | int]] = json.loads(record.read_text())  # relative: [mtime_ns, sha256]
        except (FileNotFoundError, ValueError):
            known = {}
        uploaded: list[str] = []
        # The index last: a reader who follows its links finds the pages it names already there.
        files = sorted((p for p in self.staging.rglob("*") if p.is_file() and p.name not in (_PUBLISHED, CHECKED)),
                       key=lambda p: (p.name == "index.html" and p.parent == self.staging, str(p)))
        for path in files:
            relative = path.relative_to(self.staging).as_posix()
            mtime = path.stat().st_mtime_ns
            seen = known.get(relative)
            if seen and seen[0] == mtime:
                continue  # untouched since it was published: most pages, after the first builds
            data = path.read_bytes()
            digest = hashlib.sha256(data).hexdigest()
            if not seen or seen[1] != digest:
                self._store.put(relative, data)
                uploaded.append(relative)
            known[relative] = [mtime, digest]
        record.write_text(json.dumps(known, sort_keys=True))
        log.debug("published %d Data Docs file(s) to %s", len(uploaded), self.root)
        return uploaded


def docs_site(settings: Settings) -> DocsSite:
    """The Data Docs site of ``settings``' lake."""
    lake = settings.lake
    root = lake.root.sub(SITE)
    staging = root.local_path() or settings.home / "cache" / "data_docs"
    return DocsSite(root, lake.root.join(STORES), staging, lake.credentials)
