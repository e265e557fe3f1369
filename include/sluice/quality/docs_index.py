"""The Data Docs index, at the cost of what is new.

GE's index builder lists every stored validation result and then *reads* each one, for three facts its index
row shows: whether it passed, its asset name and its batch's description. The results store keeps every window
ever validated, so every cycle that validated one window read hundreds of result files (from the bucket, on
object storage): the data-quality step grew with the lake's history instead of costing what its window costs.

A stored result never changes (a re-check stores a new one, under a new run id), so its index facts are kept,
once read, in one object beside the stores (``<stores>/index/entries.json``) and the builder reads only the
results it has not seen. The object is a cache: a missing or unreadable one is rebuilt from the results, and two
processes that write it at once lose nothing but the other's additions, which the next build reads again.
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from typing import Any

from great_expectations.core import ExpectationSuiteValidationResult
from great_expectations.render.renderer.site_builder import (
    FALSEY_YAML_STRINGS,
    DefaultSiteIndexBuilder,
    _resolve_asset_name,
    resource_key_passes_run_name_filter,
)

from sluice.core.lake import credentials_for, parse_root
from sluice.storage.objects import ObjectStore, store_for

log = logging.getLogger(__name__)

ENTRIES = "index/entries.json"


class CachedSiteIndexBuilder(DefaultSiteIndexBuilder):
    """GE's ``DefaultSiteIndexBuilder``, reading each stored validation result once (module docstring).
    ``cache_root``: the folder (path or URI) of the stores, where the index facts are kept."""

    # Spelled out: GE hands a builder only the runtime arguments its signature names.
    def __init__(
        self,
        name: str,
        site_name: str,
        data_context: Any,
        target_store: Any,
        site_section_builders_config: Any,
        custom_styles_directory: str | None = None,
        custom_views_directory: str | None = None,
        show_how_to_buttons: bool = True,
        validation_results_limit: int | None = None,
        renderer: Any = None,
        view: Any = None,
        data_context_id: str | None = None,
        source_stores: Any = None,
        cache_root: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            name, site_name, data_context, target_store, site_section_builders_config,
            custom_styles_directory=custom_styles_directory, custom_views_directory=custom_views_directory,
            show_how_to_buttons=show_how_to_buttons, validation_results_limit=validation_results_limit,
            renderer=renderer, view=view, data_context_id=data_context_id, source_stores=source_stores, **kwargs,
        )
        self._cache: ObjectStore | None = None
        if cache_root:
            root = parse_root(cache_root, "Data Docs index cache")
            self._cache = store_for(root, credentials_for(root.uri))

    def _load(self) -> dict[str, dict[str, Any]]:
        data = self._cache.get(ENTRIES) if self._cache is not None else None
        if not data:
            return {}
        try:
            entries = json.loads(data)
        except ValueError:
            log.warning("Data Docs index cache %s is unreadable; reading every result again", ENTRIES)
            return {}
        return entries if isinstance(entries, dict) else {}

    def _add_validations_to_index_links(self, index_links_dict: OrderedDict, validation_and_profiling_result_site_keys:
                                         list[Any]) -> None:
        # The same rows, in the same order, as GE's own method: only where the facts come from differs.
        validations = self.site_section_builders_config.get("validations", "None")
        if not validations or validations in FALSEY_YAML_STRINGS:
            return
        run_name_filter = self.site_section_builders_config["validations"]["run_name_filter"]
        keys = sorted(
            (k for k in validation_and_profiling_result_site_keys
             if resource_key_passes_run_name_filter(k, run_name_filter)),
            key=lambda k: k.run_id.run_time, reverse=True,
        )
        if self.validation_results_limit:
            keys = keys[: self.validation_results_limit]
        entries = self._load()
        added = 0
        for key in keys:
            cache_key = json.dumps([str(part) for part in key.to_tuple()])
            facts = entries.get(cache_key)
            if facts is None:
                facts = self._read_facts(key)
                if facts is None:
                    continue
                entries[cache_key] = facts
                added += 1
            self.add_resource_info_to_index_links_dict(
                index_links_dict=index_links_dict,
                expectation_suite_name=key.expectation_suite_identifier.name,
                section_name="validations",
                batch_identifier=key.batch_identifier,
                run_id=key.run_id,
                validation_success=facts["success"],
                run_time=key.run_id.run_time,
                run_name=key.run_id.run_name,
                asset_name=facts["asset_name"],
                batch_kwargs=facts["batch_kwargs"],
                batch_spec=facts["batch_spec"],
            )
        if added and self._cache is not None:
            self._cache.put(ENTRIES, json.dumps(entries, sort_keys=True, default=str).encode())

    def _read_facts(self, key: Any) -> dict[str, Any] | None:
        try:
            validation = self.data_context.get_validation_result(
                batch_identifier=key.batch_identifier,
                expectation_suite_name=key.expectation_suite_identifier.name,
                run_id=key.run_id,
                validation_results_store_name=self.source_stores.get("validations"),
            )
        except Exception:  # as GE's own builder: a result that cannot be read is left out of the index
            log.warning("Validation result not found: %s - skipping", key.to_tuple())
            return None
        if not isinstance(validation, ExpectationSuiteValidationResult):
            log.warning("Validation result not found: %s - skipping", key.to_tuple())
            return None
        return {
            "success": bool(validation.success),
            "asset_name": _resolve_asset_name(validation),
            "batch_kwargs": validation.meta.get("batch_kwargs", {}),
            "batch_spec": validation.meta.get("batch_spec", {}),
        }
