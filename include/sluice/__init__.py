"""sluice: event-time pipelines on Airflow and Spark, with Delta tables, a DLQ, a window ledger and
data-quality checks. Declare your streams and pipelines with this API (SPEC section 8)::

    from sluice import Output, Pipeline, Stream, checks
    from sluice import kafka  # a stream that reads a Kafka topic
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.2.0"

if TYPE_CHECKING:
    from sluice import checks
    from sluice.core.api import Output, Pipeline, Stream, kafka
    from sluice.core.windows import WindowSpec

# Resolved on first use: importing `sluice` (the CLI's --version, Airflow's plugin and DAG parsing) must not
# pay for importing PySpark.
_LAZY = {
    "Output": "sluice.core.api",
    "Pipeline": "sluice.core.api",
    "Stream": "sluice.core.api",
    "kafka": "sluice.core.api",
    "WindowSpec": "sluice.core.windows",
}


def __getattr__(name: str) -> Any:
    if name == "checks":
        return importlib.import_module("sluice.checks")
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'sluice' has no attribute {name!r}")


__all__ = ["Output", "Pipeline", "Stream", "WindowSpec", "__version__", "checks", "kafka"]
