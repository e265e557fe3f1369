"""Data quality for one closed window (SPEC section 5), checked with a Great Expectations 1.x suite.

GE never scans raw data here: the caller hands over the window's gold rows (a few hundred at most) and
the window's totals (gold total vs bronze count per stream, late vs total rows), so a window validates in
well under a second once the GE context exists.

Two small frames are validated per window, each by its own suite:

* ``<pipeline>.window_totals`` - one row of window-level numbers: the declared completeness checks and
  lateness;
* ``<output>.gold_rows``       - per output, the window's gold rows: no null keys, windows exactly one
  window long, and the output's declared ``between`` / ``not_null`` checks.

They cannot share one batch: GE validates one dataframe per validation, and the totals must be checked
even when the window has no gold rows at all.  Every GE expectation carries a ``sluice_outcome`` name in
its ``meta``; the results are folded into one :class:`ExpectationOutcome` per name, which is what lands in
``ops/dq_results``.

Stores: suites and validation results are JSON objects under the site's stores (``<lake>/_gx``, local or
in a bucket: :mod:`sluice.quality.site`), so the Data Docs index, built by any process on any host, sees
every window ever validated (GE's index builder deletes pages whose result is missing from the results
store); validation definitions and the datasource live in memory (no shared YAML file for concurrent
processes to fight over).  GE renders the site into a plain local directory of HTML, which is the site on
a local lake and is published to the lake's ``_data_docs/`` on object storage.
"""

from __future__ import annotations

import importlib
import logging
import math
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlparse

import pandas as pd

from sluice.checks import Check
from sluice.quality.docs_assets import make_offline
from sluice.quality.site import DocsSite

if TYPE_CHECKING:  # GE takes seconds to import; only WindowValidator pays for it, at construction.
    from great_expectations.core import ExpectationSuiteValidationResult, ExpectationValidationResult
    from great_expectations.core.run_identifier import RunIdentifier
    from great_expectations.data_context import AbstractDataContext
    from great_expectations.data_context.types.resource_identifiers import (
        ExpectationSuiteIdentifier,
        ValidationResultIdentifier,
    )
    from great_expectations.expectations import Expectation

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
_DATASOURCE = "sluice_dq"
_TOTALS_ASSET = "window_totals"
_GOLD_ASSET = "gold_rows"
_OUTCOME_META = "sluice_outcome"
_WINDOW_SECONDS_COLUMN = "window_seconds"
_DLQ_SHARE_COLUMN = "dlq_share"
_GOLD_SUFFIX, _BRONZE_SUFFIX = "_gold_total", "_bronze_count"  # the totals frame's columns of a completeness check
_SAMPLE = 3  # offending values quoted in an observed value; GE's own page lists up to 20

COMPLETENESS_PREFIX = "completeness:"
NO_NULL_KEYS = "validity:no_null_keys"
LATENESS = "lateness:dlq_share_within_threshold"


def window_length_outcome(window_seconds: int) -> str:
    """The name of the window-length check: ``validity:window_is_one_hour`` for the SPEC's hour."""
    return "validity:window_is_one_hour" if window_seconds == 3600 else f"validity:window_is_{window_seconds}s"


@dataclass(frozen=True)
class OutputFrame:
    """The gold rows of one output for one window, with what to check on them. ``prefix`` qualifies the
    outcome names of an output that is not the pipeline's own (``<output>:validity:...``)."""

    name: str
    gold: pd.DataFrame
    keys: tuple[str, ...]
    checks: Sequence[Check] = ()
    prefix: str = ""


@dataclass(frozen=True)
class ExpectationOutcome:
    """One row of ``ops/dq_results`` for a window: a stable name, what was seen, and the verdict."""

    expectation: str
    observed_value: str
    success: bool


