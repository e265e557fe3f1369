"""The commands that run a pipeline's work by hand: ``run``, ``check``, ``ingest``, and the example data's
``generate`` and ``demo``. Each is a thin wrapper around what the Airflow tasks call (``run_cycle``,
``run_quality``, ``run_ingest``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from sluice.cli.common import EXIT_DQ_FAILED, EXIT_OK, Output, settings_of
from sluice.config import ConfigError, Settings, check_folder


def _tools() -> None:
    """``sluice_tools`` (generator, demo) ships beside the package in a clone; say so if it is missing."""
    try:
        import sluice_tools  # noqa: F401
    except ImportError:
        raise ConfigError("this command needs sluice's tools/ folder (the example-data generator and demo); run "
                          "it from a clone of the sluice repository after `make setup`") from None


def cmd_generate(args: argparse.Namespace) -> int:
    _tools()
    from sluice_tools.generate import generate, options_from_args

    settings = settings_of(args)
    landing = _local_landing(settings, "generate")
    check_folder(landing, "landing", writable=True, hint="SLUICE_LANDING (or SLUICE_HOME)")
    options = options_from_args(args)
    manifest = generate(landing, options, specs=settings.streams)
    if args.manifest:
        manifest.write_manifest(Path(args.manifest))
    print(manifest.describe())
    return EXIT_OK


def cmd_run(args: argparse.Namespace) -> Output:
    from sluice.reports.output import cycle_data
    from sluice.runtime.context import open_run
    from sluice.streaming.cycle import run_cycle

    settings = settings_of(args, writes=True)
    result = run_cycle(
        open_run(settings, app_name=f"sluice-{args.pipeline}"), args.pipeline,
        check_quality=not args.skip_quality, deliver_alerts=not args.no_deliver,
    )
    # The DAG's run_cycle records failing windows here and lets send_alerts deliver them and fail the run:
    # failing this task instead would retry a cycle that has nothing left to do.
    code = EXIT_OK if args.no_fail_on_checks else result.exit_code
    return Output(code, result.render(), cycle_data(result, code))


def cmd_check(args: argparse.Namespace) -> Output:
    from sluice.alerting.outbox import alerts_recorded_since, outbox_snapshot
    from sluice.reports.output import check_data
    from sluice.runtime.context import open_run
    from sluice.streaming.cycle import run_quality

    settings = settings_of(args, writes=True)
    outbox = outbox_snapshot(settings, settings.pipeline(args.pipeline).name)
    report = run_quality(open_run(settings, app_name=f"sluice-dq-{args.pipeline}"), args.pipeline,
                         deliver_alerts=not args.no_deliver)
    alerts = alerts_recorded_since(settings, args.pipeline, outbox)
    lines = [f"data quality {args.pipeline}: {len(report.checked) - len(report.failed)} passed, "
             f"{len(report.failed)} failed; Data Docs: {report.docs_index or '-'}"]
    lines += report.failure_lines()
    lines += alerts.render()
    # Failing windows are recorded and alerted; only --strict turns them into a failing exit code.
    code = EXIT_DQ_FAILED if report.failed and args.strict else EXIT_OK
    return Output(code, "\n".join(lines), check_data(args.pipeline, report, code, alerts))


def cmd_ingest(args: argparse.Namespace) -> int:
    from sluice.ingest.accounting import accounting_table
    from sluice.ingest.run import run_ingest
    from sluice.runtime.context import open_run

    settings = settings_of(args, writes=True)
    for stream in args.streams:
        settings.stream(stream)  # unknown names fail before the JVM starts
    run_ingest(open_run(settings, app_name="sluice-ingest"), args.streams)
    print(accounting_table(settings, args.streams))
    return EXIT_OK


def cmd_demo(args: argparse.Namespace) -> int:
    _tools()
    from sluice_tools.demo import run_demo

    settings = settings_of(args, writes=True)
    check_folder(_local_landing(settings, "demo"), "landing", writable=True, hint="SLUICE_LANDING (or SLUICE_HOME)")
    return run_demo(settings)


def _local_landing(settings: Settings, command: str) -> Path:
    """The landing folder of a command that writes landing files on this machine."""
    if settings.landing.local_path() is None:
        raise ConfigError(
            f"sluice {command} writes landing files to a local folder, and SLUICE_LANDING is {settings.landing.uri}: "
            f"run it with SLUICE_LANDING set to a local folder, then upload that folder's stream folders to "
            f"{settings.landing.uri}/ (for example with `aws s3 cp --recursive`)")
    return settings.landing.local()
