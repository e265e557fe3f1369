"""SPEC 8: the public API validates definitions at load time, and the pipelines folder is discovered file by
file, so that one broken file names itself and its problem without hiding the other pipelines."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from datetime import timedelta
from pathlib import Path

import pytest

from sluice import Output, Pipeline, Stream, checks
from sluice.config import ConfigError, load_settings
from sluice.core.errors import DefinitionError
from sluice.core.model import PipelineDef, StreamSpec
from sluice.core.registry import load_registry
from support.spec_example import SPEC_EXAMPLE

REPO = Path(__file__).resolve().parents[1]

GOOD = SPEC_EXAMPLE


def write(folder: Path, name: str, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(textwrap.dedent(text))
    return path


def build(inputs, window):  # type: ignore[no-untyped-def]
    return inputs


def stream(**overrides: object) -> Stream:
    values: dict[str, object] = {
        "name": "s", "fields": {"s_id": "string", "event_time": "timestamp"}, "id": "s_id",
    }
    values.update(overrides)
    return Stream(**values)  # type: ignore[arg-type]


def test_the_spec_example_registers_with_its_streams_window_and_checks(tmp_path: Path) -> None:
    write(tmp_path, "device_temps.py", GOOD)
    registry = load_registry(tmp_path)
    assert registry.errors == []
    pipeline = registry.pipelines["device_temps"]
    assert pipeline.streams == ("readings",)
    assert (pipeline.window.size, pipeline.window.hop) == (timedelta(minutes=15), timedelta(minutes=5))
    assert pipeline.schedule == "*/5 * * * *"
    assert [c.name for c in pipeline.outputs[0].checks] == [
        "completeness:readings", "validity:avg_temp_c_between_-60_and_100"]
    spec = registry.streams["readings"]
    assert spec.watermark_delay == timedelta(minutes=2)
    assert spec.early_tolerance == timedelta(minutes=5) and spec.idle_timeout == timedelta(minutes=30)
    assert spec.type_of("temp_c") == "double" and spec.required == ("reading_id", "device_id", "event_time")


@pytest.mark.parametrize(("overrides", "message"), [
    ({"fields": {"s_id": "string", "event_time": "timestamp", "x": "int"}}, "unknown type 'int'"),
    ({"fields": {"s_id": "string"}}, "event-time field 'event_time' is missing"),
    ({"fields": {"s_id": "string", "event_time": "string"}}, "must have type 'timestamp'"),
    ({"id": "nope"}, "id field 'nope' is missing from fields"),
    ({"required": ["s_id", "ghost"]}, "required field 'ghost' is missing from fields"),
    ({"name": "Bad Name"}, "stream name 'Bad Name' is not valid"),
    ({"watermark_delay": "soon"}, "watermark_delay: 'soon' is not a duration"),
    ({"fields": {"s_id": "string", "event_time": "timestamp", "source_file": "string"}}, "clashes with a column"),
])
def test_stream_definitions_fail_with_what_to_fix(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(DefinitionError, match=message):
        stream(**overrides)


def test_event_time_can_have_another_name() -> None:
    s = stream(fields={"s_id": "string", "ts": "timestamp"}, event_time="ts")
    assert s.required == ("s_id", "ts")


def test_pipeline_definitions_fail_with_what_to_fix() -> None:
    out = Output("o", build, key="k")
    with pytest.raises(DefinitionError, match="streams must be a non-empty list"):
        Pipeline(name="p", streams=[], outputs=[out])
    with pytest.raises(DefinitionError, match="outputs must be a non-empty list"):
        Pipeline(name="p", streams=[stream()], outputs=[])
    with pytest.raises(DefinitionError, match="window must be a size"):
        Pipeline(name="p", streams=[stream()], outputs=[out], window=("1h", "5m", "x"))
    with pytest.raises(DefinitionError, match="names stream 'other'"):
        Pipeline(name="p", streams=[stream()], outputs=[
            Output("o", build, key="k", checks=[checks.completeness("n", stream="other")])])
    with pytest.raises(DefinitionError, match="two outputs are named alike"):
        Pipeline(name="p", streams=[stream()], outputs=[out, out])
    with pytest.raises(DefinitionError, match="low 5 is above high 1"):
        checks.between("x", 5, 1)
    with pytest.raises(DefinitionError, match="is not a check"):
        Output("o", build, key="k", checks=["not_null"])  # type: ignore[list-item]


def test_a_broken_file_names_itself_and_never_hides_the_others(tmp_path: Path) -> None:
    write(tmp_path, "device_temps.py", GOOD)
    write(tmp_path, "import_error.py", "import no_such_module_anywhere\n")
    write(tmp_path, "bad_type.py", '''
        from sluice import Output, Pipeline, Stream
        s = Stream(name="other", fields={"o_id": "uuid", "event_time": "timestamp"}, id="o_id")
    ''')
    write(tmp_path, "z_clash.py", GOOD.replace('name="readings"', 'name="readings"').replace(
        '"2m"', '"3m"').replace("device_temps", "device_temps2"))
    write(tmp_path, "z_same_name.py", GOOD.replace('watermark_delay="2m"', 'watermark_delay="2m"'))
    write(tmp_path, "missing_required.py", '''
        from sluice import Stream
        s = Stream(name="x", fields={"x_id": "string", "event_time": "timestamp"}, id="x_id",
                   required=["x_id", "size"])
    ''')
    write(tmp_path, "_helpers.py", "raise RuntimeError('helpers are not pipelines')\n")
    registry = load_registry(tmp_path)
    assert sorted(registry.pipelines) == ["device_temps"]
    errors = {e.file.name: e.message for e in registry.errors}
    assert sorted(errors) == ["bad_type.py", "import_error.py", "missing_required.py", "z_clash.py", "z_same_name.py"]
    assert "ModuleNotFoundError" in errors["import_error.py"] and "no_such_module_anywhere" in errors["import_error.py"]
    assert "unknown type 'uuid'" in errors["bad_type.py"] and "line 3" in errors["bad_type.py"]
    assert "stream 'readings' is declared differently" in errors["z_clash.py"]
    assert "already declared in" in errors["z_same_name.py"] and "device_temps.py" in errors["z_same_name.py"]
    assert "required field 'size' is missing from fields" in errors["missing_required.py"]

    settings = load_settings({"SLUICE_PIPELINES": str(tmp_path), "SLUICE_HOME": str(tmp_path / "home")})
    assert settings.pipeline("device_temps").name == "device_temps"
    with pytest.raises(ConfigError, match=r"could not be loaded: .*import_error\.py"):
        settings.pipeline("import_error")
    with pytest.raises(ConfigError, match="unknown pipeline 'nope'; choose one of: device_temps"):
        settings.pipeline("nope")


def test_a_shared_stream_is_declared_once_in_a_helper_module(tmp_path: Path) -> None:
    write(tmp_path, "_streams.py", GOOD.split("def device_temps")[0])
    for name in ("a", "b"):
        write(tmp_path, f"{name}.py", f'''
            from pyspark.sql import functions as F
            from sluice import Output, Pipeline
            from _streams import readings

            def build(inputs, window):
                return inputs["readings"].groupBy(window.column("event_time"), "device_id").agg(F.count("*").alias("n"))

            pipeline = Pipeline(name="{name}", streams=[readings],
                                outputs=[Output("{name}_out", build, key="device_id")])
        ''')
    registry = load_registry(tmp_path)
    assert registry.errors == []
    assert registry.pipelines_reading("readings") == ["a", "b"]
    assert list(registry.streams) == ["readings"]


def test_the_package_knows_no_pipeline_or_stream_name() -> None:
    """Issue 9: the shipped pipelines are user code; nothing in the package may name them."""
    found = subprocess.run(
        # (Data Docs' vendored third-party assets are not sluice's code.)
        ["grep", "-rniE", "--exclude-dir=docs_static", "impressions|ad_clicks|user_activity|clicks|unmatched",
         str(REPO / "include")],
        capture_output=True, text=True, check=False,
    ).stdout.splitlines()
    # Only comments and docstrings may mention them (as examples).
    code = [line for line in found if not _is_prose(line)]
    assert code == [], "\n".join(code)


def _is_prose(grep_line: str) -> bool:
    text = grep_line.split(":", 2)[-1].strip()
    return text.startswith(("#", '"""', "*", "``", "-")) or not any(c in text for c in "=()[]{}") or '"""' in text


def test_sluice_pipelines_lists_what_is_registered_and_what_is_broken(tmp_path: Path) -> None:
    write(tmp_path, "device_temps.py", GOOD)
    write(tmp_path, "broken.py", "def broken(:\n")
    done = subprocess.run(
        [sys.executable, "-m", "sluice.cli", "--pipelines", str(tmp_path), "--home", str(tmp_path / "h"), "pipelines"],
        capture_output=True, text=True, check=False, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    for expected in ("device_temps", "schedule: */5 * * * *", "window:   15m every 5m", "readings: id=reading_id",
                     "temp_c:double", "gold/device_temps: key=device_id", "check completeness:readings",
                     "check validity:avg_temp_c_between_-60_and_100", "broken.py: SyntaxError"):
        assert expected in out, (expected, out)


def test_new_pipeline_scaffolds_a_file_that_registers(tmp_path: Path) -> None:
    folder = tmp_path / "pipes"
    done = subprocess.run(
        [sys.executable, "-m", "sluice.cli", "--pipelines", str(folder), "--home", str(tmp_path / "h"),
         "new-pipeline", "page_views", "--tests", str(tmp_path / "tests")],
        capture_output=True, text=True, check=False, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert (folder / "page_views.py").is_file() and (tmp_path / "tests" / "test_page_views.py").is_file()
    registry = load_registry(folder)
    assert registry.errors == [] and list(registry.pipelines) == ["page_views"]
    again = subprocess.run(
        [sys.executable, "-m", "sluice.cli", "--pipelines", str(folder), "new-pipeline", "page_views"],
        capture_output=True, text=True, check=False, timeout=120,
    )
    assert again.returncode == 1 and "already exists" in again.stderr


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_scaffolded_pipeline_runs_through_the_cli_with_its_own_test(tmp_path: Path) -> None:
    """`sluice new-pipeline` gives a team a pipeline and a test; that test (which runs `sluice run` on the
    team's folder through SLUICE_PIPELINES, with no sluice file changed) passes as generated."""
    project = tmp_path / "team"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("SLUICE_HOME", None)
    done = subprocess.run(
        [sys.executable, "-m", "sluice.cli", "--pipelines", str(project / "pipelines"), "new-pipeline", "page_views",
         "--tests", str(project / "tests")], capture_output=True, text=True, check=False, timeout=120, env=env,
    )
    assert done.returncode == 0, done.stderr
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(project / "tests")],
        cwd=project, capture_output=True, text=True, check=False, timeout=800, env=env,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "1 passed" in run.stdout


