"""The lock provider (sluice.storage.locks), the same contract on a local lake (flock under the home) and on a lake
in a real S3 bucket (leases, tests/support/s3.py): one holder at a time per pipeline and per stream, a waiter
that gives up says who to look for, and a released lock is free again. Leases across processes, a SIGKILLed
holder and a paused one are tested in test_leases.py."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from sluice.config import Settings, load_settings
from sluice.storage.locks import LockTimeout, pipeline_lock, stream_lock
from support.s3 import S3Server


@pytest.fixture(params=["file", "s3"])
def homes(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Settings, Settings]:
    """Two runs' settings: one home on one machine for a local lake; on S3, two homes that share nothing but
    the lake's bucket (two Airflow workers)."""
    if request.param == "file":
        home = load_settings({}, home=tmp_path / "home")
        return home, home
    s3: S3Server = request.getfixturevalue("s3")
    env = {**s3.env(), "SLUICE_LAKE": f"s3://{s3.bucket('locks')}/lake"}
    return load_settings(env, home=tmp_path / "one"), load_settings(env, home=tmp_path / "two")


def test_one_holder_at_a_time_and_a_released_lock_is_free_again(homes: tuple[Settings, Settings]) -> None:
    lake, other = homes
    held, release, outcome = threading.Event(), threading.Event(), []

    def holder() -> None:
        with pipeline_lock(lake, "p", purpose="cycle"):
            held.set()
            release.wait(30)

    thread = threading.Thread(target=holder)
    thread.start()
    try:
        assert held.wait(30)
        with pytest.raises(LockTimeout, match="p: another run held"), pipeline_lock(other, "p", timeout=1.0):
            outcome.append("entered while held")
        with stream_lock(other, "p", timeout=1.0):  # a stream of the same name is another lock
            outcome.append("stream")
    finally:
        release.set()
        thread.join(30)
    with pipeline_lock(other, "p", timeout=30):
        outcome.append("after release")
    assert outcome == ["stream", "after release"]
