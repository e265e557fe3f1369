"""The ``sluice`` command: parsing, the commands, exit codes and error reporting.

Each command is a thin wrapper around the functions the Airflow tasks call (``run_cycle``, ``run_backfill``,
``run_quality``, ``deliver_pending_alerts``...), so the CLI and the DAGs behave the same. A command returns
either an exit code or an :class:`Output` (its text for people and its ``--json`` document for scripts).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import traceback
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from sluice.alerting.alert import KINDS
from sluice.config import ConfigError, Settings, check_folder, load_settings
from sluice.core import logsetup

log = logging.getLogger("sluice")

DISTRIBUTION = "sluice"  # [project] name in pyproject.toml

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_DQ_FAILED = 2
EXIT_USAGE = 64  # sysexits.h EX_USAGE: the command line itself is wrong
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report Ctrl-C

DESCRIPTION = """\
sluice runs event-time pipelines: it ingests the JSON event files that land under
$SLUICE_HOME/landing/<stream>/ into Delta tables, closes windows by watermark, writes
the gold tables and checks every closed window with Great Expectations.
Airflow runs the same code on a schedule; this command runs it by hand."""

EPILOG = """\
examples:
  sluice pipelines                               what is registered: streams, windows, checks
  sluice run orders_hourly                    one full cycle: ingest, aggregate, check
  sluice run orders_hourly --now 2024-05-01T07:00:00Z
  sluice backfill orders_hourly --start 2024-05-01T02:00:00Z --end 2024-05-01T05:00:00Z
  sluice retry orders_hourly                     recompute and re-check the failed windows
  sluice status                                  watermarks, windows, row counts
  sluice status --json | jq '.streams'           the same, for scripts
  sluice alerts --deliver                        send the alerts a run recorded but did not send
  sluice alerts --all                            every alert recorded: sent, none or pending

environment:
  SLUICE_HOME       where data lives: landing/ and lake/ (default: .sluice in the current directory)
  SLUICE_PIPELINES  the pipelines folder (default: pipelines/)
  SLUICE_NOW        a fixed "now" (RFC 3339) for reproducible runs; --now overrides it

exit codes:
  0   done; every window checked passed
  1   the command failed (the error line says why; --debug shows the traceback)
  2   done, but some windows failed their checks (recorded in ops/alerts and alerted)
  64  wrong usage: unknown command or option, missing or invalid argument

`sluice <command> --help` shows a command's options. Add --json to status, run, backfill,
retry, check, pipelines or alerts for one JSON document on stdout (logs stay on stderr)."""


def package_version() -> str:
    """The installed distribution's version; from a source tree that is not installed, pyproject.toml's."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:
        pass
    pyproject = Path(__file__).resolve().parents[3] / "pyproject.toml"
    try:
        import tomllib

        project = tomllib.loads(pyproject.read_text())["project"]
        if project.get("name") == DISTRIBUTION:
            return f"{project['version']} (source tree, not installed)"
    except (OSError, KeyError, ValueError):
        pass
    return "unknown (not installed)"


class Parser(argparse.ArgumentParser):
    """Usage errors exit 64, never 2: 2 means "some windows failed their checks"."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n(see `{self.prog} --help`)\n")


@dataclass
class Output:
    """What a command prints: ``text`` for people, ``data`` with ``--json``; and its exit code."""

    code: int
    text: str
    data: dict[str, Any]


def setup_logging(verbose: bool = False) -> None:
    """Logs go to stderr, so stdout carries only the command's output (see :mod:`sluice.core.logsetup`)."""
    logsetup.configure(verbose)


def warn(message: str) -> None:
    print(f"sluice: warning: {message}", file=sys.stderr)


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
    landing = _local_landing(settings, "generate")
    check_folder(landing, "landing", writable=True, hint="SLUICE_LANDING (or SLUICE_HOME)")
    options = options_from_args(args)
    manifest = generate(landing, options, specs=settings.streams)
    if args.manifest:
        manifest.write_manifest(Path(args.manifest))
    print(manifest.describe())
    return EXIT_OK


