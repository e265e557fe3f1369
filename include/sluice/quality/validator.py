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

Many windows: a check step that closes many windows (a catch-up, a backfill) validates each suite over all of
their frames at once (``*_together``): one GE validation and one Data Docs page for the step's passing
windows, each window's outcomes read from that result and its own frame. GE's cost is per validation, not per
row (a catch-up of a day of 5-minute windows is hundreds). A window that fails is validated again on its own,
so it has its own page and its own numbers, exactly as when it closes alone; a screen that failed is removed
from the results store.

This module registers the suites, runs them and renders their Data Docs; the parts live beside it:
:mod:`~sluice.quality.outcomes` (outcome names, what a validation reports), :mod:`~sluice.quality.frames`
(the two frames), :mod:`~sluice.quality.expectations` (checks -> GE expectations),
:mod:`~sluice.quality.results` (GE results -> outcomes and observed values) and
:mod:`~sluice.quality.gx_context` (GE's context, logs and background import).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlparse

import pandas as pd

from sluice.core.windows import Window
from sluice.quality.docs_assets import make_offline
from sluice.quality.expectations import SuiteContent, gold_expectations, totals_expectations
from sluice.quality.frames import BRONZE_SUFFIX, OutputFrame, gold_frame, totals_frame
from sluice.quality.gx_context import SITE_NAME, make_context
from sluice.quality.outcomes import ExpectationOutcome, WindowValidation
from sluice.quality.results import Formatter, fold_results
from sluice.quality.site import DocsSite

if TYPE_CHECKING:  # GE takes seconds to import; only WindowValidator pays for it, at construction.
    from great_expectations.core import ExpectationSuiteValidationResult
    from great_expectations.core.run_identifier import RunIdentifier
    from great_expectations.data_context.types.resource_identifiers import (
        ExpectationSuiteIdentifier,
        ValidationResultIdentifier,
    )
    from great_expectations.expectations import Expectation

log = logging.getLogger(__name__)

_DATASOURCE = "sluice_dq"
_TOTALS_ASSET = "window_totals"
_GOLD_ASSET = "gold_rows"
_TOTALS_PER_WINDOW = "totals_per_window"  # the suite of many windows' totals, a row each


@dataclass(frozen=True)
class SuiteRun:
    """One suite's validation of one window: its outcomes, its verdict and its stored result."""

    outcomes: list[ExpectationOutcome]
    success: bool
    result_id: ValidationResultIdentifier


@dataclass
class _Registered:
    """A suite as registered in this process, with the signature it was built from."""

    signature: tuple[object, ...]
    suite_name: str
    validation: Any  # gx.ValidationDefinition; Any keeps GE out of import time
    formatters: dict[str, Formatter] = field(default_factory=dict)


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
        self._context = make_context(self.site)
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
        totals = totals_frame(completeness, late_rows=late_rows, total_rows=total_rows)
        return self._suite_run(self._totals_suite(pipeline, list(completeness)), totals, _TOTALS_ASSET,
                               pipeline, window_start)

    def validate_outputs(
        self, pipeline: str, window_start: datetime, window_end: datetime, outputs: Sequence[OutputFrame]
    ) -> list[SuiteRun]:
        """Each output's suite over the window's gold rows."""
        runs = []
        for out in outputs:
            columns = [c.column for c in out.checks]  # type: ignore[attr-defined]
            frame = gold_frame(out.gold, keys=out.keys, columns=columns)
            runs.append(self._suite_run(self._gold_suite(out), frame, _GOLD_ASSET, pipeline, window_start))
        return runs

    # Many windows at once (module docstring): what the two methods above return per window, from one GE
    # validation per suite where the windows pass.

    def validate_outputs_together(
        self, pipeline: str, outputs: Mapping[Window, Sequence[OutputFrame]]
    ) -> dict[Window, list[SuiteRun]]:
        """:meth:`validate_outputs` of every window in ``outputs`` (each window's outputs in one order)."""
        windows = sorted(outputs)
        runs: dict[Window, list[SuiteRun]] = {w: [] for w in windows}
        for i, out in enumerate(outputs[windows[0]] if windows else ()):
            columns = [c.column for c in out.checks]  # type: ignore[attr-defined]
            frames = {w: gold_frame(outputs[w][i].gold, keys=out.keys, columns=columns) for w in windows}
            registered = self._gold_suite(out)

            def alone(w: Window, frames: Mapping[Window, pd.DataFrame] = frames,
                      registered: _Registered = registered) -> SuiteRun:
                return self._suite_run(registered, frames[w], _GOLD_ASSET, pipeline, w[0])

            for w, run in self._together(registered, frames, _GOLD_ASSET, pipeline, alone).items():
                runs[w].append(run)
        return runs

    def validate_totals_together(
        self, pipeline: str, totals: Mapping[Window, tuple[Mapping[str, tuple[int, int]], int, int]]
    ) -> dict[Window, SuiteRun]:
        """:meth:`validate_totals` of every window in ``totals``: (completeness, late rows, total rows) each."""
        frames = {w: totals_frame(c, late_rows=late, total_rows=total) for w, (c, late, total) in totals.items()}
        names = sorted({tuple(c) for c, _late, _total in totals.values()})
        if len(names) != 1:  # windows with different checks cannot share a suite
            return {w: self.validate_totals(pipeline, *w, completeness=c, late_rows=late, total_rows=total)
                    for w, (c, late, total) in totals.items()}
        signature: tuple[object, ...] = (names[0], self.lateness_threshold)
        registered = self._suite(f"{pipeline}.{_TOTALS_PER_WINDOW}", signature, self._totals_batch,
                                 lambda: totals_expectations(list(names[0]), self.lateness_threshold, per_row=True))

        def alone(w: Window) -> SuiteRun:
            completeness, late, total = totals[w]
            return self.validate_totals(pipeline, *w, completeness=completeness, late_rows=late, total_rows=total)

        return self._together(registered, frames, _TOTALS_ASSET, pipeline, alone)

    def _together(
        self, registered: _Registered, frames: Mapping[Window, pd.DataFrame], asset: str, pipeline: str,
        alone: Callable[[Window], SuiteRun], *, attributed: bool = False,
    ) -> dict[Window, SuiteRun]:
        """``registered``'s suite over the frames of many windows in one validation, or each window ``alone``:
        a window whose rows fail (GE lists their rows) on its own; the others together again, once."""
        windows = sorted(frames)
        rows = [frames[w] for w in windows if len(frames[w])]
        if len(windows) < 2 or len({tuple(f.columns) for f in rows}) > 1:
            return {w: alone(w) for w in windows}
        data = pd.concat(rows, ignore_index=True) if rows else frames[windows[0]]
        owner = [w for w in windows for _ in range(len(frames[w]))]  # the window of each row of data
        first, last = windows[0][0], windows[-1][0]
        run_id = self._run_id(f"{pipeline}-{_utc(first):%Y%m%dT%H%M%SZ}-{_utc(last):%Y%m%dT%H%M%SZ}"
                              f"-{len(windows)}-windows")
        # COMPLETE: a failing expectation lists the rows it failed on, so the failing windows are known.
        result = self._run(registered, data, run_id, result_format="COMPLETE")
        result_id = self._result_id(registered.suite_name, run_id, asset)
        if result.success:
            return {w: SuiteRun(fold_results(result, frames[w], registered.formatters), True, result_id)
                    for w in windows}
        self._context.validation_results_store.remove_key(result_id)
        failing = None if attributed else _failing_windows(result, owner)
        if failing is None:
            return {w: alone(w) for w in windows}
        passing = {w: frames[w] for w in windows if w not in failing}
        together = self._together(registered, passing, asset, pipeline, alone, attributed=True)
        return {**together, **{w: alone(w) for w in sorted(failing)}}

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
        # One run per window: every result sits together under this run name in the Data Docs index.
        run_id = self._run_id(f"{pipeline}-{_utc(window_start):%Y%m%dT%H%M%SZ}")
        # The totals suite compares each gold total with this window's bronze count (see _totals_suite).
        parameters = {c: int(data[c].iloc[0]) for c in data.columns if c.endswith(BRONZE_SUFFIX) and len(data)}
        result = self._run(registered, data, run_id, parameters=parameters)
        return SuiteRun(fold_results(result, data, registered.formatters), bool(result.success),
                        self._result_id(registered.suite_name, run_id, asset))

    def _run_id(self, run_name: str) -> RunIdentifier:
        from great_expectations.core.run_identifier import RunIdentifier

        return RunIdentifier(run_name=run_name, run_time=self._run_time)

    def _run(
        self, registered: _Registered, data: pd.DataFrame, run_id: RunIdentifier, *,
        parameters: Mapping[str, int] | None = None, result_format: str = "SUMMARY",
    ) -> ExpectationSuiteValidationResult:
        from great_expectations.exceptions.resource_freshness import ResourceFreshnessAggregateError

        options: dict[str, Any] = {"batch_parameters": {"dataframe": data}, "run_id": run_id,
                                   "expectation_parameters": dict(parameters) if parameters else None,
                                   "result_format": result_format}
        try:
            return registered.validation.run(**options)
        except ResourceFreshnessAggregateError:
            # Another process rewrote the shared suite file with a different signature (e.g. a window
            # whose gold frame lacked a column): write ours back and run again.
            log.info("suite %s changed on disk; re-registering it", registered.suite_name)
            # (add_or_update on the definition saves its suite too.)
            registered.validation = self._context.validation_definitions.add_or_update(registered.validation)
            result: ExpectationSuiteValidationResult = registered.validation.run(**options)
            return result

    # ------------------------------------------------------------------ suites

    def _totals_suite(self, pipeline: str, names: list[str]) -> _Registered:
        signature: tuple[object, ...] = (tuple(names), self.lateness_threshold)
        return self._suite(f"{pipeline}.{_TOTALS_ASSET}", signature, self._totals_batch,
                           lambda: totals_expectations(names, self.lateness_threshold))

    def _gold_suite(self, out: OutputFrame) -> _Registered:
        signature: tuple[object, ...] = (out.keys, tuple(out.checks), out.prefix, self.window_seconds)
        return self._suite(f"{out.name}.{_GOLD_ASSET}", signature, self._gold_batch,
                           lambda: gold_expectations(out, self.window_seconds))

    def _suite(
        self, name: str, signature: tuple[object, ...], batch_definition: Any, content: Callable[[], SuiteContent]
    ) -> _Registered:
        """The suite ``name`` as registered in this process, registered again when its signature changed."""
        known = self._registered.get(name)
        if known and known.signature == signature:
            return known
        return self._register(name, signature, batch_definition, *content())

    def _register(
        self,
        name: str,
        signature: tuple[object, ...],
        batch_definition: Any,
        expectations: list[Expectation],
        formatters: dict[str, Formatter],
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


def _failing_windows(result: ExpectationSuiteValidationResult, owner: Sequence[Window]) -> set[Window] | None:
    """The windows whose rows a failed validation of many windows' frames failed on (``owner``: the window of
    each row), or None when a failure names no rows (an expectation that could not be evaluated)."""
    failing: set[Window] = set()
    for part in result.results:
        if part.success:
            continue
        rows = (part.result or {}).get("unexpected_index_list")
        if not rows:
            return None
        failing.update(owner[int(row)] for row in rows)
    return failing


def _same_suite(stored: Any, expectations: list[Expectation], notes: list[str]) -> bool:
    """Equal up to the ids GE assigns on save."""

    def plain(items: Sequence[Expectation]) -> list[dict[str, Any]]:
        return [e.dict(exclude={"id", "rendered_content"}) for e in items]

    return bool(stored.notes == notes and plain(stored.expectations) == plain(expectations))


def _utc(ts: datetime) -> datetime:
    return ts.replace(tzinfo=UTC) if ts.tzinfo is None else ts.astimezone(UTC)
