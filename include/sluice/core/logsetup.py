"""Logging of sluice's own processes (the CLI and the spark-submit jobs): to stderr, so that stdout carries
only a command's output.

Airflow is imported only when an alert is built or delivered (it takes seconds to import, and most cycles
raise none). Its import points the root logger, and its structlog loggers, at stdout; whoever imports it
calls :func:`reclaim_from_airflow` right after, which takes the handlers back, but only in a process whose
logging sluice configured: inside an Airflow task, Airflow's logging stays Airflow's.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

_configured: dict[str, int] = {}  # {"level": ...} once configure() ran in this process


class _Stderr:
    """Whatever ``sys.stderr`` is at the time of each write (main() may run in a process that swaps it)."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def configure(verbose: bool = False) -> None:
    level = logging.DEBUG if verbose else logging.INFO
    _configured["level"] = level
    _apply(level)


def _apply(level: int) -> None:
    logging.basicConfig(
        level=level, format="%(asctime)s %(levelname)-5s %(name)s: %(message)s", datefmt="%H:%M:%S",
        stream=_Stderr(), force=True,
    )
    # py4j narrates every callback at INFO, and Airflow its start-up ("Reading the config from ...",
    # "Configured default timezone") when an alert imports it; nobody running a pipeline wants that.
    for noisy in ("py4j", "py4j.clientserver", "py4j.java_gateway", "airflow.configuration", "airflow.settings"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def reclaim_from_airflow() -> None:
    """After importing Airflow: logs back to stderr (no-op unless :func:`configure` ran in this process)."""
    if "level" not in _configured:
        return
    try:
        import structlog
    except ImportError:
        pass
    else:
        # Airflow's structlog loggers (its notifiers and hooks log through them) write to sys.stdout unless
        # their factory is given a stream.
        factory: Any = structlog.get_config().get("logger_factory")
        if getattr(factory, "io", False) is None:
            factory.io = _Stderr()
    _apply(_configured["level"])
