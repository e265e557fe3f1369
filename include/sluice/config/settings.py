"""The :class:`Settings` of one process: every setting, typed, with the registry they apply to."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sluice.config.values import check_folder
from sluice.core.errors import ConfigError
from sluice.core.lake import Lake, Root
from sluice.core.model import PipelineDef, StreamSpec
from sluice.core.registry import Registry, default_pipelines_path, load_registry
from sluice.core.windows import WindowSpec


@dataclass(frozen=True)
class Settings:
    """Resolved configuration for one process. Storage roots are always injected, never hard-coded."""

    home: Path
    # The two roots (SPEC 1): a local folder or an object-storage prefix. Every table, checkpoint and landing
    # folder is named from them; nothing under them is a hard-coded path.
    landing: Root
    lake: Lake
    now_override: datetime | None = None
    # The pipelines folder (SPEC 8); its streams and pipelines are the registry.
    pipelines_path: Path = field(default_factory=default_pipelines_path)
    # How far back (in event time, behind the watermark) record ids are remembered for dedup. This is
    # the memory bound of dedup: ids older than watermark - dedup_retention are forgotten.
    dedup_retention: timedelta = timedelta(hours=24)
    # Files per Spark micro-batch during catch-up. Lateness is still judged file by file (in arrival
    # order), so this only trades latency for throughput; it never changes results.
    max_files_per_trigger: int = 1000
    # One shuffle partition per core of the default master (see default_shuffle_partitions): every stateful
    # operator keeps one state store per partition, and each micro-batch loads and commits all of them, so
    # partitions beyond the cores only add fixed cost per batch (a cycle on local[2]: 20% slower with 4).
    shuffle_partitions: int = 2
    # A fresh pipeline query facing at least this many closable windows computes them as one Spark batch
    # (same transforms, same rows) and streams only from there on: batch is 2-3x faster than replaying a
    # backlog through stateful operators. 0 = always stream.
    catchup_min_windows: int = 6
    # A cycle whose closable windows read at most this many bronze rows (from the Delta log's file statistics)
    # closes them in batch from bronze instead of starting the stateful streaming queries: on a scheduled
    # increment, the queries' start, state store commits and the batch that moves Spark's watermark cost
    # seconds more than the batch itself. Above it (long windows, a large increment), the queries' state pays.
    # 0 = always stream.
    batch_close_rows: int = 250_000
    spark_master: str = "local[2]"
    driver_memory: str = "2g"
    # spark.executor.memory on a cluster (a local master runs its tasks in the driver's heap). None leaves it to
    # Spark (1g), or to spark-submit's --executor-memory. make platform sets it to its workers' memory: with
    # Spark's 1g, a 10M-event catch-up's micro-batch of 1000 files ran the executors out of heap.
    executor_memory: str | None = None
    # A folder that holds sluice's pinned jars on every worker of the cluster (the jar cache of the workers'
    # image, laid out as SLUICE_JARS_DIR is). Set, the executors load Delta's and s3a's jars from there
    # (spark.executor.extraClassPath) and the driver ships them none: shipped, every application's executors
    # each copied ~700 MB (the AWS SDK bundle) before their first task. None: the driver ships them.
    executor_jars: str | None = None
    # Where Spark keeps the stateful operators' state between micro-batches: hdfs (Spark's default provider:
    # in executor memory, versioned to the checkpoint) or rocksdb (on local disk, for state beyond the heap).
    # A query keeps the store of its first run (its checkpoint records it), so this only shapes new queries.
    state_store: str = "hdfs"
    # sluice_maintenance's vacuum keeps unreferenced files this long (never less than a day).
    vacuum_retention_hours: int = 168
    # Data quality: the share of DLQ records in a window above which the window fails (SPEC 5: 1%).
    lateness_threshold: float = 0.01
    # A lock's lease on a lake on object storage: its holder renews it every third of this, and a holder killed
    # with SIGKILL blocks the others for at most this long (README "Object storage").
    lease_ttl: timedelta = timedelta(seconds=60)
    # Overrides of the definitions' time semantics: stream -> {watermark_delay|early_tolerance|idle_timeout}
    # and pipeline -> (window size, hop), from YAML or the environment.
    stream_overrides: Mapping[str, Mapping[str, timedelta]] = field(default_factory=dict)
    windows: Mapping[str, tuple[timedelta, timedelta | None]] = field(default_factory=dict)
    # Corrections of closed windows (README "Operations"): at most this many per pipeline and cycle, so a
    # flood of late data cannot starve the schedule. Per pipeline in YAML ``pipelines.<name>``.
    max_corrections_per_run: int = 24
    # pipeline -> {corrections, correction_max_age, max_corrections_per_run, freshness_grace}, from YAML or
    # the environment; they override the pipeline's declaration.
    policies: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    # Where alerts point for Data Docs: a URL base under which the Data Docs pages are served. Default:
    # the Airflow plugin's path (``/sluice/docs``) on Airflow's ``[api] base_url``.
    data_docs_url: str | None = None
    # Kafka client properties for the streams that read a topic (SPEC 2), by librdkafka's names, as the
    # Airflow connection kafka_default holds them: bootstrap.servers, security.protocol, sasl.*, ssl.*. They may
    # hold a secret, so they are never printed (repr) and never written to a table or a log.
    kafka: Mapping[str, str] = field(default_factory=dict, repr=False)

    # The registry as loaded for these settings: one consistent view of the definitions for the whole run,
    # instead of re-scanning the pipelines folder on every stream or pipeline lookup.
    _registry: Registry | None = field(default=None, repr=False, compare=False)

    @property
    def registry(self) -> Registry:
        """The pipelines and streams of the pipelines folder, loaded once for these settings."""
        if self._registry is None:
            object.__setattr__(self, "_registry", load_registry(self.pipelines_path))
        assert self._registry is not None
        return self._registry

    @property
    def streams(self) -> dict[str, StreamSpec]:
        """Every declared stream, with configuration overrides applied."""
        out = {}
        for name, spec in self.registry.streams.items():
            overrides: dict[str, Any] = dict(self.stream_overrides.get(name) or {})
            if overrides:
                spec = replace(spec, **overrides)
            out[name] = spec
        return out

    def pipeline(self, name: str) -> PipelineDef:
        """The pipeline definition with any configured window; unknown names fail with the known ones."""
        definition = self.registry.pipeline(name)
        if name in self.windows:
            size, hop = self.windows[name]
            definition = replace(definition, window=WindowSpec(size, hop))
        policy = {"max_corrections_per_run": self.max_corrections_per_run, **dict(self.policies.get(name) or {})}
        return replace(definition, **policy)

    def docs_url(self, page: str = "index.html") -> str:
        """The URL of a Data Docs page (relative to the Data Docs folder) for alerts and the CLI."""
        base = self.data_docs_url
        if base is None:
            base = _airflow_base_url().rstrip("/") + "/sluice/docs"
        return base.rstrip("/") + "/" + page.lstrip("/")

    def now(self) -> datetime:
        """The injectable "now": ``SLUICE_NOW``/``--now`` if given, else the wall clock (UTC)."""
        return self.now_override or datetime.now(UTC)

    def stream(self, name: str) -> StreamSpec:
        streams = self.streams
        try:
            return streams[name]
        except KeyError:
            known = ", ".join(sorted(streams)) or "none"
            raise ConfigError(
                f"unknown stream {name!r}; choose one of: {known} (streams are declared by the pipelines in "
                f"{self.pipelines_path})"
            ) from None

    def landing_dir(self, stream: str) -> Path:
        return self.landing.local(stream)

    @property
    def checkpoints(self) -> Path:
        return self.lake.local("_checkpoints")

    def check_roots(self, *, writable: bool) -> None:
        """Fail fast, naming the path, when the home or a local lake cannot be used (see :func:`check_folder`)."""
        check_folder(self.home, "SLUICE_HOME", writable=writable, hint="SLUICE_HOME (or --home)")
        folder = self.lake.local_path()
        if folder is not None:
            check_folder(folder, "lake", writable=writable, hint="SLUICE_LAKE (or the YAML key lake)")


def _airflow_base_url() -> str:
    """Airflow's ``[api] base_url`` (where the sluice plugin is served), without importing Airflow when its
    environment variable says it; ``http://localhost:8080`` (Airflow's default) otherwise."""
    url = os.environ.get("AIRFLOW__API__BASE_URL")
    if url:
        return url
    try:
        from airflow.configuration import conf

        from sluice.core.logsetup import reclaim_from_airflow

        reclaim_from_airflow()  # importing Airflow pointed the logs at stdout
        return str(conf.get("api", "base_url", fallback="") or "http://localhost:8080")
    except Exception:  # Airflow not installed or not configured: the default of its config
        return "http://localhost:8080"
