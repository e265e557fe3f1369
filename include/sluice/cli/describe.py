"""``sluice pipelines``: what the pipelines folder registers (streams, window, schedule, outputs, checks)."""

from __future__ import annotations

from typing import Any

from sluice.config import Settings
from sluice.core.checks import describe as describe_check
from sluice.core.timeutil import format_duration as fmt


def describe_registry(settings: Settings) -> str:
    registry = settings.registry
    lines = [f"pipelines folder: {registry.path}"]
    if not registry.pipelines:
        lines.append("no pipelines registered; `sluice new-pipeline <name>` scaffolds one")
    streams = settings.streams
    for name in sorted(registry.pipelines):
        p = settings.pipeline(name)
        window = fmt(p.window.size) + (f" every {fmt(p.window.slide)}" if p.window.hop else " tumbling")
        lines += [
            "",
            f"{name}  ({p.source.name if p.source else '?'})",
            f"  schedule: {p.schedule or 'none (manual)'}",
            f"  window:   {window}" + (f", lateness bound {fmt(p.lateness_bound)}" if p.lateness_bound else ""),
            f"  late data: corrections {p.corrections} (max_age {fmt(p.correction_max_age)}, "
            f"{p.max_corrections_per_run} per run); freshness grace {fmt(p.freshness_grace)}",
            "  streams:",
        ]
        for stream in p.streams:
            s = streams[stream]
            fields = ", ".join(f"{s.json_name(f)}:{s.type_of(f)}{'*' if f in s.required else ''}" for f in s.fields)
            shared = [q for q in registry.pipelines_reading(stream) if q != name]
            lines.append(
                f"    {stream}: id={s.id_field} watermark_delay={fmt(s.watermark_delay)} "
                f"early_tolerance={fmt(s.early_tolerance)} idle_timeout={fmt(s.idle_timeout)}"
                + (f" (shared with {', '.join(shared)})" if shared else "")
            )
            lines.append(f"      fields: {fields}   (* required)")
        lines.append("  outputs:")
        for output in p.outputs:
            lines.append(f"    gold/{output.name}: key={', '.join(output.keys)}")
            for check in output.checks:
                lines.append(f"      check {check.name}: {describe_check(check)}")
    if registry.errors:
        lines += ["", "files that failed to load (their pipelines are not registered):"]
        lines += [f"  {e}" for e in registry.errors]
    return "\n".join(lines)


def _check_data(check: Any) -> dict[str, Any]:
    params = {k: v for k, v in vars(check).items() if k != "name" and v is not None}
    return {"name": check.name, "description": describe_check(check), "params": params}


def registry_data(settings: Settings) -> dict[str, Any]:
    """``sluice pipelines --json``: the same as :func:`describe_registry`, as data. Durations in seconds."""
    registry = settings.registry
    streams = settings.streams
    pipelines = []
    for name in sorted(registry.pipelines):
        p = settings.pipeline(name)
        pipelines.append({
            "name": name,
            "file": str(p.source) if p.source else None,
            "description": p.description or None,
            "schedule": p.schedule,
            "window": {
                "size_seconds": int(p.window.size.total_seconds()),
                "hop_seconds": int(p.window.slide.total_seconds()),
                "tumbling": p.window.slide == p.window.size,
            },
            "lateness_bound_seconds": int(p.lateness_bound.total_seconds()),
            "corrections": {"policy": p.corrections, "max_age_seconds": int(p.correction_max_age.total_seconds()),
                            "max_per_run": p.max_corrections_per_run},
            "freshness_grace_seconds": int(p.freshness_grace.total_seconds()),
            "streams": [
                {
                    "name": stream,
                    "id": streams[stream].id_field,
                    "event_time": streams[stream].time_field,
                    "watermark_delay_seconds": int(streams[stream].watermark_delay.total_seconds()),
                    "early_tolerance_seconds": int(streams[stream].early_tolerance.total_seconds()),
                    "idle_timeout_seconds": int(streams[stream].idle_timeout.total_seconds()),
                    "fields": [
                        {"name": streams[stream].json_name(f), "type": streams[stream].type_of(f),
                         "required": f in streams[stream].required}
                        for f in streams[stream].fields
                    ],
                    "shared_with": [q for q in registry.pipelines_reading(stream) if q != name],
                }
                for stream in p.streams
            ],
            "outputs": [
                {"name": o.name, "table": o.table_name, "keys": list(o.keys),
                 "checks": [_check_data(c) for c in o.checks]}
                for o in p.outputs
            ],
        })
    return {
        "pipelines_path": str(registry.path),
        "pipelines": pipelines,
        "load_errors": [{"file": str(e.file), "message": e.message} for e in registry.errors],
    }
