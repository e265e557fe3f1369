"""The ``sluice`` argument parser: the commands, their options, help texts and usage errors (exit 64)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, NoReturn

from sluice.alerting.alert import KINDS
from sluice.cli.alert_commands import cmd_alerts
from sluice.cli.common import EXIT_USAGE
from sluice.cli.pipeline_commands import cmd_new_pipeline, cmd_pipelines, cmd_plan
from sluice.cli.quarantine_commands import cmd_quarantine
from sluice.cli.run_commands import cmd_check, cmd_demo, cmd_generate, cmd_ingest, cmd_run
from sluice.cli.window_commands import cmd_backfill, cmd_retry, cmd_status
from sluice.config import ConfigError
from sluice.storage.tables import QUARANTINE_REASONS

DISTRIBUTION = "sluice"  # [project] name in pyproject.toml

DESCRIPTION = """\
sluice runs event-time pipelines: it ingests the JSON event files that land under
$SLUICE_HOME/landing/<stream>/ into Delta tables, closes windows by watermark, writes
the gold tables and checks every closed window with Great Expectations.
Airflow runs the same code on a schedule; this command runs it by hand."""

EPILOG = """\
examples:
  sluice pipelines                               what is registered: streams, windows, checks
  sluice plan device_temps                       what an edit to a pipeline changes, before it runs
  sluice run device_temps                        one full cycle: ingest, aggregate, check
  sluice run device_temps --now 2024-05-01T07:00:00Z
  sluice backfill device_temps --start 2024-05-01T02:00:00Z --end 2024-05-01T05:00:00Z
  sluice retry device_temps                      recompute and re-check the failed windows
  sluice status                                  watermarks, windows, row counts
  sluice status --json | jq '.streams'           the same, for scripts
  sluice quarantine readings                     the lines a stream rejected, and why
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
retry, check, pipelines, plan, alerts or quarantine for one JSON document on stdout (logs stay on
stderr)."""


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


def _positive(key: str) -> Any:
    """An argparse type: a whole number >= 0 (0: counts only)."""
    def convert(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            number = -1
        if number < 0:
            raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {value!r}")
        return number

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
        "  sluice run device_temps\n"
        "  sluice run device_temps --now 2024-05-01T07:00:00Z   # a fixed 'now' (also: $SLUICE_NOW)\n"
        "  sluice run device_temps --json | jq '.quality.failed'",
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
        "  sluice check device_temps --strict",
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
        "  sluice ingest readings",
    )
    ingest.add_argument("streams", nargs="+", help="stream names (see `sluice pipelines`)")
    _now_option(ingest)
    ingest.set_defaults(func=cmd_ingest)

    backfill = _command(
        sub, "backfill", "recompute a range of closed windows from bronze",
        "Recompute the windows in [start, end) from bronze, replace them in one atomic commit, check\n"
        "them again and mark them reprocessed. Running it twice gives the same tables. It waits for a\n"
        "scheduled run of the same pipeline to finish, and the other way round.",
        "  sluice backfill device_temps --start 2024-05-01T02:00:00Z --end 2024-05-01T05:00:00Z\n"
        "  sluice backfill device_temps --start 2024-05-01T00:00:00Z --end 2024-05-02T00:00:00Z "
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
        "  sluice retry device_temps\n  sluice retry device_temps --include-late\n"
        "  sluice retry device_temps --check-only",
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
        "  sluice status --window 2024-05-01T10:00:00Z --pipeline device_temps   # one window, what changed",
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

    plan = _command(
        sub, "plan", "what a change to a pipeline file changes, and what the next run will do about it",
        "Per output, its definition now (Spark's analyzed plan of build over the declared streams, the\n"
        "window, keys, lateness bound, checks and stream declarations) against the one its gold was last\n"
        "built with: columns added, removed or retyped, and each other change before -> after. Then what\n"
        "the next run does, as on_change says: rebuild the closed windows (which, over which range), go\n"
        "forward, or refuse. A comment-only edit is no change. Starts no Spark job; writes nothing.",
        "  sluice plan device_temps\n  sluice plan --json | jq '.pipelines[].outputs[].next_run'",
        exit_codes="  0   the plan was printed, whether or not anything changed\n"
                   "  1   the command failed (a pipeline file that does not load, an unknown pipeline)",
    )
    plan.add_argument("pipeline", nargs="?", help="one pipeline (default: every registered pipeline)")
    _json_option(plan)
    plan.set_defaults(func=cmd_plan)

    alerts = _command(
        sub, "alerts", "list alerts recorded but not sent yet (--all: the history); --deliver sends them",
        "The alerts in ops/alerts that were recorded but not delivered yet (a run with --no-deliver, or a\n"
        "DAG run before its send_alerts task). --deliver sends them through the Airflow connections\n"
        "sluice_webhook and/or sluice_smtp (AIRFLOW_CONN_* variables are enough) and marks them sent.\n"
        "--all lists every alert recorded, with what became of it: sent (and through which channels),\n"
        "none (no channel was configured) or pending; --kind, --status and --since filter it.",
        "  sluice alerts\n  sluice alerts device_temps --deliver\n"
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

    quarantine = _command(
        sub, "quarantine", "a stream's quarantined lines: counts per reason and examples (no Spark)",
        "The records of a stream that went to quarantine/<stream>, counted per reason, with a few examples\n"
        "of each: the file and line number, what was wrong (detail; for malformed_json what the JSON parser\n"
        "said) and the raw line. Newest file first, lines in file order. Read from Delta metadata and files\n"
        "without Spark. Blank lines are no records: they are not quarantined (ops/ingest_batches.skipped).",
        "  sluice quarantine readings\n"
        "  sluice quarantine readings --reason malformed_json --limit 10\n"
        "  sluice quarantine readings --since 2024-05-01T00:00:00Z --json | jq '.counts'",
    )
    quarantine.add_argument("stream", help="a stream (see `sluice pipelines`)")
    quarantine.add_argument("--reason", action="append", choices=QUARANTINE_REASONS,
                            help="only records quarantined for this reason (repeatable)")
    quarantine.add_argument("--since", metavar="TS", type=_timestamp("--since"),
                            help="only records whose file arrived at or after TS (RFC 3339 with a zone)")
    quarantine.add_argument("--limit", metavar="N", type=_positive("--limit"), default=3,
                            help="examples per reason (default: 3)")
    _json_option(quarantine)
    quarantine.set_defaults(func=cmd_quarantine)

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
