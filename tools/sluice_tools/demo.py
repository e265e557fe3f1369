"""``sluice demo`` (what ``make run`` calls): the whole story on a generated day, through Airflow.

1. Generate a day of messy events (disorder, late, early, duplicate and malformed records, an idle gap)
   into an *incoming* folder, and let files "arrive" in the landing zone as the clock advances.
2. Run the scheduled DAGs with ``airflow dags test`` at several logical dates (``SLUICE_NOW`` = that
   date): each run ingests what has arrived, closes windows by watermark and validates them.
3. Trigger the ``sluice_backfill`` DAG over a few closed hours, with the DLQ records included.
4. Print where every record went, the gold tables, the data-quality results, alerts and the Data Docs.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path

import pyarrow as pa

from sluice.config import Settings
from sluice.ingest.accounting import accounting_table, render_table
from sluice.quality.site import docs_site
from sluice.reports.status import ledger_summary
from sluice.storage import snapshots, tables
from sluice.windows.ledger import Ledger

log = logging.getLogger("sluice.demo")


def _airflow_env(settings: Settings, now: datetime) -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("AIRFLOW_HOME", str(settings.home / "airflow"))
    env["SLUICE_HOME"] = str(settings.home)
    env["SLUICE_NOW"] = now.isoformat()
    env["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
    repo = Path(__file__).resolve().parents[2]
    env.setdefault("AIRFLOW__CORE__DAGS_FOLDER", str(repo / "dags"))
    env.setdefault("AIRFLOW__CORE__PLUGINS_FOLDER", str(repo / "plugins"))
    return env


def _airflow(settings: Settings, now: datetime, *args: str, log_name: str) -> tuple[int, float, Path]:
    logs = settings.home / "demo-logs"
    logs.mkdir(parents=True, exist_ok=True)
    log_file = logs / f"{log_name}.log"
    airflow = str(Path(sys.executable).parent / "airflow")
    started = time.monotonic()
    with open(log_file, "w") as out:
        code = subprocess.call([airflow, *args], env=_airflow_env(settings, now), stdout=out, stderr=subprocess.STDOUT)
    return code, time.monotonic() - started, log_file


def _arrive(incoming: Path, landing: Path, now: datetime) -> int:
    """Move the files whose arrival time (mtime) has come into the landing zone (mtime is kept)."""
    moved = 0
    for file in sorted(incoming.glob("*/*.json*")):
        if file.stat().st_mtime <= now.timestamp():
            target = landing / file.parent.name / file.name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(file, target)
            moved += 1
    return moved


def _gold_summary(settings: Settings) -> str:
    out = []
    for name in ("ad_clicks_hourly", "unmatched_clicks_hourly", "user_activity_hourly"):
        table = snapshots.open_table(str(settings.lake.table(f"gold/{name}")))
        if table is None:
            continue
        data = pa.table(table.to_pyarrow_table()).to_pandas()
        if data.empty:
            out.append(f"gold/{name}: empty")
            continue
        by_hour = data.groupby("window_start").agg("sum", numeric_only=True).reset_index()
        out.append(f"gold/{name}: {len(data)} rows in {len(by_hour)} windows")
        if name == "ad_clicks_hourly":
            rows = [[f"{r.window_start:%m-%d %H:%M}", int(r.impressions), int(r.clicks),
                     f"{r.clicks / r.impressions:.3f}" if r.impressions else "-"]
                    for r in by_hour.itertuples()][:6]
            out.append(render_table(["window", "impressions", "clicks", "ctr"], rows))
    return "\n".join(out)


def _dq_summary(settings: Settings) -> str:
    lines = [ledger_summary(settings)]
    alerts_table = snapshots.open_table(tables.ALERTS.path(settings))
    if alerts_table is not None:
        alerts = pa.table(alerts_table.to_pyarrow_table()).to_pylist()
        lines.append(f"\nalerts raised: {len(alerts)}")
        lines += [f"  {a['message']}  [{a['channels'] or 'no channel configured'}]" for a in alerts[:10]]
    failed = Ledger(settings).in_state("failed")
    if failed:
        lines.append(f"failed windows: {len(failed)} (see `sluice status`)")
    lines.append(f"Data Docs: {docs_site(settings).root.join('index.html')}")
    return "\n".join(lines)


def summary(settings: Settings) -> str:
    """Where every record went, the gold tables, the windows and their data quality, read from the lake
    (local or in a bucket): the end of ``make run`` and of ``make platform-demo``."""
    return "\n".join(["where every record went:", accounting_table(settings, list(settings.streams)), "",
                      _gold_summary(settings), "", "windows and data quality:", _dq_summary(settings)])


def run_demo(settings: Settings) -> int:
    from sluice_tools.generate import GenerateOptions, generate

    options = GenerateOptions(hours=24, idle_gap_minutes=45)
    incoming = settings.home / "incoming"
    landing = settings.landing.local()
    if not any(landing.glob("*/*.json*")) and not any(incoming.glob("*/*.json*")):
        print(f"[1/4] generating {options.hours:g} hours of events from {options.start:%Y-%m-%d} into {incoming}")
        manifest = generate(incoming, options, specs=settings.streams)
        print(manifest.describe(), flush=True)

    env = _airflow_env(settings, options.start)
    if not (Path(env["AIRFLOW_HOME"]) / "airflow.db").exists():
        print(f"[2/4] preparing Airflow in {env['AIRFLOW_HOME']} (airflow db migrate)", flush=True)
        code, _secs, log_file = _airflow(settings, options.start, "db", "migrate", log_name="airflow-db-migrate")
        if code:
            print(f"airflow db migrate failed; see {log_file}")
            return 1

    schedule = [
        ("ad_clicks_hourly", options.start + timedelta(hours=12)),
        ("ad_clicks_hourly", options.end + timedelta(hours=1)),
        ("user_activity_hourly", options.end + timedelta(hours=1)),
    ]
    print("[3/4] scheduled runs through Airflow (`airflow dags test`), the clock advancing:", flush=True)
    worst = 0
    for dag_id, now in schedule:
        arrived = _arrive(incoming, landing, now)
        code, secs, log_file = _airflow(settings, now, "dags", "test", dag_id, now.isoformat(),
                                        log_name=f"{dag_id}-{now:%Y%m%dT%H%M}")
        state = "success" if code == 0 else "FAILED (a window failed its checks, or the run broke)"
        print(f"  {dag_id:<22} @ {now:%Y-%m-%d %H:%M}Z  +{arrived} files  {state}  ({secs:.0f}s, log {log_file})",
              flush=True)
        worst = max(worst, 0 if code == 0 else 2)

    start = options.start + timedelta(hours=2)
    end = options.start + timedelta(hours=5)
    conf = f'{{"pipeline": "ad_clicks_hourly", "start": "{start:%Y-%m-%dT%H:%M:%SZ}", ' \
           f'"end": "{end:%Y-%m-%dT%H:%M:%SZ}", "include_late": true}}'
    now = options.end + timedelta(hours=1)
    code, secs, log_file = _airflow(settings, now, "dags", "test", "sluice_backfill", now.isoformat(), "-c", conf,
                                    log_name="sluice_backfill")
    print(f"  sluice_backfill        ad_clicks_hourly [{start:%H:%M}, {end:%H:%M}) include_late  "
          f"{'success' if code == 0 else 'FAILED'}  ({secs:.0f}s, log {log_file})", flush=True)

    print("\n[4/4] what happened\n")
    print(summary(settings))
    print(f"\nNext: `sluice status`, open the Data Docs, or `make airflow` for the UI. Pipelines: "
          f"{', '.join(sorted(settings.registry.pipelines))}.")
    return worst
