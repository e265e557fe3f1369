"""Ingest: landing JSON Lines -> bronze, quarantine, dlq and ops/ingest_batches (SPEC sections 2-3).

One Structured Streaming query per stream reads ``landing/<stream>/`` as text with
``trigger(availableNow=True)``; each Spark micro-batch is handed to :meth:`StreamIngest.process_batch`.

What a *micro-batch* means here. Spark may group many files into one trigger (``max_files_per_trigger``)
for throughput, but the time semantics are applied per landing file, in arrival order (file mtime, then
path) - exactly what Spark's own rule gives with one file per trigger. So results never depend on how
files were grouped into triggers, and every file gets its own row in ``ops/ingest_batches`` with its own
``batch_id`` (a per-stream sequence shared with heartbeats).

Every line ends up in exactly one place:

* ``quarantine`` with a reason (``bad_encoding``, ``malformed_json``, ``missing_field``, ``bad_timestamp``,
  ``bad_type``, ``early``; ``unreadable_file`` for a whole file that cannot be read),
* the duplicate count (an id already accepted or dead-lettered, or an earlier copy in the same batch),
* ``dlq`` with the watermark it missed (``event_time < watermark``),
* ``bronze`` (accepted).

Exactly once: for each Spark batch the ops rows are committed first (they are the intent log that pins
the batch ids), then bronze, quarantine and dlq, each with the Delta app transaction
``(sluice.ingest.<stream>, last batch id)``. A batch re-run after a crash reuses its batch ids and every
table that already has the commit skips it.
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import json
import logging
import os
import uuid
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlparse

import pyarrow.compute as pc
from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, Row, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import TimestampType

from sluice.config import Settings
from sluice.core.lake import Credentials, Root, credentials_for
from sluice.core.model import EVENT_TIME, StreamSpec
from sluice.core.progress import nothing, progress
from sluice.core.spark import collected_utc, local_frame
from sluice.core.timeutil import EARLIEST_EVENT_TIME
from sluice.storage import tables
from sluice.storage.engine import DeltaEngine
from sluice.storage.objects import ObjectInfo, ObjectStore, store_for
from sluice.storage.snapshots import read_small_table
from sluice.storage.state import lake_state
from sluice.storage.tables import HEARTBEAT_PREFIX

log = logging.getLogger("sluice.ingest")

# RFC 3339 date-time: a 'T' (or space) separator, optional fraction, and a mandatory zone (Z or +hh:mm).
# Spark's cast alone would also accept zoneless strings and read them in the session zone.
RFC3339 = r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d{1,9})?([Zz]|[+-]\d{2}:\d{2})$"
LANDING_GLOB = "*.{json,jsonl,json.gz,jsonl.gz}"
# A batch of landing files up to this size (gzip files counted at GZIP_RATIO times their size) has its ids
# broadcast for the dedup look-up (a few tens of MB of ids at most); larger ones are shuffled instead.
BROADCAST_BATCH_BYTES = 128 << 20
GZIP_RATIO = 8
# Up to this many quarantined and late lines in a batch are collected and written by the driver: a Parquet
# write job per table costs more than the rows. More (a whole file of bad lines) are written by Spark.
DRIVER_WRITE_ROWS = 10_000
LANDING_SUFFIXES = (".json", ".jsonl", ".json.gz", ".jsonl.gz")
LANDING_READ_OPTIONS = {
    # An unreadable file never fails the query: it is quarantined whole before the query runs, and Spark
    # skips it (and the partial lines of a truncated .gz).
    "ignoreCorruptFiles": "true",
    # SPARK-58518 (Spark 4.2.0): when a micro-batch holds a file whose name has one of [ ] { } * ? \, Spark
    # builds the batch with every other path of the batch once more per such name, so their lines are read
    # twice or more. With a recursive lookup the file index takes each file once from its listing. It also
    # lists the files of subfolders, which are not landing files: _process drops them.
    "recursiveFileLookup": "true",
}
# A landing zone on local disk only: Hadoop's checksumming local file system derives a ".<name>.crc" path by
# parsing the file name as a URI, which fails for names with ':' (events-2024-05-01T10:02:00Z.jsonl). The raw
# local file system reads the same bytes; it is set for this source only (uncached), because the checkpoints and
# state stores keep to the checksumming one. Never for a landing zone on object storage: the option travels
# with the batch into its writes, where S3A's upload buffer casts the local file system it gets to the
# checksumming class, and on an executor of a cluster that cast failed every write to an s3:// lake.
LOCAL_LANDING_READ_OPTIONS = {
    "fs.file.impl": "org.apache.hadoop.fs.RawLocalFileSystem",
    "fs.file.impl.disable.cache": "true",
}


def app_id(stream: str) -> str:
    return f"sluice.ingest.{stream}"


@dataclass
class BatchRow:
    """One row of ops/ingest_batches (a landing file or a heartbeat)."""

    stream: str
    batch_id: int
    lines: int = 0
    accepted: int = 0
    quarantined: int = 0
    late: int = 0
    duplicates: int = 0
    watermark_before: datetime | None = None
    watermark_after: datetime | None = None
    max_event_time: datetime | None = None
    max_arrival_time: datetime | None = None
    source_file: str | None = None
    is_heartbeat: bool = False
    spark_batch_id: int | None = None
    query_id: str | None = None

    @property
    def unreadable(self) -> bool:
        """A landing file quarantined whole before any Spark batch could read it (``unreadable_file``)."""
        return not self.is_heartbeat and self.spark_batch_id is None and self.source_file is not None


@dataclass
class StreamState:
    """What earlier batches of a stream left behind, derived from its ops/ingest_batches rows."""

    rows: list[BatchRow] = field(default_factory=list)

    def before(self, batch_id: int) -> StreamState:
        return StreamState([r for r in self.rows if r.batch_id < batch_id])

    @property
    def last_batch_id(self) -> int:
        return max((r.batch_id for r in self.rows), default=-1)

    @property
    def watermark(self) -> datetime | None:
        # The watermark never moves backwards: it is the max over every batch ever committed.
        return max((r.watermark_after for r in self.rows if r.watermark_after), default=None)

    @property
    def max_event_time(self) -> datetime | None:
        return max((r.max_event_time for r in self.rows if r.max_event_time), default=None)

    @property
    def last_arrival(self) -> datetime | None:
        return max((r.max_arrival_time for r in self.rows if r.max_arrival_time), default=None)

    def totals(self) -> dict[str, int]:
        keys = ("lines", "accepted", "quarantined", "late", "duplicates")
        return {k: sum(getattr(r, k) for r in self.rows) for k in keys}


def load_state(settings: Settings, stream: str) -> StreamState:
    """Read the stream's ops rows. ops/ingest_batches is metadata-sized (one row per file), so it is read
    on the driver directly with delta-rs rather than through a Spark job."""
    data = read_small_table(tables.INGEST_BATCHES.path(settings))
    if data is None:
        return StreamState()
    table = data.filter(pc.field("stream") == stream)
    names = {f.name for f in tables.INGEST_BATCHES.schema.fields}
    rows = [BatchRow(**{k: v for k, v in r.items() if k in names}) for r in table.to_pylist()]
    return StreamState(sorted(rows, key=lambda r: r.batch_id))


def _max(a: datetime | None, b: datetime | None) -> datetime | None:
    if a is None:
        return b
    if b is None:
        return a
    return max(a, b)


def source_key(uri: str) -> str:
    """A landing file's identity however it is spelled: the local path of a local file (``file:/a/b%20c.jsonl``
    and ``/a/b c.jsonl`` -> ``/a/b c.jsonl``), ``s3://bucket/key`` with the key decoded for an object."""
    if "://" not in uri and not uri.startswith("file:"):
        return os.path.normpath(uri)  # a plain path: nothing is encoded in it ('#', '%' are name characters)
    parsed = urlparse(uri)
    if parsed.scheme in ("s3", "s3a"):
        return f"s3://{parsed.netloc}{unquote(parsed.path)}"
    return unquote(parsed.path)


