"""``delayq_pipeline enqueue``: one message per row of a data set, idempotently.

The job in three steps, all but the last read-only:

1. **Options and schema** are checked before Spark reads a row: the queue,
   kind and priority as ``enqueue`` checks them; the key, payload and run-at
   columns exist and have types JSON can hold.
2. **Every row is validated in the JVM** (a key that is null, empty, over 255
   characters or holds NUL; a NaN or an infinity, which JSON cannot hold; a
   NUL character, which PostgreSQL's JSON cannot store; a payload over
   ``MAX_PAYLOAD_SIZE``; a run-at value that is no timestamp). If more than
   ``max_reject_rate`` of the rows fail, the job stops with the first
   reason and nothing is written; otherwise the failing rows go to a rejects
   file and the rest go on. The rejects file is created new (``O_EXCL``,
   mode 0600, never through a symlink): a path where anything exists is
   refused before Spark starts, and one where something appeared since is
   refused by the create itself, still before any row is written.
3. **Each partition upserts its rows** through one connection
   (``dbapi.write_partition``): COPY into a temporary table, then one
   ``INSERT ... SELECT ... ON CONFLICT (queue, key)`` per 50,000 rows, each
   its own transaction with one NOTIFY (MariaDB/MySQL: multi-row inserts
   into the temporary table, ``INSERT IGNORE ... SELECT``, then with
   ``update`` ``ON DUPLICATE KEY UPDATE``). Keys make it idempotent: a
   retried task, or a re-run of the whole job, finds its rows already there.

**Ordered groups** (``--group-column``): each row's group is that column's
value as text (null or empty: no group; over 200 characters or holding NUL:
a rejected row). The rows are repartitioned by group, so that all the rows
of a group are written by one task, one transaction after another, in
their input order: by ``--order-column`` (nulls last), then by the order
Spark read them in, which is each file's own order (Spark reads the files
of a directory in an order of its own, larger ones first). Their ids follow
that order, which is the order their group runs in. In each transaction,
after the insert, the rows that an earlier message of their group holds
back are marked held (``store.groups.hold_back_loaded``), as
``enqueue_many`` does. The claim keeps a group's order with or without it;
the hold keeps waiting messages out of the claim's way. It runs on the
executors, in the insert's transaction, rather than once from the driver
at the end: each commit then leaves what ``enqueue_many`` would (workers
start on the first rows while the rest load, and would otherwise step over
every waiting message until the end), and a job that dies midway leaves no
unheld rows behind for a last step that never ran.

Payloads are encoded by Spark's ``to_json`` in the JVM, so the Python
workers only stream three strings per row into COPY (re-encoding the few
whose floats Java wrote with an exponent, as ``enqueue`` writes them: see
``dbapi.write_partition``). JSON lines are the exception: Spark's schema
inference is not used at all (it changes the types of ragged input, drops
objects whose keys are ``""``, stops at keys that differ only in case), the
columns are the lines' top-level keys (``dbapi.scan_lines``) and each
payload is parsed from its line's own text by the rules of ``enqueue``
(``dbapi.decode_line``). A payload nested deeper than ``MAX_PAYLOAD_DEPTH``
is refused before anything is written: by its column's type (Parquet), or
as a rejected row (JSON lines).
"""

from __future__ import annotations

import errno
import functools
import json
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from django.db import connections

from django_delayq import clock
from django_delayq.conf import get_config
from django_delayq.contrib.spark import PipelineError, check_seconds, database, dbapi
from django_delayq.contrib.spark.storage import java_message
from django_delayq.enqueuing import check_priority
from django_delayq.flow import GROUP_MAX_LENGTH
from django_delayq.models import KEY_MAX_LENGTH
from django_delayq.payload import MAX_PAYLOAD_DEPTH
from django_delayq.registry import validate_kind, validate_queue_name
from django_delayq.store.features import features

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import DataType

FORMATS = ("csv", "parquet", "json")
ON_CONFLICT = ("ignore", "update")
DEFAULT_MAX_REJECT_RATE = 0.01
_EXTENSIONS = {
    ".csv": "csv",
    ".parquet": "parquet",
    ".pq": "parquet",
    ".json": "json",
    ".jsonl": "json",
    ".ndjson": "json",
}
_COMPRESSION = (".gz", ".bz2", ".zst", ".lz4", ".snappy", ".deflate")
_URL = re.compile(r"^[A-Za-z][\w+.-]*://")
CORRUPT = "_corrupt_record"
# The column holding each JSON line's own text (read_source).
LINE = "_delayq_line"
# How to_json writes what JSON has no type for: ISO 8601, in UTC.
JSON_OPTIONS = {
    "ignoreNullFields": "false",
    "timestampFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSSXXX",
    "timestampNTZFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSS",
    "dateFormat": "yyyy-MM-dd",
}


