"""sluice's own small state, kept with the lake beside Spark's checkpoints (``<lake>/_checkpoints/...``):
markers, plans and caches (the closing boundary of the batch close, a catch-up's progress, the corrections
plan, a backfill's plan, the DLQ's bucket cache, the ingest query's lineage id).

Each one is a whole object, replaced in one write: a rename over the old file on a local lake, a PUT on object
storage (atomic per object), so a crash leaves the old content or the new, never half. Nothing here needs a
rename across objects or a local disk, so the lake can live on S3 and its state moves with it.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from typing import Any

from sluice.config import Settings
from sluice.core.lake import Credentials, Root
from sluice.storage.objects import ObjectInfo, ObjectStore, store_for

PREFIX = "_checkpoints"


class LakeState:
    """The state objects under ``<lake>/_checkpoints``, named by their path below it
    (``pipelines/<pipeline>/closed_through.json``)."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store

    @staticmethod
    def _key(*parts: str) -> str:
        return "/".join([PREFIX, *(p.strip("/") for p in parts)])

    def read(self, *parts: str) -> str | None:
        data = self.store.get(self._key(*parts))
        return None if data is None else data.decode()

    def read_json(self, *parts: str) -> Any:
        text = self.read(*parts)
        return None if text is None else json.loads(text)

    def exists(self, *parts: str) -> bool:
        return self.store.get(self._key(*parts)) is not None

    def write(self, text: str, *parts: str) -> None:
        """Replace the object whole (see the module docstring)."""
        self.store.put(self._key(*parts), text.encode())

    def create(self, text: str, *parts: str) -> str:
        """Write ``text`` unless the object exists (put-if-absent); the object's content either way."""
        self.store.create(self._key(*parts), text.encode())
        existing = self.read(*parts)
        assert existing is not None
        return existing

    def list(self, *parts: str) -> Iterator[ObjectInfo]:
        """The objects directly in the folder ``parts`` (e.g. a Spark checkpoint's ``commits``)."""
        return self.store.list(self._key(*parts))

    def delete(self, *parts: str) -> None:
        self.store.delete(self._key(*parts))

    def delete_folder(self, *parts: str) -> int:
        """Delete the folder ``parts`` with everything under it (a retired streaming checkpoint); the number of
        objects deleted. Calling it again after a crash halfway deletes the rest."""
        return self.store.delete_folder(self._key(*parts))


@functools.cache
def _store(root: Root, credentials: Credentials) -> ObjectStore:
    # One client per lake and process: a boto3 client costs tens of milliseconds to build.
    return store_for(root, credentials)


def lake_state(settings: Settings) -> LakeState:
    """The state of ``settings``' lake."""
    return LakeState(_store(settings.lake.root, settings.lake.credentials))
