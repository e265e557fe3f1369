"""``make platform-demo``: a generated day through the running platform (``make platform``), as a team's
producers and scheduler would drive it.

1. Generate the events of the last ``--hours`` (default 24) for every registered stream, with their disorder,
   late, duplicate and malformed records, and land them in the bucket in arrival order, in ``--slices``
   parts (an object's arrival time is its ``LastModified``: the clock is the real one). The pipeline DAGs are
   paused while a part is uploaded, so that every run, the scheduler's own included, sees whole parts.
2. After each part, a run of every pipeline DAG through the scheduler, triggered through the REST API at the
   current time (so successive runs have successive logical dates); each run's Spark job runs on the cluster.
   The ``events`` of each part are also produced, record by record, to the broker's ``events`` topic
   (``LogAppendTime``: a record's arrival time is the broker's stamp), which a third pipeline reads:
   ``user_activity_live``, ``user_activity_hourly`` on the topic (``source=kafka(topic="events")``). The demo
   adds it beside the shipped pipelines in its own folder (``pipelines_path`` in ``$SLUICE_HOME/sluice.yaml``),
   so a ``make run`` of the repository never needs a broker.
3. ``airflow backfill create`` over the first hours of ``ad_clicks_hourly``, with the DLQ records included.
4. One late file for a closed hour of ``user_activity_hourly``: its next run corrects that window by itself
   (the demo opts both pipelines into automatic corrections in ``$SLUICE_HOME/sluice.yaml``).
5. The same summary as ``make run``, read from the bucket, and a check that the executors wrote the tables
   to the bucket and nothing to a local folder.

The steps (the keys landed, each run's clock, the backfill) are written to ``steps.json`` beside the generated
files, so that a run of the same data elsewhere can follow them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx

from sluice.platform.launcher import Platform
from sluice.platform.topology import TOPOLOGY

HOUR = timedelta(hours=1)
RUN_TIMEOUT_S = 1800
FINISHED = {"success", "failed"}
#: The topic the demo produces the ``events`` stream to, and the pipeline that reads it.
TOPIC = "events"
KAFKA_PIPELINE = "user_activity_live"
KAFKA_PIPELINE_SOURCE = f'''"""{KAFKA_PIPELINE}: user_activity_hourly on the Kafka topic "{TOPIC}" (make platform-demo).