@dataclass(frozen=True)
class EnqueueOptions:
    source: str
    queue: str
    format: str | None = None  # inferred from the file names when None
    key_column: str | None = None  # None: a SHA-256 of the whole row
    payload_columns: tuple[str, ...] | None = None  # None: every column
    kind: str = ""
    priority: int = 0
    delay: float | None = None  # seconds; every row due at start + delay
    run_at_column: str | None = None
    on_conflict: str = "ignore"
    partitions: int | None = None  # None: the source's own partitioning
    database: str | None = None
    max_reject_rate: float = DEFAULT_MAX_REJECT_RATE
    rejects_path: str | None = None  # None: beside the source
    group_column: str | None = None  # each row's ordered group; None: no groups
    order_column: str | None = None  # the order of a group's rows; None: as read


@dataclass(frozen=True)
class EnqueueSummary:
    source: str
    format: str
    queue: str
    rows: int  # rows read
    created: int
    updated: int
    ignored: int
    rejected: int
    rejects_path: str | None
    partitions: int
    transactions: int
    seconds: float  # from reading to the last commit (the session was already up)

    @property
    def rate(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else 0.0


# -- step 1: options and schema ---------------------------------------------------


def is_url(source: str) -> bool:
    return bool(_URL.match(source))


def infer_format(source: str) -> str:
    """``csv`` / ``parquet`` / ``json`` from the file name(s), else a :class:`PipelineError`."""
    names = [source]
    if not is_url(source) and os.path.isdir(source):
        names = [
            n
            for n in sorted(os.listdir(source))
            if not n.startswith(("_", ".")) and os.path.isfile(os.path.join(source, n))
        ]
        if not names:
            raise PipelineError(f"SOURCE {source} is an empty directory")
    found = set()
    for name in names:
        stem = name.lower()
        for suffix in _COMPRESSION:
            stem = stem.removesuffix(suffix)
        found.add(_EXTENSIONS.get(os.path.splitext(stem)[1]))
    if len(found) == 1 and None not in found:
        return str(found.pop())
    raise PipelineError(f"cannot tell the format of {source}; pass --format csv|parquet|json")


def default_rejects_path(source: str) -> str:
    """``_<name>.rejects.jsonl`` beside SOURCE (``_``: Spark skips it when reading the folder)."""
    name = source.rstrip("/").rsplit("/", 1)[-1] or "source"
    if is_url(source):
        return os.path.abspath(f"_{name}.rejects.jsonl")
    parent = Path(source.rstrip("/")).resolve().parent
    if not os.access(parent, os.W_OK):
        return os.path.abspath(f"_{name}.rejects.jsonl")
    return str(parent / f"_{name}.rejects.jsonl")


def check_rejects_option(path: str) -> str:
    """``--rejects PATH`` made absolute: a local file in a directory that exists.

    (Whether the directory is writable is found when the file is created,
    only if the run has rows to reject.)
    """
    if is_url(path):
        raise PipelineError(f"--rejects {path}: the rejects file must be a local path")
    path = os.path.abspath(path)
    parent = os.path.dirname(path)
    if not os.path.isdir(parent):
        raise PipelineError(f"--rejects {path}: the directory {parent} does not exist")
    return path


def _rejects_exist(path: str) -> PipelineError:
    what = (
        "as a symbolic link, which is not followed: remove it"
        if os.path.islink(path)
        else "(from an earlier run?): move it away"
    )
    return PipelineError(
        f"rejects file {path} already exists {what}, or pass --rejects PATH to write "
        "elsewhere; nothing was written"
    )


def refuse_existing_rejects(path: str) -> None:
    """A rejects file is never overwritten (nor a symlink followed): stop before Spark starts.

    ``write_rejects`` creates the file exclusively too, so a file that appears
    after this check stops the job just the same, still before any row is
    written to the database.
    """
    if os.path.lexists(path):
        raise _rejects_exist(path)


def validate_options(options: EnqueueOptions) -> EnqueueOptions:
    """Everything that can be checked without Spark; returns the options completed."""
    try:
        validate_queue_name(options.queue)
        validate_kind(options.kind)
        check_priority(options.priority)
    except (TypeError, ValueError) as exc:
        raise PipelineError(str(exc)) from exc
    if options.delay is not None and options.run_at_column is not None:
        raise PipelineError("pass either --delay or --run-at-column, not both")
    check_seconds("--delay", options.delay)
    if options.on_conflict not in ON_CONFLICT:
        raise PipelineError(f"--on-conflict must be ignore or update, got {options.on_conflict!r}")
    if options.partitions is not None and options.partitions < 1:
        raise PipelineError(f"--partitions must be at least 1, got {options.partitions}")
    if not 0 <= options.max_reject_rate <= 1:
        raise PipelineError(f"--max-reject-rate must be from 0 to 1, got {options.max_reject_rate}")
    if options.payload_columns is not None and not options.payload_columns:
        raise PipelineError("--payload-columns names no column")
    if options.order_column is not None and options.group_column is None:
        raise PipelineError("--order-column orders the rows of each group: pass --group-column too")
    if options.format is not None and options.format not in FORMATS:
        raise PipelineError(f"--format must be csv, parquet or json, got {options.format!r}")
    source = options.source
    if not is_url(source):
        if not os.path.exists(source):
            raise PipelineError(f"SOURCE {source} does not exist")
        if not os.access(source, os.R_OK) or (
            os.path.isdir(source) and not os.access(source, os.X_OK)
        ):
            raise PipelineError(f"SOURCE {source} is not readable")
    fmt = options.format or infer_format(source)
    alias = database.resolve_alias(options.database)
    if options.rejects_path is None:
        rejects = default_rejects_path(source)
    else:
        rejects = check_rejects_option(options.rejects_path)
    refuse_existing_rejects(rejects)
    return replace(options, format=fmt, database=alias, rejects_path=rejects)


@dataclass(frozen=True)
class Source:
    """A data set as read: its rows, its columns and their types.

    ``columns`` is every column, in order; ``types`` the type of each, or,
    for JSON lines (``lines``), only of the key, group, order and run-at
    columns, the others being read from each line's own text (``LINE``).
    A column is always referred to through :meth:`column`, never by a name
    Spark would parse (``a.b`` is the field ``b`` of ``a`` to it, a backtick
    a syntax error).
    """

    df: DataFrame
    columns: tuple[str, ...]
    types: dict[str, DataType]
    lines: bool = False
    # JSON lines: the column of ``df`` that holds each typed column's values.
    refs: tuple[tuple[str, str], ...] = ()

    def column(self, name: str) -> Column:
        return self.df[quoted(dict(self.refs).get(name, name))]


def quoted(name: str) -> str:
    """``name`` as one column name to Spark, whatever it holds (dots, backticks)."""
    return "`" + name.replace("`", "``") + "`"


def read_source(spark: SparkSession, options: EnqueueOptions) -> Source:
    """The data set as Spark reads it; CSV dates and timestamps stay the text they were."""
    from pyspark.sql.types import DateType, StructField, StructType, TimestampNTZType, TimestampType

    source, fmt = options.source, str(options.format)
    try:
        if fmt == "json":
            return _read_json_lines(spark, options)
        if fmt == "parquet":
            df = spark.read.parquet(source)
        else:
            reader = spark.read.option("header", True).option("mode", "PERMISSIVE")
            inferred = reader.option("inferSchema", True).csv(source).schema
            # CSV has no date type: a column Spark guessed to be one keeps its text.
            text = StructType(
                [
                    StructField(f.name, _string(), True)
                    if isinstance(f.dataType, DateType | TimestampType | TimestampNTZType)
                    else f
                    for f in inferred.fields
                ]
            )
            df = reader.schema(text).csv(source)
    except PipelineError:
        raise
    except Exception as exc:
        raise PipelineError(f"cannot read {source} as {fmt}: {java_message(exc)}") from exc
    types = {f.name: f.dataType for f in df.schema.fields if f.name != CORRUPT}
    return Source(df, tuple(types), types)


def _read_json_lines(spark: SparkSession, options: EnqueueOptions) -> Source:
    """The lines (``LINE``), and the key, group, order and run-at columns as Spark reads them.

    Spark's schema inference is not used: it drops a field whose objects
    have no key but ``""`` (``{"": 0}``, ``{}``), stops at keys that differ
    only in case (``{"a": 1, "A": 2}``) or repeat, and widens ragged columns
    (beside a deeper array, ``{"deep": [[1]]}`` would read as ``[["1"]]``).
    The columns are the top-level keys of the lines, as Python's parser reads
    them (``dbapi.scan_lines``); each payload is made from its line's own
    text (``dbapi.decode_line``). The key, group and run-at columns are read
    from each line as text (a number as its digits, ``true`` for true); the
    order column with the type its values share (``order_type``), so numbers
    sort as numbers.
    """
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructField, StructType

    source = options.source
    lines = spark.read.text(source).filter(F.trim(F.col("value")) != "")
    spark.sparkContext.setJobDescription(f"delayq enqueue: read the columns of {source}")
    scanned = lines.rdd.mapPartitions(
        functools.partial(dbapi.scan_lines, options.order_column)
    ).collect()
    names: dict[str, None] = {}
    kinds: set[str] = set()
    for found, order_kinds in scanned:
        names.update(dict.fromkeys(found))
        kinds.update(order_kinds)
    # By UTF-16 code unit, the order of the fields of a schema Spark infers.
    columns = tuple(sorted(names, key=lambda n: n.encode("utf-16-be", "surrogatepass")))
    plain = [
        c
        for c in (
            options.key_column,
            options.group_column,
            options.order_column,
            options.run_at_column,
        )
        if c is not None and c in names
    ]
    types: dict[str, DataType] = {}
    selected = [F.col("value").alias(LINE)]
    refs = []
    for i, name in enumerate(dict.fromkeys(plain)):
        dtype = order_type(kinds) if name == options.order_column else _string()
        types[name] = dtype
        schema = StructType([StructField(name, dtype)])
        parsed = F.from_json(F.col("value"), schema, {"mode": "PERMISSIVE"})
        selected.append(parsed.getField(name).alias(f"_delayq_{i}"))
        refs.append((name, f"_delayq_{i}"))
    return Source(lines.select(*selected), columns, types, lines=True, refs=tuple(refs))


def order_type(kinds: set[str]) -> DataType:
    """The type of an order column of JSON lines holding values of these kinds
    (``dbapi.scan_lines``): numbers that are all integers of a bigint a
    bigint, past it a decimal(38,0); numbers with a fraction a double;
    booleans a boolean; a mix, or text, text (as Spark's inference types
    them). Objects and arrays are rejected rows (``dbapi.decode_line``)."""
    from pyspark.sql import types as T

    atomic = kinds - {"null", "object", "array"}
    if atomic == {"boolean"}:
        return T.BooleanType()
    if atomic and atomic <= {"bigint", "decimal", "double"}:
        if "double" in atomic:
            return T.DoubleType()
        return T.DecimalType(38, 0) if "decimal" in atomic else T.LongType()
    return _string()


def _type_depth(dtype: DataType) -> int:
    """How deeply arrays and objects nest in a value of ``dtype`` (as JSON)."""
    from pyspark.sql import types as T

    if isinstance(dtype, T.ArrayType):
        return 1 + _type_depth(dtype.elementType)
    if isinstance(dtype, T.MapType):
        return 1 + _type_depth(dtype.valueType)
    if isinstance(dtype, T.StructType):
        return 1 + max((_type_depth(f.dataType) for f in dtype.fields), default=0)
    return 0


def _string() -> DataType:
    from pyspark.sql.types import StringType

    return StringType()


def json_problem(dtype: DataType) -> str | None:
    """Why a column of this type cannot go into a JSON payload, or None if it can."""
    from pyspark.sql import types as T

    if isinstance(
        dtype,
        T.StringType
        | T.BooleanType
        | T.ByteType
        | T.ShortType
        | T.IntegerType
        | T.LongType
        | T.FloatType
        | T.DoubleType
        | T.DecimalType
        | T.DateType
        | T.TimestampType
        | T.TimestampNTZType
        | T.NullType,
    ):
        return None
    if isinstance(dtype, T.ArrayType):
        return json_problem(dtype.elementType)
    if isinstance(dtype, T.StructType):
        return next((p for f in dtype.fields if (p := json_problem(f.dataType))), None)
    if isinstance(dtype, T.MapType):
        if not isinstance(dtype.keyType, T.StringType):
            return f"{dtype.simpleString()} (JSON object keys are strings)"
        return json_problem(dtype.valueType)
    return dtype.simpleString()


def _atomic(dtype: DataType) -> bool:
    from pyspark.sql import types as T

    return not isinstance(dtype, T.ArrayType | T.MapType | T.StructType | T.BinaryType)


def check_schema(source: Source, options: EnqueueOptions) -> tuple[list[str], list[str]]:
    """The data columns and the payload columns, or a :class:`PipelineError` naming the column."""
    from pyspark.sql import types as T

    types = source.types
    listing = ", ".join(source.columns) or "none"

    def require(name: str, what: str) -> DataType:
        if name not in source.columns:
            raise PipelineError(
                f"{what} {name!r} is not a column of {options.source} (columns: {listing})"
            )
        # JSON lines: a payload column is read from each line's text, as JSON.
        return types.get(name, T.NullType())

    # Columns that must hold one plain value per row (text, a number, a time).
    plain = [
        (options.key_column, "key column", "a key must be text or a number"),
        (options.group_column, "group column", "a group must be text or a number"),
        (
            options.order_column,
            "order column",
            "rows are ordered by a number, text, a date or a timestamp",
        ),
    ]
    for column, what, why in plain:
        if column is None:
            continue
        dtype = require(column, what)
        if not _atomic(dtype):
            raise PipelineError(f"{what} {column!r} has type {dtype.simpleString()}; {why}")
    if options.run_at_column is not None:
        dtype = require(options.run_at_column, "run-at column")
        if not isinstance(dtype, T.StringType | T.TimestampType | T.TimestampNTZType | T.DateType):
            raise PipelineError(
                f"run-at column {options.run_at_column!r} has type {dtype.simpleString()}; "
                "it must hold timestamps, dates or ISO 8601 text"
            )
    payload = list(options.payload_columns or source.columns)
    for name in payload:
        dtype = require(name, "payload column")
        if source.lines:
            continue  # each line's own payload is checked (dbapi.decode_line)
        problem = json_problem(dtype)
        if problem:
            raise PipelineError(
                f"payload column {name!r} has type {problem}, which JSON cannot hold; "
                "convert it first or leave it out with --payload-columns"
            )
        depth = 1 + _type_depth(dtype)  # the payload is an object of the columns
        if depth > MAX_PAYLOAD_DEPTH:
            raise PipelineError(
                f"payload column {name!r} has type {dtype.simpleString()}: in the "
                f"payload (an object of the columns) it nests {depth} levels of arrays and "
                f"objects, over MAX_PAYLOAD_DEPTH ({MAX_PAYLOAD_DEPTH}); nothing was written"
            )
    return list(source.columns), payload


# -- step 2: row validation -----------------------------------------------------


def _mentions(dtype: DataType, leaf: type | tuple[type, ...]) -> bool:
    """Whether a value of ``dtype`` can hold a ``leaf`` value anywhere inside."""
    from pyspark.sql import types as T

    if isinstance(dtype, leaf):
        return True
    if isinstance(dtype, T.ArrayType):
        return _mentions(dtype.elementType, leaf)
    if isinstance(dtype, T.StructType):
        return any(_mentions(f.dataType, leaf) for f in dtype.fields)
    if isinstance(dtype, T.MapType):
        return _mentions(dtype.keyType, leaf) or _mentions(dtype.valueType, leaf)
    return False


def _any_leaf(
    col: Column, dtype: DataType, leaf: type | tuple[type, ...], test: Callable[[Column], Column]
) -> Column:
    """True where ``test`` holds for some ``leaf`` value inside ``col`` (arrays, structs, maps)."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    if isinstance(dtype, leaf):
        return F.coalesce(test(col), F.lit(False))
    parts: list[Column] = []
    if isinstance(dtype, T.ArrayType):
        elem = dtype.elementType
        parts.append(
            F.coalesce(F.exists(col, lambda x: _any_leaf(x, elem, leaf, test)), F.lit(False))
        )
    elif isinstance(dtype, T.StructType):
        parts += [
            _any_leaf(col[f.name], f.dataType, leaf, test)
            for f in dtype.fields
            if _mentions(f.dataType, leaf)
        ]
    elif isinstance(dtype, T.MapType):
        for inner, items in (
            (dtype.keyType, F.map_keys(col)),
            (dtype.valueType, F.map_values(col)),
        ):
            if _mentions(inner, leaf):
                parts.append(_any_leaf(items, T.ArrayType(inner), leaf, test))
    return functools.reduce(lambda a, b: a | b, parts, F.lit(False))


def _non_finite(col: Column, dtype: DataType) -> Column | None:
    """True where a float anywhere inside ``col`` is NaN or infinite (JSON has neither)."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    floats = (T.FloatType, T.DoubleType)
    if not _mentions(dtype, floats):
        return None
    return _any_leaf(col, dtype, floats, lambda x: F.isnan(x) | (F.abs(x) == float("inf")))


def _negative_zero(col: Column, dtype: DataType) -> Column | None:
    """True where a float anywhere inside ``col`` is -0.0 (``enqueue`` refuses it too)."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    floats = (T.FloatType, T.DoubleType)
    if not _mentions(dtype, floats):
        return None
    return _any_leaf(
        col, dtype, floats, lambda x: (x == 0) & x.cast("string").startswith(F.lit("-"))
    )


def _has_nul(col: Column, dtype: DataType) -> Column | None:
    """True where a string anywhere inside ``col`` holds NUL (PostgreSQL's JSON cannot)."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    if not _mentions(dtype, T.StringType):
        return None
    return _any_leaf(col, dtype, T.StringType, lambda x: F.instr(x, "\x00") > 0)


def _django_datetime_text(ts: Column) -> Column:
    """How Django writes a datetime on SQLite and MariaDB/MySQL (``str()`` of the naive
    UTC value; MariaDB/MySQL's DATETIME(6) parses it)."""
    from pyspark.sql import functions as F

    return F.when(
        F.unix_micros(ts) % 1_000_000 == 0, F.date_format(ts, "yyyy-MM-dd HH:mm:ss")
    ).otherwise(F.date_format(ts, "yyyy-MM-dd HH:mm:ss.SSSSSS"))


def _text_checks(value: Column, what: str, max_length: int) -> list[tuple[Column, Column]]:
    """The reject reasons of a text column's value: too long, or holding a NUL
    (the checks ``values.check_text`` makes of a key or group given in Python)."""
    from pyspark.sql import functions as F

    too_long = F.concat(
        F.lit(f"{what} is "),
        F.length(value).cast("string"),
        F.lit(f" characters, over {max_length}"),
    )
    return [
        (F.length(value) > max_length, too_long),
        (F.instr(value, "\x00") > 0, F.lit(f"{what} contains a NUL character")),
    ]


def prepare(
    source: Source, options: EnqueueOptions, columns: list[str], payload: list[str], now: datetime
) -> DataFrame:
    """``key``, ``payload`` (JSON text), ``due`` (text the database parses) and ``reason``.

    ``reason`` is null for a valid row, else why it is rejected; ``row`` is
    the whole row as JSON (JSON lines: the line), for the rejects file.
    With a group column, also ``group`` ("" for none), ``seq`` (the order
    Spark read the rows in) and, with an order column, ``sort`` (its values).
    """
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    df, types, column = source.df, source.types, source.column
    checks: list[tuple[Column, Column]] = []
    if source.lines:
        roles = [
            (options.key_column, "key"),
            (options.group_column, "group"),
            (options.order_column, "order"),
            (options.run_at_column, "run-at"),
        ]
        decode = F.udf(
            functools.partial(
                dbapi.decode_line,
                tuple(payload),
                tuple((name, role) for name, role in roles if name is not None),
                tuple(columns) if options.key_column is None else None,
            ),
            "payload string, reason string, row string",
            useArrow=False,  # the pipeline needs neither pandas nor PyArrow
        )
        decoded = decode(df[LINE])
        payload_json = decoded["payload"]
        checks.append((decoded["reason"].isNotNull(), decoded["reason"]))
        row_json = df[LINE]
        whole_row = decoded["row"]
    else:
        payload_json = F.to_json(F.struct(*[column(c) for c in payload]), JSON_OPTIONS)
        row_json = whole_row = F.to_json(F.struct(*[column(c) for c in columns]), JSON_OPTIONS)
    if CORRUPT in df.columns:
        checks.append((df[CORRUPT].isNotNull(), F.lit("malformed JSON line")))

    if options.key_column is None:
        key = F.sha2(whole_row, 256)  # deterministic: the same row always gets the same key
    else:
        name = options.key_column
        key = column(name).cast("string")
        checks += [
            (key.isNull(), F.lit(f"key column {name!r} is null")),
            (key == "", F.lit(f"key column {name!r} is empty")),
            *_text_checks(key, f"key column {name!r}", KEY_MAX_LENGTH),
        ]

    extra: list[Column] = []
    if options.group_column is not None:
        name = options.group_column
        group = column(name).cast("string")
        checks += _text_checks(group, f"group column {name!r}", GROUP_MAX_LENGTH)
        # seq: taken on the rows as read, before any shuffle: (the read
        # partition, the row's place in it), so in each file's own order.
        extra += [
            F.coalesce(group, F.lit("")).alias("group"),
            F.monotonically_increasing_id().alias("seq"),
        ]
        if options.order_column is not None:
            extra.append(column(options.order_column).alias("sort"))

    if options.run_at_column is not None:
        name = options.run_at_column
        raw = column(name)
        dtype = types[name]
        if isinstance(dtype, T.StringType):
            due = F.try_to_timestamp(raw)
        elif isinstance(dtype, T.TimestampType):
            due = raw
        else:  # a date, or a timestamp without zone: read in UTC (the session's zone)
            due = raw.cast("timestamp")
        checks += [
            (raw.isNull(), F.lit(f"run-at column {name!r} is empty")),
            (
                due.isNull(),
                F.concat(F.lit(f"run-at column {name!r} is not a timestamp: "), raw.cast("string")),
            ),
        ]
    else:
        due = F.lit(now + timedelta(seconds=options.delay or 0))

    for name in [] if source.lines else payload:
        zero = _negative_zero(column(name), types[name])
        if zero is not None:
            checks.append(
                (
                    zero,
                    F.lit(
                        f"payload column {name!r} holds -0.0, which PostgreSQL's JSON type "
                        "stores as 0.0"
                    ),
                )
            )
        bad = _non_finite(column(name), types[name])
        if bad is not None:
            checks.append((bad, F.lit(f"payload column {name!r} holds NaN or an infinity")))
        nul = _has_nul(column(name), types[name])
        if nul is not None:
            checks.append((nul, F.lit(f"payload column {name!r} contains a NUL character")))
    limit = get_config()["MAX_PAYLOAD_SIZE"]
    if limit:
        size = F.octet_length(payload_json)
        checks.append(
            (
                size > limit,
                F.concat(
                    F.lit("payload is "),
                    size.cast("string"),
                    F.lit(f" bytes, over DELAYQ['MAX_PAYLOAD_SIZE'] ({limit})"),
                ),
            )
        )

    reason: Column = F.lit(None).cast("string")
    for condition, text in reversed(checks):  # the first failing check names the row
        reason = F.when(F.coalesce(condition, F.lit(False)), text).otherwise(reason)

    due_text = (
        _django_datetime_text(due)
        if features(connections[str(options.database)]).naive_datetimes
        else F.date_format(due, "yyyy-MM-dd HH:mm:ss.SSSSSSXXX")
    )
    return df.select(
        key.alias("key"),
        payload_json.alias("payload"),
        due_text.alias("due"),
        reason.alias("reason"),
        row_json.alias("row"),
        *extra,
    )


def create_rejects_file(path: str) -> int:
    """A new file at ``path``, mode 0600, for writing: never an existing file, never a symlink.

    ``O_EXCL`` fails if anything is at ``path`` (a dangling or planted symlink
    included), so a shared directory cannot make the job write elsewhere;
    ``fchmod`` makes the mode 0600 whatever the umask.
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o600)
    except FileExistsError:
        raise _rejects_exist(path) from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _rejects_exist(path) from None
        raise PipelineError(
            f"cannot create rejects file {path}: {exc.strerror}; nothing was written"
        ) from exc
    try:
        os.fchmod(fd, 0o600)
    except BaseException:
        os.close(fd)
        raise
    return fd


# What str.splitlines() ends a line at besides \n and \r. JSON text holds them
# raw only inside strings (where the control characters are escaped already,
# by Python and by Spark), so a JSON-lines file escapes them there too: a
# reader's splitlines() then cuts it at its newlines only.
_LINE_BREAKS = {c: f"\\u{c:04x}" for c in (0x0B, 0x0C, 0x1C, 0x1D, 0x1E, 0x85, 0x2028, 0x2029)}


def jsonl_text(text: str) -> str:
    """JSON ``text`` fit for one line of a JSON-lines file (see ``_LINE_BREAKS``)."""
    return text.translate(_LINE_BREAKS)


def _as_json(line: str) -> str:
    """A JSON line as it is if it is standard JSON, else as a JSON string of its text
    (malformed, or holding NaN or Infinity, which Python's parser takes)."""

    def refuse(constant: str) -> Any:
        raise ValueError(constant)

    try:
        json.loads(line, parse_constant=refuse)
    except (ValueError, RecursionError):
        return json.dumps(line)
    return line


def reject_record(reason: str, row: str, *, lines: bool = False) -> str:
    """One line of the rejects file: ``{"reason": ..., "row": ...}`` and its newline.

    ``row`` is the row's JSON text (``to_json``'s), or with ``lines`` the
    JSON line itself, given as a JSON string if it is not JSON.
    """
    text = _as_json(row) if lines else row
    return jsonl_text(f'{{"reason": {json.dumps(reason)}, "row": {text}}}') + "\n"


def write_rejects(prepared: DataFrame, path: str, *, lines: bool = False) -> None:
    """The rejected rows as JSON lines (``reject_record``), in a new 0600 file.

    If reading the rows fails, the partial file is removed (a re-run then
    finds the path free).
    """
    from pyspark.sql import functions as F

    rejected = prepared.filter(F.col("reason").isNotNull()).select("reason", "row")
    fd = create_rejects_file(path)
    created = os.fstat(fd)
    try:
        with open(fd, "w", encoding="utf-8") as out:
            for record in rejected.toLocalIterator():
                out.write(reject_record(record["reason"], record["row"], lines=lines))
    except BaseException:
        try:
            if os.path.samestat(created, os.lstat(path)):  # still the file created above
                os.unlink(path)
        except OSError:
            pass
        raise


# -- the job --------------------------------------------------------------------


def in_group_order(valid: DataFrame, options: EnqueueOptions) -> DataFrame:
    """``(key, payload, due, group)`` rows, each group's in one partition, in its order.

    Rows are spread by group (an ungrouped row by its key, so that rows
    without a group do not all land in one partition) over ``--partitions``
    partitions, else as many as the source had; within a partition they are
    sorted by ``--order-column`` (nulls last), then by the order they were
    read in, which is the order the partition's writer gives them ids in.
    """
    from pyspark.sql import functions as F

    count = options.partitions or valid.rdd.getNumPartitions()
    spread = F.when(F.col("group") != "", F.col("group")).otherwise(F.col("key"))
    order = [F.col("seq")]
    if options.order_column is not None:
        order.insert(0, F.col("sort").asc_nulls_last())
    return (
        valid.repartition(count, spread)
        .sortWithinPartitions(*order)
        .select("key", "payload", "due", "group")
    )


def run_enqueue(spark: SparkSession, options: EnqueueOptions) -> EnqueueSummary:
    """Validate, then enqueue every valid row; see the module docstring."""
    from pyspark.sql import functions as F

    options = validate_options(options)
    started = time.perf_counter()
    now = clock.now()
    fmt = str(options.format)
    alias = str(options.database)
    sc = spark.sparkContext
    source = read_source(spark, options)
    columns, payload = check_schema(source, options)
    prepared = prepare(source, options, columns, payload, now)

    sc.setJobDescription(f"delayq enqueue: validate {options.source}")
    try:
        stats = prepared.agg(
            F.count(F.lit(1)).alias("rows"),
            F.count("reason").alias("rejected"),
            F.first(
                F.when(
                    F.col("reason").isNotNull(),
                    F.concat(F.col("reason"), F.lit(" in row "), F.substring("row", 1, 200)),
                ),
                ignorenulls=True,
            ).alias("first"),
        ).first()
    except Exception as exc:
        raise PipelineError(f"cannot read {options.source}: {java_message(exc)}") from exc
    assert stats is not None
    rows, rejected = int(stats["rows"]), int(stats["rejected"])
    if rejected and (rejected == rows or rejected > options.max_reject_rate * rows):
        raise PipelineError(
            f"{rejected} of {rows} row(s) of {options.source} are invalid, over "
            f"--max-reject-rate {options.max_reject_rate:g}; nothing was written. "
            f"First: {stats['first']}"
        )
    rejects_path = None
    if rejected:
        rejects_path = str(options.rejects_path)
        write_rejects(prepared, rejects_path, lines=source.lines)

    valid = prepared.filter(F.col("reason").isNull())
    if options.group_column is not None:
        good = in_group_order(valid, options)
    else:
        good = valid.select("key", "payload", "due")
        if options.partitions:
            good = good.repartition(options.partitions)
    plan = database.load_plan(
        alias,
        queue=options.queue,
        kind=options.kind,
        priority=options.priority,
        on_conflict=options.on_conflict,
        now=now,
        grouped=options.group_column is not None,
    )
    sc.setJobDescription(f"delayq enqueue: write {rows - rejected} rows to {options.queue}")
    rdd = good.rdd
    results = rdd.mapPartitions(functools.partial(dbapi.write_partition, plan)).collect()
    sc.setJobDescription(None)  # type: ignore[arg-type]
    total = [sum(r[i] for r in results) for i in range(6)]
    return EnqueueSummary(
        source=options.source,
        format=fmt,
        queue=options.queue,
        rows=rows,
        created=total[1],
        updated=total[2],
        ignored=total[3],
        rejected=rejected,
        rejects_path=rejects_path,
        partitions=rdd.getNumPartitions(),
        transactions=total[4],
        seconds=time.perf_counter() - started,
    )
