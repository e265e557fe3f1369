"""A Great Expectations store backend under the lake: a local folder or a bucket prefix (SPEC 1).

GE 1.x ships a filesystem backend only (its S3 backend is gone), so the expectations and validation results
stores are kept through sluice's own :class:`~sluice.storage.objects.ObjectStore`: the same keys and files as
GE's ``TupleFilesystemStoreBackend`` writes, on either back end. GE loads this class by name from its
configuration (``module_name``/``class_name``) and passes ``root``, the store's folder as a path or URI; the
credentials of a URI are those the settings mounted (:func:`sluice.core.lake.credentials_for`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from great_expectations.data_context.store.tuple_store_backend import (
    TupleFilesystemStoreBackend,
    TupleStoreBackend,
)
from great_expectations.exceptions import InvalidKeyError

from sluice.core.lake import credentials_for, parse_root
from sluice.storage.objects import ObjectStore, store_for


class LakeStoreBackend(TupleStoreBackend):
    def __init__(  # GE passes every option its store backends take
        self,
        root: str,
        filepath_template: str | None = None,
        filepath_prefix: str | None = None,
        filepath_suffix: str | None = None,
        forbidden_substrings: list[str] | None = None,
        platform_specific_separator: bool = False,
        fixed_length_key: bool = False,
        suppress_store_backend_id: bool = True,
        manually_initialize_store_backend_id: str = "",
        base_public_path: str | None = None,
        store_name: str | None = None,
    ) -> None:
        super().__init__(
            filepath_template=filepath_template,
            filepath_prefix=filepath_prefix,
            filepath_suffix=filepath_suffix,
            forbidden_substrings=forbidden_substrings,
            # Object keys are "/"-separated on every platform.
            platform_specific_separator=False,
            fixed_length_key=fixed_length_key,
            suppress_store_backend_id=suppress_store_backend_id,
            manually_initialize_store_backend_id=manually_initialize_store_backend_id,
            base_public_path=base_public_path,
            store_name=store_name,
        )
        self.root = parse_root(root, "Great Expectations store")
        self._objects: ObjectStore = store_for(self.root, credentials_for(self.root.uri))
        self._config = {
            "root": root,
            "filepath_template": filepath_template,
            "filepath_prefix": filepath_prefix,
            "filepath_suffix": filepath_suffix,
            "forbidden_substrings": forbidden_substrings,
            "fixed_length_key": fixed_length_key,
            "suppress_store_backend_id": suppress_store_backend_id,
            "manually_initialize_store_backend_id": manually_initialize_store_backend_id,
            "base_public_path": base_public_path,
            "store_name": store_name,
            "module_name": self.__class__.__module__,
            "class_name": self.__class__.__name__,
        }
        self._config = {k: v for k, v in self._config.items() if v}
        if not self._suppress_store_backend_id:
            _ = self.store_backend_id

    def _key_of(self, key: Any) -> str:
        return str(self._convert_key_to_filepath(key if isinstance(key, tuple) else key.to_tuple()))

    def _get(self, key: Any) -> str:  # type: ignore[override]  # GE's own backends return the value too
        data = self._objects.get(self._key_of(key))
        if data is None:
            raise InvalidKeyError(f"no object {self._key_of(key)!r} in the store at {self.root}")
        return data.decode("utf-8").rstrip("\n")  # as GE's filesystem backend returns it

    def _get_all(self) -> list[Any]:
        return [self._get(key) for key in self.list_keys() if key != self.STORE_BACKEND_ID_KEY]

    def _set(self, key: Any, value: Any, **kwargs: Any) -> str:  # type: ignore[override]
        data = value.encode("utf-8") if isinstance(value, str) else value
        self._objects.put(self._key_of(key), data)
        return self.root.join(self._key_of(key))

    def _move(self, source_key: Any, dest_key: Any, **kwargs: Any) -> Any:
        data = self._objects.get(self._key_of(source_key))
        if data is None:
            return False
        self._objects.put(self._key_of(dest_key), data)
        self._objects.delete(self._key_of(source_key))
        return dest_key

    def list_keys(self, prefix: tuple[str, ...] = ()) -> list[Any]:
        return list(_keys(self, self._objects, "/".join(prefix)))

    def remove_key(self, key: Any) -> bool:  # type: ignore[override]
        if not self._has_key(key):
            return False
        self._objects.delete(self._key_of(key))
        return True

    def _has_key(self, key: Any) -> bool:
        return self._objects.get(self._key_of(key)) is not None

    def get_url_for_key(self, key: Any, protocol: str | None = None) -> str:
        return self.root.url(self._url_path_escape_special_characters(path=self._key_of(key)))

    @property
    def config(self) -> dict[str, Any]:
        return self._config


class PublishedSiteBackend(TupleFilesystemStoreBackend):
    """The Data Docs site's backend when the site is published to object storage (:mod:`sluice.quality.site`):
    GE renders into the local folder ``base_directory``, and its index lists what the lake's site at
    ``published`` holds as well, so pages that other hosts rendered and published stay in the index.

    GE's index builder lists the pages the *site* has, then keeps those whose result the results store still
    holds; with the local folder alone, a host would list only the windows it validated itself."""

    def __init__(self, base_directory: str, published: str, **options: Any) -> None:
        super().__init__(base_directory, **options)
        self.published = published
        self._site: ObjectStore = store_for(parse_root(published, "Data Docs site"), credentials_for(published))
        self._config["published"] = published

    def list_keys(self, prefix: tuple[str, ...] = ()) -> list[Any]:
        keys = {tuple(k) for k in super().list_keys(prefix)}
        folder = "/".join([*([self.filepath_prefix] if self.filepath_prefix else []), *prefix])
        keys.update(tuple(k) for k in _keys(self, self._site, folder))
        return sorted(keys)

    def _has_key(self, key: Any) -> bool:
        return bool(super()._has_key(key)) or self._site.get(self._convert_key_to_filepath(key)) is not None

    def remove_key(self, key: Any) -> bool:  # type: ignore[override]
        removed = bool(super().remove_key(key))
        path = self._convert_key_to_filepath(key if isinstance(key, tuple) else key.to_tuple())
        if self._site.get(path) is not None:
            self._site.delete(path)
            removed = True
        return removed


def _keys(backend: TupleStoreBackend, objects: ObjectStore, folder: str) -> Iterator[Any]:
    """The GE keys of the objects under ``folder``, filtered as GE's filesystem backend filters its files."""
    for path in objects.walk(folder):
        if backend._is_missing_prefix_or_suffix(filepath_prefix=backend.filepath_prefix,
                                                filepath_suffix=backend.filepath_suffix, key=path):
            continue
        key = backend._convert_filepath_to_key(path)
        if key and not backend.is_ignored_key(key):
            yield key