def spark_path(location: str) -> str:
    """A landing file's local path or object URI as Spark's ``_metadata.file_path`` spells it: Hadoop keeps ':'
    and non-ASCII as they are and percent-encodes the rest of what a URI cannot hold (space, '%', '#')."""
    safe = "/:@!$&'()*+,;=-._~"

    def encode(text: str) -> str:
        return "".join(c if ord(c) > 127 else quote(c, safe=safe) for c in text)

    if location.startswith(("s3://", "s3a://")):
        bucket, _, key = location.split("://", 1)[1].partition("/")
        return f"s3://{bucket}/{encode(key)}"
    return "file:" + encode(os.path.abspath(location))


def probe_file(location: str, credentials: Credentials | None = None) -> str | None:
    """Why a landing file (a local path or an ``s3://`` URI) cannot be read, or None when it can. A gzip file
    is decompressed to its end, because a truncated or corrupt member only shows there. Runs on executors
    (see ``_probe``), which reach an object with ``credentials``."""
    try:
        with _open_landing(location, credentials) as raw:
            if location.endswith(".gz"):
                with gzip.GzipFile(fileobj=raw) as fh:
                    while fh.read(1 << 20):
                        pass
            else:
                raw.read(1)
    except (OSError, EOFError, zlib.error) as exc:
        return f"{type(exc).__name__}: {exc}"
    except Exception as exc:  # an object store's refusal (botocore's ClientError: no such key, access denied)
        if type(exc).__module__.startswith("botocore"):
            return f"{type(exc).__name__}: {exc}"
        raise
    return None


def _open_landing(location: str, credentials: Credentials | None) -> Any:
    if not location.startswith(("s3://", "s3a://")):
        return open(location, "rb")
    bucket, _, key = location.split("://", 1)[1].partition("/")
    client = (credentials or Credentials.from_env()).boto3_client()
    return contextlib.closing(client.get_object(Bucket=bucket, Key=key)["Body"])


# --------------------------------------------------------------------------------------------------
# Transforms: small DataFrame -> DataFrame steps, shared by tests and the job.
# --------------------------------------------------------------------------------------------------
NUMBER_TYPES = ("BIGINT", "DECIMAL", "DOUBLE")
BAD_ENCODING_DETAIL = "line is not valid UTF-8; raw holds its bytes base64-encoded"


def _json_path(name: str) -> str:
    """A variant path to a top-level key; the quote that the name does not contain delimits it."""
    return f"$['{name}']" if "'" not in name else f'$["{name}"]'


def _canonical_double(value: Column) -> Column:
    """The canonical JSON text of a number that only fits a double (exponent notation, huge values):
    integral values as plain digits (``1.5e3`` -> ``1500``, not Spark's ``1500.0``), others in
    exponent form (``1e-7``); infinities have no JSON text (null, so they are a ``bad_type``)."""
    finite = ~F.isnan(value) & (F.abs(value) < F.lit(float("inf")))
    integral = (value == F.floor(value)) & (F.abs(value) < F.lit(1e21))
    java = value.cast("string")  # Java's shortest form: 1.0E-7, 1.2345678901234568E41, 0.001
    exponent = F.regexp_replace(F.regexp_replace(java, r"\.0E", "E"), r"E(\d)", "e+$1")
    return F.when(finite & integral, value.cast("decimal(38,0)").cast("string")).when(
        finite, F.regexp_replace(exponent, "E-", "e-"))


def parse_lines(spec: StreamSpec) -> Any:
    """Parse ``raw`` JSON and give, per declared field, its JSON type (``_t_<field>``: STRING, BIGINT,
    DECIMAL(p,s), DOUBLE, BOOLEAN, OBJECT<..>, ARRAY<..>, VOID for null; null when absent), its text
    (``_s_<field>``: the string itself, or the canonical JSON text of any other value) and its value in
    the declared type (``_v_<field>``, null when the JSON type cannot hold it). Flags lines that are not
    valid UTF-8 (``_bad_encoding``) and lines that are not a JSON object (``_malformed``).

    The line is parsed once, as a VARIANT, because the JSON type decides what is valid: a struct schema
    would turn ``1.5e3`` into "1500.0", an object into its text and bad bytes into U+FFFD, silently."""

    def transform(df: DataFrame) -> DataFrame:
        utf8 = F.is_valid_utf8("raw")
        doc = F.when(utf8, F.try_parse_json("raw"))
        not_one_object = doc.isNull() | ~F.col("raw").rlike(r"^\s*\{") | _trailing_content(F.col("raw"))
        df = df.select("*", doc.alias("_doc"), (~utf8).alias("_bad_encoding"),
                       (utf8 & not_one_object).alias("_malformed"))
        df = df.select("*", *[F.try_variant_get("_doc", _json_path(spec.json_name(f)), "variant").alias(f"_j_{f}")
                              for f in spec.fields])
        df = df.select("*", *[F.schema_of_variant(f"_j_{f}").alias(f"_t_{f}") for f in spec.fields])
        df = df.select("*", *[_text(f).alias(f"_s_{f}") for f in spec.fields])
        values = [typed_value(spec, f).alias(f"_v_{f}") for f in spec.fields if f != EVENT_TIME]
        return df.select("*", *values).drop("_doc", *[f"_j_{f}" for f in spec.fields])

    return transform


# JSON text with its strings blanked (``"a}b"`` -> ``""``), so that only structure is left. The unrolled,
# possessive form never backtracks, so a long line costs one pass.
JSON_STRING = r'"[^"\\]*+(?:\\.[^"\\]*+)*+"'
JSON_SPACE = "[ \t\r\n]*"


