"""``sluice pipelines``: what the pipelines folder registers (streams, window, schedule, outputs, checks)."""

from __future__ import annotations

from datetime import timedelta

from sluice.checks import describe as describe_check
from sluice.config import Settings


def _duration(value: timedelta) -> str:
    seconds = int(value.total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds and seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def describe_registry(settings: Settings) -> str:
    registry = settings.registry
    lines = [f"pipelines folder: {registry.path}"]
    if not registry.pipelines:
        lines.append("no pipelines registered; `sluice new-pipeline <name>` scaffolds one")
    streams = settings.streams
    for name in sorted(registry.pipelines):
        p = settings.pipeline(name)
        window = _duration(p.window.size) + (f" every {_duration(p.window.slide)}" if p.window.hop else " tumbling")
        lines += [
            "",
            f"{name}  ({p.source.name if p.source else '?'})",
            f"  schedule: {p.schedule or 'none (manual)'}",
            f"  window:   {window}" + (f", lateness bound {_duration(p.lateness_bound)}" if p.lateness_bound else ""),
            "  streams:",
        ]
        for stream in p.streams:
            s = streams[stream]
            fields = ", ".join(f"{s.json_name(f)}:{s.type_of(f)}{'*' if f in s.required else ''}" for f in s.fields)
            shared = [q for q in registry.pipelines_reading(stream) if q != name]
            lines.append(
                f"    {stream}: id={s.id_field} watermark_delay={_duration(s.watermark_delay)} "
                f"early_tolerance={_duration(s.early_tolerance)} idle_timeout={_duration(s.idle_timeout)}"
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
