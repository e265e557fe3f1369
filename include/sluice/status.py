"""``sluice status``: watermarks, last arrivals and row counts per table, read from Delta metadata only
(no Spark, so it answers in well under a second)."""

from __future__ import annotations

from sluice import tables
from sluice.config import Settings
from sluice.report import accounting_table, render_table, table_rows


def render_status(settings: Settings) -> str:
    streams = list(settings.streams)
    out = [f"SLUICE_HOME={settings.home}", f"lake={settings.lake}", "", "streams (where every line went):",
           accounting_table(settings, streams), "", "tables (rows):"]
    rows = []
    for table in tables.all_ingest_tables(settings):
        count = table_rows(table.path(settings))
        rows.append([table.name, "-" if count is None else count])
    out.append(render_table(["table", "rows"], rows))
    return "\n".join(out)
