"""The commands about closed windows: ``backfill`` and ``retry`` recompute (or re-check) them, ``status``
shows them (and, with ``--window``, one of them)."""

from __future__ import annotations

import argparse

from sluice.cli.common import EXIT_OK, Output, settings_of, warn
from sluice.config import ConfigError, Settings


def _require_bronze(settings: Settings, pipeline: str) -> None:
    """A backfill recomputes from bronze: without it there is nothing to do, most likely because SLUICE_HOME
    points at a fresh home instead of the one the runs use."""
    from sluice.storage import snapshots, tables

    bronze = {s: tables.bronze(settings.stream(s)).path(settings) for s in settings.pipeline(pipeline).streams}
    missing = [s for s, path in bronze.items() if not snapshots.exists(path)]
    if missing:
        raise ConfigError(
            f"nothing to backfill: no bronze table for {', '.join(missing)} under {settings.lake.table('bronze')}; "
            f"if SLUICE_HOME ({settings.home}) is not the home your runs use, point SLUICE_HOME (or --home) at it, "
            f"otherwise ingest first with `sluice run {pipeline}`"
        )


def cmd_backfill(args: argparse.Namespace) -> Output:
    from sluice.reports.output import backfill_data
    from sluice.runtime.context import open_run
    from sluice.streaming.backfill import run_backfill, validate_request

    settings = settings_of(args, writes=True)
    request = validate_request(settings, args.pipeline, args.start, args.end, args.include_late)  # errors first
    _require_bronze(settings, args.pipeline)
    if args.check_only:
        from sluice.reports.output import retry_data
        from sluice.streaming.retry import run_recheck

        checked = run_recheck(open_run(settings, app_name=f"sluice-recheck-{args.pipeline}"), args.pipeline,
                              request.start, request.end, deliver_alerts=not args.no_deliver)
        code = EXIT_OK if args.no_fail_on_checks else checked.exit_code
        return Output(code, checked.render(), {**retry_data(checked), "exit_code": code})
    result = run_backfill(
        open_run(settings, app_name=f"sluice-backfill-{args.pipeline}", work="backfill"), args.pipeline,
        args.start, args.end, include_late=args.include_late, deliver_alerts=not args.no_deliver,
    )
    # The backfill DAG records failing windows here and lets its send_alerts task deliver them and fail the
    # run: failing this task instead would retry the whole backfill and skip the alerts.
    code = EXIT_OK if args.no_fail_on_checks else result.exit_code
    return Output(code, result.render(), backfill_data(result, code))


def cmd_retry(args: argparse.Namespace) -> Output:
    from sluice.reports.output import retry_data
    from sluice.runtime.context import open_run
    from sluice.streaming.retry import run_retry

    settings = settings_of(args, writes=True)
    settings.pipeline(args.pipeline)  # an unknown name says which ones exist
    result = run_retry(open_run(settings, app_name=f"sluice-retry-{args.pipeline}"), args.pipeline,
                       check_only=args.check_only, include_late=args.include_late, deliver_alerts=not args.no_deliver)
    return Output(result.exit_code, result.render(), retry_data(result))


def cmd_status(args: argparse.Namespace) -> Output:
    from sluice.reports.status import home_warnings, render_status, render_window, status_data, window_data
    from sluice.storage.state import lake_state

    settings = settings_of(args, writes=False)
    for message in home_warnings(settings):
        warn(message)
    if args.window is not None:
        if args.json:
            return Output(EXIT_OK, "", window_data(settings, args.window, args.pipeline))
        return Output(EXIT_OK, render_window(settings, args.window, args.pipeline), {})
    if args.pipeline is not None:
        raise ConfigError("--pipeline chooses the pipeline of --window; give --window START too")
    state = lake_state(settings)  # the definitions kept beside the checkpoints (SPEC 9)
    data = status_data(settings, state) if args.json else {}
    return Output(EXIT_OK, "" if args.json else render_status(settings, state), data)
