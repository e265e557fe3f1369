"""sluice: event-time pipelines on Spark, scheduled by Airflow.

Exit codes of run and backfill: 0 = the cycle ran and every closed window passed; 2 = the cycle ran but
some windows failed their checks (they are reported and alerted); anything else = the cycle itself failed.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from sluice.config import ConfigError, Settings, check_folder, load_settings

log = logging.getLogger("sluice")

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_DQ_FAILED = 2


def setup_logging(verbose: bool = False) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)-5s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stderr,
    )
    # py4j narrates every callback at INFO; nobody running a pipeline wants that.
    for noisy in ("py4j", "py4j.clientserver", "py4j.java_gateway"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def _settings(args: argparse.Namespace, *, writes: bool | None = None) -> Settings:
    """The settings of this invocation. ``writes`` (True: the command writes the home and the lake; False: it
    only reads them) checks those folders first, so a wrong SLUICE_HOME fails before any Spark work."""
    settings = load_settings(
        home=getattr(args, "home", None), now=getattr(args, "now", None), pipelines=getattr(args, "pipelines", None)
    )
    if writes is not None:
        settings.check_roots(writable=writes)
    return settings


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

    settings = _settings(args)
    check_folder(settings.landing, "landing", writable=True, hint="SLUICE_LANDING (or SLUICE_HOME)")
    options = options_from_args(args)
    manifest = generate(settings.landing, options, specs=settings.streams)
    if args.manifest:
        manifest.write_manifest(Path(args.manifest))
    print(manifest.describe())
    return EXIT_OK


def cmd_run(args: argparse.Namespace) -> int:
    from sluice.streaming.cycle import run_cycle

    settings = _settings(args, writes=True)
    result = run_cycle(
        settings, args.pipeline, check_quality=not args.skip_quality, deliver_alerts=not args.no_deliver
    )
    print(result.render())
    return result.exit_code


def cmd_check(args: argparse.Namespace) -> int:
    from sluice.streaming.cycle import run_quality

    report = run_quality(_settings(args, writes=True), args.pipeline, deliver_alerts=not args.no_deliver)
    print(f"data quality {args.pipeline}: {len(report.checked) - len(report.failed)} passed, "
          f"{len(report.failed)} failed; Data Docs: {report.docs_index or '-'}")
    for (start, _end), failures in sorted(report.failed.items()):
        print(f"  FAILED {start:%Y-%m-%d %H:%M}: " + ", ".join(f"{e} ({v})" for e, v in failures))
    # Failing windows are recorded and alerted; only --strict turns them into a failing exit code.
    return EXIT_DQ_FAILED if report.failed and args.strict else EXIT_OK


def cmd_ingest(args: argparse.Namespace) -> int:
    from sluice.cli.report import accounting_table
    from sluice.core.spark import get_spark
    from sluice.ingest.landing import run_ingest
    from sluice.storage.engine import get_engine

    settings = _settings(args, writes=True)
    for stream in args.streams:
        settings.stream(stream)  # unknown names fail before the JVM starts
    spark = get_spark(settings, "sluice-ingest")
    run_ingest(spark, settings, get_engine(spark, settings.delta_engine), args.streams)
    print(accounting_table(settings, args.streams))
    return EXIT_OK


def _require_bronze(settings: Settings, pipeline: str) -> None:
    """A backfill recomputes from bronze: without it there is nothing to do, most likely because SLUICE_HOME
    points at a fresh home instead of the one the runs use."""
    from deltalake import DeltaTable

    from sluice.storage import tables

    bronze = {s: tables.bronze(settings.stream(s)).path(settings) for s in settings.pipeline(pipeline).streams}
    missing = [s for s, path in bronze.items() if not DeltaTable.is_deltatable(str(path))]
    if missing:
        raise ConfigError(
            f"nothing to backfill: no bronze table for {', '.join(missing)} under {settings.lake / 'bronze'}; "
            f"if SLUICE_HOME ({settings.home}) is not the home your runs use, point SLUICE_HOME (or --home) at it, "
            f"otherwise ingest first with `sluice run {pipeline}`"
        )


def cmd_backfill(args: argparse.Namespace) -> int:
    from sluice.streaming.backfill import run_backfill, validate_request

    settings = _settings(args, writes=True)
    validate_request(settings, args.pipeline, args.start, args.end, args.include_late)  # its errors come first
    _require_bronze(settings, args.pipeline)
    result = run_backfill(
        settings, args.pipeline, args.start, args.end, include_late=args.include_late,
        deliver_alerts=not args.no_deliver,
    )
    print(result.render())
    # The backfill DAG records failing windows here and lets its send_alerts task deliver them and fail the
    # run: failing this task instead would retry the whole backfill and skip the alerts.
    return EXIT_OK if args.no_fail_on_checks else result.exit_code


def cmd_status(args: argparse.Namespace) -> int:
    from sluice.cli.status import render_status

    print(render_status(_settings(args, writes=False)))
    return EXIT_OK


def cmd_demo(args: argparse.Namespace) -> int:
    _tools()
    from sluice_tools.demo import run_demo

    settings = _settings(args, writes=True)
    check_folder(settings.landing, "landing", writable=True, hint="SLUICE_LANDING (or SLUICE_HOME)")
    return run_demo(settings)


def cmd_pipelines(args: argparse.Namespace) -> int:
    from sluice.cli.describe import describe_registry

    settings = _settings(args)
    print(describe_registry(settings))
    return EXIT_FAILED if settings.registry.errors and args.strict else EXIT_OK


def cmd_new_pipeline(args: argparse.Namespace) -> int:
    from sluice.cli.scaffold import scaffold

    settings = _settings(args)
    created = scaffold(args.name, settings.pipelines_path, tests_dir=Path(args.tests) if args.tests else None)
    for path in created:
        print(f"created {path}")
    print(f"next: edit {created[0]}, then `sluice pipelines` and `sluice run {args.name}`")
    return EXIT_OK


def _flag(value: str) -> bool:
    lowered = str(value).strip().lower()
    if lowered in {"true", "1", "yes"}:
        return True
    if lowered in {"false", "0", "no", ""}:
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {value!r}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sluice", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n  sluice pipelines\n  sluice run <pipeline> --now 2024-05-01T06:00:00Z\n"
               "  sluice backfill <pipeline> --start 2024-05-01T00:00:00Z --end 2024-05-01T06:00:00Z\n"
               "  sluice status",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("--home", help="SLUICE_HOME (default: $SLUICE_HOME or ./.sluice)")
    parser.add_argument("--pipelines", help="the pipelines folder (default: $SLUICE_PIPELINES or pipelines/)")
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="write synthetic landing files for the example streams "
                         "(deterministic by --seed)")
    try:
        from sluice_tools.generate import add_arguments
    except ImportError:  # installed without the repo's tools/: cmd_generate says what to do
        pass
    else:
        add_arguments(gen)
    gen.set_defaults(func=cmd_generate)

    run = sub.add_parser("run", help="one full cycle of a pipeline without Airflow")
    run.add_argument("pipeline", help="a registered pipeline (see `sluice pipelines`)")
    run.add_argument("--now", help="injectable 'now' (RFC 3339); default $SLUICE_NOW or the clock")
    run.add_argument("--skip-quality", action="store_true", help="ingest and aggregate only (DQ runs later)")
    run.add_argument("--no-deliver", action="store_true",
                     help="record alerts in ops/alerts but do not send them (the DAG's send_alerts task does)")
    run.set_defaults(func=cmd_run)

    check = sub.add_parser("check", help="validate closed windows that are not validated yet")
    check.add_argument("pipeline", help="a registered pipeline (see `sluice pipelines`)")
    check.add_argument("--now", help="injectable 'now' (RFC 3339)")
    check.add_argument("--no-deliver", action="store_true", help="record alerts but do not send them")
    check.add_argument("--strict", action="store_true", help="exit 2 when a window fails")
    check.set_defaults(func=cmd_check)

    ingest = sub.add_parser("ingest", help="ingest landing streams into bronze only")
    ingest.add_argument("streams", nargs="+", help="stream names (see `sluice pipelines`)")
    ingest.add_argument("--now", help="injectable 'now' (RFC 3339)")
    ingest.set_defaults(func=cmd_ingest)

    backfill = sub.add_parser("backfill", help="recompute a range of closed windows from bronze")
    backfill.add_argument("pipeline", help="a registered pipeline (see `sluice pipelines`)")
    backfill.add_argument("--start", required=True, help="first window start, RFC 3339 (inclusive)")
    backfill.add_argument("--end", required=True, help="range end, RFC 3339 (exclusive)")
    backfill.add_argument(
        "--include-late", nargs="?", const="true", default="false", type=_flag,
        help="also bring in the DLQ records (a bare flag, or true/false)",
    )
    backfill.add_argument("--now", help="injectable 'now' (RFC 3339)")
    backfill.add_argument("--no-deliver", action="store_true", help="record alerts but do not send them")
    backfill.add_argument("--no-fail-on-checks", action="store_true",
                          help="exit 0 when windows fail their checks (still recorded and alerted; for the DAG)")
    backfill.set_defaults(func=cmd_backfill)

    status = sub.add_parser("status", help="watermarks, last arrivals and row counts")
    status.add_argument("--now", help=argparse.SUPPRESS)
    status.set_defaults(func=cmd_status)

    pipelines = sub.add_parser("pipelines", help="list the registered pipelines: streams, window, schedule, "
                               "outputs and checks")
    pipelines.add_argument("--strict", action="store_true", help="exit 1 when a pipeline file failed to load")
    pipelines.set_defaults(func=cmd_pipelines)

    new = sub.add_parser("new-pipeline", help="scaffold a pipeline file (and a test) to start from")
    new.add_argument("name", help="the pipeline name, e.g. device_temps (lower case, digits, '_')")
    new.add_argument("--tests", help="also write a test into this folder (default: none)")
    new.set_defaults(func=cmd_new_pipeline)

    demo = sub.add_parser("demo", help="generate a day of data and run every pipeline end to end")
    demo.add_argument("--now", help=argparse.SUPPRESS)
    demo.set_defaults(func=cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    setup_logging(args.verbose)
    try:
        return int(args.func(args))
    except ConfigError as exc:
        print(f"sluice: error: {exc}", file=sys.stderr)
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
