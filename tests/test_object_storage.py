"""The lake on object storage, end to end (SPEC 1, issue 27): the same files and the same commands give the
same tables with ``SLUICE_LAKE=s3://...`` on a real S3 server (s3proxy, tests/support/s3.py) as on a local
lake, even when every stage on S3 is SIGKILLed once (ingest, the aggregate, data quality, a correction, a
backfill) and run again. The commands are the CLI's (tests/support/replay.py), the two lakes side by side: the
lake in the bucket in a process of its own (a killed run in one more), the local lake in the test's process on
the suite's Spark session:

* the shipped pipelines (``ad_clicks_hourly``, ``user_activity_hourly``) on generated streams with late,
  early, duplicate and malformed records; late records land for closed windows of ``ad_clicks_hourly`` and
  the automatic correction rewrites them; then a backfill with ``--include-late``;
* the README tutorial's pipeline, whose completeness check fails three windows: data quality alerts through a
  webhook on 127.0.0.1, and a late reading is corrected.

The second test puts the landing zone in a bucket too, runs ``sluice status`` there, and runs the same
pipeline from two homes at once on the same buckets (two hosts, as far as the lease in the bucket knows).

Every table of both lakes is compared row for row (the Spark checkpoint's lineage ids aside), and both lakes
alert the same windows."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from sluice.config import Settings, load_settings
from sluice.storage.maintenance import delta_tables
from sluice_tools.generate import GenerateOptions, generate
from support import replay
from support.lake import read_arrow
from support.s3 import S3Server
from support.servers import serve_webhook
from support.shell import as_the_user, user_shell
from support.tutorial import write_tutorial

pytestmark = [pytest.mark.spark, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[1]
START = datetime(2024, 5, 1, tzinfo=UTC)
OPTIONS = GenerateOptions(seed=5, start=START, hours=2, impressions_per_hour=200, events_per_hour=150,
                          late_share=0.03, early_share=0.02, duplicate_share=0.05, malformed_share=0.03)
# The README tutorial's readings (tests/test_accounting.py): r2 has no temperature, so the completeness check
# fails the three 15-minute windows that hold 10:02; the late reading lands for them after they closed.
READINGS = [("r1.jsonl", 6, [("r1", "d1", 0, 20.0), ("r2", "d2", 2, None), ("r3", "d1", 4, 22.0)]),
            ("r2.jsonl", 16, [("r5", "d1", 10, 24.0), ("r6", "d2", 12, 31.0), ("r7", "d1", 14, 26.0)]),
            ("late.jsonl", 62, [("r8", "d1", 3, 21.0)])]
FAILING = 3


def _at(hours: float) -> str:
    return (START + timedelta(hours=hours)).isoformat()


# (reveal the files that arrived up to this hour after START, now, the command, and on the lake in the bucket a
# kill first). Each command once where once shows it (sluice status on S3: the next test), to keep the suite's
# time. On S3, a process of its own runs the command first and is SIGKILLed right after the given commit (the
# crash hook, table:n), one stage each, and the command then runs again as on the local lake, recovering: so
# the lake in the bucket is also a run killed at every stage, and its tables must still be the local lake's.
STEPS: list[tuple[float, str, list[str], str | None]] = [
    # ingest: a micro-batch's ops rows and bronze committed, its quarantine and DLQ rows not
    (1.25, _at(1.25), ["run", "ad_clicks_hourly"], "bronze/impressions:1"),
    # data quality: the failing windows are in the ledger, their alerts recorded but not delivered
    (11.0, "2024-05-01T11:00:00+00:00", ["run", "device_temps"], "ops/window_ledger@sluice.ledger.dq:1"),
    # the aggregate: gold written, the ledger not; late records for closed hours land in this step
    (24.0, _at(3.5), ["run", "ad_clicks_hourly"], "gold/ad_clicks_hourly:1"),
    (24.0, _at(3.5), ["run", "user_activity_hourly"], None),
    # a correction: the late reading's windows rewritten in gold, nothing else
    (24.0, "2024-05-01T11:05:00+00:00", ["run", "device_temps"], "gold/device_temps:1"),
    # a backfill: its one replace of gold committed, its ledger and checks not
    (24.0, _at(3.5), ["backfill", "ad_clicks_hourly", "--start", _at(0), "--end", _at(2), "--include-late"],
     "gold/ad_clicks_hourly:1"),
]


def _stage(folder: Path, pipelines: Path) -> None:
    generate(folder, OPTIONS, specs=load_settings({"SLUICE_PIPELINES": str(pipelines)}, home=folder).streams)
    readings = folder / "readings"
    readings.mkdir()
    for name, minute, rows in READINGS:
        path = readings / name
        path.write_text("".join(json.dumps({"reading_id": r, "device_id": d, "temp_c": t,
                                            "event_time": f"2024-05-01T10:{m:02d}:00Z"}) + "\n"
                                for r, d, m, t in rows))
        arrival = (datetime(2024, 5, 1, 10, tzinfo=UTC) + timedelta(minutes=minute)).timestamp()
        os.utime(path, (arrival, arrival))


def _snapshot(settings: Settings) -> dict[str, list[tuple[str, ...]]]:
    """Every table's rows, sorted; the lake's and the home's paths (in docs_path, source_file) made neutral, and
    left out: the ids of the Spark checkpoints' lineage (fresh uuids per checkpoint) and when an alert was
    delivered (the wall clock)."""
    out = {}
    for name, uri in delta_tables(settings):
        data = read_arrow(uri)
        data = data.drop_columns([c for c in ("spark_batch_id", "query_id", "delivered_at")
                                  if c in data.column_names])
        out[name] = sorted(tuple(str(v).replace(settings.lake.uri, "<lake>").replace(str(settings.home), "<home>")
                                 for v in row.values())
                           for row in data.to_pylist())
    return out


@pytest.mark.usefixtures("spark")  # the local lake's commands run on it
def test_a_lake_on_s3_holds_exactly_what_a_local_lake_holds(
    s3: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pipelines = write_tutorial(tmp_path / "pipelines")
    for shipped in sorted((REPO / "pipelines").glob("[!_]*.py")):
        shutil.copy(shipped, pipelines / shipped.name)
    _stage(tmp_path / "staged", pipelines)
    bucket = s3.bucket("lake")
    # Both homes' paths have the same length, so nothing in the tables depends on which is which.
    homes = {"s3": tmp_path / "home_s3", "local": tmp_path / "home_lo"}
    with serve_webhook() as hook_s3, serve_webhook() as hook_local:
        hooks = {"s3": hook_s3, "local": hook_local}
        envs = {}
        for kind, home in homes.items():
            shutil.copytree(tmp_path / "staged", home / "staged")  # copy2: arrival times kept
            envs[kind] = {
                "SLUICE_HOME": str(home), "SLUICE_PIPELINES": str(pipelines), "PYSPARK_PYTHON": sys.executable,
                "SLUICE_DATA_DOCS_URL": "https://airflow.example.com/sluice/docs",
                "SLUICE_AD_CLICKS_HOURLY_CORRECTIONS": "auto", "SLUICE_DEVICE_TEMPS_CORRECTIONS": "auto",
                "AIRFLOW_CONN_SLUICE_WEBHOOK": json.dumps({"conn_type": "http", "host": hooks[kind].url}),
            }
        # A killed run's lease keeps the next run waiting for its time to live: 10 s here, not 60.
        envs["s3"].update({**s3.env(), "SLUICE_LAKE": f"s3://{bucket}/lake", "SLUICE_LEASE_TTL": "10s"})
        steps = {kind: [[START.timestamp() + reveal * 3600, now, argv, kill if kind == "s3" else None]
                        for reveal, now, argv, kill in STEPS] for kind in homes}
        # The lake in the bucket in a process of its own (its killed runs too), the local one here on the
        # suite's session, at the same time.
        on_s3 = subprocess.Popen(
            replay.command(homes["s3"] / "staged", homes["s3"] / "landing", steps["s3"]),
            env=replay.environment({**user_shell(), **envs["s3"]}), stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True)
        try:
            # The replay sets SLUICE_NOW as it goes: named here so that it goes too.
            as_the_user(monkeypatch, {**envs["local"], "SLUICE_NOW": ""})
            codes_local, _ = replay.run_steps(homes["local"] / "staged", homes["local"] / "landing", steps["local"])
        finally:
            stdout, stderr = on_s3.communicate(timeout=1500)
        posts = {kind: hook.posts() for kind, hook in hooks.items()}

    codes = {"s3": replay.parse(stdout, "exit codes"), "local": codes_local}
    assert codes["s3"], stderr[-3000:]
    # Every stage's crash happened where it was meant to: each killed process died of the hook's SIGKILL.
    assert replay.parse(stdout, "killed") == [-9] * 5, stderr[-3000:]
    # The tutorial's windows fail their check (exit 2) in its cycle and its correction; the generated streams'
    # late share fails some lateness checks too.
    # The same outcome on both lakes, but for the run after the data-quality kill: the ledger already holds its
    # failing windows, so that rerun only delivers their alerts and finds nothing failing itself (exit 0; as on a
    # local lake, tests/test_accounting.py).
    assert codes["s3"] == [0 if i == 1 else code for i, code in enumerate(codes["local"])], (codes, stderr[-3000:])
    assert [codes["local"][i] for i in (1, 4)] == [2, 2], codes

    tables_s3 = _snapshot(load_settings({**s3.env(), "SLUICE_LAKE": f"s3://{bucket}/lake"}, home=homes["s3"]))
    tables_local = _snapshot(load_settings({}, home=homes["local"]))
    assert sorted(tables_s3) == sorted(tables_local)
    assert {"gold/ad_clicks_hourly", "gold/user_activity_hourly", "gold/device_temps", "ops/alerts"} <= set(tables_s3)
    for name in tables_local:
        assert tables_s3[name] == tables_local[name], name
    # The same alerts from both, with the tutorial's failing windows and the correction among them.
    ids = {kind: sorted(p["alert_id"] for p in found) for kind, found in posts.items()}
    assert ids["s3"] == ids["local"]
    kinds = [p["kind"] for p in posts["s3"]]
    assert kinds.count("dq_failure") >= FAILING and "correction" in kinds, kinds


@pytest.mark.usefixtures("spark")  # the local lake's commands run on it
def test_a_landing_zone_on_s3_is_ingested_as_a_local_one(
    s3: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SPEC 1 with the landing zone in a bucket too: an object's arrival time is its LastModified, keys play the
    part of file names (odd characters, gzip and an unreadable .gz among them; '.'/'_' keys are in flight). The
    same bytes in a local landing zone, with each file's mtime set to its object's LastModified, give the same
    tables; the S3 home's lake is in a bucket of its own."""
    now = datetime.now(UTC).replace(microsecond=0)
    options = replace(OPTIONS, start=now - timedelta(hours=3), hours=2.5, streams=("impressions", "clicks"),
                      odd_file_names=True, unreadable_files=1, gzip=True, late_share=0.02)
    staged = tmp_path / "staged"
    generate(staged, options)
    (staged / "clicks" / "_in-flight.jsonl").write_text('{"click_id": "never read"}\n')
    (staged / "clicks" / ".hidden.jsonl").write_text('{"click_id": "never read"}\n')
    landing_bucket, lake_bucket = s3.bucket("landing"), s3.bucket("lake")
    client = s3.client()
    files = sorted(staged.glob("*/*"), key=lambda f: (f.stat().st_mtime, f.name))
    for file in files:  # in arrival order, as producers would upload them
        client.put_object(Bucket=landing_bucket, Key=f"zone/{file.parent.name}/{file.name}", Body=file.read_bytes())
    local_landing = tmp_path / "home_lo" / "landing"
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=landing_bucket, Prefix="zone/"):
        for item in page["Contents"]:
            target = local_landing / item["Key"].removeprefix("zone/")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes((staged / item["Key"].removeprefix("zone/")).read_bytes())
            arrival = item["LastModified"].timestamp()
            os.utime(target, (arrival, arrival))
    run_now = (now + timedelta(minutes=5)).isoformat()
    steps = [[float("inf"), run_now, ["run", "ad_clicks_hourly"], None], [float("inf"), run_now, ["status"], None]]
    # The twin runs the same pipeline on the same buckets at the same time, from a home of its own (another
    # host, as far as it can tell): it shares only the bucket, so only the lease in the bucket keeps the two
    # apart. One waits for the other; their tables are those of one run.
    homes = {"s3": tmp_path / "home_s3", "twin": tmp_path / "home_tw", "local": tmp_path / "home_lo"}
    runs = {}
    for kind in ("s3", "twin"):
        env = {**user_shell(), "SLUICE_HOME": str(homes[kind]), "PYSPARK_PYTHON": sys.executable,
               "SLUICE_LATENESS_THRESHOLD": "1", **s3.env(), "SLUICE_LANDING": f"s3://{landing_bucket}/zone",
               "SLUICE_LAKE": f"s3://{lake_bucket}/lake"}
        runs[kind] = subprocess.Popen(replay.command(homes[kind] / "staged", homes[kind] / "nowhere", steps),
                                      env=replay.environment(env), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True)
    try:  # the local home here, on the suite's session, while the two S3 homes run
        as_the_user(monkeypatch, {"SLUICE_HOME": str(homes["local"]), "SLUICE_LATENESS_THRESHOLD": "1",
                                  "SLUICE_NOW": ""})
        codes_local, _ = replay.run_steps(homes["local"] / "staged", homes["local"] / "nowhere", steps)
    finally:
        outputs = {kind: run.communicate(timeout=1500) for kind, run in runs.items()}
    assert codes_local == [0, 0], codes_local
    for kind, (stdout, stderr) in outputs.items():
        assert replay.parse(stdout, "exit codes") == [0, 0], f"{kind}: {stdout[-2000:]} {stderr[-3000:]}"
    assert f"lake=s3://{lake_bucket}/lake" in outputs["s3"][0]
    waited = [kind for kind in ("s3", "twin") if "waiting for the lease held by another run" in outputs[kind][1]]
    assert len(waited) == 1, [outputs[kind][1][-2000:] for kind in ("s3", "twin")]

    def by_file_name(settings: Settings) -> dict[str, list[tuple[str, ...]]]:
        # source_file (and an alert's message) names the file where it lies (file:<home>/landing/... or
        # s3://<bucket>/zone/...): compare what follows, the stream's folder and the file's name.
        # The unreadable-file alert's id ends in a digest of those paths.
        where = re.compile(rf"(file:)?<home>/landing/|s3://{re.escape(landing_bucket)}/zone/")
        digest = re.compile(r"(/unreadable_file/\d+/)[0-9a-f]+$")
        return {name: sorted(tuple(digest.sub(r"\1<digest>", where.sub("<landing>/", v)) for v in row)
                             for row in rows)
                for name, rows in _snapshot(settings).items()}

    # Either S3 home may have run the pipeline (the other waited, then found nothing to do): its own home
    # appears where a path under the home does.
    (ran,) = {"s3", "twin"} - set(waited)
    on_s3 = by_file_name(load_settings({**s3.env(), "SLUICE_LANDING": f"s3://{landing_bucket}/zone",
                                        "SLUICE_LAKE": f"s3://{lake_bucket}/lake"}, home=homes[ran]))
    local = by_file_name(load_settings({}, home=homes["local"]))
    assert sorted(on_s3) == sorted(local)
    for name in local:
        assert on_s3[name] == local[name], name
    assert "unreadable_file" in str(local["quarantine/impressions"] + local["quarantine/clicks"])
    assert not any("never read" in str(row) for rows in on_s3.values() for row in rows)