@dataclass(frozen=True)
class WindowValidation:
    """Every outcome of one window's validation, plus the Data Docs page to look at."""

    pipeline: str
    window_start: datetime
    window_end: datetime
    outcomes: list[ExpectationOutcome]
    # The page of the first failing suite (totals before gold rows), else the totals page. It exists on
    # disk only after WindowValidator.build_docs().
    docs_path: Path | None = None

    @property
    def success(self) -> bool:
        return all(o.success for o in self.outcomes)

    @property
    def failed(self) -> list[ExpectationOutcome]:
        return [o for o in self.outcomes if not o.success]


@dataclass(frozen=True)
class SuiteRun:
    """One suite's validation of one window: its outcomes, its verdict and its stored result."""

    outcomes: list[ExpectationOutcome]
    success: bool
    result_id: ValidationResultIdentifier


# An observed-value formatter gets the GE results of one outcome's expectations (in suite order) and the
# frame they ran on: a passing expectation reports no values, so numbers are read back from the frame.
_Formatter = Callable[[list["ExpectationValidationResult"], pd.DataFrame], str]


@dataclass
class _Registered:
    """A suite as registered in this process, with the signature it was built from."""

    signature: tuple[object, ...]
    suite_name: str
    validation: Any  # gx.ValidationDefinition; Any keeps GE out of import time
    formatters: dict[str, _Formatter] = field(default_factory=dict)


