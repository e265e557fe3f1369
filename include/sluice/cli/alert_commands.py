"""The ``alerts`` command: the alerts recorded but not sent yet, their history (``--all``), and delivering
them (``--deliver``)."""

from __future__ import annotations

import argparse
from typing import Any

from sluice.cli.common import EXIT_FAILED, EXIT_OK, Output, settings_of, warn


def cmd_alerts(args: argparse.Namespace) -> Output:
    from sluice.cli.alerts import (
        alert_history,
        deliver,
        pending_alerts,
        render_alerts,
        render_delivered,
        render_history,
    )

    settings = settings_of(args, writes=bool(args.deliver))
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
