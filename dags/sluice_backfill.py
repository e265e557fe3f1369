"""
### sluice_backfill

Recompute a range of closed windows `[start, end)` of one pipeline from bronze, in batch, with the same
transforms as the scheduled path, and replace exactly that range of gold in one atomic Delta commit. Then
re-run the data-quality checks and mark the windows `reprocessed` in `ops/window_ledger`.

Params: `pipeline`, `start`, `end` (RFC 3339, aligned to the pipeline's windows), `include_late` (also
bring in the DLQ records), `check_only` (re-check the closed windows of the range as they stand, without
rewriting gold: the window-ledger page's "re-check"). Bad params are refused by **validate_params**
before any Spark work, with a message that says what to fix. A backfill and a scheduled run of the same
pipeline never write at the same time (a per-pipeline lock taken by the shared code). **send_alerts**
delivers the run's alerts; **check_quality** fails the run when windows of the range (still) fail their
checks, as recorded in the ledger and alerted. This DAG is not paused when it is created.

When **backfill** succeeds it emits one Asset event per gold table of the chosen pipeline
(`sluice://gold/<output>`, through the AssetAlias `sluice_backfill_gold`; each event's extra holds
`pipeline`, `start`, `end`, `include_late`, and the windows rewritten with their rows and states), so
asset-scheduled DAGs downstream see the rewrite. A re-check rewrites no gold and emits none.

To reprocess the windows of past DAG runs of a pipeline instead, backfill the pipeline's own DAG
(`airflow backfill create --dag-id <pipeline> --from-date ... --to-date ...`, or *Run backfill* in the UI):
each run of type backfill reprocesses the windows whose start lies in its data interval.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import Param, dag, task

from sluice.airflow.factory import DEFAULT_ARGS, GOLD_ALIAS
from sluice.airflow.operators import SluiceGoldOperator, gold_assets, job
from sluice.airflow.outcomes import check_quality_task, send_alerts_task
from sluice.config import load_settings

# The registered pipelines (definitions only, no Spark, no data) make the `pipeline` param's choices.
REGISTRY = load_settings().registry
PIPELINES = sorted(REGISTRY.pipelines) or ["none registered"]


@dag(
    dag_id="sluice_backfill",
    schedule=None,
    start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
    catchup=False,
    # Triggered on demand (the CLI, the ledger page): usable as shipped, where a new DAG would start paused
    # and its runs would wait in `queued` with no word.
    is_paused_upon_creation=False,
    max_active_runs=1,
    default_args=DEFAULT_ARGS,
    tags=["sluice", "backfill"],
    doc_md=__doc__,
    params={
        "pipeline": Param(PIPELINES[0], type="string", enum=PIPELINES,
                          description="a registered pipeline (`sluice pipelines`)"),
        "start": Param("2024-05-01T00:00:00Z", type="string", format="date-time",
                       description="first window start (inclusive), RFC 3339"),
        "end": Param("2024-05-01T01:00:00Z", type="string", format="date-time",
                     description="end of the range (exclusive), RFC 3339"),
        "include_late": Param(False, type="boolean", description="also recompute with the DLQ records"),
        "check_only": Param(False, type="boolean",
                            description="re-check the closed windows of the range as they stand, without "
                                        "rewriting gold (the ledger page's re-check)"),
    },
)
def sluice_backfill() -> None:
    @task(task_id="validate_params", retries=0)
    def validate(params: dict | None = None) -> str:  # type: ignore[type-arg]
        from sluice.config import load_settings
        from sluice.streaming.backfill import validate_request

        assert params is not None
        if params.get("check_only") and params.get("include_late"):
            from sluice.config import ConfigError

            raise ConfigError("check_only re-checks gold as it stands, so it cannot bring in late data: set "
                              "include_late or check_only, not both")
        request = validate_request(
            load_settings(), params["pipeline"], params["start"], params["end"], bool(params["include_late"])
        )
        return request.pipeline.name

    validate_params = validate()
    backfill = SluiceGoldOperator(
        task_id="backfill",
        pipeline="{{ params.pipeline }}",
        gold_alias=GOLD_ALIAS,  # resolved at run time to the chosen pipeline's gold Assets
        event_extra={"start": "{{ params.start }}", "end": "{{ params.end }}",
                     "include_late": "{{ params.include_late | string | lower }}"},  # a re-check emits none
        application=job(),
        application_args=[
            "backfill",
            "{{ params.pipeline }}",
            "--start", "{{ params.start }}",
            "--end", "{{ params.end }}",
            "--include-late", "{{ params.include_late | string | lower }}",
            "--check-only", "{{ params.check_only | string | lower }}",
            "--no-deliver",
            "--no-fail-on-checks",  # a failed check is the outcome, not a failed job: check_quality says it
        ],
    )
    send_alerts = send_alerts_task(validate_params)
    gold = [asset for name in sorted(REGISTRY.pipelines) for asset in gold_assets(REGISTRY.pipelines[name])]
    validate_params >> backfill >> send_alerts >> check_quality_task(send_alerts, gold)


sluice_backfill()
