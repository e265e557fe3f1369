"""``sluice new-pipeline NAME``: a pipeline file to start from, the landing folder of its stream, and
optionally a test for it, the way ``dbt init`` or ``astro dev init`` start a project."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from string import Template

from sluice.core.errors import ConfigError

_NAME = re.compile(r"^[a-z][a-z0-9_]*$")

PIPELINE_TEMPLATE = '''"""{name}: describe what this pipeline computes, for the DAG's documentation."""

from __future__ import annotations

from pyspark.sql import functions as F

from sluice import Output, Pipeline, Stream, checks

{stream} = Stream(
    name="{stream}",                       # reads landing/{stream}/*.jsonl
    fields={{"{stream}_id": "string", "key": "string", "value": "double", "event_time": "timestamp"}},
    id="{stream}_id",                      # the dedup key
    required=["{stream}_id", "key", "event_time"],
    watermark_delay="5m",
)


def build(inputs, window):
    """Rows of one window per key: a `window` column, the key, the metrics."""
    rows = inputs["{stream}"]
    return (rows.groupBy(window.column("event_time"), "key")
                .agg(F.count("*").alias("records"), F.avg("value").alias("avg_value")))


pipeline = Pipeline(
    name="{name}",
    description=__doc__ or "",
    streams=[{stream}],
    window="1h",                           # or ("15m", "5m") for hopping windows
    schedule="*/15 * * * *",
    outputs=[Output("{name}", build, key="key",
                    checks=[checks.completeness("records", stream="{stream}"),
                            checks.not_null("avg_value")])],
)
'''

# The generated test reads the stream's declaration from the pipeline file, so it keeps passing when the
# skeleton above is replaced by the team's own stream and output (the README's tutorial does exactly that).
TEST_TEMPLATE = Template('''"""A first test for the ${name} pipeline.

Two valid records of its first stream, built from the fields the pipeline file declares, land in a fresh
SLUICE_HOME; one `sluice run` must accept both, pass its checks and write gold rows. It follows the pipeline
file as you edit it; add tests with your own records and expected values beside it."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from deltalake import DeltaTable

from sluice import Pipeline, Stream
from sluice.config import without_settings

NAME = "${name}"
PIPELINES = (Path(__file__).resolve().parent / "${pipelines}").resolve()
ARRIVAL = datetime(2024, 5, 1, 0, 20, tzinfo=UTC)  # the landing file's mtime: its arrival time
EVENT_TIMES = [datetime(2024, 5, 1, 0, 10, tzinfo=UTC), datetime(2024, 5, 1, 0, 11, tzinfo=UTC)]


def rfc3339(ts: datetime) -> str:
    return ts.strftime("%Y-%m-%dT%H:%M:%SZ")


def load_pipeline() -> Pipeline:
    """The Pipeline named NAME, imported from its file as sluice imports it (helpers such as a shared
    `_streams.py` are importable from the pipelines folder)."""
    sys.path.insert(0, str(PIPELINES))
    try:
        spec = importlib.util.spec_from_file_location(f"_pipeline_under_test_{NAME}", PIPELINES / f"{NAME}.py")
        assert spec is not None and spec.loader is not None, f"cannot import {PIPELINES / f'{NAME}.py'}"
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(PIPELINES))
    found = [v for v in vars(module).values() if isinstance(v, Pipeline) and v.name == NAME]
    assert found, f"{NAME}.py defines no Pipeline named {NAME!r}"
    return found[0]


def valid_record(stream: Stream, i: int) -> dict[str, Any]:
    """Record ``i``: a distinct id, the event time, and a plausible value of every other declared field (the
    same for both records, so they share their keys)."""
    event_time = EVENT_TIMES[i]
    plain = {"string": "test", "long": 1, "double": 21.5, "boolean": True, "timestamp": rfc3339(event_time)}
    ids = {"string": f"{NAME}-test-{i}", "long": i + 1, "double": i + 1.5, "boolean": i == 0,
           "timestamp": rfc3339(event_time.replace(second=i))}
    record = {name: plain[kind] for name, kind in stream.fields.items()}
    record[stream.id] = ids[stream.fields[stream.id]]
    record[stream.event_time] = rfc3339(event_time)
    return record


def test_${name}_accepts_two_records_and_writes_gold(tmp_path: Path) -> None:
    pipeline = load_pipeline()
    stream = pipeline.streams[0]
    home = tmp_path / "home"
    landing = home / "landing" / stream.name
    landing.mkdir(parents=True)
    part = landing / "part-1.jsonl"
    part.write_text("".join(json.dumps(valid_record(stream, i)) + "\\n" for i in range(len(EVENT_TIMES))))
    os.utime(part, (ARRIVAL.timestamp(), ARRIVAL.timestamp()))
    # Late enough that the stream has been idle for its idle_timeout: its heartbeat moves the watermark past
    # every window holding the two records, so they all close, are checked, and reach gold.
    waits = [pipeline.window_size, pipeline.lateness_bound, stream.idle_timeout, stream.watermark_delay]
    assert all(isinstance(w, timedelta) for w in waits), waits  # Pipeline and Stream parse their durations
    now = ARRIVAL + sum((w for w in waits if isinstance(w, timedelta)), timedelta())
    env = without_settings(os.environ)  # no setting of yours leaks in (the jar cache does)
    env.update(SLUICE_HOME=str(home), SLUICE_PIPELINES=str(PIPELINES))
    done = subprocess.run(
        [sys.executable, "-m", "sluice.cli", "run", NAME, "--now", rfc3339(now), "--json"],
        capture_output=True, text=True, check=False, env=env, timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(done.stdout)
    (counts,) = [s["total"] for s in report["streams"] if s["stream"] == stream.name]
    assert (counts["lines"], counts["accepted"], counts["quarantined"]) == (2, 2, 0), counts
    gold = DeltaTable(str(home / "lake" / "gold" / pipeline.outputs[0].name)).to_pyarrow_table().to_pylist()
    assert gold, f"gold/{pipeline.outputs[0].name} has no rows: {report}"
''')


@dataclass
class Scaffolded:
    """What ``new-pipeline`` created: the pipeline file (first), the test, and the landing folders."""

    files: list[Path] = field(default_factory=list)
    landing: list[Path] = field(default_factory=list)


def scaffold(
    name: str,
    pipelines_dir: Path,
    *,
    tests_dir: Path | None = None,
    stream: str | None = None,
    landing_root: Path | None = None,
    declared_streams: Mapping[str, Path] | None = None,
) -> Scaffolded:
    """Write ``NAME.py`` (one stream, ``stream`` or ``NAME_events``; one output; two checks) into
    ``pipelines_dir``, with ``tests_dir`` a test into that folder, and with ``landing_root`` create the
    stream's landing folder ``landing_root/<stream>/`` (kept if it exists). ``declared_streams`` (stream
    name -> the file declaring it) refuses a stream another pipeline file already declares."""
    if not _NAME.match(name):
        raise ConfigError(f"pipeline name {name!r} is not valid; use lower-case letters, digits and '_', "
                          "starting with a letter, e.g. device_temps")
    stream = stream or f"{name}_events"
    if not _NAME.match(stream):
        raise ConfigError(f"stream name {stream!r} is not valid; use lower-case letters, digits and '_', "
                          "starting with a letter, e.g. readings")
    target = pipelines_dir / f"{name}.py"
    if target.exists():
        raise ConfigError(f"{target} already exists; pick another name or edit that file")
    if declared_streams and stream in declared_streams:
        raise ConfigError(f"stream {stream!r} is already declared in {declared_streams[stream]}; pick another "
                          "--stream, or import that Stream into your pipeline file and list it in streams=[...]")
    test = tests_dir / f"test_{name}.py" if tests_dir is not None else None
    if test is not None and test.exists():
        raise ConfigError(f"{test} already exists; pick another name or edit that file")
    pipelines_dir.mkdir(parents=True, exist_ok=True)
    target.write_text(PIPELINE_TEMPLATE.format(name=name, stream=stream))
    done = Scaffolded(files=[target])
    if test is not None:
        assert tests_dir is not None
        tests_dir.mkdir(parents=True, exist_ok=True)
        relative = Path(os.path.relpath(pipelines_dir.resolve(), tests_dir.resolve())).as_posix()
        test.write_text(TEST_TEMPLATE.substitute(name=name, pipelines=relative))
        done.files.append(test)
    if landing_root is not None:
        folder = landing_root / stream
        folder.mkdir(parents=True, exist_ok=True)
        done.landing.append(folder)
    return done
