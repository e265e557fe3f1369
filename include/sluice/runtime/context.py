"""The run context: what one process needs to run sluice's work, built once at the edge and handed down.

The edge is where a run starts: a CLI command, an Airflow task, a test fixture. It builds one
:class:`RunContext` from the settings (and, where it has one already, the Spark session), and passes it to the
operations (a cycle, a backfill, a re-check, ingest, data quality). Below the edge nothing builds its own
session, engine, lake state or ledger: it takes them from the context, as Dagster's ``definitions.py`` hands
resources to the assets. The Spark session and its engine start on first use, so a command that finds nothing
to do (or fails on its arguments) never starts a JVM.
"""

from __future__ import annotations

import dataclasses
import threading
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from typing import TYPE_CHECKING

from sluice.config import Settings
from sluice.core.lake import Lake
from sluice.storage.engine import DeltaEngine, OpsDeltaEngine
from sluice.storage.locks import pipeline_lock, stream_lock
from sluice.storage.state import LakeState, lake_state
from sluice.windows.ledger import Ledger

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

_STARTING = threading.Lock()


@dataclass
class RunContext:
    """The settings, the lake, the Spark session (started on first use), the engines, the locks and the opened
    ledgers of one run."""

    settings: Settings
    session: SparkSession | None = None
    #: The Spark application's name when the context starts the session (``sluice-<pipeline>``).
    app_name: str = "sluice"
    #: The kind of run when the context starts the session: ``cycle``, ``increment`` or ``backfill`` (its JIT
    #: settings, :data:`sluice.runtime.spark.JIT_OPTIONS`); a cycle becomes an increment in :meth:`expect`.
    work: str = "cycle"
    _ledgers: dict[str | None, Ledger] = field(default_factory=dict, repr=False)

    @property
    def lake(self) -> Lake:
        return self.settings.lake

    @property
    def now(self) -> datetime:
        return self.settings.now()

    @cached_property
    def state(self) -> LakeState:
        """sluice's own state objects under ``<lake>/_checkpoints`` (plans, marks, caches)."""
        return lake_state(self.settings)

    @property
    def spark(self) -> SparkSession:
        """The run's Spark session: the edge's, or one this context starts on first use."""
        with _STARTING:  # the streams' ingest threads may ask for it at once: one session
            if self.session is None:
                from sluice.runtime.spark import get_spark  # imports PySpark's JVM side only when Spark is needed

                self.session = get_spark(self.settings, self.app_name, work=self.work)
        return self.session

    def expect(self, new_bytes: int) -> None:
        """What a cycle is about to read, before it first needs Spark: a cycle of at most
        :data:`~sluice.runtime.spark.INCREMENT_BYTES` of new data starts its session as an ``increment``. No effect
        once the session runs (the edge's own, or a spark-submit's JVM) or for other kinds of run."""
        from sluice.runtime.spark import INCREMENT_BYTES

        with _STARTING:
            if self.session is None and self.work == "cycle" and new_bytes <= INCREMENT_BYTES:
                self.work = "increment"

    @cached_property
    def engine(self) -> DeltaEngine:
        """delta-spark, for every table Spark writes (the session starts when the engine first needs it)."""
        from sluice.storage.engines import engine_for

        return engine_for(lambda: self.spark, self.settings)

    @cached_property
    def ops_engine(self) -> OpsDeltaEngine:
        """delta-rs, for the small ops tables: no Spark session needed."""
        from sluice.storage.engines import ops_engine

        return ops_engine(self.settings)

    def ledger(self, pipeline: str | None = None) -> Ledger:
        """The window ledger of ``pipeline`` (of every pipeline when None), opened once for the run."""
        if pipeline not in self._ledgers:
            self._ledgers[pipeline] = Ledger(self.settings, pipeline)
        return self._ledgers[pipeline]

    def pipeline_lock(self, pipeline: str, *, purpose: str = "", timeout: float = 3600.0
                      ) -> AbstractContextManager[None]:
        return pipeline_lock(self.settings, pipeline, timeout=timeout, purpose=purpose)

    def stream_lock(self, stream: str, *, purpose: str = "", timeout: float = 3600.0) -> AbstractContextManager[None]:
        return stream_lock(self.settings, stream, timeout=timeout, purpose=purpose)

    def at(self, settings: Settings) -> RunContext:
        """The same run's resources (session, engines) under other settings of the same lake, e.g. another
        ``now``: what a test that runs several cycles on one session, or a task that re-reads the clock, needs."""
        if settings.lake != self.settings.lake:
            raise ValueError(f"a run context is for one lake: {self.settings.lake} is not {settings.lake}")
        return dataclasses.replace(self, settings=settings, _ledgers={})


def open_run(settings: Settings, spark: SparkSession | None = None, *, app_name: str = "sluice",
             work: str = "cycle") -> RunContext:
    """The edge's one call: the run context of ``settings`` (with the edge's Spark session, if it has one);
    ``work``: ``cycle`` or ``backfill``, for a session it starts."""
    return RunContext(settings, spark, app_name, work)

