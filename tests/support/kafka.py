"""A real Kafka broker on 127.0.0.1 for the Kafka tests: Kafka 4.4 in KRaft combined mode
(``sluice.platform.kafka_server``), formatted and started on free ports in a temporary folder, and stopped with
its process group. No mock: producers and Spark's Kafka source talk the Kafka protocol to it.

The session fixture ``kafka`` is the broker; ``KafkaBroker.topic()`` makes a fresh topic for one test, with the
broker stamping each record's timestamp on arrival (``LogAppendTime``) unless told otherwise.
"""

from __future__ import annotations

import itertools
import os
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from sluice.core.processes import stop_group
from sluice.platform.kafka_server import start_broker


@dataclass(frozen=True)
class Delivered:
    """Where the broker put a record, and its timestamp (the broker's clock for a LogAppendTime topic)."""

    partition: int
    offset: int
    timestamp: datetime


@dataclass
class KafkaBroker:
    bootstrap: str  # 127.0.0.1:<port>
    root: Path
    process: subprocess.Popen[bytes]
    _names: Iterator[int] = field(default_factory=itertools.count)

    def admin(self) -> Any:
        from confluent_kafka.admin import AdminClient

        return AdminClient({"bootstrap.servers": self.bootstrap})

    def topic(self, prefix: str = "test", partitions: int = 1, timestamps: str = "LogAppendTime",
              **config: str) -> str:
        """A new, empty topic; ``config`` adds topic settings (``retention_ms="1000"`` for retention.ms)."""
        from confluent_kafka.admin import NewTopic

        name = f"{prefix}-{os.getpid()}-{next(self._names)}"
        settings = {"message.timestamp.type": timestamps, **{k.replace("_", "."): v for k, v in config.items()}}
        admin = self.admin()  # kept until the result is in: a client that is collected cancels its requests
        admin.create_topics([NewTopic(name, partitions, 1, config=settings)])[name].result(timeout=60)
        return name

    def produce(self, topic: str, values: Sequence[bytes | str | None], partition: int | None = None
                ) -> list[Delivered]:
        """Each value as one record (None: a record with no value, a tombstone), in order, acknowledged by the
        broker before this returns; where each landed and the timestamp it got, in the order given."""
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": self.bootstrap, "enable.idempotence": True, "linger.ms": 0})
        delivered: dict[int, Delivered] = {}
        errors: list[str] = []

        def report(index: int) -> Any:
            def callback(error: Any, message: Any) -> None:
                if error is not None:
                    errors.append(str(error))
                else:
                    stamp = datetime.fromtimestamp(message.timestamp()[1] / 1000, UTC)
                    delivered[index] = Delivered(message.partition(), message.offset(), stamp)
            return callback

        for index, value in enumerate(values):
            extra = {} if partition is None else {"partition": partition}
            producer.produce(topic, value, on_delivery=report(index), **extra)
        left = producer.flush(60)
        assert left == 0 and not errors, f"{left} record(s) of {topic} not acknowledged within 60 s {errors}"
        return [delivered[i] for i in range(len(values))]

    def stop(self) -> None:
        stop_group(self.process)


def kafka_pipelines(folder: Path, topic: str) -> Path:
    """The README's tutorial (SPEC 8's pipeline) in ``folder``, its stream declared on ``topic``."""
    from support.tutorial import write_tutorial

    write_tutorial(folder)
    source = (folder / "device_temps.py").read_text()
    source = source.replace("from sluice import Output, Pipeline, Stream, checks",
                            "from sluice import Output, Pipeline, Stream, checks, kafka")
    declared = f'    watermark_delay="2m",\n    source=kafka(topic="{topic}"),'
    source = source.replace('    watermark_delay="2m",', declared)
    assert "source=kafka" in source
    (folder / "device_temps.py").write_text(source)
    return folder


def start_kafka(root: Path) -> KafkaBroker:
    broker = start_broker(root)
    return KafkaBroker(broker.bootstrap, broker.root, broker.process)


@pytest.fixture(scope="session")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    broker = start_kafka(tmp_path_factory.mktemp("kafka"))
    yield broker
    broker.stop()