def _count(text: Column, char: str) -> Column:
    return F.length(text) - F.length(F.replace(text, F.lit(char), F.lit("")))


def _trailing_content(raw: Column) -> Column:
    """Whether a line that starts with a JSON object holds anything but whitespace after it
    (``{...}{...}``, ``{...} xyz``, ``{...}\\0``). Spark's ``try_parse_json`` returns the first value and
    ignores the rest, so without this the second record of ``{...}{...}`` would vanish without a trace.

    A flat object (one ``{`` and one ``}``, the last character) is settled by counting. Otherwise the
    strings are blanked and the brackets walked: the first object must close exactly at the end."""
    ends_with_brace = r"\}" + JSON_SPACE + "$"
    flat = (_count(raw, "{") == 1) & (_count(raw, "}") == 1) & raw.rlike(ends_with_brace)
    structure = F.regexp_replace(raw, JSON_STRING, '""')
    brackets = F.split(F.regexp_replace(structure, r"[^\[\]{}]", ""), "")
    # (depth, how often the depth fell to 0 or below): a single object reaches 0 once, at its last bracket.
    walk = F.aggregate(
        brackets, F.struct(F.lit(0).alias("depth"), F.lit(0).alias("closed")),
        lambda acc, c: F.struct(
            (acc["depth"] + F.when(c.isin("{", "["), 1).otherwise(-1)).alias("depth"),
            (acc["closed"] + F.when(acc["depth"] + F.when(c.isin("{", "["), 1).otherwise(-1) <= 0, 1)
             .otherwise(0)).alias("closed"),
        ),
    )
    one_object = structure.rlike(ends_with_brace) & (walk["depth"] == 0) & (walk["closed"] == 1)
    return F.when(flat, F.lit(False)).otherwise(~one_object)


def _is_number(field_name: str) -> Column:
    jtype = F.col(f"_t_{field_name}")
    return F.greatest(*[jtype.startswith(t) for t in NUMBER_TYPES])


def _text(field_name: str) -> Column:
    value, jtype = F.col(f"_j_{field_name}"), F.col(f"_t_{field_name}")
    return (
        F.when(jtype == "STRING", F.variant_get(value, "$", "string"))
        .when(jtype == "DOUBLE", _canonical_double(F.variant_get(value, "$", "double")))
        .when(jtype != "VOID", F.to_json(value))
    )


def _rfc3339(text: Column) -> Column:
    """An RFC 3339 timestamp, or null. Spark's cast alone would accept zoneless strings (session zone)."""
    # RFC 3339 allows a lower-case "t" and "z"; Spark's parser does not.
    return F.when(text.rlike(RFC3339), F.try_to_timestamp(F.upper(text)))


def typed_value(spec: StreamSpec, field_name: str) -> Column:
    """The declared type's value of a field, or null when its JSON type cannot hold it (SPEC 2: a number
    is a string's canonical text; text is never a number; only true and false are booleans)."""
    text, jtype = F.col(f"_s_{field_name}"), F.col(f"_t_{field_name}")
    kind = spec.type_of(field_name)
    if kind == "string":
        return F.when((jtype == "STRING") | _is_number(field_name), text)
    if kind == "timestamp":
        return F.when(jtype == "STRING", _rfc3339(F.trim(text)))
    if kind == "boolean":
        return F.when(jtype == "BOOLEAN", text == "true")
    # long and double: a JSON number whose exact value the type holds ("1.5" is not a long).
    return F.when(_is_number(field_name), text.try_cast(kind))


def classify_invalid(spec: StreamSpec) -> Any:
    """Assign quarantine reasons (bad_encoding, malformed_json, missing_field, bad_timestamp, bad_type,
    early), in that order, with a ``detail`` that names the field."""

    def transform(df: DataFrame) -> DataFrame:
        def null(f: str) -> Column:
            jtype = F.col(f"_t_{f}")
            return jtype.isNull() | (jtype == "VOID")

        def absent(f: str) -> Column:
            # Blank text counts as missing only where a value is required; in an optional number or
            # boolean it is text where a number is declared (bad_type), never a silent null.
            jtype = F.col(f"_t_{f}")
            return null(f) | ((jtype == "STRING") & (F.trim(F.col(f"_s_{f}")) == ""))

        missing = [absent(f) for f in spec.required]
        missing_names = F.concat_ws(
            ",", *[F.when(m, F.lit(spec.json_name(f))) for m, f in zip(missing, spec.required, strict=True)]
        )
        raw_ts = F.trim(F.col(f"_s_{EVENT_TIME}"))
        event_time = F.when(F.col(f"_t_{EVENT_TIME}") == "STRING", _rfc3339(raw_ts))
        too_old = event_time < F.lit(EARLIEST_EVENT_TIME)
        any_missing = F.lit(False)
        for m in missing:
            any_missing = any_missing | m
        # Fields other than event_time whose JSON value the declared type cannot hold.
        wrong = [(f, ~null(f) & F.col(f"_v_{f}").isNull()) for f in spec.fields if f != EVENT_TIME]
        bad_ts = [(f, w) for f, w in wrong if spec.type_of(f) == "timestamp"]
        bad_type = [(f, w) for f, w in wrong if spec.type_of(f) != "timestamp"]

        def first(problems: list[tuple[str, Column]], label: str) -> Column:
            out = F.lit(None).cast("string")
            for f, w in reversed(problems):
                text = F.concat(F.lit(f"{spec.json_name(f)}: "), F.coalesce(F.col(f"_s_{f}"), F.lit("<null>")),
                                F.lit(f" is not a {label or spec.type_of(f)}"))
                out = F.when(w, text).otherwise(out)
            return out

        any_of = lambda problems: F.lit(False) if not problems else F.greatest(  # noqa: E731
            *[w for _f, w in problems], F.lit(False))
        early_bound = F.col("arrival_time") + F.expr(
            f"make_dt_interval(0, 0, 0, {spec.early_tolerance.total_seconds()})"
        )
        reason = (
            F.when(F.col("_bad_encoding"), "bad_encoding")
            .when(F.col("_malformed"), "malformed_json")
            .when(any_missing, "missing_field")
            .when(event_time.isNull() | too_old, "bad_timestamp")
            .when(any_of(bad_ts), "bad_timestamp")
            .when(any_of(bad_type), "bad_type")
            .when(event_time > early_bound, "early")
        )
        detail = (
            F.when(F.col("_bad_encoding"), BAD_ENCODING_DETAIL)
            .when(F.col("_malformed"), None)
            .when(any_missing, F.concat(F.lit("missing: "), missing_names))
            .when(event_time.isNull(), F.concat(F.lit(f"{spec.json_name(EVENT_TIME)}: "),
                                                F.coalesce(raw_ts, F.lit("<null>"))))
            .when(too_old, F.concat(F.lit(f"{spec.json_name(EVENT_TIME)}: "), raw_ts,
                                    F.lit(f" is before {EARLIEST_EVENT_TIME:%Y-%m-%dT%H:%M:%SZ}, the earliest "
                                          "event time sluice accepts")))
            .when(any_of(bad_ts), first(bad_ts, "RFC 3339 timestamp"))
            .when(any_of(bad_type), first(bad_type, ""))
            .when(event_time > early_bound, F.concat(F.lit("arrival_time + "),
                                                     F.lit(str(spec.early_tolerance)), F.lit(" exceeded")))
        )
        return df.withColumn("event_time", event_time).withColumn("reason", reason).withColumn("detail", detail)

    return transform


