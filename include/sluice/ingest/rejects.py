"""A micro-batch's few rejected lines, written by the driver (:mod:`sluice.ingest.microbatch`): when a batch has
up to ``DRIVER_WRITE_ROWS`` quarantined and late lines, one Spark job collects them and they are appended here to
``quarantine/<stream>`` and ``dlq/<stream>``, laid out as the Spark writes would lay them out, instead of a Parquet
write job per table."""

from __future__ import annotations

from typing import Any

from pyspark.sql import Row
from pyspark.sql.types import TimestampType

from sluice.config import Settings
from sluice.core.model import StreamSpec
from sluice.core.spark import collected_utc
from sluice.ingest.parsing import MALFORMED, malformed_detail
from sluice.storage import tables
from sluice.storage.engine import DeltaEngine


def write_rejects(engine: DeltaEngine, settings: Settings, spec: StreamSpec, collected: list[Row], appid: str,
                  version: int, meta: dict[str, Any]) -> None:
    """Quarantine and DLQ rows of a batch, collected (``_status`` says which; quarantine's own columns are
    prefixed ``_q_``), written in one commit per table (app transaction ``(appid, version)``): one file per table,
    rows in (batch, line number) and (batch, id) order."""
    by_status: dict[str, list[dict[str, Any]]] = {"quarantined": [], "late": []}
    for row in collected:
        record = row.asDict()
        if record["_status"] == "quarantined":
            reason = record["_q_reason"]
            record = {**{k: record[k] for k in ("raw", "source_file", "arrival_time", "ingest_batch_id")},
                      "reason": reason, "line_number": record["_q_line"],
                      "detail": malformed_detail(record["raw"]) if reason == MALFORMED else record["_q_detail"]}
        by_status[row["_status"]].append(record)
    id_field = spec.id_field
    for table, records, key in (
        (tables.quarantine(spec), by_status["quarantined"], lambda r: (r["ingest_batch_id"], r["line_number"])),
        (tables.dlq(spec), by_status["late"], lambda r: (r["ingest_batch_id"], r[id_field])),
    ):
        if not records:
            continue
        schema = table.schema
        stamps = [f.name for f in schema.fields if isinstance(f.dataType, TimestampType)]
        for record in records:
            for name in stamps:
                if record[name] is not None:
                    record[name] = collected_utc(record[name])
        engine.append_rows(
            [tuple(r[n] for n in schema.names) for r in sorted(records, key=key)], schema,
            table.path(settings), app_id=appid, version=version, metadata=meta,
        )
