"""Step 2 of ``delayq_pipeline enqueue``: every row checked in the JVM, as ``enqueue``
checks a message (its key, group, run-at time and payload), each row given
the reason it is rejected, or none."""

from __future__ import annotations

import functools
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from django.db import connections

from django_delayq.conf import get_config
from django_delayq.contrib.spark import dbapi
from django_delayq.contrib.spark.sources import CORRUPT, LINE, Source
from django_delayq.flow import GROUP_MAX_LENGTH
from django_delayq.models import KEY_MAX_LENGTH
from django_delayq.store.features import features

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import DataType

    from django_delayq.contrib.spark.enqueue_job import EnqueueOptions

JSON_OPTIONS = {
    "ignoreNullFields": "false",
    "timestampFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSSXXX",
    "timestampNTZFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSS",
    "dateFormat": "yyyy-MM-dd",
}


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


def _parents(
    value: Column, types: dict[str, DataType], options: EnqueueOptions
) -> tuple[Column, list[tuple[Column, Column]]]:
    """The after column as an array of parent keys (empty: none), and its reject reasons:
    each parent a key as ``enqueue`` takes one, none named twice."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    name = str(options.after_column)
    dtype = types.get(name, T.StringType())
    if isinstance(dtype, T.ArrayType):
        keys = F.transform(value, lambda x: x.cast("string"))
    else:
        keys = F.when(value.isNotNull(), F.array(value.cast("string")))
    parents = F.coalesce(keys, F.array().cast("array<string>"))
    what = f"after column {name!r}"

    def first(test: Callable[[Column], Column], reason: Callable[[Column], Column]) -> Column:
        bad = F.filter(parents, test)
        return F.when(F.size(bad) > 0, reason(bad[0]))

    checks = [
        (F.exists(parents, lambda k: k.isNull()), F.lit(f"{what} holds a null parent")),
        (F.exists(parents, lambda k: k == ""), F.lit(f"{what} holds an empty key")),
        (
            F.exists(parents, lambda k: F.length(k) > KEY_MAX_LENGTH),
            F.lit(f"{what} holds a key over {KEY_MAX_LENGTH} characters"),
        ),
        (
            F.exists(parents, lambda k: F.instr(k, "\x00") > 0),
            F.lit(f"{what} holds a key with a NUL character"),
        ),
        (
            F.size(F.array_distinct(parents)) < F.size(parents),
            F.concat(
                F.lit(f"{what} names parent "),
                first(
                    lambda k: F.size(F.filter(parents, lambda o: o == k)) > 1,
                    lambda k: F.concat(F.lit("'"), k, F.lit("'")),
                ),
                F.lit(" twice"),
            ),
        ),
    ]
    return parents, checks


def prepare(
    source: Source, options: EnqueueOptions, columns: list[str], payload: list[str], now: datetime
) -> DataFrame:
    """``key``, ``payload`` (JSON text), ``due`` (text the database parses) and ``reason``.

    ``reason`` is null for a valid row, else why it is rejected; ``row`` is
    the whole row as JSON (JSON lines: the line), for the rejects file.
    With a group column, also ``group`` ("" for none), ``seq`` (the order
    Spark read the rows in) and, with an order column, ``sort`` (its values);
    with an after column, ``parents`` (an array of keys, empty for none) and
    ``seq``.
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
            (options.after_column, "after"),
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
    if options.after_column is not None:
        parents, parent_checks = _parents(column(options.after_column), types, options)
        checks += parent_checks
        extra += [parents.alias("parents"), F.monotonically_increasing_id().alias("seq")]
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