def seen_in_batch(seen_ids: DataFrame, spec: StreamSpec, *, small: bool = True) -> Any:
    """Flag (``_seen``) the valid records whose id was already accepted or dead-lettered (``seen_ids``:
    one ``id`` column, the text the id was parsed from).

    The look-up goes from the horizon to the batch: every id of the horizon is probed against a hash of
    the batch's ids (broadcast when the batch is ``small``), and only the few that match are joined back.
    The dedup horizon (rate x ``dedup_retention``) is much larger than a steady-state batch, and shuffling
    all of it to join it with the batch cost more than the rest of the batch's work."""

    def transform(df: DataFrame) -> DataFrame:
        id_col = f"_s_{spec.id_field}"
        batch_ids = df.filter(F.col("reason").isNull()).select(F.col(id_col).alias("id"))
        matched = seen_ids.select("id").join(F.broadcast(batch_ids) if small else batch_ids, "id", "left_semi")
        seen = matched.distinct().select(F.col("id").alias("_seen_id"), F.lit(True).alias("_seen"))
        return df.join(seen, df[id_col] == seen["_seen_id"], "left").drop("_seen_id")

    return transform


def mark_duplicates(spec: StreamSpec) -> Any:
    """A valid record is a duplicate when its id was already accepted or dead-lettered (``_seen``, from
    :func:`seen_in_batch`), or an earlier copy exists in this batch (earlier file in arrival order; ties
    broken by the raw line so the choice is deterministic)."""

    def transform(df: DataFrame) -> DataFrame:
        id_col = f"_s_{spec.id_field}"
        candidate = F.col("reason").isNull()
        # Valid copies rank first: a quarantined copy of the id (bad timestamp, early) is not a record, so it
        # must not make the valid one a duplicate - as it cannot when the two land in different triggers.
        # Arrival order is (mtime, path), the order batch ids are given in.
        order = Window.partitionBy(id_col).orderBy(F.col("reason").isNotNull(), "arrival_time", "source_file", "raw")
        ranked = df.withColumn("_rank", F.when(candidate, F.row_number().over(order)))
        is_dup = candidate & ((F.col("_rank") > 1) | F.col("_seen").isNotNull())
        return ranked.withColumn("_duplicate", F.coalesce(is_dup, F.lit(False))).drop("_rank", "_seen")

    return transform


def file_watermarks(
    per_file_max: Sequence[tuple[int, datetime | None]], start: datetime | None, delay: timedelta
) -> dict[int, tuple[datetime | None, datetime | None]]:
    """Spark's watermark rule applied file by file: a file is judged against the max event time accepted
    in *earlier* files (minus the delay), and the watermark never moves backwards.

    Late records cannot raise the max (they are below a watermark that is already <= the max), so the
    max over all non-duplicate valid records of a file equals the max over its accepted ones; that is
    what lets this run without first knowing which records are late."""
    out: dict[int, tuple[datetime | None, datetime | None]] = {}
    watermark = start
    for seq, max_event in sorted(per_file_max, key=lambda item: item[0]):
        before = watermark
        if max_event is not None:
            watermark = _max(watermark, max_event - delay)
        out[seq] = (before, watermark)
    return out