def cmd_run(args: argparse.Namespace) -> Output:
    from sluice.cli.output import cycle_data
    from sluice.streaming.cycle import run_cycle

    settings = _settings(args, writes=True)
    result = run_cycle(
        settings, args.pipeline, check_quality=not args.skip_quality, deliver_alerts=not args.no_deliver
    )
    # The DAG's run_cycle records failing windows here and lets send_alerts deliver them and fail the run:
    # failing this task instead would retry a cycle that has nothing left to do.
    code = EXIT_OK if args.no_fail_on_checks else result.exit_code
    return Output(code, result.render(), cycle_data(result, code))


def cmd_check(args: argparse.Namespace) -> Output:
    from sluice.alerting.outbox import alerts_recorded_since, outbox_snapshot
    from sluice.cli.output import check_data
    from sluice.streaming.cycle import run_quality

    settings = _settings(args, writes=True)
    outbox = outbox_snapshot(settings, settings.pipeline(args.pipeline).name)
    report = run_quality(settings, args.pipeline, deliver_alerts=not args.no_deliver)
    alerts = alerts_recorded_since(settings, args.pipeline, outbox)
    lines = [f"data quality {args.pipeline}: {len(report.checked) - len(report.failed)} passed, "
             f"{len(report.failed)} failed; Data Docs: {report.docs_index or '-'}"]
    lines += report.failure_lines()
    lines += alerts.render()
    # Failing windows are recorded and alerted; only --strict turns them into a failing exit code.
    code = EXIT_DQ_FAILED if report.failed and args.strict else EXIT_OK
    return Output(code, "\n".join(lines), check_data(args.pipeline, report, code, alerts))


def cmd_ingest(args: argparse.Namespace) -> int:
    from sluice.cli.report import accounting_table
    from sluice.core.spark import get_spark
    from sluice.ingest.landing import run_ingest
    from sluice.storage.engines import engine_for

    settings = _settings(args, writes=True)
    for stream in args.streams:
        settings.stream(stream)  # unknown names fail before the JVM starts
    spark = get_spark(settings, "sluice-ingest")
    run_ingest(spark, settings, engine_for(spark, settings), args.streams)
    print(accounting_table(settings, args.streams))
    return EXIT_OK


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
    from sluice.cli.output import backfill_data
    from sluice.streaming.backfill import run_backfill, validate_request

    settings = _settings(args, writes=True)
    request = validate_request(settings, args.pipeline, args.start, args.end, args.include_late)  # errors first
    _require_bronze(settings, args.pipeline)
    if args.check_only:
        from sluice.cli.output import retry_data
        from sluice.streaming.retry import run_recheck

        checked = run_recheck(settings, args.pipeline, request.start, request.end,
                              deliver_alerts=not args.no_deliver)
        code = EXIT_OK if args.no_fail_on_checks else checked.exit_code
        return Output(code, checked.render(), {**retry_data(checked), "exit_code": code})
    result = run_backfill(
        settings, args.pipeline, args.start, args.end, include_late=args.include_late,
        deliver_alerts=not args.no_deliver,
    )
    # The backfill DAG records failing windows here and lets its send_alerts task deliver them and fail the
    # run: failing this task instead would retry the whole backfill and skip the alerts.
    code = EXIT_OK if args.no_fail_on_checks else result.exit_code
    return Output(code, result.render(), backfill_data(result, code))


def cmd_retry(args: argparse.Namespace) -> Output:
    from sluice.cli.output import retry_data
    from sluice.streaming.retry import run_retry

    settings = _settings(args, writes=True)
    settings.pipeline(args.pipeline)  # an unknown name says which ones exist
    result = run_retry(settings, args.pipeline, check_only=args.check_only, include_late=args.include_late,
                       deliver_alerts=not args.no_deliver)
    return Output(result.exit_code, result.render(), retry_data(result))


def cmd_status(args: argparse.Namespace) -> Output:
    from sluice.cli.status import home_warnings, render_status, render_window, status_data, window_data

    settings = _settings(args, writes=False)
    for message in home_warnings(settings):
        warn(message)
    if args.window is not None:
        if args.json:
            return Output(EXIT_OK, "", window_data(settings, args.window, args.pipeline))
        return Output(EXIT_OK, render_window(settings, args.window, args.pipeline), {})
    if args.pipeline is not None:
        raise ConfigError("--pipeline chooses the pipeline of --window; give --window START too")
    data = status_data(settings) if args.json else {}
    return Output(EXIT_OK, "" if args.json else render_status(settings), data)


