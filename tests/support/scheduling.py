"""The order the suite runs in, so that ``make test``'s xdist workers finish together.

Most of the suite's time is in a few end-to-end tests of several minutes each. xdist (``--dist loadgroup``)
hands the work out in collection order, one unit at a time to whichever worker is free, so the longest units go
first: a ten-minute test that starts last would leave the other worker idle for those ten minutes.

A unit is one test, or one module whose tests share a module-scoped fixture (a home that several cycles
built, an Airflow server): those run on one worker, one after the other, so the fixture is built once and not
once per worker. An ``xdist_group`` mark sets a unit by hand.

The costs come from ``durations.json`` beside this file (seconds per test, setup and teardown included),
recorded by a run with ``SLUICE_RECORD_DURATIONS=<file>``. A test that is not in it yet is guessed from its
markers. A stale file only changes the order, never what runs or what passes.

xdist learns a test's group from a suffix on its node id, which pytest 9.2 no longer lets it write
(pytest-dev/pytest-xdist#1386): the lock keeps pytest below 9.2, and tests/test_suite_scheduling.py fails when the
groups stop holding.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path

import pytest

DURATIONS = Path(__file__).with_name("durations.json")
# Seconds for a test the file does not know yet, by marker (the rest: GUESS_OTHER).
GUESS = {"slow": 60.0, "spark": 8.0}
GUESS_OTHER = 0.5


def _guess(item: pytest.Item) -> float:
    return next((s for marker, s in GUESS.items() if item.get_closest_marker(marker)), GUESS_OTHER)


def _shares_a_module_fixture(item: pytest.Item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    return any(defs and defs[-1].scope in ("module", "package", "class") for defs in info.name2fixturedefs.values())


def unit_of(item: pytest.Item) -> str:
    """The work unit an item belongs to: its ``xdist_group``, its module when it shares a fixture there, or
    itself."""
    mark = item.get_closest_marker("xdist_group")
    if mark is not None:
        return str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
    if _shares_a_module_fixture(item):
        return item.nodeid.split("::")[0]
    return item.nodeid


def order_longest_first(items: list[pytest.Item]) -> None:
    """Group each module that shares a fixture (an ``xdist_group`` mark), then sort the units by their cost,
    longest first; tests keep their order inside a unit. Deterministic, so every worker collects the same list."""
    known: dict[str, float] = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
    units = {id(item): unit_of(item) for item in items}
    cost: dict[str, float] = defaultdict(float)
    first: dict[str, int] = {}
    for index, item in enumerate(items):
        unit = units[id(item)]
        cost[unit] += known.get(item.nodeid, _guess(item))
        first.setdefault(unit, index)
        if unit != item.nodeid and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(unit))
    position = {id(item): index for index, item in enumerate(items)}
    items.sort(key=lambda item: (-cost[units[id(item)]], first[units[id(item)]], position[id(item)]))


def plain_nodeid(nodeid: str) -> str:
    """The node id without the ``@<group>`` that xdist's loadgroup appends (a parameter id may hold an ``@``
    too, but always inside the brackets that end the id)."""
    head, at, tail = nodeid.rpartition("@")
    return head if at and "]" not in tail else nodeid


class DurationRecorder:
    """Sums each test's setup, call and teardown (on the controller under xdist) into ``target``."""

    def __init__(self, target: Path) -> None:
        self.target = target
        self.seconds: dict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[plain_nodeid(report.nodeid)] += report.duration

    def pytest_sessionfinish(self) -> None:
        if os.environ.get("PYTEST_XDIST_WORKER"):
            return  # the controller sees every worker's reports
        rounded = {nodeid: round(s, 1) for nodeid, s in sorted(self.seconds.items())}
        self.target.write_text(json.dumps(rounded, indent=0) + "\n")


def configure(config: pytest.Config) -> None:
    target = os.environ.get("SLUICE_RECORD_DURATIONS")
    if target:
        config.pluginmanager.register(DurationRecorder(Path(target)), "sluice-durations")