# --------------------------------------------------------------------------------------------------
class StreamIngest:
    """Runs one availableNow ingest query for one stream and the heartbeat after it."""

    def __init__(self, spark: SparkSession, settings: Settings, engine: DeltaEngine, spec: StreamSpec):
        self.spark = spark
        self.settings = settings
        self.engine = engine
        self.spec = spec
        self.bronze = tables.bronze(spec)
        self.quarantine = tables.quarantine(spec)
        self.dlq = tables.dlq(spec)
        # The ingest query's Spark checkpoint (a URI under the lake), and sluice's own objects beside it.
        self.checkpoint = settings.lake.checkpoint("ingest", spec.name)
        self._state = ("ingest", spec.name)
        self.reports: list[BatchRow] = []
        # The readable landing files this cycle found new: what the ingest query's batches are made of.
        self._pending: list[ObjectInfo] = []
        self._advance: Callable[[int], None] = nothing

    # -- setup --------------------------------------------------------------------------------------
    def ensure_tables(self) -> None:
        for table in (tables.INGEST_BATCHES, self.bronze, self.quarantine, self.dlq):
            self.engine.ensure_table(table.path(self.settings), table.schema, table.partition_by)

    def query_id(self) -> str:
        """Identifies the checkpoint lineage, so that Spark batch ids of a new checkpoint (which restart at
        0) are never mistaken for those of an old one."""
        # Put-if-absent: two processes that race to start a new lineage agree on one id.
        return lake_state(self.settings).create(uuid.uuid4().hex, *self._state, "sluice_query_id").strip()

    # -- the cycle ----------------------------------------------------------------------------------
    def run(self) -> list[BatchRow]:
        self.ensure_tables()
        self.reconcile_single_row_batches()
        landing = self.settings.landing.join(self.spec.name)
        # One listing serves the unreadable-file probe, the "anything to do?" test and the progress total.
        listed = self._listing()
        readable = self.quarantine_unreadable(self._new_files(listed)) if listed is not None else []
        self._pending = readable
        if listed is not None and (readable or self._uncommitted_batch()):
            with progress(len(readable), f"ingest {self.spec.name}", "file") as self._advance:
                self._run_query(landing)
            self._advance = nothing
        elif listed is not None:
            log.info("%s: no new landing files", self.spec.name)
        else:
            log.info("%s: landing directory %s does not exist yet; stream is idle", self.spec.name, landing)
        self.maybe_heartbeat()
        return self.reports

    def _uncommitted_batch(self) -> bool:
        """Whether the ingest query planned a Spark batch it never committed (a crash). Together with new
        landing files, this decides whether the query runs at all: starting an availableNow query costs
        seconds even when it finds nothing, which is the common case of a scheduled cycle. (A file that
        yields no ops row, e.g. an empty one, only costs that start on each cycle.)"""

        state = lake_state(self.settings)

        def last(folder: str) -> int:
            return max((int(o.name) for o in state.list(*self._state, folder) if o.name.isdigit()), default=-1)

        return last("offsets") != last("commits")

    def _listing(self) -> list[ObjectInfo] | None:
        """The objects directly in the stream's landing folder (paged on object storage), or None when the
        folder does not exist: on object storage, when no object has its prefix yet."""
        listed = list(landing_store(self.settings).list(self.spec.name))
        if self.settings.landing.is_local:
            return listed if self.settings.landing.local(self.spec.name).is_dir() else None
        return listed or None

    def _new_files(self, listed: list[ObjectInfo]) -> list[ObjectInfo]:
        """Landing files that no ops row records yet, in arrival order (mtime or LastModified, then path). Like
        Spark's file source, names starting with '.' or '_' (in-flight files) are not landing files."""
        seen = {source_key(r.source_file) for r in load_state(self.settings, self.spec.name).rows if r.source_file}
        found = [
            f for f in listed
            if f.name.endswith(LANDING_SUFFIXES) and not f.name.startswith((".", "_")) and source_key(f.uri) not in seen
        ]
        return sorted(found, key=lambda f: (f.modified, f.uri))

    # -- unreadable files ---------------------------------------------------------------------------
    def quarantine_unreadable(self, new: list[ObjectInfo]) -> list[ObjectInfo]:
        """SPEC 2: a file that cannot be read at all (a corrupt or truncated .gz, no read permission) gets
        one quarantine row, reason ``unreadable_file`` with the error in ``detail``, and its own ops row,
        so that it never blocks the stream. The streaming query then skips it (``ignoreCorruptFiles``) and
        drops any lines Spark could read from it before the corruption. Returns the readable ones."""
        errors = self._probe([f.uri for f in new])
        state = load_state(self.settings, self.spec.name)
        batch_id = state.last_batch_id
        for f in new:
            if errors.get(f.uri) is None:
                continue
            batch_id += 1
            arrival = f.modified
            # The file counts as one line, its one quarantine row, so lines = accepted + quarantined + late +
            # duplicates still holds for every batch.
            row = BatchRow(
                stream=self.spec.name, batch_id=batch_id, lines=1, quarantined=1, watermark_before=state.watermark,
                watermark_after=state.watermark, max_arrival_time=arrival, source_file=spark_path(f.uri),
            )
            log.warning("%s: %s cannot be read and is quarantined whole (%s)", self.spec.name, f.name, errors[f.uri])
            self.engine.append_rows(
                self._ops_rows([row]), tables.INGEST_BATCHES.schema, tables.INGEST_BATCHES.path(self.settings),
                app_id=app_id(self.spec.name), version=batch_id, metadata=self._single_meta(row),
            )
            self._write_unreadable(row, errors[f.uri])
            self._report(row)
        return [f for f in new if errors.get(f.uri) is None]

    def _probe(self, paths: list[str]) -> dict[str, str | None]:
        """probe_file for each path. Decompressing a .gz to its end is real work, so it runs on the
        executors, never pulling file contents through the driver; other files only need an open()."""
        gz = [p for p in paths if p.endswith(".gz")]
        # An object is read with the landing zone's credentials, on the driver and the executors alike.
        credentials = credentials_for(self.settings.landing.uri)
        out = {p: probe_file(p, credentials) for p in paths if not p.endswith(".gz")}
        if gz:
            probed = (self.spark.sparkContext.parallelize(gz, len(gz))
                      .map(lambda p: (p, probe_file(p, credentials))).collect())
            out.update(dict(probed))
        return out

    def _write_unreadable(self, row: BatchRow, error: str | None) -> None:
        assert row.source_file is not None and row.max_arrival_time is not None
        detail = f"file cannot be read: {error or 'unknown error (it may have been replaced since)'}"
        record = (None, row.source_file, "unreadable_file", detail, row.max_arrival_time, row.batch_id)
        self.engine.append_rows(
            [record], self.quarantine.schema, self.quarantine.path(self.settings), app_id=app_id(self.spec.name),
            version=row.batch_id, metadata=self._single_meta(row),
        )

    def _run_query(self, landing: str) -> None:
        self._query_id = self.query_id()
        stream = (
            self.spark.readStream.format("text")
            .option("pathGlobFilter", LANDING_GLOB)
            .options(**LANDING_READ_OPTIONS)
            .options(**(LOCAL_LANDING_READ_OPTIONS if self.settings.landing.is_local else {}))
            .option("maxFilesPerTrigger", str(self.settings.max_files_per_trigger))
            .load(landing)
            .select(
                F.col("value").alias("raw"),
                F.col("_metadata.file_path").alias("source_file"),
                F.col("_metadata.file_modification_time").alias("arrival_time"),
            )
        )
        query = (
            stream.writeStream.queryName(f"sluice_ingest_{self.spec.name}")
            .option("checkpointLocation", self.checkpoint)
            .trigger(availableNow=True)
            .foreachBatch(self.process_batch)
            .start()
        )
        query.awaitTermination()

    # -- one Spark micro-batch ------------------------------------------------------------------------
    def process_batch(self, df: DataFrame, spark_batch_id: int) -> None:
        state = load_state(self.settings, self.spec.name)
        # Lines Spark read from a file quarantined whole (the start of a truncated .gz) are not records.
        unreadable = {r.source_file for r in state.rows if r.unreadable and r.source_file}
        self._process(df, spark_batch_id, state, unreadable)

    def _process(self, df: DataFrame, spark_batch_id: int, state: StreamState, unreadable: set[str]) -> None:
        spec = self.spec
        if unreadable:
            df = df.filter(~F.col("source_file").isin(sorted(unreadable)))
        existing = sorted(
            (r for r in state.rows if r.spark_batch_id == spark_batch_id and r.query_id == self._query_id),
            key=lambda r: r.batch_id,
        )
        # A retry of a batch whose ops rows were committed reuses exactly the same batch ids.
        first_id = existing[0].batch_id if existing else state.last_batch_id + 1
        prior = state.before(first_id)
        # Parsed once: the batch's ids are taken from it for the dedup look-up, and it is then marked.
        # Parse and classify columns that nothing after them reads: not cached, and not shuffled by dedup.
        spent = [*(f"_t_{f}" for f in spec.fields), *(f"_s_{f}" for f in spec.fields if f != spec.id_field),
                 "_bad_encoding", "_malformed"]
        classified = df.transform(parse_lines(spec)).transform(classify_invalid(spec)).drop(*spent).persist(
            StorageLevel.MEMORY_AND_DISK)
        try:
            flag_seen = seen_in_batch(self._seen_ids(prior, first_id), spec, small=self._small_batch())
            parsed = classified.transform(flag_seen).transform(mark_duplicates(spec)).persist(
                StorageLevel.MEMORY_AND_DISK)
            try:
                # One Spark job lists the batch's files and counts what happened to their lines.
                per_file = self._per_file(parsed, prior.watermark)
                # The file path as Spark spelled it may differ from ours (spark_path): judge by identity.
                unread = {source_key(u) for u in unreadable}
                skipped = {path for path in per_file if source_key(path) in unread or self._nested(path)}
                if skipped:
                    self._process(df, spark_batch_id, state, unreadable | skipped)
                elif per_file:
                    self._finish_batch(parsed, per_file, existing, prior, spark_batch_id, first_id)
            finally:
                parsed.unpersist()
        finally:
            classified.unpersist()

    def _nested(self, path: str) -> bool:
        """Whether a file Spark read lies in a subfolder of the landing folder (the recursive lookup lists
        those too): landing files are the folder's own files, as the listing of new files has them."""
        folder = source_key(self.settings.landing.join(self.spec.name))
        nested = source_key(path).rsplit("/", 1)[0] != folder.rstrip("/")
        if nested:
            log.warning("%s: ignoring %s: landing files must sit directly in %s", self.spec.name,
                        source_key(path), folder)
        return nested

    @staticmethod
    def _per_file(parsed: DataFrame, watermark: datetime | None) -> dict[str, Row]:
        """Per landing file of the batch: its arrival time, lines, the max event time of its candidate
        records (valid, not duplicates), and how many lines were quarantined, duplicates, or below
        ``watermark`` (the stream's watermark before the batch: late, for every file that the batch's own
        earlier files do not move it past)."""
        candidate = F.col("reason").isNull() & ~F.col("_duplicate")
        below = candidate & (F.col("event_time") < F.lit(watermark)) if watermark else F.lit(False)
        rows = (
            parsed.groupBy("source_file", "arrival_time")
            .agg(
                F.count(F.lit(1)).alias("lines"),
                F.max(F.when(candidate, F.col("event_time"))).alias("max_event"),
                F.count(F.when(F.col("reason").isNotNull(), 1)).alias("quarantined"),
                F.count(F.when(F.col("reason").isNull() & F.col("_duplicate"), 1)).alias("duplicates"),
                F.count(F.when(below, 1)).alias("below_watermark"),
            )
            .collect()
        )
        return {r["source_file"]: r for r in rows}

    def _small_batch(self) -> bool:
        """Whether a batch's ids are few enough to be broadcast for the dedup look-up, judged from the size
        of the landing files this cycle listed (metadata, no Spark job): a batch holds at most
        ``max_files_per_trigger`` of them. Either way the result is the same."""
        if not self._pending:
            # Only a batch planned before a crash is left, of files this cycle no longer lists: size unknown.
            return False
        sizes = [f.size * GZIP_RATIO if f.name.endswith(".gz") else f.size for f in self._pending]
        largest = sorted(sizes, reverse=True)[: self.settings.max_files_per_trigger]
        return sum(largest) <= BROADCAST_BATCH_BYTES

    def _finish_batch(
        self,
        parsed: DataFrame,
        per_file: dict[str, Row],
        existing: list[BatchRow],
        prior: StreamState,
        spark_batch_id: int,
        first_id: int,
    ) -> None:
        spec = self.spec
        # Batch ids follow arrival order (mtime, then path), as one file per trigger would give them.
        files = sorted((collected_utc(r["arrival_time"]), path) for path, r in per_file.items())
        if existing:
            by_file = {r.source_file: r.batch_id for r in existing}
            seq = {path: by_file[path] for _arrival, path in files}
        else:
            seq = {path: first_id + i for i, (_arrival, path) in enumerate(files)}
        last_id = max(seq.values())
        max_event = {seq[p]: collected_utc(r["max_event"]) for p, r in per_file.items() if r["max_event"] is not None}
        marks = file_watermarks([(s, max_event.get(s)) for s in seq.values()], prior.watermark, spec.watermark_delay)
        files_df = local_frame(
            self.spark,
            [(path, s, marks[s][0]) for path, s in seq.items()],
            "source_file string, _file_seq long, _wm_before timestamp",
        )
        status = (
            F.when(F.col("reason").isNotNull(), "quarantined")
            .when(F.col("_duplicate"), "duplicate")
            .when(F.col("_wm_before").isNotNull() & (F.col("event_time") < F.col("_wm_before")), "late")
            .otherwise("accepted")
        )
        # Cheap to recompute from the cached `parsed` (a broadcast join and a column), so not cached itself.
        final = parsed.join(F.broadcast(files_df), "source_file").withColumn("_status", status)
        late = {seq[p]: r["below_watermark"] for p, r in per_file.items()}
        if any(before != prior.watermark for before, _after in marks.values()):
            # An earlier file of the batch moved the watermark for a later one (a catch-up of several files):
            # count those files' late records against their own watermark.
            late = {s: 0 for s in seq.values()}
            late.update({
                r["_file_seq"]: r["n"]
                for r in final.filter(F.col("_status") == "late").groupBy("_file_seq")
                .agg(F.count(F.lit(1)).alias("n")).collect()
            })
        rows = []
        for arrival, path in files:
            s, counts = seq[path], per_file[path]
            before, after = marks[s]
            rows.append(BatchRow(
                stream=spec.name,
                batch_id=s,
                lines=counts["lines"],
                accepted=counts["lines"] - counts["quarantined"] - counts["duplicates"] - late[s],
                quarantined=counts["quarantined"],
                late=late[s],
                duplicates=counts["duplicates"],
                watermark_before=before,
                watermark_after=after,
                max_event_time=max_event.get(s),
                max_arrival_time=arrival,
                source_file=path,
                spark_batch_id=spark_batch_id,
                query_id=self._query_id,
            ))
        self._commit(final, rows, first_id, last_id)

    def _commit(self, final: DataFrame, rows: list[BatchRow], first_id: int, last_id: int) -> None:
        spec = self.spec
        meta = {
            "stream": spec.name,
            "batch_ids": [first_id, last_id],
            "watermark_before": rows[0].watermark_before,
            "watermark_after": rows[-1].watermark_after,
            "spark_batch_id": rows[0].spark_batch_id,
            "query_id": rows[0].query_id,
        }
        appid = app_id(spec.name)
        # The ops rows go first: they pin the batch ids if the rest has to be retried.
        self.engine.append_rows(
            self._ops_rows(rows), tables.INGEST_BATCHES.schema, tables.INGEST_BATCHES.path(self.settings),
            app_id=appid, version=last_id, metadata=meta,
        )
        payload = [F.col(f"_v_{f}").alias(f) if f != EVENT_TIME else F.col(EVENT_TIME) for f in spec.fields]
        lineage = [F.col("arrival_time"), F.col("source_file"), F.col("_file_seq").alias("ingest_batch_id")]
        accepted = final.filter(F.col("_status") == "accepted").select(
            *payload, *lineage, F.lit(False).alias("is_heartbeat"),
            F.to_date("event_time").alias("event_date"), F.hour("event_time").alias("event_hour"),
        )
        # One file per event hour, rows in id order: fewer files, and deterministic file content.
        accepted = accepted.repartition("event_date", "event_hour").sortWithinPartitions(
            spec.id_field, "ingest_batch_id"
        )
        # A line that is not UTF-8 cannot be stored as text (readers of the table would fail on it), so
        # its bytes are kept losslessly as base64, as its detail says.
        # (Spark's base64 may wrap lines MIME-style; the stored text has no line breaks.)
        b64 = F.regexp_replace(F.base64(F.col("raw").cast("binary")), r"\s", "")
        raw = F.when(F.col("reason") == "bad_encoding", b64).otherwise(F.col("raw"))
        totals = {k: sum(getattr(r, k) for r in rows) for k in ("accepted", "quarantined", "late")}
        # A few rejected lines (the usual share is about 1%): one Spark job collects both kinds and the driver
        # writes them, instead of a Parquet write job per table. Not when a late record may hold a timestamp
        # that Python cannot (before year 1): only its event time is bounded, by EARLIEST_EVENT_TIME.
        other_times = any(spec.type_of(f) == "timestamp" for f in spec.fields if f != EVENT_TIME)
        on_driver = 0 < totals["quarantined"] + totals["late"] <= DRIVER_WRITE_ROWS and not other_times
        writes = [(self.bronze, accepted, totals["accepted"])]
        if not on_driver:
            quarantined = final.filter(F.col("_status") == "quarantined").select(
                raw.alias("raw"), "source_file", "reason", "detail", "arrival_time",
                F.col("_file_seq").alias("ingest_batch_id"),
            ).coalesce(1).sortWithinPartitions("ingest_batch_id", "raw")
            late = final.filter(F.col("_status") == "late").select(
                *payload, F.col("_wm_before").alias("watermark"), *lineage, "raw"
            ).coalesce(1).sortWithinPartitions("ingest_batch_id", spec.id_field)
            writes += [(self.quarantine, quarantined, totals["quarantined"]), (self.dlq, late, totals["late"])]
        for table, frame, n in writes:
            if n:
                self.engine.append(
                    frame, table.path(self.settings), app_id=appid, version=last_id, metadata=meta
                )
        if on_driver:
            # A quarantined line's parsed values are not stored (and may be out of Python's range): nulls.
            is_late = F.col("_status") == "late"
            late_payload = [F.when(is_late, F.col(f"_v_{f}" if f != EVENT_TIME else f)).alias(f) for f in spec.fields]
            side = final.filter(F.col("_status").isin("quarantined", "late")).select(
                *late_payload, F.when(is_late, F.col("_wm_before")).alias("watermark"), *lineage, raw.alias("raw"),
                # Prefixed: a stream may have fields of these names.
                F.col("reason").alias("_q_reason"), F.col("detail").alias("_q_detail"), "_status",
            )
            self._write_rows_on_driver(side.collect(), appid, last_id, meta)
        for row in rows:
            self._report(row)

    def _write_rows_on_driver(self, collected: list[Row], appid: str, version: int, meta: dict[str, Any]) -> None:
        """Quarantine and DLQ rows of a batch, collected, written as the Spark writes would lay them out:
        one file per table, rows in (batch, raw line) and (batch, id) order."""
        by_status: dict[str, list[dict[str, Any]]] = {"quarantined": [], "late": []}
        for row in collected:
            record = row.asDict()
            if record["_status"] == "quarantined":
                record = {**{k: record[k] for k in ("raw", "source_file", "arrival_time", "ingest_batch_id")},
                          "reason": record["_q_reason"], "detail": record["_q_detail"]}
            by_status[row["_status"]].append(record)
        id_field = self.spec.id_field
        for table, records, key in (
            (self.quarantine, by_status["quarantined"], lambda r: (r["ingest_batch_id"], r["raw"])),
            (self.dlq, by_status["late"], lambda r: (r["ingest_batch_id"], r[id_field])),
        ):
            if not records:
                continue
            schema = table.schema
            stamps = [f.name for f in schema.fields if isinstance(f.dataType, TimestampType)]
            for record in records:
                for name in stamps:
                    if record[name] is not None:
                        record[name] = collected_utc(record[name])
            self.engine.append_rows(
                [tuple(r[n] for n in schema.names) for r in sorted(records, key=key)], schema,
                table.path(self.settings), app_id=appid, version=version, metadata=meta,
            )

    @staticmethod
    def _ops_rows(rows: Iterable[BatchRow]) -> list[tuple[Any, ...]]:
        return [tuple(asdict(r).values()) for r in rows]

    def _seen_ids(self, prior: StreamState, first_id: int) -> DataFrame:
        """Ids that were accepted or dead-lettered before this batch, within the dedup horizon.

        The horizon (watermark - dedup_retention) is the memory bound of dedup: bronze is partitioned by
        event hour, so only the hours inside the horizon are read."""
        horizon = prior.watermark - self.settings.dedup_retention if prior.watermark else None

        in_horizon = tables.hours_overlapping(horizon, None)

        id_field = self.spec.id_field
        bronze = self.engine.read(self.bronze.path(self.settings), files=in_horizon)
        dlq = self.engine.read(self.dlq.path(self.settings))
        keep = F.col("ingest_batch_id") < first_id
        if horizon is not None:
            keep = keep & (F.col("event_time") >= F.lit(horizon))
        # Ids are compared as the text they were parsed from (bronze holds the declared type).
        ids = F.col(id_field).cast("string").alias("id")
        return bronze.filter(keep & ~F.col("is_heartbeat")).select(ids).unionByName(dlq.filter(keep).select(ids))

    # -- heartbeats ---------------------------------------------------------------------------------
    def maybe_heartbeat(self) -> None:
        """SPEC 3: a stream is idle when now - latest arrival >= idle_timeout; it then gets a heartbeat at
        event time now - idle_timeout, recorded after this cycle's files, which advances the watermark as
        a record would. A heartbeat that would not move the watermark is pointless and is not stored."""
        spec = self.spec
        state = load_state(self.settings, spec.name)
        now = self.settings.now()
        last = state.last_arrival
        if last is None:
            # A stream that has never received a file is not idle: it has no clock yet. A heartbeat at
            # wall-clock time would move its watermark to today, and the history its producer lands first
            # (event times of last year) would all be late. It holds its pipelines' windows open instead.
            log.info("%s: no file has arrived yet; no watermark, no heartbeat", spec.name)
            return
        if now - last < spec.idle_timeout:
            return
        event_time = now - spec.idle_timeout
        watermark = state.watermark
        after = event_time - spec.watermark_delay
        if watermark is not None and after <= watermark:
            return
        row = BatchRow(
            stream=spec.name,
            batch_id=state.last_batch_id + 1,
            watermark_before=watermark,
            watermark_after=_max(watermark, after),
            max_event_time=event_time,
            is_heartbeat=True,
        )
        self.engine.append_rows(
            self._ops_rows([row]), tables.INGEST_BATCHES.schema, tables.INGEST_BATCHES.path(self.settings),
            app_id=app_id(spec.name), version=row.batch_id, metadata=self._single_meta(row),
        )
        self._write_heartbeat(row)
        self._report(row)

    def reconcile_single_row_batches(self) -> None:
        """Finish heartbeats and unreadable files whose ops row was committed but whose bronze or
        quarantine row was not (a crash between the two commits), before any new batch can take a higher
        version."""
        state = load_state(self.settings, self.spec.name)
        appid = app_id(self.spec.name)
        bronze_done = self.engine.committed_version(self.bronze.path(self.settings), appid)
        quarantine_done = self.engine.committed_version(self.quarantine.path(self.settings), appid)
        for row in state.rows:
            if row.is_heartbeat and (bronze_done is None or row.batch_id > bronze_done):
                log.warning("%s: completing heartbeat batch %s after an interrupted cycle",
                            self.spec.name, row.batch_id)
                self._write_heartbeat(row)
            elif row.unreadable and (quarantine_done is None or row.batch_id > quarantine_done):
                log.warning("%s: completing the quarantine of unreadable file batch %s after an interrupted "
                            "cycle", self.spec.name, row.batch_id)
                self._write_unreadable(row, probe_file(source_key(row.source_file or ""),
                                                       credentials_for(self.settings.landing.uri)))

    def _single_meta(self, row: BatchRow) -> dict[str, Any]:
        return {
            "stream": row.stream, "batch_ids": [row.batch_id, row.batch_id], "heartbeat": row.is_heartbeat,
            "watermark_before": row.watermark_before, "watermark_after": row.watermark_after,
        }

    def _write_heartbeat(self, row: BatchRow) -> None:
        spec = self.spec
        assert row.max_event_time is not None
        values: dict[str, Any] = {f: None for f in spec.fields}
        # A heartbeat only moves the stream's watermark; user code never sees it (the pipeline inputs drop
        # is_heartbeat rows). String keys still carry a sentinel, distinct per stream and batch, so that a
        # heartbeat row read by any other tool can never be taken for a real record.
        for f in spec.required:
            if spec.type_of(f) == "string":
                values[f] = f"{HEARTBEAT_PREFIX}:{spec.name}"
        if spec.type_of(spec.id_field) == "string":
            values[spec.id_field] = f"{HEARTBEAT_PREFIX}:{spec.name}:{row.batch_id}"
        values["event_time"] = row.max_event_time
        record = (
            *values.values(), self.settings.now(), None, row.batch_id, True,
            row.max_event_time.date(), row.max_event_time.hour,
        )
        self.engine.append_rows(
            [record], self.bronze.schema, self.bronze.path(self.settings), app_id=app_id(spec.name),
            version=row.batch_id, metadata=self._single_meta(row),
        )

    def _report(self, row: BatchRow) -> None:
        self.reports.append(row)
        if row.spark_batch_id is not None:
            self._advance(1)
        wm = lambda ts: ts.strftime("%Y-%m-%dT%H:%M:%SZ") if ts else "-"  # noqa: E731
        if row.is_heartbeat:
            log.info("ingest %-11s batch %4d heartbeat at %s  watermark %s -> %s", row.stream, row.batch_id,
                     wm(row.max_event_time), wm(row.watermark_before), wm(row.watermark_after))
        else:
            if all_late(row):
                log.warning("%s: %s", row.stream, all_late_message(row))
            log.info(
                "ingest %-11s batch %4d %-28s lines=%d accepted=%d quarantined=%d late=%d duplicates=%d"
                "  watermark %s -> %s", row.stream, row.batch_id, Path(row.source_file or "").name,
                row.lines, row.accepted, row.quarantined, row.late, row.duplicates,
                wm(row.watermark_before), wm(row.watermark_after),
            )