def cmd_demo(args: argparse.Namespace) -> int:
    _tools()
    from sluice_tools.demo import run_demo

    settings = _settings(args, writes=True)
    check_folder(_local_landing(settings, "demo"), "landing", writable=True, hint="SLUICE_LANDING (or SLUICE_HOME)")
    return run_demo(settings)


def _local_landing(settings: Settings, command: str) -> Path:
    """The landing folder of a command that writes landing files on this machine."""
    if not settings.landing.is_local:
        raise ConfigError(
            f"sluice {command} writes landing files to a local folder, and SLUICE_LANDING is {settings.landing.uri}: "
            f"run it with SLUICE_LANDING set to a local folder, then upload that folder's stream folders to "
            f"{settings.landing.uri}/ (for example with `aws s3 cp --recursive`)")
    return settings.landing.local()


def cmd_pipelines(args: argparse.Namespace) -> Output:
    from sluice.cli.describe import describe_registry, registry_data

    settings = _settings(args)
    code = EXIT_FAILED if settings.registry.errors and args.strict else EXIT_OK
    if args.json:
        return Output(code, "", registry_data(settings))
    return Output(code, describe_registry(settings), {})


def cmd_alerts(args: argparse.Namespace) -> Output:
    from sluice.cli.alerts import (
        alert_history,
        deliver,
        pending_alerts,
        render_alerts,
        render_delivered,
        render_history,
    )

    settings = _settings(args, writes=bool(args.deliver))
    if args.pipeline is not None:
        settings.pipeline(args.pipeline)  # an unknown name says which ones exist
    if args.all:
        filters = bool(args.kind or args.status or args.since)
        history = alert_history(settings, args.pipeline, kinds=args.kind or (), statuses=args.status or (),
                                since=args.since)
        return Output(EXIT_OK, render_history(history, args.pipeline, filters),
                      {"pipeline": args.pipeline, "alerts": history})
    code = EXIT_OK
    sent: list[dict[str, Any]] = []
    text = []
    if args.deliver:
        sent, channels = deliver(settings, args.pipeline)
        text.append(render_delivered(sent, channels))
        incomplete = [a for a in sent if set(channels) - set(a["channels"])]
        if incomplete:
            code = EXIT_FAILED
            warn(f"{len(incomplete)} alert(s) were not delivered through every configured channel "
                 f"({', '.join(channels)}); the errors above say why")
    pending = pending_alerts(settings, args.pipeline)
    if not args.deliver or pending:
        text.append(render_alerts(pending, args.pipeline))
    return Output(code, "\n".join(text), {"pipeline": args.pipeline, "pending": pending, "delivered": sent})


def cmd_new_pipeline(args: argparse.Namespace) -> int:
    from sluice.cli.scaffold import scaffold

    settings = _settings(args)
    registry = settings.registry
    declared = {stream: p.source or registry.path for p in registry.pipelines.values() for stream in p.streams}
    done = scaffold(args.name, settings.pipelines_path, tests_dir=Path(args.tests) if args.tests else None,
                    stream=args.stream, landing_root=settings.landing.local() if settings.landing.is_local else None,
                    declared_streams=declared)

    def shown(path: Path) -> str:  # relative to the working directory when under it: what a user types
        with contextlib.suppress(ValueError):
            return str(path.absolute().relative_to(Path.cwd()))
        return str(path)

    for path in done.files:
        print(f"created {shown(path)}")
    for folder in done.landing:
        print(f"landing {shown(folder)}/  (the stream's files go here; a file's mtime is its arrival time)")
    print(f"next: edit {shown(done.files[0])}, then `sluice pipelines` and `sluice run {args.name}`")
    return EXIT_OK


def _now_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--now", metavar="TS", type=_timestamp("--now"),
                        help="the time to run at, RFC 3339 with a zone, e.g. 2024-05-01T07:00:00Z "
                             "(default: $SLUICE_NOW, else the clock)")


def _timestamp(key: str) -> Any:
    """An argparse type: an RFC 3339 timestamp as aware UTC; a bad one is a usage error (exit 64)."""
    def convert(value: str) -> Any:
        from sluice.config import parse_time

        try:
            return parse_time(value, key)
        except ConfigError as exc:  # argparse names the option itself
            raise argparse.ArgumentTypeError(str(exc).removeprefix(f"{key}: ")) from None

    return convert


