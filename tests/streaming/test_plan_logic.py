"""The plan of a change (SPEC 9) as logic, without Spark: what counts as a change, what each ``on_change`` allows,
what ``sluice plan`` prints and puts in its ``--json``. tests/streaming/test_changes.py runs the same plans on
real Spark and Delta, once each."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

import pytest

from sluice import Output, Pipeline, Stream
from sluice.core.errors import DefinitionError
from sluice.core.model import OutputDef, PipelineDef
from sluice.streaming.changes import OutputChange, PipelinePlan
from sluice.streaming.definitions import OutputDefinition, Recorded

BEFORE = OutputDefinition(
    output="device_temps", plan="aaaa", columns=(("window_start", "timestamp"), ("window_end", "timestamp"),
                                                 ("device_id", "string"), ("avg_temp_c", "double")),
    window="15m every 5m", keys=("device_id",), lateness_bound="0", checks=("completeness:readings()",),
    streams=(("readings", '{"fields": {}}'),))
T = datetime(2024, 5, 1, 10, tzinfo=UTC)
CLOSED = [(T + timedelta(minutes=5 * k), T + timedelta(minutes=5 * k + 15)) for k in range(4)]


def pipeline(*on_change: str) -> PipelineDef:
    outputs = tuple(OutputDef(f"out{i}", lambda inputs, window: None, ("device_id",), (), mode)
                    for i, mode in enumerate(on_change))
    return PipelineDef("device_temps", ("readings",), outputs)


def plan(after: OutputDefinition, mode: str = "rebuild", before: OutputDefinition | None = BEFORE,
         closed: list | None = None) -> PipelinePlan:
    return PipelinePlan(pipeline(mode), [OutputChange("out0", before, after, mode)],
                        closed=CLOSED if closed is None else closed, boundary=CLOSED[-1][1])


def changed(**fields: object) -> OutputDefinition:
    return dataclasses.replace(BEFORE, **fields)  # type: ignore[arg-type]


def test_the_same_definition_is_no_change_and_a_pipeline_without_one_is_new() -> None:
    same = plan(BEFORE)
    assert (same.status, same.changed, same.refusals()) == ("unchanged", [], [])
    assert "no change since gold was built" in same.render() and "unchanged" in same.render()
    new = plan(BEFORE, before=None, closed=[])
    assert new.status == "new" and new.render().startswith("device_temps: new (never ran)")
    # Gold built before definitions were kept: nothing to compare with, so no rebuild of everything.
    legacy = plan(BEFORE, before=None)
    assert (legacy.status, legacy.changed) == ("unchanged", []) and "no definition recorded yet" in legacy.render()


def test_a_plan_names_each_change_before_and_after_and_what_the_next_run_does() -> None:
    after = changed(plan="bbbb", columns=(*BEFORE.columns, ("max_temp_c", "double")), window="10m tumbling",
                    checks=())
    p = plan(after)
    text = p.render()
    assert "columns added: max_temp_c double" in text
    assert "window: 15m every 5m -> 10m tumbling" in text and "checks: completeness:readings() -> -" in text
    assert ("next run: rebuild: recomputes the 4 closed window(s) (2024-05-01 10:00 .. 2024-05-01 10:30 UTC) "
            "from bronze as windows of 10m tumbling; the old windows leave gold and the ledger") in text
    doc = p.to_json()
    assert doc["status"] == "changed" and doc["closed_range"] == [CLOSED[0][0].isoformat(), CLOSED[-1][1].isoformat()]
    assert doc["closed_through"] == CLOSED[-1][1].isoformat()
    [out] = doc["outputs"]
    assert out["columns"] == {"added": ["max_temp_c double"], "removed": [], "retyped": []}
    assert out["changes"]["window"] == {"before": "15m every 5m", "after": "10m tumbling"}
    assert (out["before"], out["after"]) == (BEFORE.fingerprint, after.fingerprint)
    # Only the computation changed (a filter): the plan says so, since no column or aspect did.
    filtered = plan(changed(plan="cccc")).render()
    assert "build: plan aaaa -> plan cccc" in filtered


@pytest.mark.parametrize(
    ("mode", "after", "refused"),
    [
        ("rebuild", changed(window="10m tumbling"), None),
        ("rebuild", changed(columns=(*BEFORE.columns[:3], ("avg_temp_c", "string"))), None),
        ("forward", changed(plan="bbbb", columns=(*BEFORE.columns, ("max_temp_c", "double"))), None),
        ("forward", changed(columns=BEFORE.columns[:3]), None),  # a removed column: null in new rows
        ("forward", changed(window="10m tumbling"), "a change of the window or the keys cannot go forward"),
        ("forward", changed(keys=("site_id",)), "a change of the window or the keys cannot go forward"),
        ("forward", changed(columns=(*BEFORE.columns[:3], ("avg_temp_c", "string"))), "a retyped column"),
        ("fail", changed(checks=()), "its definition changed and on_change='fail'"),
    ],
)
def test_what_each_on_change_allows(mode: str, after: OutputDefinition, refused: str | None) -> None:
    p = plan(after, mode)
    assert p.status == "changed"
    if refused is None:
        assert p.refusals() == []
        assert p.action(p.outputs[0]).startswith(mode)
    else:
        [reason] = p.refusals()
        assert refused in reason and p.action(p.outputs[0]).startswith("refuses, exit 1")


def test_on_change_is_checked_when_the_file_loads_and_an_output_overrides_its_pipeline() -> None:
    readings = Stream(name="readings", fields={"reading_id": "string", "event_time": "timestamp"}, id="reading_id")
    build = lambda inputs, window: None  # noqa: E731
    with pytest.raises(DefinitionError, match="on_change must be one of rebuild, forward, fail"):
        Pipeline(name="p", streams=[readings], outputs=[Output("o", build, key="k")], on_change="full-refresh")
    with pytest.raises(DefinitionError, match="Output 'o': on_change must be one of"):
        Output("o", build, key="k", on_change="drop")
    declared = Pipeline(name="p", streams=[readings], on_change="forward",
                        outputs=[Output("a", build, key="k"), Output("b", build, key="k", on_change="fail")])
    assert [o.on_change for o in PipelineDef.from_pipeline(declared).outputs] == ["forward", "fail"]
    assert [o.on_change for o in PipelineDef.from_pipeline(dataclasses.replace(declared, on_change="rebuild")
                                                           ).outputs] == ["rebuild", "fail"]


def test_a_record_keeps_its_checkpoint_generation_and_where_its_query_starts() -> None:
    kept = Recorded(BEFORE, 3, T)
    assert Recorded.from_dict(kept.to_dict()) == kept
    # Records written before generations were kept read as the first checkpoint.
    assert Recorded.from_dict({"fingerprint": "x", "definition": BEFORE.to_dict()}) == Recorded(BEFORE)
