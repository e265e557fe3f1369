"""A watchdog for tests stuck where pytest-timeout cannot reach them.

pytest-timeout's alarm interrupts a test only when the main thread comes back to Python. A test stuck in native
code (a wait inside Rust, C++ or the JVM's bridge that retries through the signal) is never interrupted: one such
hang held an xdist worker until CI's own limit ended the whole run, with nothing said. faulthandler's watchdog is
a C thread. Past the test's timeout plus ``watchdog_grace`` seconds it prints every thread's Python stack to the
process's own stderr (not to the test's captured output, which would die with it) and ends the process: under
xdist the test is reported as crashed and a fresh worker goes on with the rest.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
from collections.abc import Iterator

import pytest

_STDERR = pytest.StashKey[int]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini("watchdog_grace", "seconds past a test's timeout before the watchdog ends its process",
                  default="120")


def pytest_configure(config: pytest.Config) -> None:
    capture = config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
        config.stash[_STDERR] = os.dup(2)


def timeout_of(item: pytest.Item) -> float:
    """The test's pytest-timeout: its ``timeout`` mark, else the ini's (0: none)."""
    marker = item.get_closest_marker("timeout")
    if marker is not None and marker.args:
        return float(marker.args[0] or 0)
    return float(item.config.getini("timeout") or 0)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[object]:
    timeout = timeout_of(item)
    if timeout > 0:
        grace = float(item.config.getini("watchdog_grace"))
        faulthandler.dump_traceback_later(timeout + grace, exit=True, file=item.config.stash[_STDERR])
    try:
        return (yield)
    finally:
        faulthandler.cancel_dump_traceback_later()