def _flag(value: str) -> bool:
    lowered = str(value).strip().lower()
    if lowered in {"true", "1", "yes"}:
        return True
    if lowered in {"false", "0", "no", ""}:
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {value!r}")


def _global_options(parser: argparse.ArgumentParser, *, defaults: bool) -> None:
    """Options every command takes, before or after its name. On the subcommands they default to SUPPRESS,
    so a value given before the subcommand is not overwritten by the subcommand's default."""
    def default(value: object) -> object:
        return value if defaults else argparse.SUPPRESS

    group: Any = parser if defaults else parser.add_argument_group("global options (also before the command)")
    group.add_argument("--home", metavar="DIR", default=default(None),
                       help="the sluice home (default: $SLUICE_HOME, else .sluice in the current directory)")
    group.add_argument("--pipelines", metavar="DIR", default=default(None),
                       help="the pipelines folder (default: $SLUICE_PIPELINES, else pipelines/)")
    group.add_argument("-v", "--verbose", action="store_true", default=default(False), help="debug logging")
    group.add_argument("--debug", action="store_true", default=default(False),
                       help="on an error, show the full traceback")


def _json_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true",
                        help="print one JSON document on stdout instead of text (logs stay on stderr)")


def _command(sub: Any, name: str, summary: str, description: str, examples: str = "",
             exit_codes: str = "") -> argparse.ArgumentParser:
    epilog = "\n\n".join(part for part in (examples and "examples:\n" + examples,
                                           exit_codes and "exit codes:\n" + exit_codes) if part)
    parser: argparse.ArgumentParser = sub.add_parser(
        name, help=summary, description=description, epilog=epilog or None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _global_options(parser, defaults=False)
    return parser


CYCLE_EXIT_CODES = """\
  0   every window checked passed (or none closed)
  1   the command itself failed (nothing half-written stays visible; run it again)
  2   some windows failed their checks: reported above, recorded and alerted
  64  wrong usage"""


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="sluice", description=DESCRIPTION, epilog=EPILOG,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    _global_options(parser, defaults=True)
    sub = parser.add_subparsers(dest="command", required=True, metavar="<command>", title="commands")

    gen = _command(
        sub, "generate", "write synthetic landing files for the example streams",
        "Write synthetic event files under $SLUICE_HOME/landing/, with controllable disorder, late, early,\n"
        "duplicate and malformed records and idle gaps. The same --seed writes the same bytes.",
        "  sluice generate --hours 6 --seed 7\n"
        "  sluice generate --hours 2 --late-share 0.01 --duplicate-share 0.02 --streams events",
    )
    try:
        from sluice_tools.generate import add_arguments
    except ImportError:  # installed without the repo's tools/: cmd_generate says what to do
        pass
    else:
        add_arguments(gen)
    gen.set_defaults(func=cmd_generate)

    run = _command(
        sub, "run", "one full cycle of a pipeline, without Airflow",
        "One full cycle of a pipeline: ingest the files that arrived for its streams, close the windows\n"
        "the watermark has passed, write them to the gold tables and check them (data quality). What the\n"
        "scheduled DAG does, in one process.",
        "  sluice run orders_hourly\n"
        "  sluice run orders_hourly --now 2024-05-01T07:00:00Z   # a fixed 'now' (also: $SLUICE_NOW)\n"
        "  sluice run orders_hourly --json | jq '.quality.failed'",
        CYCLE_EXIT_CODES,
    )
    run.add_argument("pipeline", help="a registered pipeline (see `sluice pipelines`)")
    _now_option(run)
    run.add_argument("--skip-quality", action="store_true",
                     help="ingest and aggregate only; `sluice check` validates later")
    run.add_argument("--no-deliver", action="store_true",
                     help="record failing windows' alerts in ops/alerts without sending them; "
                          "`sluice alerts --deliver` (or the DAG's send_alerts task) sends them")
    run.add_argument("--no-fail-on-checks", action="store_true",
                     help="exit 0 when windows fail their checks (still recorded and alerted; for the DAG)")
    _json_option(run)
    run.set_defaults(func=cmd_run)

    check = _command(
        sub, "check", "validate closed windows that are not validated yet",
        "Run the data-quality checks on every window that is closed but not validated yet (the DAGs'\n"
        "check_quality task). Failing windows are recorded and alerted; the exit code stays 0 unless\n"
        "--strict.",
        "  sluice check orders_hourly --strict",
        "  0   done (and, with --strict, every window passed)\n  1   the command failed\n"
        "  2   with --strict: some windows failed their checks\n  64  wrong usage",
    )
    check.add_argument("pipeline", help="a registered pipeline (see `sluice pipelines`)")
    _now_option(check)
    check.add_argument("--no-deliver", action="store_true", help="record alerts but do not send them")
    check.add_argument("--strict", action="store_true", help="exit 2 when a window fails")
    _json_option(check)
    check.set_defaults(func=cmd_check)

    ingest = _command(
        sub, "ingest", "ingest landing streams into bronze only",
        "Ingest the files that arrived for some streams into their bronze, quarantine and DLQ tables,\n"
        "without aggregating or checking.",
        "  sluice ingest orders",
    )
    ingest.add_argument("streams", nargs="+", help="stream names (see `sluice pipelines`)")
    _now_option(ingest)
    ingest.set_defaults(func=cmd_ingest)

    backfill = _command(
        sub, "backfill", "recompute a range of closed windows from bronze",
        "Recompute the windows in [start, end) from bronze, replace them in one atomic commit, check\n"
        "them again and mark them reprocessed. Running it twice gives the same tables. It waits for a\n"
        "scheduled run of the same pipeline to finish, and the other way round.",
        "  sluice backfill orders_hourly --start 2024-05-01T02:00:00Z --end 2024-05-01T05:00:00Z\n"
        "  sluice backfill orders_hourly --start 2024-05-01T00:00:00Z --end 2024-05-02T00:00:00Z "
        "--include-late",
        CYCLE_EXIT_CODES,
    )
    backfill.add_argument("pipeline", help="a registered pipeline (see `sluice pipelines`)")
    backfill.add_argument("--start", metavar="TS", required=True,
                          help="first window start, RFC 3339 (inclusive; on a window boundary)")
    backfill.add_argument("--end", metavar="TS", required=True,
                          help="range end, RFC 3339 (exclusive; on a window boundary)")
    backfill.add_argument(
        "--include-late", nargs="?", const="true", default="false", type=_flag, metavar="BOOL",
        help="also bring in the late (DLQ) records (a bare flag, or true/false)",
    )
    backfill.add_argument(
        "--check-only", nargs="?", const="true", default="false", type=_flag, metavar="BOOL",
        help="re-check the closed windows of the range as they stand, without rewriting gold (a bare flag, or "
             "true/false)",
    )
    _now_option(backfill)
    backfill.add_argument("--no-deliver", action="store_true",
                          help="record alerts but do not send them (`sluice alerts --deliver` sends them)")
    backfill.add_argument("--no-fail-on-checks", action="store_true",
                          help="exit 0 when windows fail their checks (still recorded and alerted; for the DAG)")
    _json_option(backfill)
    backfill.set_defaults(func=cmd_backfill)

    retry = _command(
        sub, "retry", "recompute and re-check the failed windows (like dbt retry)",
        "The windows whose checks failed (the ledger's failed state), again: recomputed from bronze and\n"
        "checked, as the backfills of each run of consecutive failed windows, without working out --start\n"
        "and --end by hand. --include-late brings their late (DLQ) records in; --check-only re-checks them\n"
        "as they stand (after a fix upstream of gold or to a threshold) without rewriting gold.",
        "  sluice retry orders_hourly\n  sluice retry orders_hourly --include-late\n"
        "  sluice retry orders_hourly --check-only",
        CYCLE_EXIT_CODES,
    )
    retry.add_argument("pipeline", help="a registered pipeline (see `sluice pipelines`)")
    retry.add_argument("--include-late", action="store_true", help="also bring in the windows' late (DLQ) records")
    retry.add_argument("--check-only", action="store_true", help="re-check the failed windows without recomputing")
    _now_option(retry)
    retry.add_argument("--no-deliver", action="store_true",
                       help="record alerts but do not send them (`sluice alerts --deliver` sends them)")
    _json_option(retry)
    retry.set_defaults(func=cmd_retry)

    status = _command(
        sub, "status", "watermarks, windows, row counts (no Spark, about a second)",
        "Where every line went per stream, the watermarks and last arrivals, the windows of each pipeline\n"
        "by state, failed windows, files that failed to load and row counts. Read from Delta metadata\n"
        "only.",
        "  sluice status\n  sluice --home /data/sluice status --json | jq '.pipelines'\n"
        "  sluice status --window 2024-05-01T10:00:00Z --pipeline orders_hourly   # one window, what changed",
    )
    status.add_argument("--now", type=_timestamp("--now"), help=argparse.SUPPRESS)
    status.add_argument("--window", metavar="START", type=_timestamp("--window"),
                        help="show the window starting at START (RFC 3339): its ledger row and, after a backfill "
                             "or correction, its gold rows before vs after (Delta time travel)")
    status.add_argument("--pipeline", metavar="NAME",
                        help="with --window: only this pipeline's window (default: every pipeline's)")
    _json_option(status)
    status.set_defaults(func=cmd_status)

    pipelines = _command(
        sub, "pipelines", "list the registered pipelines, and files that failed to load",
        "Every pipeline the pipelines folder registers (streams, window, schedule, outputs and checks),\n"
        "then every file that failed to load, with its problem.",
        "  sluice pipelines\n  sluice --pipelines ./my_pipelines pipelines --strict",
    )
    pipelines.add_argument("--strict", action="store_true", help="exit 1 when a pipeline file failed to load")
    _json_option(pipelines)
    pipelines.set_defaults(func=cmd_pipelines)

    alerts = _command(
        sub, "alerts", "list alerts recorded but not sent yet (--all: the history); --deliver sends them",
        "The alerts in ops/alerts that were recorded but not delivered yet (a run with --no-deliver, or a\n"
        "DAG run before its send_alerts task). --deliver sends them through the Airflow connections\n"
        "sluice_webhook and/or sluice_smtp (AIRFLOW_CONN_* variables are enough) and marks them sent.\n"
        "--all lists every alert recorded, with what became of it: sent (and through which channels),\n"
        "none (no channel was configured) or pending; --kind, --status and --since filter it.",
        "  sluice alerts\n  sluice alerts orders_hourly --deliver\n"
        "  sluice alerts --all --status none --since 2024-05-01T00:00Z",
        "  0   listed (or all delivered)\n  1   the command failed, or an alert failed on a channel\n"
        "  64  wrong usage",
    )
    alerts.add_argument("pipeline", nargs="?", help="only this pipeline's alerts (default: every pipeline)")
    alerts.add_argument("--deliver", action="store_true", help="send the pending alerts now")
    alerts.add_argument("--all", action="store_true",
                        help="the whole history: sent, none (no channel configured) and pending")
    alerts.add_argument("--kind", action="append", choices=KINDS,
                        help="with --all: only alerts of this kind (repeatable)")
    alerts.add_argument("--status", action="append", choices=("sent", "none", "pending"),
                        help="with --all: only alerts with this status (repeatable)")
    alerts.add_argument("--since", metavar="TS", type=_timestamp("--since"),
                        help="with --all: only alerts raised at or after TS (with a timezone)")
    _json_option(alerts)
    alerts.set_defaults(func=cmd_alerts)

    new = _command(
        sub, "new-pipeline", "scaffold a pipeline file (and a test) to start from",
        "Write NAME.py into the pipelines folder: a commented skeleton with one stream, one output and\n"
        "two checks, and create the stream's landing folder, $SLUICE_HOME/landing/<stream>/. With\n"
        "--tests, a first test too: it lands two valid records of the pipeline's first stream (built\n"
        "from the fields the file declares, so it keeps passing as you edit the file), runs one cycle\n"
        "and reads gold.",
        "  sluice new-pipeline device_temps --stream readings --tests tests",
    )
    new.add_argument("name", help="the pipeline name, e.g. device_temps (lower case, digits, '_')")
    new.add_argument("--stream", metavar="NAME",
                     help="the name of the skeleton's stream, e.g. readings (default: NAME_events)")
    new.add_argument("--tests", metavar="DIR", help="also write a test into this folder (default: none)")
    new.set_defaults(func=cmd_new_pipeline)

    demo = _command(
        sub, "demo", "generate a day of data and run every pipeline end to end",
        "Generate a day of example events and run every pipeline over it, files arriving as the clock\n"
        "advances; ends with where every record went. What `make run` shows, without Airflow.",
    )
    demo.add_argument("--now", type=_timestamp("--now"), help=argparse.SUPPRESS)
    demo.set_defaults(func=cmd_demo)
    return parser


@contextlib.contextmanager
def _stdout_to_stderr(enabled: bool) -> Iterator[None]:
    """With --json, stdout carries the document only: anything else written to it meanwhile (by Python code,
    or by the Spark JVM, which inherits file descriptor 1) goes to stderr."""
    if not enabled:
        yield
        return
    sys.stdout.flush()
    with contextlib.redirect_stdout(sys.stderr):  # print() here, whatever sys.stdout is (main() in a process)
        try:
            saved = os.dup(1)
            os.dup2(2, 1)
        except OSError:  # no usable descriptors (e.g. a closed stdout): nothing more to protect
            yield
            return
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 1)
            os.close(saved)


