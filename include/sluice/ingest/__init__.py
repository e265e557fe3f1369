"""Landing JSON Lines -> bronze, quarantine, dlq and ops/ingest_batches (SPEC sections 2-3)."""

from sluice.ingest.landing import StreamIngest
from sluice.ingest.run import run_ingest, summary
from sluice.ingest.state import BatchRow, StreamState, load_state
from sluice.ingest.time_rules import file_watermarks

__all__ = ["BatchRow", "StreamIngest", "StreamState", "file_watermarks", "load_state", "run_ingest", "summary"]
