"""The storage contract of the driver's own objects (sluice.storage.objects), the same on a local folder and on
a real S3 server (s3proxy, tests/support/s3.py): whole-object replace, create-only writes with exactly one
winner, paged listings of one folder with arrival times, names with ':', spaces and unicode. And the roots
and credentials they are built from (sluice.core.lake)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from sluice.core.errors import ConfigError
from sluice.core.lake import Credentials, Lake, Root, parse_root
from sluice.storage.objects import LocalStore, ObjectStore, S3Store, store_for
from support.s3 import S3Server

NAMES = ["plain.jsonl", "2024-05-01T10:00:00Z.jsonl", "with space.jsonl", "ünïcødé-日本.jsonl.gz"]


@pytest.fixture(params=["file", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ObjectStore]:
    if request.param == "file":
        yield LocalStore(parse_root(tmp_path / "root", "root"))
        return
    s3: S3Server = request.getfixturevalue("s3")
    bucket = s3.bucket("objects")
    credentials = Credentials.from_env(s3.env())
    yield S3Store(parse_root(f"s3://{bucket}/some/prefix", "root"), credentials.boto3_client(), page_size=7)


def test_put_replaces_whole_objects_and_get_reads_them(store: ObjectStore) -> None:
    assert store.get("state/closed_through.json") is None
    store.put("state/closed_through.json", b'{"v": 1}')
    store.put("state/closed_through.json", b'{"v": 2}')
    assert store.get("state/closed_through.json") == b'{"v": 2}'
    store.delete("state/closed_through.json")
    store.delete("state/closed_through.json")  # deleting what is gone is no error
    assert store.get("state/closed_through.json") is None


def test_exactly_one_of_eight_concurrent_creates_wins(store: ObjectStore) -> None:
    start = threading.Barrier(8)
    won: list[int] = []

    def create(i: int) -> None:
        start.wait()
        if store.create("locks/p/00000000000000000001", f"writer {i}".encode()):
            won.append(i)

    threads = [threading.Thread(target=create, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(won) == 1, won
    assert store.get("locks/p/00000000000000000001") == f"writer {won[0]}".encode()
    assert not store.create("locks/p/00000000000000000001", b"late")


def test_list_pages_through_one_folder_with_arrival_times(store: ObjectStore) -> None:
    before = datetime.now(UTC) - timedelta(minutes=5)
    names = [*NAMES, *(f"f{i:02d}.jsonl" for i in range(20))]  # 24 objects: four pages of 7 on S3
    for name in names:
        store.put(f"landing/readings/{name}", name.encode())
    store.put("landing/readings/nested/deeper.jsonl", b"x")  # a subfolder's object is not the folder's
    store.put("landing/readingsX/other.jsonl", b"x")  # nor is a sibling folder's that shares the prefix
    found = list(store.list("landing/readings"))
    assert sorted(o.name for o in found) == sorted(names)
    by_name = {o.name: o for o in found}
    for name in names:
        info = by_name[name]
        assert info.key == f"landing/readings/{name}"
        assert info.size == len(name.encode())
        assert before <= info.modified <= datetime.now(UTC) + timedelta(minutes=5)
        assert info.modified.tzinfo is not None
        assert store.get(info.key) == name.encode()
    assert list(store.list("landing/nothing-here")) == []


def test_arrival_time_is_the_time_an_object_was_written(store: ObjectStore) -> None:
    store.put("landing/s/first.jsonl", b"1")
    time.sleep(1.1)  # S3's LastModified has second precision
    store.put("landing/s/second.jsonl", b"2")
    arrived = {o.name: o.modified for o in store.list("landing/s")}
    assert arrived["first.jsonl"] < arrived["second.jsonl"]


def test_a_folder_is_deleted_with_everything_under_it_and_nothing_beside_it(store: ObjectStore) -> None:
    # A retired streaming checkpoint (PipelineRunner._restart_behind): more objects than a page, nested folders.
    folder = "_checkpoints/pipelines/p/out.g1"
    inside = [f"{folder}/offsets/{i}" for i in range(9)] + [f"{folder}/state/0/{i}/1.delta" for i in range(2)]
    beside = ["_checkpoints/pipelines/p/out.g10/offsets/0", "_checkpoints/pipelines/p/out.g2/commits/0",
              "_checkpoints/pipelines/p/definitions.json"]
    for key in inside + beside:
        store.put(key, b"x")
    assert store.delete_folder(folder) == len(inside)
    assert not any(True for _ in store.walk(folder))
    assert sorted(store.walk("_checkpoints")) == sorted(beside)
    assert store.delete_folder(folder) == 0


# -- roots and credentials ------------------------------------------------------------------------------
@pytest.mark.parametrize(("value", "expected"), [
    ("s3://bucket/lake", Root("s3", "lake", "bucket")),
    ("s3://bucket/a/b/", Root("s3", "a/b", "bucket")),
    ("s3://bucket", Root("s3", "", "bucket")),
    ("s3a://bucket/lake", Root("s3", "lake", "bucket")),
    ("file:///data/lake", Root("file", "/data/lake")),
    ("/data/lake", Root("file", "/data/lake")),
])
def test_roots_are_local_folders_or_object_storage_prefixes(value: str, expected: Root) -> None:
    assert parse_root(value, "SLUICE_LAKE") == expected


def test_a_relative_local_root_is_taken_from_the_base(tmp_path: Path) -> None:
    assert parse_root("lake", "SLUICE_LAKE", base=tmp_path) == Root("file", str(tmp_path / "lake"))


@pytest.mark.parametrize("value", ["gs://bucket/lake", "s3:///lake", "file://host/lake", " "])
def test_roots_sluice_cannot_use_fail_naming_the_key(value: str) -> None:
    with pytest.raises(ConfigError, match=r"^SLUICE_LAKE: .*(s3://bucket/prefix|file:///path)"):
        parse_root(value, "SLUICE_LAKE")


def test_uris_of_tables_and_checkpoints_under_each_kind_of_root(tmp_path: Path) -> None:
    on_s3 = Lake(parse_root("s3://b/lake", "SLUICE_LAKE"))
    assert on_s3.table("bronze/readings") == "s3://b/lake/bronze/readings"
    assert on_s3.checkpoint("pipelines", "p") == "s3://b/lake/_checkpoints/pipelines/p"
    assert on_s3.root.key("_state", "x.json") == "lake/_state/x.json"
    local = Lake(parse_root(tmp_path / "lake", "SLUICE_LAKE"))
    assert local.table("bronze/readings") == str(tmp_path / "lake" / "bronze" / "readings")
    assert local.storage_options() == {} and local.spark_conf() == {}
    with pytest.raises(ValueError, match="object storage"):
        on_s3.root.local("bronze")


def test_credentials_reach_every_client_and_no_text_shows_the_secret(s3: S3Server) -> None:
    credentials = Credentials.from_env(s3.env())
    lake = Lake(parse_root("s3://b/lake", "SLUICE_LAKE"), credentials)
    options = lake.storage_options()
    assert options["AWS_ENDPOINT_URL"] == s3.endpoint and options["AWS_ALLOW_HTTP"] == "true"
    assert options["AWS_SECRET_ACCESS_KEY"] == s3.env()["AWS_SECRET_ACCESS_KEY"]
    conf = lake.spark_conf()
    assert conf["spark.hadoop.fs.s3a.endpoint"] == s3.endpoint
    assert conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] == "false"
    assert conf["spark.hadoop.fs.s3a.path.style.access"] == "true"
    assert conf["spark.hadoop.fs.s3.impl"] == "org.apache.hadoop.fs.s3a.S3AFileSystem"
    secret = s3.env()["AWS_SECRET_ACCESS_KEY"]
    for shown in (repr(credentials), str(credentials), repr(lake), str(lake)):
        assert secret not in shown
    # The boto3 client they make reaches the server (store_for is what sluice's own code calls).
    bucket = s3.bucket("creds")
    store = store_for(parse_root(f"s3://{bucket}/p", "SLUICE_LAKE"), credentials)
    store.put("k", b"v")
    assert store.get("k") == b"v"


def test_folders_are_listed_by_name_without_their_contents(store: ObjectStore) -> None:
    """How sluice_maintenance finds the lake's tables on either back end."""
    for key in ("gold/t1/_delta_log/0.json", "gold/t2/part-0.parquet", "ops/a/_delta_log/0.json", "top.json"):
        store.put(key, b"x")
    assert sorted(store.folders("")) == ["gold", "ops"]
    assert sorted(store.folders("gold")) == ["t1", "t2"]
    assert list(store.folders("gold/t1")) == ["_delta_log"] and list(store.folders("nothing")) == []


