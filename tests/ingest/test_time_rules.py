"""The warning of a run whose records arrived after its now (SPEC 3): it names what arrived, files or Kafka
micro-batches, in the words a user of each would look for."""

from __future__ import annotations

from datetime import UTC, datetime

from sluice.ingest.state import BatchRow
from sluice.ingest.time_rules import arrived_after, arrived_after_message

NOW = datetime(2024, 5, 1, 10, 30, tzinfo=UTC)


def batch(batch_id: int, source: str, arrival: str) -> BatchRow:
    return BatchRow(stream="readings", batch_id=batch_id, lines=1, accepted=1, source_file=source,
                    max_arrival_time=datetime.fromisoformat(f"2024-05-01T{arrival}:00+00:00"), spark_batch_id=0)


def test_files_and_kafka_micro_batches_that_arrived_after_now_are_named_as_what_they_are() -> None:
    files = {"readings": [batch(0, "landing/readings/a.jsonl", "10:20"), batch(1, "landing/readings/b.jsonl", "10:40"),
                          batch(2, "landing/readings/c.jsonl", "10:45")]}
    assert arrived_after_message(arrived_after(files, NOW), NOW) == (
        "2 files arrived after now (2024-05-01T10:30:00Z; the latest at 2024-05-01T10:45:00Z) and were taken "
        "under their own arrival time; was --now meant?")

    topic = {"readings": [batch(0, "kafka://readings/0/0-99", "10:20"),
                          batch(1, "kafka://readings/0/100-199,1/0-80", "10:41")]}
    assert arrived_after_message(arrived_after(topic, NOW), NOW) == (
        "1 Kafka micro-batch held records that arrived after now (2024-05-01T10:30:00Z; the latest at "
        "2024-05-01T10:41:00Z), taken under their own arrival time; was --now meant?")
    # Heartbeats carry no records: never named.
    beat = BatchRow(stream="readings", batch_id=3, is_heartbeat=True, max_arrival_time=NOW.replace(hour=11))
    assert arrived_after({"readings": [beat]}, NOW) == []
