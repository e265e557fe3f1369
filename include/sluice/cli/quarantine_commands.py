"""``sluice quarantine <stream>``: the stream's quarantined records, counted per reason, with a few examples of
each (file and line, what was wrong, the raw line). Read from the Delta table without Spark, as ``status``."""

from __future__ import annotations

import argparse

from sluice.cli.common import EXIT_OK, Output, settings_of, warn


def cmd_quarantine(args: argparse.Namespace) -> Output:
    from sluice.reports.quarantine import quarantine_data, quarantine_view, render_quarantine
    from sluice.reports.status import home_warnings

    settings = settings_of(args, writes=False)
    settings.stream(args.stream)  # an unknown name says which ones exist, before anything is read
    for message in home_warnings(settings):
        warn(message)
    view = quarantine_view(settings, args.stream, args.reason, args.since, args.limit)
    if args.json:
        return Output(EXIT_OK, "", quarantine_data(view))
    return Output(EXIT_OK, render_quarantine(view), {})
