"""Leases in a bucket (sluice.core.leases) on a real S3 server (s3proxy): one holder at a time across
processes that share nothing but the bucket, a SIGKILLed holder blocks the others for at most its TTL, and a
holder whose lease was taken over finds out before it commits."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from sluice.core.leases import LeaseLost, LeaseStore
from sluice.storage.locks import LockTimeout
from support.s3 import S3Server

pytestmark = pytest.mark.slow

HOLDER = textwrap.dedent("""
    import sys, time
    import boto3
    from botocore.config import Config
    from sluice.core.leases import LeaseStore
    client = boto3.client("s3", endpoint_url={endpoint!r}, aws_access_key_id="sluice-test",
                          aws_secret_access_key="sluice-test-secret", region_name="us-east-1",
                          config=Config(s3={{"addressing_style": "path"}}))
    store = LeaseStore(client, {bucket!r}, "locks", ttl_s={ttl}, poll_s=0.1)
    with store.hold("pipeline/p", timeout=120) as lease:
        with open({log!r}, "a") as f:
            f.write(f"in {{lease.generation}} {{time.time()}}\\n")
        print("held", flush=True)
        time.sleep({hold_s})
        with open({log!r}, "a") as f:
            f.write(f"out {{lease.check()}} {{time.time()}}\\n")
""")


def holder(s3: S3Server, bucket: str, log: Path, *, ttl: float, hold_s: float) -> subprocess.Popen[str]:
    code = HOLDER.format(endpoint=s3.endpoint, bucket=bucket, ttl=ttl,
                         log=str(log), hold_s=hold_s)
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)


def store(s3: S3Server, bucket: str, **kwargs: float) -> LeaseStore:
    return LeaseStore(s3.client(), bucket, "locks", **{"ttl_s": 5.0, "poll_s": 0.1, **kwargs})


def test_processes_that_share_only_the_bucket_hold_the_lease_one_at_a_time(s3: S3Server, tmp_path: Path) -> None:
    bucket, log = s3.bucket("leases"), tmp_path / "log"
    procs = [holder(s3, bucket, log, ttl=10, hold_s=1.0) for _ in range(3)]
    for p in procs:
        assert p.wait(timeout=120) == 0
    events = [line.split() for line in log.read_text().splitlines()]
    assert [e[0] for e in events] == ["in", "out"] * 3, events  # never two "in" without an "out" between
    tokens = [int(e[1]) for e in events]
    assert tokens[0::2] == tokens[1::2] and tokens[0::2] == sorted(set(tokens[0::2])), tokens  # rising tokens
    # Each release deleted the generations before it: the prefix does not grow with every run.
    listed = s3.client().list_objects_v2(Bucket=bucket, Prefix="locks/pipeline/p/")
    assert len(listed.get("Contents", [])) <= 2


def test_a_holder_killed_with_sigkill_blocks_the_others_for_at_most_its_ttl(s3: S3Server, tmp_path: Path) -> None:
    bucket, ttl = s3.bucket("leases"), 4.0
    proc = holder(s3, bucket, tmp_path / "log", ttl=ttl, hold_s=600)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    killed = time.monotonic()
    other = store(s3, bucket)
    assert other.try_acquire("pipeline/p", "other") is None  # still within its TTL
    with other.hold("pipeline/p", timeout=60) as lease:
        waited = time.monotonic() - killed
        assert lease.check() == lease.generation
    # Never for ever: the TTL (plus the renewal period it may have used, and the clock's one-second grain).
    assert waited <= ttl + ttl / 3 + 3, waited


def test_a_holder_paused_past_its_ttl_finds_its_lease_taken_before_it_commits(s3: S3Server) -> None:
    bucket = s3.bucket("leases")
    paused = store(s3, bucket, ttl_s=2.0).try_acquire("stream/readings", "paused")  # no renewal: a long GC
    assert paused is not None and paused.check() == paused.generation
    time.sleep(3.5)
    taker = store(s3, bucket, ttl_s=2.0).try_acquire("stream/readings", "taker")
    assert taker is not None and taker.generation > paused.generation
    with pytest.raises(LeaseLost):
        paused.check()  # the fencing check before a commit
    with pytest.raises(LeaseLost):
        paused.renew()
    assert taker.check() == taker.generation


def test_a_waiter_gives_up_with_a_clear_error_and_a_released_lease_is_free_at_once(s3: S3Server) -> None:
    bucket = s3.bucket("leases")
    first, second = store(s3, bucket, ttl_s=30.0), store(s3, bucket, ttl_s=30.0, page_size=1)
    with (first.hold("pipeline/p", purpose="cycle"), pytest.raises(LockTimeout, match="another run held the lease"),
          second.hold("pipeline/p", timeout=1)):
        pass
    started = time.monotonic()
    with second.hold("pipeline/p", timeout=10) as lease:  # page_size=1: the listing pages through
        assert time.monotonic() - started < 2
        assert lease.check() == lease.generation
