"""Reading the message table with Spark's JDBC source, in parallel by id range.

The columns and their Spark types come from the model, so the archive's
schema follows the table (a column added by a migration is archived too) and
is the same whichever database it came from: on SQLite, where datetimes are
text, and on MariaDB/MySQL, where Django stores them as DATETIME(6) in UTC
without a zone (which a JDBC driver would read in the JVM's own zone), they
are read as text and converted in Spark, in the UTC session zone.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from django.db import connections, models

from django_delayq.contrib.spark import database
from django_delayq.models import Message
from django_delayq.store.features import features

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

# Rows per JDBC partition: each is one query on an id range, one Spark task.
ROWS_PER_PARTITION = 200_000

_SPARK_TYPES = {
    "BigAutoField": "bigint",
    "AutoField": "int",
    "BigIntegerField": "bigint",
    "IntegerField": "int",
    "PositiveIntegerField": "int",
    "PositiveBigIntegerField": "bigint",
    "SmallIntegerField": "int",
    "PositiveSmallIntegerField": "int",
    "BooleanField": "boolean",
    "DateTimeField": "timestamp",
    "FloatField": "double",
}


def message_fields() -> list[models.Field]:
    return list(Message._meta.concrete_fields)


def spark_type(field: models.Field) -> str:
    """Text, JSON and UUIDs are archived as strings; the payload as its JSON text."""
    return _SPARK_TYPES.get(field.get_internal_type(), "string")


def archive_schema() -> StructType:
    """The archive's Parquet schema: every column, then the partition columns."""
    from pyspark.sql.types import DateType, StructField, StructType, _parse_datatype_string

    fields = [
        StructField(str(f.column), _parse_datatype_string(spark_type(f)), True)
        for f in message_fields()
        if f.column != "queue"
    ]
    fields += [
        StructField("queue", _parse_datatype_string("string"), True),
        StructField("date", DateType(), True),
    ]
    return StructType(fields)


def read_messages(
    spark: SparkSession, alias: str, *, where: str, lower: int, upper: int, rows: int
) -> DataFrame:
    """The rows matching ``where`` (SQL over the table) with ids in ``[lower, upper]``.

    ``lower``/``upper``/``rows`` come from a count made just before; they
    only decide how the id range is cut into partitions. Each partition is
    its own query, so the read is not one snapshot: each row is read once,
    in whatever version it had then, and the archive's delete re-checks that
    version.
    """
    from pyspark.sql import functions as F

    connection = connections[alias]
    qn = connection.ops.quote_name
    fields = message_fields()
    naive = features(connection).naive_datetimes  # datetimes without a zone, in UTC
    columns = ", ".join(qn(str(f.column)) for f in fields)
    query = (
        f"(SELECT {columns} FROM {database.table(alias)} "
        f"WHERE {qn('id')} BETWEEN {int(lower)} AND {int(upper)} AND ({where})) AS delayq_selected"
    )

    def read_type(f: models.Field) -> str:
        kind = spark_type(f)
        return "string" if naive and kind == "timestamp" else kind

    partitions = max(
        spark.sparkContext.defaultParallelism, math.ceil(max(rows, 1) / ROWS_PER_PARTITION)
    )
    reader = spark.read.format("jdbc").options(**database.jdbc_options(alias))
    df = (
        reader.option("dbtable", query)
        .option("customSchema", ", ".join(f"{f.column} {read_type(f)}" for f in fields))
        .option("partitionColumn", "id")
        .option("lowerBound", str(int(lower)))
        .option("upperBound", str(int(upper) + 1))
        .option("numPartitions", str(partitions if upper > lower else 1))
        .load()
    )
    if naive:
        for f in fields:
            if spark_type(f) == "timestamp":
                df = df.withColumn(str(f.column), F.col(str(f.column)).cast("timestamp"))
    return df