class WindowValidator:
    """Validates closed windows against SPEC section 5 with one long-lived GE context.

    Creating the context (and importing GE) is the slow part, so build one validator per process and
    call :meth:`validate` for every window, then :meth:`build_docs` once for the batch.
    """

    def __init__(
        self,
        docs: Path | DocsSite,
        *,
        lateness_threshold: float = 0.01,
        window_seconds: int = 3600,
        store_dir: Path | None = None,
        run_time: datetime | None = None,
    ) -> None:
        # The injected "now" of the cycle: it names the validation runs (and so the Data Docs pages and
        # docs_path in ops/dq_results), which must not depend on the wall clock.
        self._run_time = run_time or datetime.now(UTC)
        if not 0 <= lateness_threshold <= 1:
            raise ValueError(f"lateness_threshold must be within [0, 1], got {lateness_threshold!r}")
        if window_seconds < 1:
            raise ValueError(f"window_seconds must be >= 1, got {window_seconds!r}")
        # A folder (a site of its own, its stores beside it in store_dir or gx_store), or the lake's site.
        self.site = docs if isinstance(docs, DocsSite) else DocsSite.local(Path(docs), store_dir)
        self.docs_dir = self.site.staging  # where GE renders the pages
        self.lateness_threshold = float(lateness_threshold)
        self.window_seconds = int(window_seconds)
        self._context = _make_context(self.site)
        datasource = self._context.data_sources.add_pandas(_DATASOURCE)
        self._totals_batch = datasource.add_dataframe_asset(_TOTALS_ASSET).add_batch_definition_whole_dataframe(
            "whole"
        )
        self._gold_batch = datasource.add_dataframe_asset(_GOLD_ASSET).add_batch_definition_whole_dataframe("whole")
        # The results store keys a result by batch id; GE does not return it, so learn it once per asset.
        self._batch_ids = {
            _TOTALS_ASSET: self._totals_batch.get_batch(batch_parameters={"dataframe": pd.DataFrame()}).id,
            _GOLD_ASSET: self._gold_batch.get_batch(batch_parameters={"dataframe": pd.DataFrame()}).id,
        }
        self._registered: dict[str, _Registered] = {}
        self._pending: list[ValidationResultIdentifier] = []

    # ------------------------------------------------------------------ validation

    def validate(
        self,
        pipeline: str,
        window_start: datetime,
        window_end: datetime,
        *,
        outputs: Sequence[OutputFrame],
        completeness: Mapping[str, tuple[int, int]],
        late_rows: int,
        total_rows: int,
    ) -> WindowValidation:
        """Validate one closed window of every output; see the module docstring for what is checked."""
        totals = self.validate_totals(pipeline, window_start, window_end, completeness=completeness,
                                      late_rows=late_rows, total_rows=total_rows)
        return self.combine(pipeline, window_start, window_end,
                            [totals, *self.validate_outputs(pipeline, window_start, window_end, outputs)])

    # The two halves of :meth:`validate`, for a caller that has a window's gold rows before its totals (the
    # totals need a Spark job over bronze, which can run while GE checks the gold rows): each returns the
    # suite runs that :meth:`combine` folds into the window's validation, totals first.

    def validate_totals(
        self, pipeline: str, window_start: datetime, window_end: datetime, *,
        completeness: Mapping[str, tuple[int, int]], late_rows: int, total_rows: int,
    ) -> SuiteRun:
        """The window-level suite: the declared completeness checks and lateness."""
        totals = _totals_frame(completeness, late_rows=late_rows, total_rows=total_rows)
        return self._suite_run(self._totals_suite(pipeline, list(completeness)), totals, _TOTALS_ASSET,
                               pipeline, window_start)

    def validate_outputs(
        self, pipeline: str, window_start: datetime, window_end: datetime, outputs: Sequence[OutputFrame]
    ) -> list[SuiteRun]:
        """Each output's suite over the window's gold rows."""
        runs = []
        for out in outputs:
            columns = [c.column for c in out.checks]  # type: ignore[attr-defined]
            frame = _gold_frame(out.gold, keys=out.keys, columns=columns)
            runs.append(self._suite_run(self._gold_suite(out), frame, _GOLD_ASSET, pipeline, window_start))
        return runs

    def combine(
        self, pipeline: str, window_start: datetime, window_end: datetime, runs: Sequence[SuiteRun]
    ) -> WindowValidation:
        """One window's validation from its suite runs (totals first); its page is the first failing one's."""
        outcomes = [outcome for run in runs for outcome in run.outcomes]
        self._pending.extend(run.result_id for run in runs)
        page = next((run.result_id for run in runs if not run.success), runs[0].result_id)
        return WindowValidation(pipeline, window_start, window_end, outcomes, self._page_path(page))

    def _suite_run(
        self, registered: _Registered, data: pd.DataFrame, asset: str, pipeline: str, window_start: datetime
    ) -> SuiteRun:
        from great_expectations.core.run_identifier import RunIdentifier

        # One run per window: every result sits together under this run name in the Data Docs index.
        run_id = RunIdentifier(
            run_name=f"{pipeline}-{_utc(window_start):%Y%m%dT%H%M%SZ}", run_time=self._run_time
        )
        result = self._run(registered, data, run_id)
        return SuiteRun(_fold(result, data, registered.formatters), bool(result.success),
                        self._result_id(registered.suite_name, run_id, asset))

    def _run(
        self, registered: _Registered, data: pd.DataFrame, run_id: RunIdentifier
    ) -> ExpectationSuiteValidationResult:
        from great_expectations.exceptions.resource_freshness import ResourceFreshnessAggregateError

        # The totals suite compares each gold total with this window's bronze count (see _totals_suite).
        parameters = {c: int(data[c].iloc[0]) for c in data.columns if c.endswith(_BRONZE_SUFFIX) and len(data)}
        try:
            return registered.validation.run(batch_parameters={"dataframe": data}, run_id=run_id,
                                             expectation_parameters=parameters or None)
        except ResourceFreshnessAggregateError:
            # Another process rewrote the shared suite file with a different signature (e.g. a window
            # whose gold frame lacked a column): write ours back and run again.
            log.info("suite %s changed on disk; re-registering it", registered.suite_name)
            # (add_or_update on the definition saves its suite too.)
            registered.validation = self._context.validation_definitions.add_or_update(registered.validation)
            result: ExpectationSuiteValidationResult = registered.validation.run(
                batch_parameters={"dataframe": data}, run_id=run_id, expectation_parameters=parameters or None
            )
            return result

    # ------------------------------------------------------------------ suites

    def _totals_suite(self, pipeline: str, names: list[str]) -> _Registered:
        import great_expectations as gx

        signature: tuple[object, ...] = (tuple(names), self.lateness_threshold)
        name = f"{pipeline}.{_TOTALS_ASSET}"
        known = self._registered.get(name)
        if known and known.signature == signature:
            return known
        expectations: list[Expectation] = []
        formatters: dict[str, _Formatter] = {}
        for outcome, label in _labels(names).items():
            # The gold total must equal the window's bronze count, passed per window as a suite parameter:
            # Data Docs then shows the gold total as the unexpected value and the bronze count as the
            # expected one, apart (a column pair's unexpected value renders as "4546" for 45 vs 46).
            bronze = {"$PARAMETER": f"{label}{_BRONZE_SUFFIX}"}
            expectations.append(gx.expectations.ExpectColumnValuesToBeBetween(
                column=f"{label}{_GOLD_SUFFIX}", min_value=bronze, max_value=bronze, meta={_OUTCOME_META: outcome},
            ))
            formatters[outcome] = _format_completeness
        expectations.append(gx.expectations.ExpectColumnValuesToBeBetween(
            column=_DLQ_SHARE_COLUMN, min_value=0, max_value=self.lateness_threshold, meta={_OUTCOME_META: LATENESS},
        ))
        formatters[LATENESS] = _format_share
        notes = [
            "SPEC 5 completeness: each gold total equals the bronze count of the same window.",
            f"SPEC 5 lateness: DLQ rows not in gold / all rows of the window <= {self.lateness_threshold:g}.",
        ]
        return self._register(name, signature, self._totals_batch, expectations, formatters, notes)

    def _gold_suite(self, out: OutputFrame) -> _Registered:
        import great_expectations as gx

        from sluice.checks import Between, NotNull

        signature: tuple[object, ...] = (out.keys, tuple(out.checks), out.prefix, self.window_seconds)
        name = f"{out.name}.{_GOLD_ASSET}"
        known = self._registered.get(name)
        if known and known.signature == signature:
            return known
        ex = gx.expectations
        no_nulls = out.prefix + NO_NULL_KEYS
        expectations: list[Expectation] = [
            ex.ExpectColumnValuesToNotBeNull(column=column, meta={_OUTCOME_META: no_nulls})
            for column in (*out.keys, "window_start", "window_end")
        ]
        formatters: dict[str, _Formatter] = {no_nulls: _format_nulls}
        for check in out.checks:
            outcome = out.prefix + check.name
            if isinstance(check, Between):
                expectations.append(ex.ExpectColumnValuesToBeBetween(
                    column=check.column, min_value=check.low, max_value=check.high, meta={_OUTCOME_META: outcome},
                ))
                formatters[outcome] = _format_between
            elif isinstance(check, NotNull):
                expectations.append(
                    ex.ExpectColumnValuesToNotBeNull(column=check.column, meta={_OUTCOME_META: outcome})
                )
                formatters[outcome] = _format_nulls
        length = out.prefix + window_length_outcome(self.window_seconds)
        expectations.append(ex.ExpectColumnValuesToBeBetween(
            column=_WINDOW_SECONDS_COLUMN, min_value=self.window_seconds, max_value=self.window_seconds,
            meta={_OUTCOME_META: length},
        ))
        formatters[length] = _format_window_length(self.window_seconds)
        notes = [
            f"Validity of the window's rows of gold/{out.name}: no null keys, the declared checks, and "
            "window_end - window_start equal to one window.",
            f"`{_WINDOW_SECONDS_COLUMN}` is derived by sluice as window_end - window_start in seconds.",
        ]
        return self._register(name, signature, self._gold_batch, expectations, formatters, notes)

    def _register(
        self,
        name: str,
        signature: tuple[object, ...],
        batch_definition: Any,
        expectations: list[Expectation],
        formatters: dict[str, _Formatter],
        notes: list[str],
    ) -> _Registered:
        import great_expectations as gx
        from great_expectations.exceptions import DataContextError

        # The suite file is shared by every process. Rewriting an equal suite would still give its
        # expectations new ids, making every other live validator's copy stale (GE then refuses to run it),
        # so an equal stored suite is adopted as it is.
        try:
            stored = self._context.suites.get(name)
        except DataContextError:
            stored = None
        if stored is not None and _same_suite(stored, expectations, notes):
            suite = stored
        else:
            suite = self._context.suites.add_or_update(
                gx.ExpectationSuite(name=name, expectations=expectations, notes=notes)
            )
        # Validation definitions live in this process's memory store. add_or_update would write the suite
        # file again (GE always saves the suite with the definition), so replace the definition instead.
        definitions = self._context.validation_definitions
        if name in self._registered:
            definitions.delete(name)
        validation = definitions.add(gx.ValidationDefinition(name=name, data=batch_definition, suite=suite))
        registered = _Registered(signature, name, validation, formatters)
        self._registered[name] = registered
        return registered

    # ------------------------------------------------------------------ Data Docs

    def _result_id(self, suite_name: str, run_id: RunIdentifier, asset: str) -> ValidationResultIdentifier:
        from great_expectations.data_context.types.resource_identifiers import (
            ExpectationSuiteIdentifier,
            ValidationResultIdentifier,
        )

        return ValidationResultIdentifier(ExpectationSuiteIdentifier(name=suite_name), run_id, self._batch_ids[asset])

    def _page_path(self, resource: ValidationResultIdentifier | None) -> Path | None:
        urls = self._context.get_docs_sites_urls(resource_identifier=resource, site_name=SITE_NAME,
                                                 only_if_exists=False)
        url = urls[0].get("site_url") if urls else None
        return Path(unquote(urlparse(url).path)) if url else None

    def build_docs(self) -> Path:
        """Render the pages of every validation since the last call, the suites, and the index.

        Incremental on purpose: GE renders every stored result when given no resource list, and the
        store keeps every window ever validated.
        """
        from great_expectations.data_context.types.resource_identifiers import ExpectationSuiteIdentifier

        suites: list[ExpectationSuiteIdentifier] = [ExpectationSuiteIdentifier(name=n) for n in self._registered]
        resources: list[Any] = [*suites, *self._pending]
        # An empty list means "render everything" to GE; with nothing new, only the index is refreshed.
        self._context.build_data_docs(site_names=[SITE_NAME], resource_identifiers=resources or None,
                                      build_index=True)
        self._pending.clear()
        make_offline(self.docs_dir)  # the pages load their CSS and JS from the docs folder, not from CDNs
        self.site.publish()
        return self.docs_dir / "index.html"


