"""The production topology, described once.

``make platform`` starts it as processes on 127.0.0.1 (:mod:`sluice.platform.launcher`), and
``docker-compose.yaml`` describes the same services as containers; ``tests/test_compose.py`` checks the compose
file against this description, so the two cannot drift:

- PostgreSQL, Airflow's metadata database;
- an S3 server that holds the landing zone and the lake (one bucket, two prefixes);
- a Kafka broker (KRaft, one node) for streams that read a topic, which every task reaches through the Airflow
  connection ``kafka_default``;
- a Spark standalone master and its workers, which share no disk with the drivers;
- Airflow 3's api-server, scheduler (with ``LocalExecutor``) and dag-processor, sharing one configuration.

Ports, passwords and folders differ between the two (free ports on 127.0.0.1, service names in compose); what
a deployment decides is here.
"""

from __future__ import annotations

from dataclasses import dataclass

SIMPLE_AUTH_MANAGER = "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager"


@dataclass(frozen=True)
class Topology:
    bucket: str = "sluice"
    lake_prefix: str = "lake"
    landing_prefix: str = "landing"
    region: str = "us-east-1"
    spark_workers: int = 2
    worker_cores: int = 1
    worker_memory: str = "2g"
    # Cores an application gets unless it asks for more (the master's spark.deploy.defaultCores): without it,
    # the first application takes every core and a second pipeline's run waits for it to end.
    app_cores: int = 1
    # A worker keeps each application's folder (its executor's logs, and a copy of every jar the driver ships:
    # none from sluice's own tasks, whose jars the workers hold, but ~700 MB for a job that ships the AWS SDK)
    # until its own clean-up removes it; Spark's default keeps them 7 days, which fills a disk in a day of
    # hourly runs of such jobs. A finished application's folder goes after this long.
    app_data_ttl_s: int = 900
    worker_cleanup_interval_s: int = 120
    airflow_executor: str = "LocalExecutor"
    airflow_components: tuple[str, ...] = ("api-server", "scheduler", "dag-processor")
    airflow_admin: str = "admin"
    database: str = "airflow"
    database_user: str = "airflow"

    @property
    def lake(self) -> str:
        return f"s3://{self.bucket}/{self.lake_prefix}"

    @property
    def landing(self) -> str:
        return f"s3://{self.bucket}/{self.landing_prefix}"

    @property
    def worker_names(self) -> list[str]:
        return [f"spark-worker-{n}" for n in range(1, self.spark_workers + 1)]

    @property
    def services(self) -> list[str]:
        """Every long-running service, in the order they start (and stop in reverse)."""
        return ["postgres", "s3", "kafka", "spark-master", *self.worker_names,
                *(f"airflow-{c}" for c in self.airflow_components)]

    def master_options(self) -> str:
        """``SPARK_MASTER_OPTS`` of the standalone master."""
        return f"-Dspark.deploy.defaultCores={self.app_cores}"

    def worker_options(self) -> str:
        """``SPARK_WORKER_OPTS`` of each worker: its clean-up of finished applications' folders."""
        return (f"-Dspark.worker.cleanup.enabled=true -Dspark.worker.cleanup.interval={self.worker_cleanup_interval_s}"
                f" -Dspark.worker.cleanup.appDataTtl={self.app_data_ttl_s}")

    def kafka_connection(self, bootstrap: str) -> dict[str, object]:
        """The Airflow connection ``kafka_default`` (the Apache Kafka provider's type: the client's properties in
        its extra) for a broker at ``bootstrap``."""
        return {"conn_type": "kafka", "extra": {"bootstrap.servers": bootstrap}}

    def sluice_settings(self) -> dict[str, str]:
        """Where sluice's tasks find the landing zone and the lake, and the heap their executors ask for: the
        whole of a worker's memory (one executor of one core per worker; Spark's 1g left half of it unused, and
        a 10M-event catch-up ran out of heap in it)."""
        return {"SLUICE_LANDING": self.landing, "SLUICE_LAKE": self.lake, "SLUICE_EXECUTOR_MEMORY": self.worker_memory}

    def airflow_settings(self) -> dict[str, str]:
        """What every Airflow component agrees on, wherever it runs (the rest is per host: URLs, secrets)."""
        return {
            "AIRFLOW__CORE__EXECUTOR": self.airflow_executor,
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__AUTH_MANAGER": SIMPLE_AUTH_MANAGER,
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{self.airflow_admin}:admin",
            # Two workers of one core: two Spark applications at once is what the cluster holds.
            "AIRFLOW__CORE__PARALLELISM": str(2 * self.spark_workers),
            "AIRFLOW__CORE__MAX_ACTIVE_RUNS_PER_DAG": "1",
        }


TOPOLOGY = Topology()
