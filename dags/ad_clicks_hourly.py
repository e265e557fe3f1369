"""
### ad_clicks_hourly

Impressions joined with clicks (click within 30 min of its impression) into hourly windows per ad:
`gold/ad_clicks_hourly` (impressions, clicks, ctr) and `gold/unmatched_clicks_hourly`.

1. **run_cycle** (one Spark application): ingest `landing/impressions` and `landing/clicks` into bronze,
   quarantine and DLQ, then the stateful join/window queries write the windows the watermark closed.
2. **check_quality**: Great Expectations on each newly closed window -> `ops/dq_results`, Data Docs, ledger.
3. **send_alerts**: webhook/email for failing windows (connections `sluice_webhook`, `sluice_smtp`).

Every 15 minutes: a window closes 40 min after its end (10-min watermark delay + 30-min join bound), so
this keeps gold within ~15 min of closable without paying JVM start-up more often than useful.
Spark runs on the `spark_default` connection if defined, else in local mode.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import dag

from sluice.orchestration import DEFAULT_ARGS, GOLD_ASSETS, SluiceSparkSubmitOperator, job, send_alerts_task

PIPELINE = "ad_clicks_hourly"


@dag(
    dag_id=PIPELINE,
    schedule="*/15 * * * *",
    start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULT_ARGS,
    tags=["sluice", "pipeline"],
    doc_md=__doc__,
)
def ad_clicks_hourly() -> None:
    run_cycle = SluiceSparkSubmitOperator(
        task_id="run_cycle",
        application=job(PIPELINE),
        application_args=["--skip-quality"],
        outlets=GOLD_ASSETS[PIPELINE],
    )
    check_quality = SluiceSparkSubmitOperator(
        task_id="check_quality",
        application=job("check_quality"),
        application_args=[PIPELINE, "--no-deliver"],
    )
    send_alerts = send_alerts_task(PIPELINE)
    run_cycle >> check_quality >> send_alerts


ad_clicks_hourly()
