"""Great Expectations itself, for the validator: its logs kept quiet, its (slow) import started early, and
the ephemeral data context whose stores and Data Docs site live under the lake (:mod:`sluice.quality.site`).
Importing this module quiets GE's logs."""

from __future__ import annotations

import importlib
import logging
import threading
from typing import TYPE_CHECKING

from sluice.quality.site import DocsSite

if TYPE_CHECKING:  # GE takes seconds to import; only WindowValidator pays for it, at construction.
    from great_expectations.data_context import AbstractDataContext

log = logging.getLogger(__name__)


def _quiet_great_expectations() -> None:
    """GE logs at INFO what nobody running a pipeline needs: ~200 "Skipping registering function" lines
    when it is imported, "Multiple declarations of metric", its configuration being loaded. Keep its
    warnings and errors, unless the application set GE's log level itself."""
    ge = logging.getLogger("great_expectations")
    if ge.level == logging.NOTSET:
        ge.setLevel(logging.WARNING)
    # GE sets this one to INFO itself when it is imported: let it follow its parent again.
    base = logging.getLogger("great_expectations.data_context.types.base")
    if base.level == logging.INFO:
        base.setLevel(logging.NOTSET)


_quiet_great_expectations()

SITE_NAME = "sluice"


def make_context(site: DocsSite) -> AbstractDataContext:
    import great_expectations as gx
    from great_expectations.data_context.types.base import (
        DataContextConfig,
        InMemoryStoreBackendDefaults,
        ProgressBarsConfig,
    )

    def on_disk(sub: str) -> dict[str, str]:
        # Under the lake, local or in a bucket: the index lists every result any host stored.
        return {"module_name": "sluice.quality.gx_store", "class_name": "LakeStoreBackend",
                "root": f"{site.stores.rstrip('/')}/{sub}"}

    pages: dict[str, str] = {"class_name": "TupleFilesystemStoreBackend", "base_directory": str(site.staging)}
    if site.published:  # rendered here, read from the lake: the index lists every host's pages
        pages = {"module_name": "sluice.quality.gx_store", "class_name": "PublishedSiteBackend",
                 "base_directory": str(site.staging), "published": site.root.uri}

    in_memory = {"class_name": "InMemoryStoreBackend"}
    config = DataContextConfig(
        store_backend_defaults=InMemoryStoreBackendDefaults(),
        stores={
            "expectations_store": {"class_name": "ExpectationsStore", "store_backend": on_disk("expectations")},
            "validation_results_store": {
                "class_name": "ValidationResultsStore",
                "store_backend": on_disk("validations"),
            },
            "checkpoint_store": {"class_name": "CheckpointStore", "store_backend": in_memory},
            "validation_definition_store": {"class_name": "ValidationDefinitionStore", "store_backend": in_memory},
        },
        data_docs_sites={
            SITE_NAME: {
                "class_name": "SiteBuilder",
                "show_how_to_buttons": False,
                "store_backend": pages,
                # GE's index builder, reading each stored result once (sluice.quality.docs_index).
                "site_index_builder": {"module_name": "sluice.quality.docs_index",
                                       "class_name": "CachedSiteIndexBuilder", "cache_root": site.stores},
            }
        },
        analytics_enabled=False,
        # tqdm bars per validation would flood the Airflow task log.
        progress_bars=ProgressBarsConfig(globally=False),
    )
    _quiet_great_expectations()
    return gx.get_context(mode="ephemeral", project_config=config)


_warming: threading.Thread | None = None


def warm_up() -> None:
    """Import Great Expectations in a background thread. It is seconds of pure-Python import work, so a
    caller that will validate windows starts it before its Spark work (best: before the JVM starts, whose
    launch leaves the Python process waiting), and the validator's own imports then find the modules
    loaded (Python's per-module import locks make the two imports safe). Once per process."""
    global _warming
    if _warming is None:
        _warming = threading.Thread(target=_import_ge, name="sluice-ge-import", daemon=True)
        _warming.start()


def _import_ge() -> None:
    try:
        for module in ("great_expectations", "great_expectations.data_context.types.base",
                       "great_expectations.expectations.row_conditions"):
            importlib.import_module(module)
    except Exception:  # the validator's own import reports any problem, in context
        log.debug("background import of Great Expectations failed", exc_info=True)
