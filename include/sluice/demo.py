"""``sluice demo`` (what ``make run`` calls): generate a day of messy events and run every pipeline."""

from __future__ import annotations

import logging
from dataclasses import replace
from datetime import timedelta

from sluice.config import PIPELINE_STREAMS, Settings
from sluice.cycle import run_cycle
from sluice.spark import get_spark
from sluice.status import render_status

log = logging.getLogger("sluice.demo")


def run_demo(settings: Settings) -> int:
    from sluice.generate import GenerateOptions, generate

    options = GenerateOptions(hours=24)
    if not any(settings.landing.glob("*/*.json*")):
        log.info("demo: generating %d hours of synthetic events into %s", options.hours, settings.landing)
        manifest = generate(settings.landing, options, specs=settings.streams)
        print(manifest.describe(), "\n", flush=True)
    # "now" an hour after the data ends: every stream is idle by then, so heartbeats close the last hour.
    now = settings.now_override or options.start + timedelta(hours=options.hours + 1)
    settings = replace(settings, now_override=now)
    spark = get_spark(settings, "sluice-demo")
    worst = 0
    for pipeline in PIPELINE_STREAMS:
        result = run_cycle(settings, pipeline, spark=spark)
        print(result.render(), "\n", flush=True)
        worst = max(worst, result.exit_code)
    print(render_status(settings))
    return worst
