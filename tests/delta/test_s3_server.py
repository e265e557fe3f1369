"""The tests' S3 server (s3proxy, tests/support/s3.py) can back Delta commits: a conditional put is atomic,
and delta-rs commits to it with its default conditional puts, addressed the ecosystem's way (the standard
AWS variables, an http:// endpoint on loopback)."""

from __future__ import annotations

import threading
from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from support.s3 import S3Server

WRITERS = 8


def test_exactly_one_of_eight_concurrent_create_only_puts_wins(s3: S3Server) -> None:
    client, bucket = s3.client(), s3.bucket("probe")
    start = threading.Barrier(WRITERS)
    outcomes: dict[int, str] = {}

    def put(i: int) -> None:
        start.wait()
        try:
            client.put_object(Bucket=bucket, Key="_delta_log/00000000000000000001.json", Body=f"writer {i}",
                              IfNoneMatch="*")
            outcomes[i] = "won"
        except client.exceptions.ClientError as exc:
            outcomes[i] = str(exc.response["Error"]["Code"])

    threads = [threading.Thread(target=put, args=(i,)) for i in range(WRITERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    winners = [i for i, o in outcomes.items() if o == "won"]
    assert len(outcomes) == WRITERS, outcomes
    assert len(winners) == 1 and sorted(set(outcomes.values())) == ["PreconditionFailed", "won"], (
        f"{s3.endpoint} does not implement If-None-Match: * atomically ({outcomes}): it cannot back Delta "
        "commits (delta-rs) or sluice's leases")
    body = client.get_object(Bucket=bucket, Key="_delta_log/00000000000000000001.json")["Body"].read()
    assert body == f"writer {winners[0]}".encode()


def test_delta_rs_commits_and_reads_a_table_in_the_bucket(s3: S3Server, tmp_path: Path) -> None:
    uri = f"s3://{s3.bucket('delta')}/lake/bronze/readings"
    options = s3.env()
    for n in range(3):
        write_deltalake(uri, pa.table({"reading_id": [f"r{n}"], "n": [n]}), mode="append", storage_options=options)
    table = DeltaTable(uri, storage_options=options)
    assert table.version() == 2
    assert sorted(table.to_pyarrow_table().column("reading_id").to_pylist()) == ["r0", "r1", "r2"]
    # The objects are in the server's store, not in a local folder of this process.
    assert not (tmp_path / "lake").exists() and any(s3.root.rglob("00000000000000000002.json"))
