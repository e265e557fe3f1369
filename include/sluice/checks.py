"""Data-quality checks declared beside a pipeline's outputs (SPEC section 8): the public face of
:mod:`sluice.core.checks`, where the pipeline definitions that hold them live.

``completeness``, ``between`` and ``not_null`` are declarations only: plain data that the quality step turns into
Great Expectations expectations on each closed window.
"""

from sluice.core.checks import Between, Check, Completeness, NotNull, between, completeness, describe, not_null

__all__ = ["Between", "Check", "Completeness", "NotNull", "between", "completeness", "describe", "not_null"]
