"""``sluice new-pipeline NAME``: a pipeline file to start from, and optionally a test for it, the way
``dbt init`` or ``astro dev init`` start a project."""

from __future__ import annotations

import re
from pathlib import Path

from sluice.core.errors import ConfigError

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

TEST_TEMPLATE = '''"""A first test for the {name} pipeline: land two records, run one cycle, read gold."""

import json
import os
import subprocess
from pathlib import Path

from deltalake import DeltaTable

PIPELINES = Path(__file__).resolve().parents[1] / "pipelines"


def test_{name}_counts_records(tmp_path: Path) -> None:
    landing = tmp_path / "home" / "landing" / "{stream}"
    landing.mkdir(parents=True)
    records = [{{"{stream}_id": str(i), "key": "a", "value": 1.5, "event_time": "2024-05-01T00:1{{}}:00Z".format(i)}}
               for i in range(2)]
    (landing / "part-1.jsonl").write_text("\\n".join(json.dumps(r) for r in records) + "\\n")
    os.utime(landing / "part-1.jsonl", (1714522800, 1714522800))  # arrived 2024-05-01T00:20Z
    env = {{**os.environ, "SLUICE_HOME": str(tmp_path / "home"), "SLUICE_PIPELINES": str(PIPELINES)}}
    done = subprocess.run(["sluice", "run", "{name}", "--now", "2024-05-01T03:00:00Z"], env=env, check=False)
    assert done.returncode == 0
    gold = DeltaTable(str(tmp_path / "home" / "lake" / "gold" / "{name}")).to_pyarrow_table().to_pylist()
    assert [(r["key"], r["records"]) for r in gold] == [("a", 2)]
'''


def scaffold(name: str, pipelines_dir: Path, *, tests_dir: Path | None = None) -> list[Path]:
    if not re.match(r"^[a-z][a-z0-9_]*$", name):
        raise ConfigError(f"pipeline name {name!r} is not valid; use lower-case letters, digits and '_', "
                          "starting with a letter, e.g. device_temps")
    target = pipelines_dir / f"{name}.py"
    if target.exists():
        raise ConfigError(f"{target} already exists; pick another name or edit that file")
    stream = f"{name}_events"
    pipelines_dir.mkdir(parents=True, exist_ok=True)
    target.write_text(PIPELINE_TEMPLATE.format(name=name, stream=stream))
    created = [target]
    if tests_dir is not None:
        test = tests_dir / f"test_{name}.py"
        if test.exists():
            raise ConfigError(f"{test} already exists; pick another name or edit that file")
        tests_dir.mkdir(parents=True, exist_ok=True)
        test.write_text(TEST_TEMPLATE.format(name=name, stream=stream))
        created.append(test)
    return created