def test_substreams_are_declared_on_a_field_every_stream_and_output_share() -> None:
    """SPEC 3: substream= names a field (required from then on), skew_tolerance (default 1h) is at least the
    watermark delay, every stream of a pipeline declares the same field or none, and every output is keyed by it."""
    fields = {"s_id": "string", "device_id": "string", "event_time": "timestamp"}
    keyed = stream(fields=fields, substream="device_id", skew_tolerance="3h", watermark_delay="2m")
    assert keyed.required == ("s_id", "event_time", "device_id") and keyed.skew_tolerance == timedelta(hours=3)
    assert stream(fields=fields, substream="device_id").skew_tolerance == timedelta(hours=1)
    spec = StreamSpec.from_stream(keyed)
    assert (spec.substream, spec.skew_tolerance, "device_id" in spec.required) == (
        "device_id", timedelta(hours=3), True)
    for overrides, message in (
        ({"substream": "ghost"}, "substream='ghost' must name one of its fields"),
        ({"substream": "event_time"}, "cannot be the event-time field"),
        ({"skew_tolerance": "3h"}, "skew_tolerance applies to substreams only"),
        ({"substream": "device_id", "skew_tolerance": "1m", "watermark_delay": "2m"}, "at least watermark_delay"),
        ({"substream": "device_id", "skew_tolerance": "later"}, "skew_tolerance: 'later' is not a duration"),
    ):
        with pytest.raises(DefinitionError, match=re.escape(message)):
            stream(fields=fields, **overrides)
    other = Stream(name="txns", fields={"t_id": "string", "device_id": "string", "event_time": "timestamp"},
                   id="t_id")
    with pytest.raises(DefinitionError, match="every stream of a pipeline declares the same substream field"):
        Pipeline(name="p", streams=[keyed, other], outputs=[Output("o", build, key="device_id")])
    with pytest.raises(DefinitionError, match=r"output 'o': an output over substreams is keyed by the substream "
                                              r"field 'device_id'"):
        Pipeline(name="p", streams=[keyed], outputs=[Output("o", build, key="s_id")])
    pipeline = Pipeline(name="p", streams=[keyed], outputs=[Output("o", build, key=["device_id", "s_id"])])
    assert PipelineDef.from_pipeline(pipeline).substream == "device_id"