def _same_suite(stored: Any, expectations: list[Expectation], notes: list[str]) -> bool:
    """Equal up to the ids GE assigns on save."""

    def plain(items: Sequence[Expectation]) -> list[dict[str, Any]]:
        return [e.dict(exclude={"id", "rendered_content"}) for e in items]

    return bool(stored.notes == notes and plain(stored.expectations) == plain(expectations))


# ---------------------------------------------------------------------- context


def _make_context(site: DocsSite) -> AbstractDataContext:
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
                "site_index_builder": {"class_name": "DefaultSiteIndexBuilder"},
            }
        },
        analytics_enabled=False,
        # tqdm bars per validation would flood the Airflow task log.
        progress_bars=ProgressBarsConfig(globally=False),
    )
    _quiet_great_expectations()
    return gx.get_context(mode="ephemeral", project_config=config)


# ---------------------------------------------------------------------- frames


def _utc(ts: datetime) -> datetime:
    return ts.replace(tzinfo=UTC) if ts.tzinfo is None else ts.astimezone(UTC)


def _gold_frame(gold: pd.DataFrame, *, keys: Sequence[str], columns: Sequence[str]) -> pd.DataFrame:
    """The columns the gold suite reads, plus the derived window length in seconds.

    A column missing from a non-empty frame is left missing, so its expectations fail with GE's
    "column does not exist"; an empty frame gets the columns it lacks, so zero rows validate cleanly.
    """
    wanted = list(dict.fromkeys([*keys, "window_start", "window_end", *columns]))
    if gold.empty:
        frame = gold.reindex(columns=wanted).reset_index(drop=True)
    else:
        frame = gold[[c for c in wanted if c in gold.columns]].reset_index(drop=True)
    if {"window_start", "window_end"} <= set(frame.columns):
        start = pd.to_datetime(frame["window_start"], utc=True)
        end = pd.to_datetime(frame["window_end"], utc=True)
        frame[_WINDOW_SECONDS_COLUMN] = (end - start).dt.total_seconds()
    return frame


