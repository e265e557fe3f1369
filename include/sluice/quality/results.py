"""GE's validation results folded into sluice's outcomes: one :class:`ExpectationOutcome` per outcome name,
its observed value rendered as short text for ``ops/dq_results`` and alerts (GE's own Data Docs page holds
the full detail)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import pandas as pd

from sluice.quality.frames import BRONZE_SUFFIX, DLQ_SHARE_COLUMN, GOLD_SUFFIX
from sluice.quality.outcomes import OUTCOME_META, ExpectationOutcome

if TYPE_CHECKING:  # GE takes seconds to import; only WindowValidator pays for it, at construction.
    from great_expectations.core import ExpectationSuiteValidationResult, ExpectationValidationResult

_SAMPLE = 3  # offending values quoted in an observed value; GE's own page lists up to 20

# An observed-value formatter gets the GE results of one outcome's expectations (in suite order) and the
# frame they ran on: a passing expectation reports no values, so numbers are read back from the frame.
Formatter = Callable[[list["ExpectationValidationResult"], pd.DataFrame], str]


def fold_results(
    result: ExpectationSuiteValidationResult, data: pd.DataFrame, formatters: Mapping[str, Formatter]
) -> list[ExpectationOutcome]:
    """One outcome per ``sluice_outcome`` name, in suite order: success only if all its parts passed."""
    grouped: dict[str, list[ExpectationValidationResult]] = {}
    for part in result.results:
        meta = part.expectation_config.meta if part.expectation_config else None
        name = (meta or {}).get(OUTCOME_META)
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
    # A column pair's first column (the gold total of the completeness check over many windows' totals).
    return str(kwargs.get("column", kwargs.get("column_A", "?")))


def _first_value(data: pd.DataFrame, column: str) -> str:
    return _num(data[column].iloc[0]) if column in data.columns and len(data) else "missing"


def format_completeness(parts: list[ExpectationValidationResult], data: pd.DataFrame) -> str:
    column = _column(parts[0])
    gold = _first_value(data, column)
    bronze = _first_value(data, column.removesuffix(GOLD_SUFFIX) + BRONZE_SUFFIX)
    return f"gold={gold} bronze={bronze}"


def format_share(parts: list[ExpectationValidationResult], data: pd.DataFrame) -> str:
    return _first_value(data, DLQ_SHARE_COLUMN)


def format_nulls(parts: list[ExpectationValidationResult], data: pd.DataFrame) -> str:
    per_column = {_column(p): _unexpected(p)[0] for p in parts}
    total = sum(per_column.values())
    detail = ", ".join(f"{c}: {n}" for c, n in per_column.items() if n)
    return f"{total} null{'' if total == 1 else 's'}" + (f" ({detail})" if detail else "")


def _bounds(part: ExpectationValidationResult) -> str:
    kwargs = part.expectation_config.kwargs if part.expectation_config else {}
    low, high = kwargs.get("min_value"), kwargs.get("max_value")
    return f"[{'-inf' if low is None else _num(low)}, {'inf' if high is None else _num(high)}]"


def format_between(parts: list[ExpectationValidationResult], data: pd.DataFrame) -> str:
    found = [(_column(p), _bounds(p), *_unexpected(p)) for p in parts]
    total = sum(n for _, _, n, _ in found)
    if len({b for _, b, _, _ in found}) == 1:
        detail = ", ".join(f"{c}: {_sample(v)}" for c, _b, n, v in found if n)
        return f"{total} outside {found[0][1]}" + (f" ({detail})" if detail else "")
    # Checks folded under one name with different bounds: each part says which bounds it broke.
    detail = ", ".join(f"{c}: {_sample(v)} outside {b}" for c, b, n, v in found if n)
    return f"{total} outside their bounds" + (f" ({detail})" if detail else "")


def format_window_length(window_seconds: int) -> Formatter:
    def fmt(parts: list[ExpectationValidationResult], data: pd.DataFrame) -> str:
        wrong, values = _unexpected(parts[0])
        # The frame's rows, not GE's element count: the frame is the window's own when its result is that of
        # many windows validated together (see WindowValidator.validate_outputs_together).
        rows = len(data)
        return f"{wrong} of {rows} rows != {window_seconds}s" + (f" ({_sample(values)})" if values else "")

    return fmt


_BY_KIND: dict[str, Formatter] = {
    "expect_column_values_to_be_between": format_between,
    "expect_column_values_to_not_be_null": format_nulls,
}
