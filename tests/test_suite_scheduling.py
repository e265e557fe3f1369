"""The suite's own scheduling (tests/support/scheduling.py) under a real ``pytest -n 2 --dist loadgroup``: the
tests that share a module-scoped fixture run on one worker, which builds it once. Without this, a pytest that
xdist's loadgroup does not understand spreads them silently (pytest 9.2 with xdist 3.8: pytest-xdist#1386), and
every worker builds the module's fixture again: minutes of CI each for the end-to-end modules."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SUPPORT = Path(__file__).resolve().parent / "support"

CONFTEST = f"""
import sys
sys.path.insert(0, {str(SUPPORT.parent)!r})
import pytest
from support import scheduling


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    scheduling.order_longest_first(items)
"""

TESTS = """
import os, time
import pytest

BUILT = []


@pytest.fixture(scope="module")
def home():
    BUILT.append(os.environ["PYTEST_XDIST_WORKER"])
    return len(BUILT)


@pytest.mark.parametrize("n", range(4))
def test_shares_the_module_fixture(home, n):
    time.sleep(0.3)
    print(f"RAN shared {os.environ['PYTEST_XDIST_WORKER']} built={home}")


@pytest.mark.parametrize("n", range(4))
def test_on_its_own(n):
    time.sleep(0.3)
    print(f"RAN alone {os.environ['PYTEST_XDIST_WORKER']}")
"""


def test_tests_sharing_a_module_fixture_run_on_one_worker(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_module.py").write_text(TESTS)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-p", "no:cacheprovider", "-rP",
         "-o", "addopts=", "-q", str(tmp_path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ran = [line.split()[1:] for line in done.stdout.splitlines() if line.startswith("RAN ")]
    shared = [r for r in ran if r[0] == "shared"]
    assert len(shared) == 4 and len(ran) == 8, done.stdout[-3000:]
    assert {worker for _kind, worker, _built in shared} == {shared[0][1]}, shared
    assert {built for *_rest, built in shared} == {"built=1"}, shared