def _labels(outcomes: Sequence[str]) -> dict[str, str]:
    """Column-name-safe, distinct labels for completeness outcomes (``completeness:readings`` -> ``readings``,
    ``out:completeness:n`` -> ``out_n``)."""
    labels: dict[str, str] = {}
    for outcome in outcomes:
        label = re.sub(r"\W", "_", outcome.replace(COMPLETENESS_PREFIX, ""))
        while label in labels.values():
            label += "_"
        labels[outcome] = label
    return labels


def _totals_frame(completeness: Mapping[str, tuple[int, int]], *, late_rows: int, total_rows: int) -> pd.DataFrame:
    row: dict[str, int | float] = {}
    labels = _labels(list(completeness))
    for outcome, (gold_total, bronze_count) in completeness.items():
        row[f"{labels[outcome]}{_GOLD_SUFFIX}"] = int(gold_total)
        row[f"{labels[outcome]}{_BRONZE_SUFFIX}"] = int(bronze_count)
    row["late_rows"] = int(late_rows)
    row["total_rows"] = int(total_rows)
    row[_DLQ_SHARE_COLUMN] = int(late_rows) / max(int(total_rows), 1)
    return pd.DataFrame([row])


# ---------------------------------------------------------------------- results


def _fold(
    result: ExpectationSuiteValidationResult, data: pd.DataFrame, formatters: Mapping[str, _Formatter]
) -> list[ExpectationOutcome]:
    """One outcome per ``sluice_outcome`` name, in suite order: success only if all its parts passed."""
    grouped: dict[str, list[ExpectationValidationResult]] = {}
    for part in result.results:
        meta = part.expectation_config.meta if part.expectation_config else None
        name = (meta or {}).get(_OUTCOME_META)
        if name:
            grouped.setdefault(str(name), []).append(part)
    # In the suite's declared order (formatters are registered in that order): GE lists results grouped by
    # column, errors first, which would make the order of ops/dq_results depend on the data.
    order = {name: i for i, name in enumerate(formatters)}
    outcomes = []
    for name, parts in sorted(grouped.items(), key=lambda item: order.get(item[0], len(order))):
        success = all(bool(p.success) for p in parts)
        errors = [e for p in parts if (e := _error(p))]
        kinds = {_kind(p) for p in parts}
        if errors:
            observed = "error: " + "; ".join(dict.fromkeys(errors))
        elif len(kinds) > 1 and kinds <= set(_BY_KIND):
            # Checks of different kinds declared under one name: each kind reports its own parts.
            observed = "; ".join(_BY_KIND[k]([p for p in parts if _kind(p) == k], data) for k in sorted(kinds))
        else:
            observed = formatters[name](parts, data)
        outcomes.append(ExpectationOutcome(name, observed, success))
    return outcomes


