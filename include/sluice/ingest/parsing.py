"""Parsing and typing landing lines, and why a line is quarantined (SPEC 2).

Each step is a small DataFrame -> DataFrame transform, shared by tests and the job. Every line is parsed once
as a VARIANT; per declared field its JSON type, its text and its value in the declared type decide the
quarantine reason: ``bad_encoding``, ``malformed_json``, ``missing_field``, ``bad_timestamp``, ``bad_type`` or
``early`` (see :mod:`sluice.ingest.time_rules`), in that order. A blank line (empty or whitespace only) is no
record, as in Spark's JSON reader: it gets the internal reason :data:`BLANK`, is counted as skipped and is
stored nowhere.

What the parser says about a ``malformed_json`` line (:func:`malformed_detail`, Python's ``json`` message and
column) is computed in Python for those lines only, once the batch is filtered down to them: never a UDF over
every line.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from sluice.core.line_scan import FUNCTION as SCAN_FUNCTION
from sluice.core.line_scan import registered as scan_registered
from sluice.core.model import EVENT_TIME, StreamSpec
from sluice.core.timeutil import EARLIEST_EVENT_TIME
from sluice.ingest.time_rules import early_bound

T = TypeVar("T")

# RFC 3339 date-time: a 'T' (or space) separator, optional fraction, and a mandatory zone (Z or +hh:mm).
# Spark's cast alone would also accept zoneless strings and read them in the session zone.
RFC3339 = r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d{1,9})?([Zz]|[+-]\d{2}:\d{2})$"
NUMBER_TYPES = ("BIGINT", "DECIMAL", "DOUBLE")
BAD_ENCODING_DETAIL = "line is not valid UTF-8; raw holds its bytes base64-encoded"
#: The reason of a blank line (empty, or JSON whitespace only): no record, as in Spark's JSON reader. Internal:
#: never stored in quarantine; the line counts in ``ops/ingest_batches.skipped``, not in ``lines``.
BLANK = "blank_line"
#: The reason of a line that is not one JSON object; its detail is what the parser said (:func:`malformed_detail`).
MALFORMED = "malformed_json"
# JSON's whitespace (RFC 8259): what Spark's JSON reader (Jackson) skips before a value.
BLANK_LINE = r"^[ \t\r\n]*$"


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


def _built_once(build: Callable[[Any], T]) -> Callable[[Any], T]:
    """``build(key)``, called once per key and kept. A caller that asks while another builds the same key waits for
    that build (a batch that starts while its ingest's warm-up builds the expressions) instead of building beside it."""
    built: dict[Any, T] = {}
    lock = threading.Lock()

    def get(key: Any) -> T:
        with lock:
            if key not in built:
                built[key] = build(key)
            return built[key]

    return get


def parse_lines(spec: StreamSpec, line_scan: bool | None = None) -> Any:
    """Parse ``raw`` JSON and give, per declared field, its JSON type (``_t_<field>``: STRING, BIGINT,
    DECIMAL(p,s), DOUBLE, BOOLEAN, OBJECT<..>, ARRAY<..>, VOID for null; null when absent), its text
    (``_s_<field>``: the string itself, or the canonical JSON text of any other value) and its value in
    the declared type (``_v_<field>``, null when the JSON type cannot hold it). Flags lines that are not
    valid UTF-8 (``_bad_encoding``), blank lines (``_blank``: empty or whitespace only, no record) and lines
    that are not a JSON object (``_malformed``).

    The line is parsed once, as a VARIANT, because the JSON type decides what is valid: a struct schema
    would turn ``1.5e3`` into "1500.0", an object into its text and bad bytes into U+FFFD, silently.

    When the session has sluice's line reader (:mod:`sluice.core.line_scan`; ``line_scan`` overrides, for
    the tests that hold both paths to the same answers), the common line (a flat object of strings, whole
    numbers, booleans and nulls) gets its types and texts from it, and only the other lines are parsed as a
    VARIANT: the same columns, at a fifth of the cost.

    The returned transform builds its column expressions on first use and applies the same ones to every
    frame after that: building them takes thousands of calls into the JVM, about a second, which a stream's
    ingest would otherwise pay again in every micro-batch."""
    built = _built_once(lambda use_scan: _parse_steps(spec, use_scan))

    def transform(df: DataFrame) -> DataFrame:
        use_scan = scan_registered(df.sparkSession) if line_scan is None else line_scan
        steps, spent = built(use_scan)
        for columns in steps:
            df = df.select("*", *columns)
        return df.drop(*spent)

    return transform


def _parse_steps(spec: StreamSpec, use_scan: bool) -> tuple[list[list[Column]], list[str]]:
    """:func:`parse_lines`' projections, in order (each reads the columns of those before it), and the
    intermediate columns dropped after them."""
    steps: list[list[Column]] = []
    utf8 = F.is_valid_utf8("raw")
    if use_scan:
        names = F.array(*[F.lit(spec.json_name(f)) for f in spec.fields])
        steps.append([F.when(utf8, F.call_function(SCAN_FUNCTION, F.col("raw"), names)).alias("_scan")])
        scanned = F.col("_scan").isNotNull()
    else:
        steps.append([F.lit(None).cast("array<string>").alias("_scan")])
        scanned = F.lit(False)
    # The parse first, in a projection of its own that the flags below read: written into each flag, it ran
    # once per reference (three times a line), in a projection Spark could not compile (the bracket walk).
    # A line the reader answered is not parsed again.
    steps.append([F.when(utf8 & ~scanned, F.try_parse_json("raw")).alias("_doc"), (~utf8).alias("_bad_encoding")])
    doc, valid = F.col("_doc"), ~F.col("_bad_encoding")
    not_one_object = doc.isNull() | ~F.col("raw").rlike(r"^\s*\{") | _trailing_content(F.col("raw"))
    # Only a line that does not parse is tested for blankness (`And` stops at the first false).
    blank = valid & ~scanned & doc.isNull() & F.col("raw").rlike(BLANK_LINE)
    steps.append([blank.alias("_blank"), (valid & ~scanned & not_one_object).alias("_malformed")])
    steps.append([F.try_variant_get("_doc", _json_path(spec.json_name(f)), "variant").alias(f"_j_{f}")
                  for f in spec.fields])
    steps.append([F.when(scanned, F.col("_scan")[2 * i]).otherwise(F.schema_of_variant(f"_j_{f}")).alias(f"_t_{f}")
                  for i, f in enumerate(spec.fields)])
    # A double's value, in a column of its own: written into its canonical text it was read eight times
    # a field, and the generated code grew too large for the JIT to compile.
    steps.append([F.when(F.col(f"_t_{f}") == "DOUBLE", F.variant_get(f"_j_{f}", "$", "double")).alias(f"_d_{f}")
                  for f in spec.fields])
    steps.append([F.when(scanned, F.col("_scan")[2 * i + 1]).otherwise(_text(f)).alias(f"_s_{f}")
                  for i, f in enumerate(spec.fields)])
    steps.append([typed_value(spec, f).alias(f"_v_{f}") for f in spec.fields if f != EVENT_TIME])
    return steps, ["_doc", "_scan", *[f"_{p}_{f}" for p in "jd" for f in spec.fields]]


# JSON text with its strings blanked (``"a}b"`` -> ``""``), so that only structure is left. The unrolled,
# possessive form never backtracks, so a long line costs one pass.
JSON_STRING = r'"[^"\\]*+(?:\\.[^"\\]*+)*+"'
JSON_SPACE = "[ \t\r\n]*"


def _trailing_content(raw: Column) -> Column:
    """Whether a line that starts with a JSON object holds anything but whitespace after it
    (``{...}{...}``, ``{...} xyz``, ``{...}\\0``). Spark's ``try_parse_json`` returns the first value and
    ignores the rest, so without this the second record of ``{...}{...}`` would vanish without a trace.

    A flat object (one ``{`` and one ``}``, the last character) is settled by counting. Otherwise the
    strings are blanked and the brackets walked: the first object must close exactly at the end."""
    ends_with_brace = r"\}" + JSON_SPACE + "$"
    # One `{`, then one `}` followed only by whitespace: one pass of a regex that never backtracks.
    flat = raw.rlike(r"^[^{}]*+\{[^{}]*+\}" + JSON_SPACE + "+$")
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
        .when(jtype == "DOUBLE", _canonical_double(F.col(f"_d_{field_name}")))
        .when(jtype != "VOID", F.to_json(value))
    )


