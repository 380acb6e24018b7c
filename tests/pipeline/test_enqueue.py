"""``delayq_pipeline enqueue``: idempotent bulk enqueue from CSV, Parquet and JSON lines."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest
from django.db import connection
from django.utils import timezone

from django_delayq import clock
from django_delayq.contrib.spark import database, dbapi
from django_delayq.models import Message
from tests.json_values import exact
from tests.pipeline.conftest import run_pipeline, write_csv, write_frame

pytestmark = [pytest.mark.pipeline, pytest.mark.django_db(transaction=True)]


def people(n: int) -> list[list[object]]:
    return [[f"user{i}@example.com", f"User {i}", i, i / 4, i % 2 == 0] for i in range(n)]


def test_enqueue_twice_creates_once_then_ignores(tmp_path: Path) -> None:
    source = write_csv(tmp_path / "people.csv", ["email", "name", "n", "score", "vip"], people(40))
    args = (str(source), "--queue", "mail", "--key-column", "email")

    first, output = run_pipeline("enqueue", *args)
    assert (first.rows, first.created, first.updated, first.ignored) == (40, 40, 0, 0)
    assert "created 40, updated 0, ignored 0, rejected 0" in output
    stored = {m.key: (m.pk, m.payload) for m in Message.objects.all()}

    second, output = run_pipeline("enqueue", *args)
    assert (second.rows, second.created, second.updated, second.ignored) == (40, 0, 0, 40)
    assert "created 0, updated 0, ignored 40" in output
    assert {m.key: (m.pk, m.payload) for m in Message.objects.all()} == stored
    # CSV types are inferred: numbers and booleans stay numbers and booleans.
    assert stored["user3@example.com"][1] == {
        "email": "user3@example.com",
        "name": "User 3",
        "n": 3,
        "score": 0.75,
        "vip": False,
    }


def test_retried_partition_task_writes_nothing_twice(spark: object) -> None:
    """A Spark task that runs again (its first attempt committed) only finds its rows."""
    now = clock.now()
    due = now.strftime("%Y-%m-%d %H:%M:%S.%f+00:00")
    if connection.vendor != "postgresql":  # DATETIME text in UTC, without a zone
        due = now.astimezone(UTC).replace(tzinfo=None).isoformat(" ")
    rows = [("k1", '{"n":1}', due), ("k2", '{"n":2}', due), ("k1", '{"n":3}', due)]
    for on_conflict in ("ignore", "update"):
        plan = database.load_plan(
            "default", queue=on_conflict, kind="", priority=0, on_conflict=on_conflict, now=now
        )
        first = next(dbapi.write_partition(plan, rows))
        retried = next(dbapi.write_partition(plan, rows))
        # (rows, created, updated, ignored, transactions, notifies)
        assert first[:4] == (3, 2, 0, 1)
        assert retried[:4] == (3, 0, 0, 3)
    assert Message.objects.filter(queue="ignore", key="k1").get().payload == {"n": 1}
    assert Message.objects.filter(queue="update", key="k1").get().payload == {"n": 3}
    assert Message.objects.count() == 4


def test_default_key_is_a_stable_hash_of_the_whole_row(tmp_path: Path) -> None:
    rows = [["a", 1], ["b", 2], ["a", 1]]  # the last row repeats the first
    source = write_csv(tmp_path / "rows.csv", ["letter", "n"], rows)

    first, _ = run_pipeline("enqueue", str(source), "--queue", "q")
    assert (first.rows, first.created, first.ignored) == (3, 2, 1)
    keys = set(Message.objects.values_list("key", flat=True))
    assert all(len(k) == 64 and int(k, 16) >= 0 for k in keys)

    again, _ = run_pipeline("enqueue", str(source), "--queue", "q")
    assert (again.created, again.ignored) == (0, 3)
    assert set(Message.objects.values_list("key", flat=True)) == keys


def test_parquet_and_json_types_are_preserved_in_payloads(spark: object, tmp_path: Path) -> None:
    schema = (
        "id bigint, name string, score double, ok boolean, missing string, tags array<int>, "
        "address struct<city:string,zip:int>, weights map<string,double>, day date, "
        "at timestamp, price decimal(10,2)"
    )
    at = datetime(2024, 1, 2, 3, 4, 5, 6, tzinfo=UTC)
    rows = [
        (
            2**40,
            "Zoë",
            1.5,
            True,
            None,
            [1, 2],
            ("Lyon", 69001),
            {"a": 0.25},
            date(2024, 1, 2),
            at,
            Decimal("9.90"),
        )
    ]
    parquet = write_frame(spark, tmp_path / "typed.parquet", rows, schema)
    expected = {
        "id": 2**40,
        "name": "Zoë",
        "score": 1.5,
        "ok": True,
        "missing": None,
        "tags": [1, 2],
        "address": {"city": "Lyon", "zip": 69001},
        "weights": {"a": 0.25},
        "day": "2024-01-02",
        "at": "2024-01-02T03:04:05.000006Z",
        "price": 9.9,
    }
    run_pipeline("enqueue", str(parquet), "--queue", "typed", "--key-column", "id")
    message = Message.objects.get(queue="typed")
    assert message.key == str(2**40)
    assert message.payload == expected
    assert {k: type(v) for k, v in message.payload.items()} == {
        k: type(v) for k, v in expected.items()
    }

    lines = tmp_path / "typed.jsonl"
    lines.write_text(json.dumps({"id": 7, "v": 0.5, "flag": False, "nested": {"l": [1, None]}}))
    run_pipeline("enqueue", str(lines), "--queue", "json", "--key-column", "id")
    payload = Message.objects.get(queue="json").payload
    assert payload == {"flag": False, "id": 7, "nested": {"l": [1, None]}, "v": 0.5}


def test_scalar_values_keep_their_json_type_through_insert_and_update(
    spark: object, tmp_path: Path
) -> None:
    """Strings that look like numbers, booleans or null stay strings; each type stays its own."""
    due = "2030-01-01 00:00:00"
    rows = [
        ("a", "123", True, 1, 1.5, due),
        ("b", "true", False, 0, 0.0, due),
        ("c", "null", None, 2**40, -2.5, due),
        ("d", "", True, None, None, due),
        ("e", '"quoted"', False, -1, 0.1, due),
        ("f", " 7 ", None, 3, None, due),
    ]
    schema = "id string, text string, flag boolean, n bigint, x double, due string"
    source = write_frame(spark, tmp_path / "scalars.parquet", rows, schema)
    args = ("--queue", "scalars", "--key-column", "id", "--payload-columns", "text,flag,n,x")
    args += ("--run-at-column", "due", "--on-conflict", "update")

    def payloads() -> dict[str, object]:
        return {m.key: exact(m.payload) for m in Message.objects.filter(queue="scalars")}

    first, _ = run_pipeline("enqueue", str(source), *args)
    assert first.created == 6
    assert payloads() == {
        r[0]: exact({"text": r[1], "flag": r[2], "n": r[3], "x": r[4]}) for r in rows
    }
    again, _ = run_pipeline("enqueue", str(source), *args)
    assert (again.created, again.updated, again.ignored) == (0, 0, 6)

    # The same values under other JSON types: true is not 1, "123" is not 123.
    retyped = [(r[0], r[3], int(r[2]) if r[2] is not None else None, r[1], r[4], due) for r in rows]
    schema = "id string, text bigint, flag bigint, n string, x double, due string"
    source = write_frame(spark, tmp_path / "retyped.parquet", retyped, schema)
    changed, _ = run_pipeline("enqueue", str(source), *args)
    assert (changed.created, changed.updated) == (0, 6)
    assert payloads() == {
        r[0]: exact({"text": r[1], "flag": r[2], "n": r[3], "x": r[4]}) for r in retyped
    }


def test_payload_columns_kind_priority_and_delay(tmp_path: Path) -> None:
    source = write_csv(tmp_path / "p.csv", ["email", "name", "n", "score", "vip"], people(3))
    before = timezone.now()
    summary, _ = run_pipeline(
        "enqueue",
        str(source),
        "--queue",
        "mail",
        "--key-column",
        "email",
        "--payload-columns",
        "email,n",
        "--kind",
        "mail.campaign",
        "--priority",
        "7",
        "--delay",
        "3600",
    )
    after = timezone.now()
    assert summary.created == 3
    message = Message.objects.get(key="user2@example.com")
    assert message.payload == {"email": "user2@example.com", "n": 2}
    assert (message.kind, message.priority, message.status) == ("mail.campaign", 7, "pending")
    assert message.scheduled_time == message.next_attempt_time
    assert before + timedelta(hours=1) <= message.next_attempt_time <= after + timedelta(hours=1)


def test_run_at_column_schedules_each_row_and_rejects_bad_times(tmp_path: Path) -> None:
    rows = [[f"k{i}", f"2030-05-0{1 + i % 3}T10:00:00+02:00"] for i in range(200)]
    rows[17][1] = "next tuesday"
    source = write_csv(tmp_path / "times.csv", ["key", "send_at"], rows)
    summary, output = run_pipeline(
        "enqueue", str(source), "--queue", "t", "--key-column", "key", "--run-at-column", "send_at"
    )
    assert (summary.created, summary.rejected) == (199, 1)
    assert Message.objects.get(key="k4").next_attempt_time == datetime(2030, 5, 2, 8, tzinfo=UTC)
    rejects = [json.loads(line) for line in Path(summary.rejects_path).read_text().splitlines()]
    assert rejects == [
        {
            "reason": "run-at column 'send_at' is not a timestamp: next tuesday",
            "row": {"key": "k17", "send_at": "next tuesday"},
        }
    ]
    assert f"rejected 1 -> {summary.rejects_path}" in output


def test_on_conflict_update_rewrites_changed_rows_only(tmp_path: Path) -> None:
    header = ["email", "name", "n", "score", "vip"]
    source = write_csv(tmp_path / "p.csv", header, people(5))
    args = ("--queue", "mail", "--key-column", "email", "--on-conflict", "update")
    args += ("--run-at-column", "due")
    dated = tmp_path / "dated.csv"
    write_csv(dated, [*header, "due"], [[*row, "2030-01-01 00:00:00"] for row in people(5)])
    run_pipeline("enqueue", str(dated), *args)
    changed = [[*row, "2030-01-01 00:00:00"] for row in people(5)]
    changed[2][1] = "Renamed"
    write_csv(dated, [*header, "due"], changed)

    summary, _ = run_pipeline("enqueue", str(dated), *args)
    assert (summary.created, summary.updated, summary.ignored) == (0, 1, 4)
    assert Message.objects.get(key="user2@example.com").payload["name"] == "Renamed"
    assert source.exists()


def test_an_update_of_a_waiting_workflow_step_keeps_it_waiting(tmp_path: Path) -> None:
    """The loader's update is ``enqueue``'s: a step waiting for its parents gets the
    new content and stays waiting (they release it, not the load)."""
    from django_delayq import enqueue

    parent = enqueue("mail", {})
    step = enqueue("mail", {"name": "old"}, key="user1@example.com", after=[parent]).message
    source = write_csv(tmp_path / "p.csv", ["email", "name", "n", "score", "vip"], people(3))
    args = ("--queue", "mail", "--key-column", "email", "--on-conflict", "update")
    summary, _ = run_pipeline("enqueue", str(source), *args)
    assert (summary.created, summary.updated) == (2, 1)
    step.refresh_from_db()
    assert (step.payload["name"], step.next_attempt_time) == ("User 1", None)
    assert step.waiting_for_parents


def test_keys_differing_only_in_case_or_trailing_spaces_are_different_messages(
    spark: object, tmp_path: Path
) -> None:
    """The loader compares keys byte-wise, as the table does (MariaDB/MySQL's
    default collations would call these three one key)."""
    keys = ["Welcome-42", "welcome-42", "welcome-42 "]
    args = ("--queue", "mail", "--key-column", "key", "--format", "json")
    args += ("--run-at-column", "due", "--on-conflict", "update")
    due = "2030-01-01T00:00:00Z"
    schema = "key string, n int, due string"
    first = write_frame(
        spark, tmp_path / "a", [(k, n, due) for n, k in enumerate(keys)], schema, "json"
    )
    summary, _ = run_pipeline("enqueue", str(first), *args)
    assert (summary.created, summary.updated, summary.ignored) == (3, 0, 0)

    changed = [(k, 9 if n == 2 else n, due) for n, k in enumerate(keys)]
    second = write_frame(spark, tmp_path / "b", changed, schema, "json")
    summary, _ = run_pipeline("enqueue", str(second), *args)
    assert (summary.created, summary.updated, summary.ignored) == (0, 1, 2)
    assert {m.key: m.payload["n"] for m in Message.objects.all()} == {
        "Welcome-42": 0,
        "welcome-42": 1,
        "welcome-42 ": 9,
    }


def test_a_few_invalid_rows_go_to_the_rejects_file(tmp_path: Path) -> None:
    rows = people(400)
    rows[10][0] = ""  # an empty CSV field is a null key
    rows[20][0] = "x" * 256
    source = write_csv(tmp_path / "big.csv", ["email", "name", "n", "score", "vip"], rows)
    summary, output = run_pipeline("enqueue", str(source), "--queue", "q", "--key-column", "email")
    assert (summary.rows, summary.created, summary.rejected) == (400, 398, 2)
    assert summary.rejects_path == str(tmp_path / "_big.csv.rejects.jsonl")
    reasons = [
        json.loads(line)["reason"]
        for line in Path(summary.rejects_path).read_text().split("\n")
        if line
    ]
    assert reasons == [
        "key column 'email' is null",
        "key column 'email' is 256 characters, over 255",
    ]
    assert "rejected 2" in output
    assert Message.objects.count() == 398


@pytest.mark.skipif("connection.vendor != 'postgresql'", reason="NOTIFY is PostgreSQL's")
def test_one_notify_per_partition_transaction(tmp_path: Path) -> None:
    import psycopg

    params = database.target("default").params
    source = write_csv(tmp_path / "p.csv", ["email", "name", "n", "score", "vip"], people(30))
    with psycopg.connect(**params, autocommit=True) as listener:
        listener.execute("LISTEN django_delayq")
        summary, _ = run_pipeline(
            "enqueue", str(source), "--queue", "woken", "--key-column", "email", "--partitions", "3"
        )
        bodies = [json.loads(n.payload) for n in listener.notifies(timeout=2, stop_after=4)]
    assert summary.partitions == 3 and summary.transactions == 3
    assert [b["queue"] for b in bodies] == ["woken"] * 3
    assert all(abs(b["due"] - clock.now().timestamp()) < 600 for b in bodies)