The same records as the landing zone's events, produced to the platform's broker (kafka_default): each record's
arrival time is the broker's stamp (a LogAppendTime topic), its source_file its kafka:// address.
"""

from __future__ import annotations

from collections.abc import Mapping

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from sluice import Output, Pipeline, Stream, WindowSpec, checks, kafka

events_live = Stream(
    name="events_live",
    fields={{"event_id": "string", "user_id": "string", "event_type": "string", "event_time": "timestamp"}},
    id="event_id",
    required=["event_id", "user_id", "event_time"],
    watermark_delay="5m",
    source=kafka(topic="{TOPIC}"),
)


def user_activity(inputs: Mapping[str, DataFrame], window: WindowSpec) -> DataFrame:
    per_10min = (
        inputs["events_live"]
        .groupBy(F.window("event_time", "600 seconds", "600 seconds"), "user_id")
        .agg(F.count(F.lit(1)).alias("events"))
    )
    return (
        per_10min.filter(window.keep(F.col("window.start")))
        .groupBy(window.column(F.col("window")), "user_id")
        .agg(F.avg("events").alias("avg_events_per_10min"))
    )


pipeline = Pipeline(
    name="{KAFKA_PIPELINE}",
    description=__doc__ or "",
    streams=[events_live],
    window="1h",
    schedule="*/15 * * * *",
    outputs=[
        Output("{KAFKA_PIPELINE}", user_activity, key="user_id", checks=[
            checks.completeness("user_id", stream="events_live", distinct="user_id", name="users"),
        ]),
    ],
)
'''


def z(value: datetime) -> str:
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Api:
    """Airflow's REST API, as the platform's admin."""

    def __init__(self, platform: Platform) -> None:
        self.http = httpx.Client(base_url=platform.api_url, trust_env=False, timeout=60)
        login = self.http.post("/auth/token", json={"username": platform.topology.airflow_admin,
                                                    "password": platform.secret("admin")})
        login.raise_for_status()
        self.http.headers["Authorization"] = f"Bearer {login.json()['access_token']}"

    def get(self, path: str, **params: Any) -> Any:
        response = self.http.get(f"/api/v2{path}", params=params)
        response.raise_for_status()
        return response.json()

    def set_paused(self, dag_id: str, paused: bool) -> None:
        self.http.patch(f"/api/v2/dags/{dag_id}", json={"is_paused": paused}).raise_for_status()

    def wait_idle(self, dag_id: str, timeout: float = RUN_TIMEOUT_S) -> None:
        """Wait until no run of the DAG is queued or running (the scheduler's own runs included)."""
        deadline = time.monotonic() + timeout
        while any(r["state"] in ("queued", "running") for r in self.runs(dag_id)):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{dag_id}: still busy after {timeout:.0f} s")
            time.sleep(3)

    def run_info(self, dag_id: str, run_id: str) -> dict[str, Any]:
        return dict(self.get(f"/dags/{dag_id}/dagRuns/{run_id}"))

    def trigger(self, dag_id: str, conf: dict[str, Any] | None = None) -> str:
        # Each run's logical date is the time it is triggered: successive runs, successive dates.
        body = {"logical_date": datetime.now(UTC).isoformat(), "conf": conf or {}}
        response = self.http.post(f"/api/v2/dags/{dag_id}/dagRuns", json=body)
        response.raise_for_status()
        return str(response.json()["dag_run_id"])

    def runs(self, dag_id: str) -> list[dict[str, Any]]:
        return list(self.get(f"/dags/{dag_id}/dagRuns", limit=100, order_by="-run_after")["dag_runs"])

    def wait(self, dag_id: str, run_ids: Sequence[str], timeout: float = RUN_TIMEOUT_S) -> dict[str, str]:
        """Wait until the runs have finished; their states."""
        deadline = time.monotonic() + timeout
        while True:
            states = {r["dag_run_id"]: r["state"] for r in self.runs(dag_id) if r["dag_run_id"] in run_ids}
            if len(states) == len(run_ids) and set(states.values()) <= FINISHED:
                return states
            if time.monotonic() > deadline:
                raise TimeoutError(f"{dag_id}: runs not finished after {timeout:.0f} s: {states}")
            time.sleep(3)

    def task_states(self, dag_id: str, run_id: str) -> dict[str, str]:
        items = self.get(f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances")["task_instances"]
        return {t["task_id"]: str(t["state"]) for t in items}


def _land(client: Any, files: Sequence[Path], staged: Path) -> list[str]:
    """Upload ``files`` in arrival order, each object whole in one PUT, as producers do; their keys."""
    keys = []
    for file in files:
        key = f"{TOPOLOGY.landing_prefix}/{file.relative_to(staged)}"
        client.put_object(Bucket=TOPOLOGY.bucket, Key=key, Body=file.read_bytes())
        keys.append(key)
    return keys


def _land_between_runs(api: Api, dags: Sequence[str], client: Any, files: Sequence[Path], staged: Path) -> list[str]:
    """Land files while no run of ``dags`` reads the landing zone: once their runs are done, pause them (the
    scheduler then starts none of its own), upload, unpause. Every run, the scheduler's included, then sees
    whole parts, and the runs' results do not depend on when the scheduler's ticks fell."""
    for dag_id in dags:
        api.wait_idle(dag_id)
        api.set_paused(dag_id, True)
    try:
        return _land(client, files, staged)
    finally:
        for dag_id in dags:
            api.set_paused(dag_id, False)


def demo_pipelines(root: Path, shipped: Path) -> Path:
    """``<root>/demo-pipelines``: the shipped pipelines (linked, so an edit of the repository's shows) and the
    Kafka one."""
    folder = root / "demo-pipelines"
    folder.mkdir(parents=True, exist_ok=True)
    for source in sorted(shipped.glob("*.py")):
        link = folder / source.name
        if not link.is_symlink():
            link.unlink(missing_ok=True)
            link.symlink_to(source.resolve())
    (folder / f"{KAFKA_PIPELINE}.py").write_text(KAFKA_PIPELINE_SOURCE)
    return folder


class Topic:
    """The broker's ``events`` topic (made once: two partitions, ``LogAppendTime``), produced to in order."""

    def __init__(self, bootstrap: str) -> None:
        from confluent_kafka import Producer
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": bootstrap})
        if TOPIC not in admin.list_topics(timeout=30).topics:
            admin.create_topics([NewTopic(TOPIC, 2, 1, config={"message.timestamp.type": "LogAppendTime"})]
                                )[TOPIC].result(timeout=60)
        self.producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})

    def produce(self, files: Sequence[Path]) -> int:
        """Every line of ``files`` as one record, in order; how many the broker acknowledged."""
        errors: list[str] = []
        acknowledged = 0

        def report(error: Any, _message: Any) -> None:
            nonlocal acknowledged
            if error is not None:
                errors.append(str(error))
            else:
                acknowledged += 1

        for file in files:
            for line in file.read_bytes().splitlines():
                self.producer.produce(TOPIC, line, on_delivery=report)
                self.producer.poll(0)
        left = self.producer.flush(120)
        if left or errors:
            raise RuntimeError(f"{left} record(s) not acknowledged by the broker within 120 s; errors: {errors[:5]}")
        return acknowledged