def _kind(part: ExpectationValidationResult) -> str:
    return str(part.expectation_config.type) if part.expectation_config else ""


def _error(part: ExpectationValidationResult) -> str | None:
    """GE's exception message when an expectation could not be evaluated (e.g. a missing column)."""
    info = part.exception_info or {}
    # Flat when the expectation itself raised; keyed by metric id when a metric failed to resolve.
    candidates = [info] if "raised_exception" in info else [v for v in info.values() if isinstance(v, dict)]
    for item in candidates:
        if item.get("raised_exception"):
            return str(item.get("exception_message") or "exception").strip()
    return None


def _unexpected(part: ExpectationValidationResult) -> tuple[int, list[Any]]:
    res = part.result or {}
    return int(res.get("unexpected_count") or 0), list(res.get("partial_unexpected_list") or [])


def _num(value: Any) -> str:
    """Render a number without float noise: 7200.0 -> 7200, nan -> null."""
    if value is None:
        return "null"
    try:
        number = float(value)
    except (TypeError, ValueError):
        return str(value)
    if math.isnan(number):
        return "null"
    return str(int(number)) if number.is_integer() else f"{number:.6g}"


def _sample(values: list[Any]) -> str:
    shown = ", ".join(_num(v) for v in values[:_SAMPLE])
    return shown + (", ..." if len(values) > _SAMPLE else "")