def all_late(row: BatchRow) -> bool:
    """A landing file every line of which was late: most likely a producer replaying history, or a clock
    gone wrong, rather than a few stragglers."""
    return not row.is_heartbeat and row.lines > 0 and row.late == row.lines


def all_late_message(row: BatchRow) -> str:
    mark = row.watermark_before.strftime("%Y-%m-%dT%H:%M:%SZ") if row.watermark_before else "-"
    return (f"file {Path(source_key(row.source_file or '')).name}: {row.late} of {row.lines} lines late "
            f"(watermark {mark}); is the producer replaying history?")


@functools.cache
def _landing_store(root: Root, credentials: Credentials) -> ObjectStore:
    return store_for(root, credentials)


def landing_store(settings: Settings) -> ObjectStore:
    """The landing zone's objects: its folder, or its bucket and prefix (SPEC 1)."""
    return _landing_store(settings.landing, settings.lake.credentials)


def run_ingest(
    spark: SparkSession, settings: Settings, engine: DeltaEngine, streams: Sequence[str]
) -> dict[str, list[BatchRow]]:
    """Ingest each stream once (availableNow) and return the batches committed in this cycle. Each stream
    is ingested under its own lock: a stream shared by several pipelines is never ingested by two
    processes at once, and whichever cycle comes first ingests it for all of them (bronze is shared; each
    pipeline's streaming query reads it from its own checkpoint, so every pipeline sees every record)."""
    from sluice.core.locks import stream_lock

    out = {}
    for name in streams:
        spec = settings.stream(name)
        with stream_lock(settings, name, purpose=f"ingest now={settings.now().isoformat()}"):
            out[name] = StreamIngest(spark, settings, engine, spec).run()
    return out


def summary(settings: Settings, streams: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Per-stream totals over all batches ever committed: where every line went."""
    out = {}
    for name in streams:
        state = load_state(settings, name)
        out[name] = {
            **state.totals(),
            "watermark": state.watermark,
            "last_arrival": state.last_arrival,
            "batches": len(state.rows),
        }
    return out


def _json_default(value: object) -> str:
    return value.isoformat() if isinstance(value, datetime) else str(value)


def dumps(obj: object) -> str:
    return json.dumps(obj, default=_json_default, indent=2, sort_keys=True)


__all__ = [
    "BatchRow",
    "StreamIngest",
    "StreamState",
    "file_watermarks",
    "load_state",
    "run_ingest",
    "summary",
]