def test_walk_yields_every_key_under_a_folder_at_any_depth(store: ObjectStore) -> None:
    """How Great Expectations' stores under the lake list their results (sluice.quality.gx_store)."""
    keys = [f"validations/p/run-{i}/result.json" for i in range(9)] + ["validations/top.json", "expectations/s.json"]
    for key in keys:
        store.put(key, b"{}")
    assert sorted(store.walk("validations")) == sorted(k for k in keys if k.startswith("validations/"))
    assert sorted(store.walk("")) == sorted(keys)  # page by page on S3 (7 keys a page here)
    assert list(store.walk("nothing")) == []


def test_a_uri_finds_the_credentials_of_the_root_it_lies_under(tmp_path: Path) -> None:
    """Code that holds only a table's URI (the snapshot readers, the ops tables' writer) reaches it with the
    credentials of the mounted root it lies under, the deepest one first; a local path needs none."""
    from sluice.core.lake import credentials_for, mount, storage_options

    bucket_wide = Credentials(endpoint_url="http://127.0.0.1:1", access_key_id="a", secret_access_key="s")
    deeper = Credentials(endpoint_url="http://127.0.0.1:2", access_key_id="b", secret_access_key="t")
    mount(parse_root("s3://mounts-test", "SLUICE_LANDING"), bucket_wide)
    mount(parse_root("s3://mounts-test/lake", "SLUICE_LAKE"), deeper)
    assert credentials_for("s3://mounts-test/lake/gold/t") == deeper
    assert credentials_for("s3a://mounts-test/lake/gold/t") == deeper  # Hadoop's name for the same objects
    assert credentials_for("s3://mounts-test/lakehouse/t") == bucket_wide  # a sibling prefix is not under it
    assert credentials_for("s3://mounts-test/landing/x.jsonl") == bucket_wide
    assert storage_options("s3://mounts-test/lake/gold/t") == deeper.delta_options()
    assert credentials_for(str(tmp_path / "lake" / "gold" / "t")) is None and storage_options(tmp_path) is None
    # Under no mounted root: the standard AWS variables, as any AWS client would read them.
    assert credentials_for("s3://not-mounted-anywhere/t") == Credentials.from_env()
