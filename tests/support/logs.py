"""Catching what sluice logs, in tests that share a process with Airflow's in-process runs."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager


class _Messages(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@contextmanager
def logged(name: str) -> Iterator[list[str]]:
    """The INFO (and above) messages of logger ``name`` and its children while the block runs. The handler
    sits on that logger itself, not on the root as pytest's ``caplog`` does: an ``airflow dags test`` or
    ``dag.test()`` run earlier in the same process re-configures the root logger's handlers."""
    logger, handler = logging.getLogger(name), _Messages()
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield handler.messages
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
