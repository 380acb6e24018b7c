"""``delayq_pipeline enqueue --group-column``: ordered groups from a data set.

Each row's group comes from a column; the rows of one group are written in
their input order (``--order-column``, else the order Spark reads them in),
so their ids are that order, and the rows that wait behind their group are
held in the transaction that wrote them, as ``enqueue_many(groups=...)``
does. A worker then runs each group one message at a time, in that order.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError
from django.db import connection

from django_delayq import clock, enqueue
from django_delayq.contrib.spark import database, dbapi
from django_delayq.models import Message
from tests.pipeline.conftest import run_pipeline, write_csv, write_frame
from tests.testapp.models import Execution

pytestmark = [pytest.mark.pipeline, pytest.mark.django_db(transaction=True)]


def groups_in_id_order(queue: str, field: str = "n") -> dict[str, list[Any]]:
    """Each group's payload ``field`` values, in id order ("" holds the ungrouped rows)."""
    found: dict[str, list[Any]] = {}
    for message in Message.objects.filter(queue=queue).order_by("pk"):
        found.setdefault(message.group, []).append(message.payload[field])
    return found


def due_keys(queue: str) -> set[str]:
    rows = Message.objects.filter(queue=queue, next_attempt_time__isnull=False)
    return set(rows.values_list("key", flat=True))


def refused(*args: str) -> str:
    with pytest.raises(CommandError) as caught:
        run_pipeline(*args)
    assert caught.value.returncode == 2
    return str(caught.value)


@pytest.fixture
def small_splits(spark: Any) -> Any:
    """Spark reads a file in splits of 256 bytes: a small file is many partitions."""
    key = "spark.sql.files.maxPartitionBytes"
    before = spark.conf.get(key)
    spark.conf.set(key, "256")
    yield
    spark.conf.set(key, before)


def test_group_column_keeps_each_groups_rows_in_file_order(
    tmp_path: Path, run_worker: Any, small_splits: None
) -> None:
    # Keys descend while the file ascends: rows written in key order would
    # reverse every group. Empty cells (null) are no group. The file is read
    # in several partitions, whose rows meet again, shuffled, in the writers'.
    accounts = ["a", "b", "c", ""]
    rows = [[f"k{999 - n:03d}", accounts[n % 4], n] for n in range(200)]
    source = write_csv(tmp_path / "steps.csv", ["key", "account", "n"], rows)

    summary, output = run_pipeline(
        "enqueue", str(source), "--queue", "default", "--key-column", "key",
        "--group-column", "account", "--partitions", "3",
    )  # fmt: skip

    assert (summary.rows, summary.created, summary.rejected) == (200, 200, 0)
    assert summary.partitions == 3
    found = groups_in_id_order("default")
    assert set(found) == {"a", "b", "c", ""}
    for account in "abc":
        assert found[account] == [n for n in range(200) if accounts[n % 4] == account]
    assert len(found[""]) == 50
    # The first row of each group is due; the rest wait behind it (held).
    grouped_due = due_keys("default") - set(
        Message.objects.filter(group="").values_list("key", flat=True)
    )
    assert grouped_due == {"k999", "k998", "k997"}

    run_worker(["default"], concurrency=4)
    assert Message.objects.exclude(status="succeeded").count() == 0
    ran = Execution.objects.order_by("pk").values_list("message_id", flat=True)
    ids = {m.pk: m for m in Message.objects.all()}
    for account in "abc":
        started = [ids[pk].payload["n"] for pk in ran if ids[pk].group == account]
        assert started == found[account]


def test_order_column_orders_each_group_whatever_the_file_order(tmp_path: Path) -> None:
    ordered = [[f"e{n}", "acct-1" if n % 3 else "acct-2", n, f"2030-01-01T00:00:{n:02d}Z"]
               for n in range(30)]  # fmt: skip
    shuffled = ordered[:]
    random.Random(7).shuffle(shuffled)
    # A row without an order value comes after those with one.
    shuffled.insert(0, ["last", "acct-1", 99, ""])
    source = write_csv(tmp_path / "events.csv", ["id", "account", "n", "at"], shuffled)

    summary, _ = run_pipeline(
        "enqueue", str(source), "--queue", "events", "--key-column", "id",
        "--group-column", "account", "--order-column", "at", "--partitions", "2",
    )  # fmt: skip

    assert summary.created == 31
    found = groups_in_id_order("events")
    assert found["acct-1"] == [n for n in range(30) if n % 3] + [99]
    assert found["acct-2"] == [n for n in range(30) if not n % 3]
    assert due_keys("events") == {"e1", "e0"}


def test_number_groups_are_their_text_and_loads_queue_behind_what_is_there(
    spark: Any, tmp_path: Path
) -> None:
    enqueue("orders", {"n": -1}, key="earlier", group="7")  # pending: the loaded 7s wait
    source = write_frame(
        spark,
        tmp_path / "orders.parquet",
        [("o1", 7, 1), ("o2", 8, 2), ("o3", 7, 3), ("o4", None, 4)],
        "key string, customer long, n int",
    )
    summary, _ = run_pipeline(
        "enqueue", str(source), "--queue", "orders", "--key-column", "key",
        "--group-column", "customer",
    )  # fmt: skip
    assert summary.created == 4
    assert groups_in_id_order("orders") == {"7": [-1, 1, 3], "8": [2], "": [4]}
    assert due_keys("orders") == {"earlier", "o2", "o4"}
    # A re-run finds every key there and changes nothing.
    again, _ = run_pipeline(
        "enqueue", str(source), "--queue", "orders", "--key-column", "key",
        "--group-column", "customer",
    )  # fmt: skip
    assert (again.created, again.ignored) == (0, 4)
    assert due_keys("orders") == {"earlier", "o2", "o4"}