def _rfc3339(text: Column) -> Column:
    """An RFC 3339 timestamp, or null. Spark's cast alone would accept zoneless strings (session zone)."""
    # RFC 3339 allows a lower-case "t" and "z"; Spark's parser does not. The pattern leaves no other letter, so
    # translate() is upper() here: Spark 4's upper() goes through ICU, whose first use loads its case tables for
    # about a second while every other task waits on that lock (seen in each ingest's first stage).
    return F.when(text.rlike(RFC3339), F.try_to_timestamp(F.translate(text, "tz", "TZ")))


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
    early), in that order, with a ``detail`` that names the field; :data:`BLANK` for a blank line, before
    any of them. The detail of a ``malformed_json`` line is left null here: :func:`malformed_detail` fills it
    when the line is written to quarantine. Like :func:`parse_lines`' transform, the returned one builds its
    column expressions once."""
    built = _built_once(lambda _key: _check_columns(spec))

    def transform(df: DataFrame) -> DataFrame:
        event_time, reason, detail = built(None)
        return df.withColumn("event_time", event_time).withColumn("reason", reason).withColumn("detail", detail)

    return transform


def _check_columns(spec: StreamSpec) -> tuple[Column, Column, Column]:
    """:func:`classify_invalid`'s columns: ``event_time``, then ``reason`` and ``detail``, which read it."""
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
    # Computed once, as a column of its own that the reason and the detail read: written into each of their
    # branches, the timestamp regex and parse ran seven times a line.
    parsed_time = F.when(F.col(f"_t_{EVENT_TIME}") == "STRING", _rfc3339(raw_ts))
    event_time = F.col("event_time")
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
    early = early_bound(spec)
    reason = (
        F.when(F.col("_blank"), BLANK)
        .when(F.col("_bad_encoding"), "bad_encoding")
        .when(F.col("_malformed"), MALFORMED)
        .when(any_missing, "missing_field")
        .when(event_time.isNull() | too_old, "bad_timestamp")
        .when(any_of(bad_ts), "bad_timestamp")
        .when(any_of(bad_type), "bad_type")
        .when(event_time > early, "early")
    )
    # The detail follows the reason, read from its column: a valid line (no reason) evaluates no condition
    # twice, where the detail's own chain of conditions repeated the reason's for every line.
    why = F.col("reason")
    too_old_detail = F.concat(F.lit(f"{spec.json_name(EVENT_TIME)}: "), raw_ts, F.lit(
        f" is before {EARLIEST_EVENT_TIME:%Y-%m-%dT%H:%M:%SZ}, the earliest event time sluice accepts"))
    detail = (
        F.when(why.isNull() | why.isin(BLANK, "malformed_json"), None)
        .when(why == "bad_encoding", BAD_ENCODING_DETAIL)
        .when(why == "missing_field", F.concat(F.lit("missing: "), missing_names))
        .when(why == "bad_timestamp",
              F.when(event_time.isNull(), F.concat(F.lit(f"{spec.json_name(EVENT_TIME)}: "),
                                                   F.coalesce(raw_ts, F.lit("<null>"))))
              .when(too_old, too_old_detail)
              .otherwise(first(bad_ts, "RFC 3339 timestamp")))
        .when(why == "bad_type", first(bad_type, ""))
        .when(why == "early", F.concat(F.lit("arrival_time + "), F.lit(str(spec.early_tolerance)),
                                       F.lit(" exceeded")))
    )
    return parsed_time, reason, detail


