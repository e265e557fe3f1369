"""The ``sluice`` command: :func:`main` runs a command, maps its errors to exit codes and prints its output.

Each command is a thin wrapper around the functions the Airflow tasks call (``run_cycle``, ``run_backfill``,
``run_quality``, ``deliver_pending_alerts``...), so the CLI and the DAGs behave the same. A command returns
either an exit code or an :class:`Output` (its text for people and its ``--json`` document for scripts).

The parser is built in :mod:`sluice.cli.parser`; the commands live in :mod:`sluice.cli.run_commands` (run,
check, ingest, generate, demo), :mod:`sluice.cli.window_commands` (backfill, retry, status),
:mod:`sluice.cli.pipeline_commands` (pipelines, new-pipeline), :mod:`sluice.cli.alert_commands` (alerts) and
:mod:`sluice.cli.quarantine_commands` (quarantine).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import traceback
from collections.abc import Iterator, Sequence
from typing import NoReturn

from sluice.cli.alert_commands import cmd_alerts
from sluice.cli.common import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, Output
from sluice.cli.parser import build_parser
from sluice.cli.window_commands import cmd_backfill, cmd_retry
from sluice.config import ConfigError
from sluice.core import logsetup

__all__ = ["build_parser", "console", "main"]

log = logging.getLogger("sluice")


def setup_logging(verbose: bool = False) -> None:
    """Logs go to stderr, so stdout carries only the command's output (see :mod:`sluice.core.logsetup`)."""
    logsetup.configure(verbose)


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
    from sluice.reports.output import dumps, error_document

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
    from sluice.storage.locks import LockTimeout

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
        from sluice.reports.output import dumps

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


def console() -> NoReturn:
    """The ``sluice`` command (and ``python -m sluice.cli``): :func:`main`, then the process ends at once.

    Once a command has returned, everything it did is committed and its output is written. What Python would
    still do is tear down its modules, and a command that imported Great Expectations, pandas, PyArrow, delta-rs
    and PySpark spent 0.6-0.7 s on that after its last line (measured 2026-12-06: 0.67 s for those imports
    alone, 0.02 s without the teardown). The Spark JVM, sluice's child, ends on its own when this process does,
    as it would after a normal exit. :func:`main` itself returns, for the tests and ``jobs/sluice_job.py``."""
    exit_now(main())


def exit_now(code: int) -> NoReturn:
    """Flush the logs and both streams, then end the process with ``code``, skipping Python's teardown."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a reader that went away, a stream already closed
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    console()
