"""Data-quality checks declared beside a pipeline's outputs (SPEC section 8).

``completeness``, ``between`` and ``not_null`` are declarations only: plain data that the quality step
turns into Great Expectations expectations on each closed window. Every output also gets, without
declaring them: no null keys, windows exactly one window long, and the lateness check of SPEC 5.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from sluice.core.errors import DefinitionError


class Stream(Protocol):
    """What a check needs of a stream's declaration (:class:`sluice.Stream` and its resolved spec have it):
    a protocol, so that the declarations of checks need not import the API that declares streams."""

    @property
    def id(self) -> str: ...

    @property
    def fields(self) -> Mapping[str, Any]: ...


@dataclass(frozen=True)
class Check:
    """A declared check; ``name`` is what ``ops/dq_results.expectation`` shows for it."""

    name: str

    def validate(self, *, owner: str, streams: Mapping[str, Stream]) -> None:
        """Fail at load time when the check cannot work with the pipeline's streams."""


@dataclass(frozen=True)
class Completeness(Check):
    """The window's sum of ``metric`` equals the number of distinct ids (or ``distinct`` values) of the
    stream's accepted records in the window. When ``metric`` is the output's key, the number of distinct
    keys is compared instead of a sum."""

    metric: str
    stream: str
    distinct: str | None = None

    def validate(self, *, owner: str, streams: Mapping[str, Stream]) -> None:
        if self.stream not in streams:
            raise DefinitionError(f"{owner}: checks.completeness names stream {self.stream!r}, which the pipeline "
                                  f"does not read; use one of: {', '.join(streams)}")
        spec = streams[self.stream]
        if self.distinct is not None and self.distinct not in spec.fields:
            raise DefinitionError(f"{owner}: checks.completeness distinct={self.distinct!r} is not a field of "
                                  f"stream {self.stream!r}; use one of: {', '.join(spec.fields)}")

    def counted_field(self, spec: Stream) -> str:
        return self.distinct or spec.id


@dataclass(frozen=True)
class Between(Check):
    column: str
    low: float | None = None
    high: float | None = None


@dataclass(frozen=True)
class NotNull(Check):
    column: str


def _num(value: float | None) -> str:
    if value is None:
        return "inf"
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def _column(kind: str, column: object) -> str:
    if not isinstance(column, str) or not column:
        raise DefinitionError(f"checks.{kind}: the column must be a column name, got {column!r}")
    return column


def completeness(metric: str, stream: str, distinct: str | None = None, *, name: str | None = None) -> Completeness:
    """``sum(metric)`` over the window's gold rows == distinct ids (or ``distinct``) of ``stream`` in it."""
    _column("completeness", metric)
    if not isinstance(stream, str) or not stream:
        raise DefinitionError("checks.completeness: stream= must name one of the pipeline's streams")
    return Completeness(f"completeness:{name or metric}", metric, stream, distinct)


def between(column: str, low: float | None = None, high: float | None = None, *, name: str | None = None) -> Between:
    """Every value of ``column`` lies in ``[low, high]`` (either bound may be None); nulls are not checked."""
    _column("between", column)
    for bound in (low, high):
        if bound is not None and (isinstance(bound, bool) or not isinstance(bound, int | float)):
            raise DefinitionError(f"checks.between({column!r}): bounds must be numbers or None, got {bound!r}")
    if low is None and high is None:
        raise DefinitionError(f"checks.between({column!r}): give low, high or both")
    if low is not None and high is not None and low > high:
        raise DefinitionError(f"checks.between({column!r}): low {low} is above high {high}; swap them")
    if name is None:
        name = (f"{column}_between_{_num(low)}_and_{_num(high)}" if low is not None and high is not None
                else f"{column}_at_least_{_num(low)}" if low is not None else f"{column}_at_most_{_num(high)}")
    return Between(f"validity:{name}", column, low, high)


def not_null(column: str, *, name: str | None = None) -> NotNull:
    """No null in ``column``."""
    _column("not_null", column)
    return NotNull(f"validity:{name or column + '_not_null'}", column)


def describe(check: Check) -> str:
    """One line for ``sluice pipelines``."""
    params: dict[str, Any] = {k: v for k, v in vars(check).items() if k != "name" and v is not None}
    kind = type(check).__name__.lower().replace("notnull", "not_null")
    return f"{kind}(" + ", ".join(f"{k}={v!r}" for k, v in params.items()) + ")"


__all__ = ["Between", "Check", "Completeness", "NotNull", "between", "completeness", "describe", "not_null"]
