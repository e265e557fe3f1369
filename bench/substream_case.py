"""``make bench``'s substream case (issue 55): SPEC 8's pipeline with ``substream="device_id",
skew_tolerance="3h"`` beside the same pipeline without substreams, on the same landing files, in one run.

The readings: ``--substreams`` devices (default 100,000), each with its own clock offset spread evenly over
[0, 2 h) behind true time, 6 hours of true time in 24 files of 15 minutes each (arriving at the end of their
quarter). With substreams every reading is accepted and each device's windows close on its own clock. The same
data without substreams is compared with the workaround a team uses today, a ``watermark_delay`` of hours
(``3h``): it too accepts every reading (with the usual ``2m`` most devices' readings would go to the DLQ, and the
two cycles would not do the same work). Stages, each from a fresh home:

* ``substream_cycle``: the 24 files, one cycle, with substreams (``watermark_delay="2m"``, ``skew_tolerance="3h"``);
* ``substream_plain``: the same files and cycle without them (``watermark_delay="3h"``).

Both cycles run at :data:`AFTER_DATA` past the last file, as the main bench's ``cycle`` does: their idle heartbeats
move both watermarks past every window, so each cycle closes the whole day and writes the same gold (checked,
untimed: ``gold_rows`` in each run's details). Earlier, the substream cycle would have written each device's rows
up to its own clock and the plain one only the windows its 3-hour delay had passed: different work.

Ratio ``substream_cycle/plain`` (target 1.2): what a watermark per key costs over the same data.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

PIPELINE = "device_temps"
FILES = 24
QUARTER = timedelta(minutes=15)
SKEW = timedelta(hours=2)
# After the last file: the 3-hour delay (plain) or skew_tolerance (substreams), the idle timeout (30 minutes) and
# the last window's 15 minutes, with margin: an idle heartbeat then closes every window on both sides.
AFTER_DATA = timedelta(hours=4, minutes=15)
PIPELINE_FILE = '''from pyspark.sql import functions as F

from sluice import Output, Pipeline, Stream, checks

readings = Stream(
    name="readings",
    fields={{"reading_id": "string", "device_id": "string", "temp_c": "double", "event_time": "timestamp"}},
    id="reading_id",
    required=["reading_id", "device_id", "event_time"],
    watermark_delay={delay},{substream}
)


def device_temps(inputs, window):
    r = inputs["readings"]
    return (r.where(F.col("temp_c").isNotNull())
             .groupBy(window.column("event_time"), "device_id")
             .agg(F.count("*").alias("readings"), F.avg("temp_c").alias("avg_temp_c")))


pipeline = Pipeline(
    name="device_temps",
    streams=[readings],
    window=("15m", "5m"),
    outputs=[Output("device_temps", device_temps, key="device_id",
                    checks=[checks.completeness("readings", stream="readings"),
                            checks.between("avg_temp_c", -60, 100)])],
)
'''
SUBSTREAM = '\n    substream="device_id",\n    skew_tolerance="3h",'


def write_files(landing: Path, events: int, devices: int, start: datetime) -> None:
    """``events`` readings over ``FILES`` quarter-hour files; device ``d`` runs ``SKEW * d / devices`` behind."""
    folder = landing / "readings"
    folder.mkdir(parents=True)
    n = 0
    for f in range(FILES):
        begin = start + QUARTER * f
        per_file = events * (f + 1) // FILES - events * f // FILES
        step = QUARTER / per_file
        lines = []
        for i in range(per_file):
            device = n % devices
            true_time = begin + step * i
            event_time = true_time - SKEW * device / devices
            lines.append(json.dumps({"reading_id": f"r{n}", "device_id": f"d{device}", "temp_c": 15.0 + n % 200 / 10,
                                     "event_time": event_time.strftime("%Y-%m-%dT%H:%M:%S.%fZ")}))
            n += 1
        path = folder / f"readings-{f:02d}.jsonl"
        path.write_text("\n".join(lines) + "\n")
        arrival = (begin + QUARTER).timestamp()
        os.utime(path, (arrival, arrival))


class SubstreamCase:
    """Runs the substream stages on a :class:`run.Bench` (its ``record``, environment and Spark settings)."""

    def __init__(self, bench: Any, events: int, devices: int, parse_sluice: Any) -> None:
        self.bench = bench
        self.events = events
        self.devices = devices
        self.parse_sluice = parse_sluice
        self.root = bench.work / "substreams"

    def run(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
        self.root.mkdir(parents=True)
        start = datetime(2024, 5, 1, tzinfo=UTC)
        landing = self.root / "landing"
        write_files(landing, self.events, self.devices, start)
        print(f"[bench] substreams: {self.events:,} readings of {self.devices:,} devices in {FILES} files",
              file=sys.stderr, flush=True)
        now = (start + QUARTER * FILES + AFTER_DATA).isoformat()
        for stage, delay, declared in (("substream_plain", '"3h"', ""), ("substream_cycle", '"2m"', SUBSTREAM)):
            pipelines = self.root / f"{stage}-pipelines"
            pipelines.mkdir()
            (pipelines / "device_temps.py").write_text(PIPELINE_FILE.format(delay=delay, substream=declared))
            home = self.root / stage
            env = {**self.bench.env, "SLUICE_HOME": str(home), "SLUICE_PIPELINES": str(pipelines),
                   "SLUICE_LANDING": str(landing), "SLUICE_NOW": now}
            run = self.bench.record(stage, self.events, 0, [*self.bench.sluice, "run", PIPELINE, "--now", now],
                                    env=env, parser=self.parse_sluice)
            run.details["gold_rows"] = gold_rows(home / "lake" / "gold" / PIPELINE)


def gold_rows(path: Path) -> int | None:
    """The rows of a gold table (None when the cycle wrote none), read without Spark."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        return int(DeltaTable(str(path)).to_pyarrow_dataset().count_rows())
    except TableNotFoundError:  # the cycle failed, which its run's rc says
        return None
