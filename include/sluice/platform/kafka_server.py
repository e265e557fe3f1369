"""A real Kafka broker on 127.0.0.1 (``jars.lock``'s kafka-broker set, fetched by ``make setup``): Kafka 4.4 in
KRaft combined mode (one process is the broker and its own controller), run as a plain Java process with its log
folder on local disk. No Docker and no ZooKeeper. :func:`start_broker` formats and starts one on free loopback
ports: the Kafka tests' fixture and ``make bench``'s Kafka case run one; the platform will run one for its
``kafka_default`` connection (issue 57).

Two steps, as Kafka's own quickstart: ``kafka.tools.StorageTool format`` writes the cluster id and the controller
quorum into the log folder once, then ``kafka.Kafka server.properties`` serves it."""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from sluice.core.jars import jar_paths
from sluice.core.processes import free_port, listening, stop_group

#: The broker's heap: a test broker holds a few small topics (about 330 MB resident at this setting).
HEAP = "-Xmx512m"
LOG4J2 = """status = warn
appender.file.type = File
appender.file.name = file
appender.file.fileName = {log}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = %d{{HH:mm:ss.SSS}} %-5p %c{{1}}: %m%n
rootLogger.level = warn
rootLogger.appenderRef.file.ref = file
logger.kafka.name = kafka
logger.kafka.level = info
"""


def cluster_id(name: str) -> str:
    """A KRaft cluster id (a base64url UUID without padding, as ``StorageTool random-uuid`` prints), the same
    for the same ``name``."""
    import base64

    raw = uuid.uuid5(uuid.NAMESPACE_URL, f"sluice-kafka:{name}").bytes
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def server_properties(root: Path, port: int, controller_port: int) -> Path:
    """``<root>/server.properties``: a one-node cluster on ``127.0.0.1:<port>`` (clients) and
    ``127.0.0.1:<controller_port>`` (its controller), its logs in ``<root>/logs``. Internal topics have one
    replica, and retention is checked every second so that a test's short ``retention.ms`` takes effect."""
    path = root / "server.properties"
    root.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join([
        "process.roles=broker,controller",
        "node.id=1",
        f"controller.quorum.bootstrap.servers=127.0.0.1:{controller_port}",
        f"listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
        f"advertised.listeners=PLAINTEXT://127.0.0.1:{port}",
        "controller.listener.names=CONTROLLER",
        "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "inter.broker.listener.name=PLAINTEXT",
        f"log.dirs={root / 'logs'}",
        "num.partitions=1",
        "offsets.topic.replication.factor=1",
        "transaction.state.log.replication.factor=1",
        "transaction.state.log.min.isr=1",
        "share.coordinator.state.topic.replication.factor=1",
        "share.coordinator.state.topic.min.isr=1",
        "group.initial.rebalance.delay.ms=0",
        "auto.create.topics.enable=false",
        "log.retention.check.interval.ms=1000",
        "log.initial.task.delay.ms=0",
    ]) + "\n")
    return path


def _java(main: str, *args: str, log4j: Path | None = None) -> list[str]:
    classpath = os.pathsep.join(str(p) for p in jar_paths(("kafka-broker",)))
    logging = [f"-Dlog4j2.configurationFile={log4j.as_uri()}"] if log4j is not None else []
    return ["java", HEAP, "-XX:TieredStopAtLevel=1", *logging, "-cp", classpath, main, *args]


def format_command(properties: Path, cluster: str) -> list[str]:
    """Formats the log folder of ``properties`` for a new one-node cluster (``--standalone``: this node is the
    whole controller quorum)."""
    # --cluster-id=<id> in one argument: a base64url id may start with '-', which the tool would read as an option.
    return _java("kafka.tools.StorageTool", "format", f"--cluster-id={cluster}", "-c", str(properties), "--standalone")


def broker_command(properties: Path) -> list[str]:
    """Serves the formatted cluster of ``properties``; its log goes to ``server.log`` beside it."""
    log4j = properties.with_name("log4j2.properties")
    log4j.write_text(LOG4J2.format(log=properties.with_name("server.log")))
    return _java("kafka.Kafka", str(properties), log4j=log4j)


START_TIMEOUT_S = 120


@dataclass
class Broker:
    """A running one-node cluster: its client address, its folder and its process (a session of its own)."""

    bootstrap: str  # 127.0.0.1:<port>
    root: Path
    process: subprocess.Popen[bytes]

    def stop(self) -> None:
        stop_group(self.process)


def start_broker(root: Path, timeout: float = START_TIMEOUT_S) -> Broker:
    """Format ``root`` for a new cluster and start its broker on free loopback ports; returns once the broker
    answers metadata with itself. Fails with the broker's output when it exits or does not come up in time."""
    port, controller = free_port(), free_port()
    properties = server_properties(root, port, controller)
    done = subprocess.run(format_command(properties, cluster_id(str(root))), capture_output=True, text=True,
                          check=False)
    if done.returncode != 0:
        raise RuntimeError(f"formatting the Kafka log folder failed: {done.stdout[-2000:]}{done.stderr[-2000:]}")
    with (root / "broker.out").open("wb") as out:
        process = subprocess.Popen(broker_command(properties), stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    broker = Broker(f"127.0.0.1:{port}", root, process)
    deadline = time.monotonic() + timeout
    while not _ready(broker):
        if process.poll() is not None:
            raise RuntimeError(f"the Kafka broker exited with {process.returncode}: "
                               f"{(root / 'broker.out').read_text()[-3000:]}")
        if time.monotonic() > deadline:
            broker.stop()
            raise RuntimeError(f"the Kafka broker did not listen on {port} within {timeout:.0f} s")
        time.sleep(0.2)
    return broker


def _ready(broker: Broker) -> bool:
    """Listening, and the controller has registered the broker (it then answers metadata with itself)."""
    if not listening(int(broker.bootstrap.rsplit(":", 1)[1])):
        return False
    from confluent_kafka.admin import AdminClient

    try:
        return bool(AdminClient({"bootstrap.servers": broker.bootstrap}).list_topics(timeout=2).brokers)
    except Exception:  # not ready yet: the client times out or the broker refuses
        return False