def _wait_for_dag(api: Api, dag_id: str, timeout: float = 600) -> None:
    """The dag-processor parses the DAG folder again within its interval: wait until it has made ``dag_id``."""
    deadline = time.monotonic() + timeout
    while True:
        response = api.http.get(f"/api/v2/dags/{dag_id}")
        if response.status_code == 200:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"the dag-processor has not made the DAG {dag_id} after {timeout:.0f} s")
        time.sleep(5)


def _describe_run(api: Api, dag_id: str, run_id: str, state: str) -> str:
    tasks = api.task_states(dag_id, run_id)
    cycle = tasks.get("run_cycle", tasks.get("reprocess_interval", "-"))
    note = "" if state == "success" else "  (windows failed their checks: recorded and alerted)" \
        if cycle == "success" and tasks.get("check_quality") == "failed" else "  (see its task logs)"
    return f"  {dag_id:<22} {run_id:<44} {state}{note}"


def run(platform: Platform, hours: float, slices: int) -> int:
    missing = [name for name in platform.topology.services if not platform.daemon(name).alive()]
    if missing:
        print(f"ERROR: the platform is not running ({', '.join(missing)} down): run `make platform` first",
              file=sys.stderr)
        return 1
    os.environ.update(platform.env())
    from sluice.config import load_settings
    from sluice_tools.demo import summary
    from sluice_tools.generate import GenerateOptions, generate

    home = Path(os.environ["SLUICE_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    (home / "sluice.yaml").unlink(missing_ok=True)
    folder = demo_pipelines(platform.root, load_settings().pipelines_path)
    pipelines = sorted(load_settings(pipelines=folder).registry.pipelines)
    (home / "sluice.yaml").write_text(
        "# make platform-demo: the shipped pipelines and one on a Kafka topic; late data corrects closed windows "
        f"by itself\npipelines_path: {folder}\npipelines:\n"
        + "".join(f"  {name}: {{corrections: auto}}\n" for name in pipelines))
    settings = load_settings()
    client = platform.s3_client()
    api = Api(platform)
    topic = Topic(platform.kafka_bootstrap)
    _wait_for_dag(api, KAFKA_PIPELINE)
    file_pipelines = [name for name in pipelines if name != KAFKA_PIPELINE]

    now = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    start = now - timedelta(hours=hours)
    staged = platform.root / "demo" / f"{start:%Y%m%dT%H%M}"
    print(f"[1/5] generating {hours:g} h of events from {z(start)} into {staged}", flush=True)
    # No early records: an object's arrival time is the bucket's clock, the time of its upload, which is after
    # every generated event time here; a producer's clock ahead of the bucket's is what makes records early.
    manifest = generate(staged, GenerateOptions(start=start, hours=hours, early_share=0.0),
                        specs={name: spec for name, spec in settings.streams.items() if spec.source is None})
    print(manifest.describe(), flush=True)
    files = sorted((f for f in staged.glob("*/*") if f.is_file()), key=lambda f: (f.stat().st_mtime, f.name))
    parts = [files[len(files) * k // slices: len(files) * (k + 1) // slices] for k in range(slices)]

    print(f"[2/5] landing them in {TOPOLOGY.landing} in {slices} parts, the events also produced to the topic "
          f"{TOPIC!r} at {platform.kafka_bootstrap}, each part followed by a run of every pipeline DAG through the "
          "scheduler", flush=True)
    # What the demo did, step by step, for anyone who wants to replay it (tests/platform does, on a local home).
    steps: list[dict[str, Any]] = []
    worst = 0
    for k, part in enumerate(parts, start=1):
        keys = _land_between_runs(api, pipelines, client, part, staged)
        produced = topic.produce([f for f in part if f.parent.name == "events"])
        started = {dag_id: api.trigger(dag_id) for dag_id in pipelines}
        print(f" part {k}/{slices}: {len(part)} files landed, {produced} records produced to {TOPIC!r}", flush=True)
        runs = []
        for dag_id, run_id in started.items():
            state = api.wait(dag_id, [run_id])[run_id]
            print(_describe_run(api, dag_id, run_id, state), flush=True)
            worst = max(worst, 0 if state == "success" else 2)
            runs.append({"dag_id": dag_id, "now": api.run_info(dag_id, run_id)["data_interval_end"]})
        # The Kafka pipeline's runs are listed apart: a replay of the landed files has no topic to read.
        steps.append({"landed": keys, "runs": [r for r in runs if r["dag_id"] != KAFKA_PIPELINE],
                      "produced": {"topic": TOPIC, "records": produced},
                      "kafka_runs": [r for r in runs if r["dag_id"] == KAFKA_PIPELINE]})

    backfill_dag = "ad_clicks_hourly" if "ad_clicks_hourly" in pipelines else file_pipelines[0]
    first, last = start + HOUR, start + HOUR + timedelta(minutes=15)
    print(f"[3/5] airflow backfill create --dag-id {backfill_dag} --from-date {z(first)} --to-date {z(last)} "
          "(DLQ records included)", flush=True)
    api.wait_idle(backfill_dag)
    before = {r["dag_run_id"] for r in api.runs(backfill_dag)}
    created = subprocess.run(
        [str(Path(sys.executable).parent / "airflow"), "backfill", "create", "--dag-id", backfill_dag,
         "--from-date", z(first), "--to-date", z(last), "--dag-run-conf", json.dumps({"include_late": True})],
        env=os.environ.copy(), capture_output=True, text=True, check=False, timeout=600)
    if created.returncode != 0:
        print(f"ERROR: airflow backfill create failed:\n{created.stderr[-3000:]}", file=sys.stderr)
        return 1
    deadline = time.monotonic() + 120
    while not (backfills := [r["dag_run_id"] for r in api.runs(backfill_dag)
                             if r["dag_run_id"] not in before and r["run_type"] == "backfill"]):
        if time.monotonic() > deadline:
            print("ERROR: the backfill created no run", file=sys.stderr)
            return 1
        time.sleep(2)
    for run_id, state in api.wait(backfill_dag, backfills).items():
        print(_describe_run(api, backfill_dag, run_id, state), flush=True)
    # A backfill run rewrites the windows that start in its data interval: [first, last) holds one hour's.
    steps.append({"backfill": {"dag_id": backfill_dag, "start": z(first), "end": z(first + HOUR),
                               "include_late": True}})

    corrected_dag = "user_activity_hourly" if "user_activity_hourly" in pipelines else file_pipelines[-1]
    stream = settings.registry.pipelines[corrected_dag].streams[0]
    late_hour = start + HOUR
    print(f"[4/5] one late file for the closed hour {z(late_hour)} of {corrected_dag} ({stream})", flush=True)
    late = _late_file(settings, stream, late_hour, staged)
    keys = _land_between_runs(api, pipelines, client, [late], staged)
    run_id = api.trigger(corrected_dag)
    state = api.wait(corrected_dag, [run_id])[run_id]
    print(_describe_run(api, corrected_dag, run_id, state), flush=True)
    steps.append({"landed": keys, "runs": [{"dag_id": corrected_dag,
                                            "now": api.run_info(corrected_dag, run_id)["data_interval_end"]}]})
    (staged / "steps.json").write_text(json.dumps(steps, indent=1) + "\n")

    print("\n[5/5] what happened (read from the bucket)\n", flush=True)
    print(summary(settings))
    print("\n" + _where_the_tables_are(platform, client))
    return worst


def _late_file(settings: Any, stream: str, hour: datetime, staged: Path) -> Path:
    """A file of records in ``hour``, which closed long ago: each is late and goes to the DLQ, and the next
    cycle corrects the window with them."""
    spec = settings.streams[stream]
    lines = []
    for n in range(5):
        record: dict[str, Any] = {}
        for name in spec.fields:
            kind = spec.type_of(name)
            if name == spec.id_field:
                value: Any = f"late-{hour:%H}-{n}"
            elif kind == "timestamp":
                value = z(hour + timedelta(minutes=7 * n + 3))
            elif kind in ("double", "long"):
                value = n
            elif kind == "boolean":
                value = n % 2 == 0
            else:
                value = f"late-{name}-{n % 2}"
            record[spec.json_name(name)] = value
        lines.append(json.dumps(record))
    target = staged / stream / f"{stream}-late-{hour:%Y%m%dT%H%M}.jsonl"
    target.write_text("\n".join(lines) + "\n")
    return target


def _where_the_tables_are(platform: Platform, client: Any) -> str:
    """The executors wrote every table to the bucket; no table file lies on a local disk of the platform."""
    objects = 0
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=TOPOLOGY.bucket,
                                                                 Prefix=f"{TOPOLOGY.lake_prefix}/"):
        objects += sum(1 for item in page.get("Contents", []) if item["Key"].endswith(".parquet"))
    local = [p for p in (platform.root / "home").rglob("*.parquet")] + \
        [p for p in (platform.root / "spark").rglob("*.parquet")]
    return (f"tables: {objects} Parquet objects in {TOPOLOGY.lake}; "
            f"{len(local)} on the local disks of the driver and the workers")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sluice_tools.platform_demo", description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=os.environ.get("PLATFORM_DIR", ".platform"))
    parser.add_argument("--hours", type=float, default=24, help="hours of generated events (default 24)")
    parser.add_argument("--slices", type=int, default=4, help="parts landed, each followed by DAG runs (default 4)")
    args = parser.parse_args(argv)
    if args.hours < 3 or args.slices < 1:
        parser.error("--hours must be at least 3 (a backfilled hour, a corrected hour, and closed ones after "
                     "them) and --slices at least 1")
    return run(Platform(Path(args.root).resolve()).load(), args.hours, args.slices)


if __name__ == "__main__":
    sys.exit(main())
