"""
### sluice pipelines

One Airflow DAG per pipeline registered in the pipelines folder (`SLUICE_PIPELINES`, default `pipelines/`), built by
`sluice.airflow.factory.pipeline_dags`: dag_id = the pipeline's name, its schedule (a cron data-interval
timetable), one Asset per gold table. A pipeline file that fails to load shows up as an import error naming
that file; the other DAGs still load.

Each DAG has two paths, chosen per run by **choose_path**: scheduled and manual runs run a cycle
(**run_cycle** >> **check_quality**, clock = the run's `data_interval_end` unless `SLUICE_NOW` is set);
backfill runs (`airflow backfill create --dag-id <pipeline> ...`, or *Run backfill* in the UI) run
**reprocess_interval**: `sluice backfill` of the windows whose start lies in the run's data interval (param
`include_late`). **send_alerts** follows either path.
"""

from __future__ import annotations

from sluice.airflow.factory import pipeline_dags
from sluice.config import load_settings

# Reads the pipeline definitions only (no Spark, no data): what a DAG factory needs to wire tasks.
for _dag_id, _dag in pipeline_dags(load_settings().registry).items():
    globals()[_dag_id] = _dag
