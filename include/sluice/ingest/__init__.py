"""Landing JSON Lines -> bronze, quarantine, dlq and ops/ingest_batches (SPEC sections 2-3)."""

from sluice.ingest.landing import BatchRow, StreamIngest, StreamState, file_watermarks, load_state, run_ingest, summary

__all__ = ["BatchRow", "StreamIngest", "StreamState", "file_watermarks", "load_state", "run_ingest", "summary"]