def _one_line(exc: BaseException) -> str:
    """The gist of an exception in one line: its first line (Spark's Java errors put the cause on the
    second), at most 500 characters."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if not lines:
        return ""
    text = lines[0]
    if text.startswith("An error occurred while calling") and len(lines) > 1:
        text = f"{text} {lines[1].lstrip(': ')}"
    return text if len(text) <= 500 else text[:497] + "..."


def _fail(exc: BaseException, *, expected: bool, debug: bool, as_json: bool) -> int:
    """One ``sluice: error:`` line on stderr (after the traceback with --debug); with --json, also the error
    document on stdout."""
    from sluice.cli.output import dumps, error_document

    if debug:
        traceback.print_exception(exc, file=sys.stderr)
    name = type(exc).__name__
    message = str(exc).strip() if expected else _one_line(exc)  # sluice's own messages are written to be read
    if expected:
        line = message or name
    else:
        line = f"{name}: {message}" if message else name
        if not debug:
            line += " (rerun with --debug for the traceback)"
    print(f"sluice: error: {line}", file=sys.stderr)
    if as_json:
        print(dumps(error_document(name, message, EXIT_FAILED)))
    return EXIT_FAILED


def _check_combinations(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Options that do not go together are usage errors (exit 64), like argparse's own."""
    if args.func is cmd_alerts:
        if (args.kind or args.status or args.since) and not args.all:
            parser.error("alerts: --kind, --status and --since filter the history: add --all, e.g. "
                         "`sluice alerts --all --status none`")
        if args.all and args.deliver:
            parser.error("alerts: --all lists the history and --deliver sends the pending alerts; run them one "
                         "at a time")
    if args.func is cmd_backfill and args.check_only and args.include_late:
        parser.error("backfill: --check-only re-checks gold as it stands, so it cannot bring in late data; use "
                     "--include-late without --check-only")
    if args.func is cmd_retry and args.check_only and args.include_late:
        parser.error("retry: --check-only re-checks gold as it stands, so it cannot bring in late data; drop "
                     "--check-only to recompute with --include-late")


def main(argv: Sequence[str] | None = None) -> int:
    from sluice.core.locks import LockTimeout

    parser = build_parser()
    args = parser.parse_args(argv)
    _check_combinations(parser, args)
    setup_logging(args.verbose)
    as_json = bool(getattr(args, "json", False))
    try:
        with _stdout_to_stderr(as_json):
            result = args.func(args)
    except (ConfigError, LockTimeout) as exc:  # things the user can fix: the message says how
        return _fail(exc, expected=True, debug=args.debug, as_json=as_json)
    except KeyboardInterrupt:
        print("sluice: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # the reader went away (`sluice ... | head`): not an error of the command
        return _reader_gone(EXIT_OK)
    except Exception as exc:
        return _fail(exc, expected=False, debug=args.debug, as_json=as_json)
    if isinstance(result, Output):
        from sluice.cli.output import dumps

        try:
            print(dumps(result.data) if as_json else result.text, flush=True)
        except BrokenPipeError:
            return _reader_gone(result.code)
        return result.code
    return int(result)


def _reader_gone(code: int) -> int:
    """stdout's reader closed the pipe: drop what is left unwritten, so the exit does not fail flushing it."""
    with contextlib.suppress(OSError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return code


if __name__ == "__main__":
    sys.exit(main())