def test_bad_group_values_are_rejected_rows(spark: Any, tmp_path: Path) -> None:
    rows: list[tuple[Any, ...]] = [(f"k{n}", f"g{n % 5}", n) for n in range(300)]
    rows[10] = ("k10", "x" * 201, 10)
    rows[20] = ("k20", "a\x00b", 20)
    rows[30] = ("k30", "y" * 200, 30)  # 200 characters: the most a group may have
    source = write_frame(spark, tmp_path / "in.parquet", rows, "key string, g string, n int")

    summary, output = run_pipeline(
        "enqueue", str(source), "--queue", "q", "--key-column", "key", "--group-column", "g"
    )

    assert (summary.rows, summary.created, summary.rejected) == (300, 298, 2)
    rejects = [json.loads(line) for line in Path(summary.rejects_path).read_text().splitlines()]
    assert sorted((r["reason"], r["row"]["key"]) for r in rejects) == [
        ("group column 'g' contains a NUL character", "k20"),
        ("group column 'g' is 201 characters, over 200", "k10"),
    ]
    assert f"rejected 2 -> {summary.rejects_path}" in output
    assert Message.objects.get(key="k30").group == "y" * 200


def test_group_and_order_columns_are_checked_before_spark_writes(
    spark: Any, tmp_path: Path
) -> None:
    source = write_frame(
        spark,
        tmp_path / "s.parquet",
        [("k", 1, {"a": 1})],
        "key string, n int, nested struct<a:int>",
    )
    base = ("enqueue", str(source), "--queue", "q", "--key-column", "key")
    assert refused(*base, "--group-column", "nope") == (
        f"group column 'nope' is not a column of {source} (columns: key, n, nested)"
    )
    assert refused(*base, "--group-column", "nested") == (
        "group column 'nested' has type struct<a:int>; a group must be text or a number"
    )
    assert refused(*base, "--group-column", "n", "--order-column", "nested") == (
        "order column 'nested' has type struct<a:int>; rows are ordered by a number, "
        "text, a date or a timestamp"
    )
    assert refused(*base, "--order-column", "n") == (
        "--order-column orders the rows of each group: pass --group-column too"
    )
    assert not Message.objects.exists()


def _due_text() -> str:
    now = clock.now()
    if connection.vendor != "postgresql":
        return str(connection.ops.adapt_datetimefield_value(now))
    return now.strftime("%Y-%m-%d %H:%M:%S.%f+00:00")


def test_a_group_spread_over_several_transactions_keeps_its_order() -> None:
    """A partition commits every ``batch_rows``; the hold-back runs in each transaction."""
    now = clock.now()
    due = _due_text()
    plan = database.load_plan(
        "default", queue="q", kind="", priority=0, on_conflict="ignore", now=now, grouped=True
    )
    plan = dbapi.LoadPlan(**{**plan.__dict__, "batch_rows": 2})
    rows = [(f"z{9 - n}", json.dumps({"n": n}), due, "g" if n % 2 else "") for n in range(7)]
    rows.append(("z8", json.dumps({"n": 100}), due, "g"))  # a key written before: ignored

    counts = next(dbapi.write_partition(plan, rows))
    # (rows, created, updated, ignored, transactions, notifies)
    assert counts[:5] == (8, 7, 0, 1, 4)
    assert groups_in_id_order("q") == {"g": [1, 3, 5], "": [0, 2, 4, 6]}
    assert due_keys("q") == {"z8", "z9", "z7", "z5", "z3"}
    retried = next(dbapi.write_partition(plan, rows))
    assert retried[:4] == (8, 0, 0, 8)
    assert due_keys("q") == {"z8", "z9", "z7", "z5", "z3"}


def test_each_partition_is_in_group_order_whatever_order_its_rows_arrive_in(spark: Any) -> None:
    from django_delayq.contrib.spark.enqueue_job import EnqueueOptions, in_group_order

    # Rows as a shuffle may hand them over: not in the order they were read (seq).
    rows = [(f"k{n}", "{}", "due", "g" if n % 2 else "", 100 - n, n % 3 or None) for n in range(40)]
    valid = spark.createDataFrame(
        rows, "key string, payload string, due string, group string, seq long, sort int"
    ).repartition(4)
    grouped = [r for r in rows if r[3] == "g"]
    for order_column, want in (
        (None, sorted(grouped, key=lambda r: r[4])),  # as read
        ("at", sorted(grouped, key=lambda r: (r[5] is None, r[5] or 0, r[4]))),  # nulls last
    ):
        options = EnqueueOptions(
            source="-", queue="q", group_column="g", order_column=order_column, partitions=3
        )
        parts = in_group_order(valid, options).rdd.glom().collect()
        assert len(parts) == 3 and sum(map(len, parts)) == 40
        holding = [part for part in parts if any(r["group"] == "g" for r in part)]
        assert len(holding) == 1  # a group is written by one task
        assert [r["key"] for r in holding[0] if r["group"] == "g"] == [r[0] for r in want]
