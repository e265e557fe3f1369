"""A real S3 server on 127.0.0.1 for the tests of a lake and a landing zone on object storage: s3proxy 4.x
(``sluice.platform.s3server``, the platform's S3 server) with its filesystem backend, started on a free port
with a fixed identity and SigV4 authentication, and stopped with its process group.

No S3 mock: clients (delta-rs, s3a, boto3) talk HTTP to a server that stores objects on disk and implements
conditional puts (``If-None-Match: *``), which delta-rs's commits and sluice's leases rely on.

The session fixture ``s3`` is the server; ``S3Server.bucket()`` makes a fresh bucket for one test.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from sluice.core.processes import free_port, listening, stop_group
from sluice.platform.s3server import s3proxy_command

ACCESS_KEY = "sluice-test"
SECRET_KEY = "sluice-test-secret"  # a test server's key on loopback, not a secret
REGION = "us-east-1"
START_TIMEOUT_S = 120


@dataclass
class S3Server:
    endpoint: str  # http://127.0.0.1:<port>
    root: Path  # the filesystem backend's folder (one sub-folder per bucket)
    process: subprocess.Popen[bytes]
    _names: Iterator[int] = field(default_factory=itertools.count)

    def env(self) -> dict[str, str]:
        """The standard AWS variables that point any client at this server."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": ACCESS_KEY,
                "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_REGION": REGION, "AWS_ALLOW_HTTP": "true"}

    def client(self) -> Any:
        import boto3
        from botocore.config import Config

        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=ACCESS_KEY,
                            aws_secret_access_key=SECRET_KEY, region_name=REGION,
                            config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}))

    def bucket(self, prefix: str = "test") -> str:
        """A new, empty bucket."""
        name = f"{prefix}-{os.getpid()}-{next(self._names)}"
        self.client().create_bucket(Bucket=name)
        return name

    def stop(self) -> None:
        stop_group(self.process)


def start_s3proxy(root: Path) -> S3Server:
    port = free_port()
    log = (root / "s3proxy.log").open("wb")
    # The suite's C1-only JVM options (tests/conftest.py, SPARK_SUBMIT_OPTS), as on the platform: the server's
    # load comes in bursts of small requests, and C2's compiler threads cost it more CPU than their code saves.
    env = dict(os.environ)
    if "SPARK_SUBMIT_OPTS" in env:
        env.setdefault("JDK_JAVA_OPTIONS", env["SPARK_SUBMIT_OPTS"])
    process = subprocess.Popen(s3proxy_command(root, port, ACCESS_KEY, SECRET_KEY, REGION), stdout=log,
                               stderr=subprocess.STDOUT, start_new_session=True, env=env)
    data = root / "data"
    server = S3Server(f"http://127.0.0.1:{port}", data, process)
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        if process.poll() is not None:
            output = (root / 's3proxy.log').read_text()[-3000:]
            raise RuntimeError(f"s3proxy exited with {process.returncode}: {output}")
        if listening(port):
            break
        if time.monotonic() > deadline:
            server.stop()
            raise RuntimeError(f"s3proxy did not listen on {port} within {START_TIMEOUT_S} s")
        time.sleep(0.2)
    return server


@pytest.fixture(scope="session")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    server = start_s3proxy(tmp_path_factory.mktemp("s3proxy"))
    yield server
    server.stop()
