"""
### sluice_maintenance

Daily housekeeping of the lake, under each pipeline's lock so it never races a cycle or a backfill:

* **compact**: bin-pack small files of every Delta table, each by the engine that writes it (delta-spark's
  OPTIMIZE for the tables Spark writes, delta-rs's for `ops/*`; `dataChange=false`, so the streaming readers
  downstream see nothing new),
* **vacuum**: delete files no longer referenced, older than the retention (default 7 days, never less
  than 1 day: readers and time travel within that horizon stay safe); this also removes files left by a
  crashed write,
* **clean_checkpoints**: drop stale `_staging` leftovers and expired Delta log files; Spark itself keeps
  only the last batches of each checkpoint and cleans RocksDB state.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import dag, task

from sluice.airflow.factory import DEFAULT_ARGS


@dag(
    dag_id="sluice_maintenance",
    schedule="@daily",
    start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULT_ARGS,
    tags=["sluice", "maintenance"],
    doc_md=__doc__,
)
def sluice_maintenance() -> None:
    @task(task_id="compact")
    def compact_tables() -> dict[str, int]:
        from sluice.airflow.credentials import task_settings
        from sluice.runtime.context import open_run
        from sluice.storage.maintenance import compact

        run = open_run(task_settings(), app_name="sluice-maintenance")
        return compact(run.settings, run.engine)

    @task(task_id="vacuum")
    def vacuum_tables() -> dict[str, int]:
        from sluice.airflow.credentials import task_settings
        from sluice.runtime.context import open_run
        from sluice.storage.maintenance import vacuum

        run = open_run(task_settings(), app_name="sluice-maintenance")
        return vacuum(run.settings, run.engine)

    @task(task_id="clean_checkpoints")
    def clean() -> int:
        from sluice.airflow.credentials import task_settings
        from sluice.storage.maintenance import clean_checkpoints

        return clean_checkpoints(task_settings())

    compact = compact_tables()
    vacuum = vacuum_tables()
    clean_checkpoints = clean()
    compact >> vacuum >> clean_checkpoints


sluice_maintenance()