def _column(part: ExpectationValidationResult) -> str:
    kwargs = part.expectation_config.kwargs if part.expectation_config else {}
    return str(kwargs.get("column", "?"))


def _first_value(data: pd.DataFrame, column: str) -> str:
    return _num(data[column].iloc[0]) if column in data.columns and len(data) else "missing"


def _format_completeness(parts: list[ExpectationValidationResult], data: pd.DataFrame) -> str:
    column = _column(parts[0])
    gold = _first_value(data, column)
    bronze = _first_value(data, column.removesuffix(_GOLD_SUFFIX) + _BRONZE_SUFFIX)
    return f"gold={gold} bronze={bronze}"


def _format_share(parts: list[ExpectationValidationResult], data: pd.DataFrame) -> str:
    return _first_value(data, _DLQ_SHARE_COLUMN)


def _format_nulls(parts: list[ExpectationValidationResult], data: pd.DataFrame) -> str:
    per_column = {_column(p): _unexpected(p)[0] for p in parts}
    total = sum(per_column.values())
    detail = ", ".join(f"{c}: {n}" for c, n in per_column.items() if n)
    return f"{total} null{'' if total == 1 else 's'}" + (f" ({detail})" if detail else "")


def _bounds(part: ExpectationValidationResult) -> str:
    kwargs = part.expectation_config.kwargs if part.expectation_config else {}
    low, high = kwargs.get("min_value"), kwargs.get("max_value")
    return f"[{'-inf' if low is None else _num(low)}, {'inf' if high is None else _num(high)}]"


def _format_between(parts: list[ExpectationValidationResult], data: pd.DataFrame) -> str:
    found = [(_column(p), _bounds(p), *_unexpected(p)) for p in parts]
    total = sum(n for _, _, n, _ in found)
    if len({b for _, b, _, _ in found}) == 1:
        detail = ", ".join(f"{c}: {_sample(v)}" for c, _b, n, v in found if n)
        return f"{total} outside {found[0][1]}" + (f" ({detail})" if detail else "")
    # Checks folded under one name with different bounds: each part says which bounds it broke.
    detail = ", ".join(f"{c}: {_sample(v)} outside {b}" for c, b, n, v in found if n)
    return f"{total} outside their bounds" + (f" ({detail})" if detail else "")


def _format_window_length(window_seconds: int) -> _Formatter:
    def fmt(parts: list[ExpectationValidationResult], data: pd.DataFrame) -> str:
        wrong, values = _unexpected(parts[0])
        rows = int((parts[0].result or {}).get("element_count") or 0)
        return f"{wrong} of {rows} rows != {window_seconds}s" + (f" ({_sample(values)})" if values else "")

    return fmt


_BY_KIND: dict[str, _Formatter] = {
    "expect_column_values_to_be_between": _format_between,
    "expect_column_values_to_not_be_null": _format_nulls,
}


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