# -- what the parser says about a malformed line ------------------------------------------------------------
_NOT_AN_OBJECT = {list: "a JSON array", str: "a JSON string", bool: "a JSON boolean", int: "a JSON number",
                  float: "a JSON number", type(None): "JSON null"}


class _Constant(ValueError):
    """NaN, Infinity or -Infinity, which Python's json accepts and JSON (and Spark) do not."""


def _no_constants(name: str) -> Any:
    raise _Constant(name)


def malformed_detail(raw: str | None) -> str | None:
    """Why a ``malformed_json`` line is not one JSON object, in the words of Python's ``json`` parser, with the
    1-based column (in characters) where it gave up: ``Expecting ',' delimiter at column 45``, ``Extra data at
    column 12`` (``{..}{..}``), ``a JSON array, not an object``.

    A pure function of the line, so the same line gets the same detail whichever path writes it (collected on
    the driver, or as a Spark UDF over the batch's malformed lines only)."""
    if raw is None:
        return None
    try:
        value = json.loads(raw, parse_constant=_no_constants)
    except json.JSONDecodeError as exc:
        if exc.msg.startswith("Unexpected UTF-8 BOM"):
            return "a byte order mark (U+FEFF) before the JSON at column 1"
        where = "column" if exc.msg.endswith(" at") else "at column"
        return f"{exc.msg} {where} {exc.colno}"
    except _Constant as exc:
        return f"{exc} is not a JSON value (JSON has no NaN or Infinity)"
    except RecursionError:
        return "nested too deeply to parse"
    if not isinstance(value, dict):
        return f"{_NOT_AN_OBJECT.get(type(value), 'a JSON value')}, not an object"
    # Python accepts it, Spark's parser does not (rare: e.g. a lone surrogate escape).
    return "not valid JSON for Spark's parser"
