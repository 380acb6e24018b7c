"""The data set ``delayq_pipeline enqueue`` reads: its format, its columns as Spark
reads them (JSON lines without Spark's schema inference), and the checks of
their types made before a row is read (step 1 of ``enqueue_job``)."""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from django_delayq.contrib.spark import PipelineError, dbapi
from django_delayq.contrib.spark.storage import java_message
from django_delayq.payload import MAX_PAYLOAD_DEPTH

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import DataType

    from django_delayq.contrib.spark.enqueue_job import EnqueueOptions

FORMATS = ("csv", "parquet", "json")
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
    from pyspark.sql.types import ArrayType, StructField, StructType

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
            options.after_column,
        )
        if c is not None and c in names
    ]
    types: dict[str, DataType] = {}
    selected = [F.col("value").alias(LINE)]
    refs = []

    def parsed(name: str, dtype: DataType) -> Column:
        schema = StructType([StructField(name, dtype)])
        return F.from_json(F.col("value"), schema, {"mode": "PERMISSIVE"}).getField(name)

    for i, name in enumerate(dict.fromkeys(plain)):
        dtype = order_type(kinds) if name == options.order_column else _string()
        value = parsed(name, dtype)
        if name == options.after_column:
            # A key, or an array of keys: read as an array where the line holds
            # one (a string that looks like one stays a string), else as text.
            dtype = ArrayType(_string())
            many = parsed(name, dtype)
            value = F.when(many.isNotNull(), many).when(value.isNotNull(), F.array(value))
        types[name] = dtype
        selected.append(value.alias(f"_delayq_{i}"))
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
    if options.after_column is not None:
        dtype = require(options.after_column, "after column")
        element = dtype.elementType if isinstance(dtype, T.ArrayType) else dtype
        if not _atomic(element) or isinstance(element, T.NullType):
            raise PipelineError(
                f"after column {options.after_column!r} has type {dtype.simpleString()}; "
                "it must hold a parent's key (text or a number) or an array of them"
            )
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
